"""What a tune's recommendation gains over the builds a user has without tuning: the generic build
(the architecture's baseline flags, what a distribution ships) and the best standard optimisation
level (each -O level the space offers, alone on top of the family's flags; the recipe's own flags
when the space offers none). Measured after the search, side by side on one instance of the
recommended type with the recommendation's run-time arguments, the builds taking turns: the
search's own figures are the best of many noisy trials (biased in the recommendation's favour),
and were measured at different times on different instances.

A gain is a speed ratio (above 1: the recommendation is faster) with a 95% interval
(fleet.stats.ratio); on one type at one price, cost per unit of work falls by 1 - 1/ratio.
"""

from __future__ import annotations

import logging
import re
from dataclasses import asdict, dataclass
from typing import Any, Protocol

import numpy as np

from amibake.errors import AmibakeError
from amibake.steps.state import Variant
from fleet import stats
from fleet.control import ENDED
from fleet.results import Results
from fleet.space import Space
from fleet.spec import Metric

log = logging.getLogger("fleet")

# A standard optimisation level gcc and clang document: -O, -O0..-O3, -Os, -Oz, -Og, -Ofast.
STANDARD_LEVEL = re.compile(r"-O([0-3sgz]|fast)?")
# Where the gain's replicates are recorded: below every trial's number.
GAIN_TRIAL = -1
RECOMMENDED = "recommended"


@dataclass(frozen=True)
class Contender:
    build: str  # the build's name in the bench (and its directory on the instance)
    variant: Variant
    label: str  # how the report names it
    kind: str  # recommended | generic | standard


@dataclass(frozen=True)
class Gain:
    against: str  # the contender's label
    kind: str  # generic | standard
    ratio: float  # the contender's time per unit of work over the recommendation's
    low: float
    high: float
    n: int  # runs of each build

    @property
    def same_build(self) -> bool:
        return self.low == self.high == 1.0 and self.n == 0

    def text(self) -> str:
        if self.same_build:
            return f"it is {self.against} itself"
        if self.low <= 1.0 <= self.high:
            told = "cannot be told apart"
        elif self.ratio > 1:
            told = f"{1 - 1 / self.ratio:.0%} less per unit of work at the same price"
        else:  # the search has not beaten it: said plainly, not as a negative saving
            told = (
                f"SLOWER: {1 / self.ratio - 1:.0%} more per unit of work; use {self.against} "
                "or search longer"
            )
        return (
            f"{self.ratio:.2f}x the speed of {self.against} "
            f"(95%: {self.low:.2f} to {self.high:.2f}, {self.n} runs each; {told})"
        )


class SideBySide(Protocol):
    """What measures builds side by side: fleet/trial.py's CloudEvaluator."""

    metric: Metric

    def side_by_side(
        self, label: str, trial: int, params: dict[str, Any], variants: dict[str, Variant], n: int
    ) -> tuple[dict[str, np.ndarray], float]: ...


def contenders(space: Space, params: dict[str, Any]) -> list[Contender]:
    """The recommendation, the generic build and the standard levels, each build once: a
    standard level that is the recommendation's own flags is not built or run twice."""
    recommended = space.cflags(params)
    out = [
        Contender(RECOMMENDED, Variant.of_flags(recommended), "the recommendation", "recommended")
    ]
    out.append(
        Contender("generic", Variant(name="generic", generic=True), "the generic build", "generic")
    )
    levels = [
        param.render(value)
        for param in space.params.values()
        if param.stage == "compile" and param.kind == "categorical"
        and param.values and all(STANDARD_LEVEL.fullmatch(param.render(v)) for v in param.values)
        for value in param.values
    ]  # fmt: skip
    if not levels:  # the recipe's own flags for the family: `amibake build`'s build
        out.append(Contender("standard", Variant(), "the family's standard build", "standard"))
    for level in dict.fromkeys(levels):
        label = f"the standard level {level}"
        out.append(Contender(f"standard{level}", Variant.of_flags(level), label, "standard"))
    return out


def builds(space: Space, params: dict[str, Any]) -> int:
    """How many builds the gain runs (a standard level that is the recommendation runs once)."""
    return len({(c.variant.cflags, c.variant.generic) for c in contenders(space, params)})


def most_builds(space: Space) -> int:
    """The most builds a gain can run, whatever is recommended (for the estimate, before the
    search): the recommendation, the generic build and each standard level (or the standard
    build, when the space has no level). Without compile parameters the recommendation is the
    standard build itself."""
    if any(p.stage == "compile" for p in space.params.values()):
        return len(contenders(space, {}))
    return builds(space, {})


def measure(
    evaluator: SideBySide, space: Space, params: dict[str, Any], n: int, label: str
) -> tuple[list[Gain], float]:
    """The recommendation's gains over the generic build and the best standard level, from `n`
    runs of each build; and what measuring them cost."""
    chosen = contenders(space, params)
    recommended = chosen[0]
    # A contender whose flags are the recommendation's is the same build: not run twice.
    same = {c.build for c in chosen[1:] if c.variant.cflags == recommended.variant.cflags
            and c.variant.generic == recommended.variant.generic}  # fmt: skip
    run = {c.build: c.variant for c in chosen if c.build not in same}
    values, usd = evaluator.side_by_side(label, GAIN_TRIAL, params, run, n)
    metric = evaluator.metric
    per_unit = {b: np.array([metric.seconds_per_unit(v) for v in vs]) for b, vs in values.items()}
    mine = per_unit[RECOMMENDED]
    gains: dict[str, Gain] = {}
    for contender in chosen[1:]:
        if contender.build in same:
            gains[contender.build] = Gain(contender.label, contender.kind, 1.0, 1.0, 1.0, 0)
            continue
        ratio = stats.ratio(per_unit[contender.build], mine)
        gains[contender.build] = Gain(
            contender.label, contender.kind, ratio.median, ratio.low, ratio.high, ratio.n
        )
    generic = [g for g in gains.values() if g.kind == "generic"]
    # The best standard level: the one the recommendation gains least over.
    standard = sorted((g for g in gains.values() if g.kind == "standard"), key=lambda g: g.ratio)
    return generic + standard[:1], usd


def as_json(gains: list[Gain]) -> list[dict[str, Any]]:
    return [{**asdict(g), "text": g.text()} for g in gains]


def recorded(results: Results, run_id: str) -> dict[str, Any] | None:
    """The run's last recorded gain, or None when it was never measured."""
    found = None
    for _, kind, detail in results.events(run_id):
        if kind == "gain":
            found = detail
    return found


def of_run(
    results: Results,
    run_id: str,
    evaluator: SideBySide,
    space: Space,
    params: dict[str, Any],
    n: int,
    room_usd: float | None,
    usd_per_run: float,
) -> dict[str, Any]:
    """Measure the gain of the run's recommendation (once: a resumed run that has it keeps it)
    and record it; what could not be measured is recorded with why. `room_usd` is what the money
    budget leaves (None: no budget); `usd_per_run` what one run cost in the search."""
    earlier = recorded(results, run_id)
    if earlier and not earlier.get("error") and earlier.get("params") == params:
        return earlier
    count = builds(space, params)
    needed = usd_per_run * n * count
    if room_usd is not None and needed > room_usd:
        detail: dict[str, Any] = {
            "params": params,
            "error": f"{n} runs of {count} builds would cost about ${needed:.4f}, more than the "
            f"${room_usd:.4f} the money budget leaves (raise it with --max-cost and resume)",
            "usd": 0.0,
        }
    else:
        try:
            gains, usd = measure(evaluator, space, params, n, "gain")
            detail = {"params": params, "gains": as_json(gains), "usd": usd, "n": n}
        except AmibakeError as exc:
            detail = {"params": params, "error": str(exc), "usd": getattr(exc, "usd", 0.0)}
    if detail.get("error"):
        log.warning("[%s] gain not measured: %s", run_id, detail["error"])
    results.event(run_id, "gain", **detail)
    # Its runs' controller made the run "running" again; it ends as the search had ended.
    ended = [k for _, k, _ in results.events(run_id) if k in ENDED]
    if ended:
        results.event(run_id, ended[-1], after="gain")
    return detail


def lines(detail: dict[str, Any] | None) -> list[str]:
    """The report's lines from the run's recorded gain (None: not measured)."""
    if not detail:
        return []
    if detail.get("error"):
        return [f"gain not measured: {detail['error']}"]
    return [
        f"gain over {'the best standard level' if g['kind'] == 'standard' else 'the generic build'}"
        f": {g['text']}"
        for g in detail.get("gains", [])
    ]
