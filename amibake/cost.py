"""What a command will spend, said before it spends it: the instances it will run, for how
long, at what price, and on what basis; then the question "Proceed?".

Prices are read as data, never through fleet (amibake does not import it): the region's table
saved by `fleet prices --refresh` (results/prices_REGION.json), else the shipped snapshot
(amibake.catalog.prices) when it is that region's. Durations come from what earlier
runs' instances lived (the journal records each instance's creation and deletion), else from a
stated guess.
"""

from __future__ import annotations

import json
import math
import re
import sqlite3
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amibake.catalog import prices
from amibake.errors import AmibakeError, UserError
from amibake.saved import read_json

# Above this, a run started with no terminal to ask needs --yes (or a cap): a script or a CI job
# that mistypes a count must not spend without a word. Below it, a demo or a test run costs cents.
THRESHOLD_USD = 1.0
# Guesses for when no earlier run of the same work is known, each said as a guess where used.
GUESS_BUILD_S = 15 * 60.0  # one family's build instance: launch, packages, compile, verify
GUESS_BAKE_S = 20 * 60.0  # the bake instance, and again its boot test's
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(s|m|h)\s*$")
MAX_DURATION_S = 7 * 86400.0  # a replicate still running after a week is stuck


class Declined(AmibakeError):
    """Asked "Proceed?", the user said no: nothing was launched."""


def dollars(usd: float) -> str:
    """Money spent, as people read it: cents to four places, less than a cent (the local
    cloud's seconds of instance time) in two significant digits, not "$0.0000"."""
    return f"${usd:.4f}" if usd >= 0.01 or usd == 0 else f"${usd:.2g}"


def seconds(text: Any) -> float:
    """A duration like "90s", "5m" or "1.5h", in seconds; a ValueError says why not."""
    match = _DURATION.match(text) if isinstance(text, str) else None
    value = float(match.group(1)) if match else math.nan
    if match is None or not value > 0:
        raise ValueError(f"{text!r} is not a duration like 90s, 5m or 1.5h")
    value *= {"s": 1, "m": 60, "h": 3600}[match.group(2)]
    if value > MAX_DURATION_S:
        raise ValueError(f"{text!r} is more than a week: a run that long is stuck")
    return value


def price_table(results_dir: Path, region: str) -> dict[str, Any] | None:
    """The region's price table (see the module's docstring), or None if there is none."""
    refreshed = prices.saved(results_dir, region)
    if refreshed.exists():
        # Damaged, it is said so: read as no table, every type was estimated at $0.00.
        remedy = f"read it again with `fleet prices --refresh --region {region}`"
        return read_json(refreshed, remedy, prices.checked)
    document = prices.snapshot()
    return document if document.get("region") == region else None


def hourly(table: dict[str, Any] | None, instance_type: str, spot: bool) -> float | None:
    """USD per hour of a type in its market (spot: the median over the zones), or None."""
    entry = (table or {}).get("prices", {}).get(instance_type)
    if entry is None:
        return None
    if not spot:
        return float(entry["on_demand"])
    zones = [float(p) for p in entry.get("spot", {}).values()]
    return statistics.median(zones) if zones else None


def price_basis(table: dict[str, Any] | None, region: str, spot: bool) -> str:
    if table is None:
        return f"no price table for {region} (fleet prices --refresh --region {region})"
    market = "spot, the median over its zones" if spot else "on-demand"
    return f"prices: {region} table of {table.get('date', '?')} ({market})"


def instance_seconds(results_dir: Path, command: str) -> list[float]:
    """How long each instance of earlier runs whose journal command matches `command` (SQL
    LIKE) lived, from its creation to its deletion: what such a run's instances cost."""
    path = results_dir / "journal.sqlite"
    if not path.exists():
        return []
    try:
        with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
            rows = db.execute(
                "SELECT x.deleted - x.created FROM resources x JOIN runs r USING (run_id) "
                "WHERE x.kind = 'instance' AND x.deleted IS NOT NULL AND r.command LIKE ? "
                "AND r.state = 'succeeded'",
                (command,),
            ).fetchall()
    except sqlite3.Error:
        return []  # a journal being written or of an older layout: no history, a guess
    return [float(r[0]) for r in rows if r[0] is not None and r[0] > 0]


@dataclass
class Line:
    """Instances of one type: how many, for how long each, at what price."""

    what: str  # e.g. "c7i.large: 8 replicates"
    instance_type: str
    instances: int
    hours: float  # instance-hours of all of them
    usd_per_hour: float | None

    @property
    def usd(self) -> float | None:
        return None if self.usd_per_hour is None else self.hours * self.usd_per_hour


@dataclass
class Estimate:
    """What a command will run and spend, with the basis of each number."""

    runs: str  # what will run, in one line
    lines: list[Line] = field(default_factory=list)
    basis: list[str] = field(default_factory=list)

    @property
    def hours(self) -> float:
        return sum(line.hours for line in self.lines)

    @property
    def usd(self) -> float:
        """The priced lines' dollars (the unpriced are named by `unpriced`)."""
        return sum(line.usd or 0.0 for line in self.lines)

    @property
    def unpriced(self) -> list[str]:
        return sorted({line.instance_type for line in self.lines if line.usd_per_hour is None})

    def text(self) -> str:
        rows = [f"will run: {self.runs}"]
        for line in self.lines:
            price = (
                f"x ${line.usd_per_hour:.4f}/h = ${line.usd:.4f}"
                if line.usd is not None and line.usd_per_hour is not None
                else "(no price)"
            )
            rows.append(
                f"  {line.what}: {line.instances} instance{'s' * (line.instances != 1)}, "
                f"{line.hours:.3g} instance-hours {price}"
            )
        # Left out of the sum, and said so with the way to a price: never counted as free.
        without = (
            f" (without {', '.join(self.unpriced)}: no price; `fleet prices --refresh` reads "
            "every type the region sells)"
            if self.unpriced
            else ""
        )
        rows.append(f"estimate: {self.hours:.3g} instance-hours, ${self.usd:.2f}{without}")
        rows += [f"  basis: {b}" for b in self.basis]
        return "\n".join(rows)

    def to_json(self) -> dict[str, Any]:
        return {
            "runs": self.runs,
            "instance_hours": self.hours,
            "usd": self.usd,
            "unpriced": self.unpriced,
            "lines": [
                {
                    "what": line.what,
                    "instance_type": line.instance_type,
                    "instances": line.instances,
                    "instance_hours": line.hours,
                    "usd_per_hour": line.usd_per_hour,
                    "usd": line.usd,
                }
                for line in self.lines
            ],
            "basis": self.basis,
        }


def terminal() -> bool:
    """Whether someone can be asked: both stdin and stderr (where the question goes) are TTYs."""
    return sys.stdin.isatty() and sys.stderr.isatty()


def approve(
    estimate: Estimate, show: str, *, yes: bool, capped: bool = False, cap_flag: str = ""
) -> None:
    """Say what will run and spend (`show`, on stderr), and ask "Proceed?" where a terminal is
    attached (--yes skips it). With none, an estimate above THRESHOLD_USD needs --yes, or a cap
    (`cap_flag`, when the command has one): refused in one line that gives the figures. So does
    one with an unpriced type, whatever the priced lines sum to: its dollars are unknown, not
    none, and a cap cannot count what it has no price for."""
    unpriced = bool(estimate.unpriced)
    cheap = estimate.usd <= THRESHOLD_USD and not unpriced
    refused = not (yes or terminal() or (capped and not unpriced) or cheap)
    if not refused:
        print(show, file=sys.stderr, flush=True)
    if yes:
        return
    if terminal():
        print("Proceed? [y/N] ", end="", file=sys.stderr, flush=True)
        answer = sys.stdin.readline().strip().lower()
        if answer not in ("y", "yes"):
            raise Declined("not launched (answered no): nothing was created")
        return
    if not refused:
        return
    if unpriced:
        raise UserError(
            f"the estimate has no price for {', '.join(estimate.unpriced)} "
            f"({estimate.hours:.3g} instance-hours in all), and there is no terminal to ask: "
            "pass --yes to run it anyway"
        )
    ways = f"--yes to run it, or {cap_flag} USD to cap its spend" if cap_flag else "--yes to run it"
    raise UserError(
        f"the estimate is ${estimate.usd:.2f} ({estimate.hours:.3g} instance-hours), above "
        f"${THRESHOLD_USD:.2f}, and there is no terminal to ask: pass {ways}"
    )


def _lived(results_dir: Path, command: str, guess: float, what: str) -> tuple[float, str]:
    """How long an instance of such a run lives: the journal's earlier runs, else a guess."""
    lived = instance_seconds(results_dir, command)
    if lived:
        each = statistics.median(lived)
        return each, f"{what}: {each / 60:.3g} min an instance (median of {len(lived)} earlier)"
    return guess, f"{what}: {guess / 60:.3g} min an instance (a guess: no earlier run)"


def build_seconds(results_dir: Path, recipe: str) -> tuple[float, str]:
    """How long a build instance of `recipe` lives (journal, else a guess), and the basis."""
    return _lived(results_dir, f"build % {recipe}", GUESS_BUILD_S, "builds")


def _cached(state: Any) -> bool:
    """Whether a preflighted build's artifact is in the cache: it then launches nothing."""
    sidecar = state.artifacts_dir / f"{state.label}.manifest.json"
    try:
        manifest = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return False
    archive = state.artifacts_dir / f"{state.label}.tar.xz"
    same = bool(state.cache_key) and manifest.get("cache_key") == state.cache_key
    return same and archive.exists()


def build_estimate(states: list[Any], results_dir: Path, region: str) -> Estimate:
    """`amibake build`: an instance per family whose artifact is not cached, for as long as
    earlier builds of the recipe kept theirs (else a guess)."""
    table = price_table(results_dir, region)
    todo = [s for s in states if not _cached(s)]
    recipe = states[0].recipe.name if states else ""
    each, basis = build_seconds(results_dir, recipe)
    lines = [
        Line(
            f"build {s.family.name}",
            s.family.instance_type(s.size),
            1,
            each / 3600,
            hourly(table, s.family.instance_type(s.size), s.spot),
        )
        for s in todo
    ]
    cached = [s.family.name for s in states if s not in todo]
    notes = [price_basis(table, region, all(s.spot for s in states)), basis]
    if cached:
        notes.append(f"in the artifact cache, no instance: {', '.join(cached)}")
    market = "spot" if all(s.spot for s in states) else "on-demand"
    runs = f"{len(todo)} {market} build instance{'s' * (len(todo) != 1)} for {recipe}"
    return Estimate(runs, lines, notes)


def bake_estimate(bakes: list[tuple[str, str, bool]], results_dir: Path, region: str) -> Estimate:
    """`amibake bake`: per architecture (name, instance type, spot), the bake instance and then
    its boot test's, each for as long as earlier bakes kept theirs (else a guess)."""
    table = price_table(results_dir, region)
    each, basis = _lived(results_dir, "bake %", GUESS_BAKE_S, "bakes")
    lines = [
        Line(f"bake {name} and boot-test it", kind, 2, 2 * each / 3600, hourly(table, kind, spot))
        for name, kind, spot in bakes
    ]
    spot = all(s for _, _, s in bakes)
    notes = [price_basis(table, region, spot), basis]
    notes.append("then the image's snapshots, stored until retired (amibake ls prices them)")
    runs = f"{len(bakes)} bake{'s' * (len(bakes) != 1)} ({', '.join(b[0] for b in bakes)})"
    return Estimate(runs, lines, notes)
