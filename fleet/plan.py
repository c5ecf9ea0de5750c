"""`fleet plan`: what N units of work would take, in time and money, on each type and build a
bench run measured, against a deadline and a budget; and, before a bench or a tune launches
anything, what it will run and spend (its instance-hours and dollars, with their basis)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tabulate import tabulate

from amibake import catalog, checks, cost, recipes
from amibake.errors import UserError
from fleet import gain, prices
from fleet.report import emulated, load_bench, summarize
from fleet.results import Results
from fleet.space import TYPE
from fleet.spec import BenchSpec

if TYPE_CHECKING:
    from fleet.tune_spec import TuneSpec

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([hm])\s*$")  # a unit: is "4" hours or minutes?
# More instances than an account's vCPU quota would ever allow: a plan for them is a typo's.
MAX_INSTANCES = 100000
INSTANCES_WHY = "more than any account's EC2 quota runs at once"
MAX_DEADLINE_H = 24 * 366.0


def hours(text: str) -> float:
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise UserError(f"--deadline {text!r} is not a duration like 4h or 90m")
    value = float(match.group(1))
    value = value / 60 if match.group(2) == "m" else value
    if value > MAX_DEADLINE_H:  # 1e400h is inf
        raise UserError(f"--deadline {text[:20]!r} is more than a year: plan for less")
    return value


def check(
    work: float, instances: int = 1, deadline_h: float | None = None, budget: float | None = None
) -> None:
    """What a plan is asked, refused before any run is read: nan compared false with every
    bound and ended in math.ceil's ValueError; --instances 10**21 planned 7e-22 hours."""
    problems = {
        "--work": checks.number(work, above=0),
        "--instances": checks.integer(instances, 1, MAX_INSTANCES, INSTANCES_WHY),
        "--deadline": "" if deadline_h is None else checks.number(deadline_h, above=0),
        "--budget": "" if budget is None else checks.number(budget, above=0),
    }
    for flag, problem in problems.items():
        if problem:
            raise UserError(f"{flag} {problem}")


def plan(
    results: Results,
    run_id: str,
    *,
    work: float,
    instances: int = 1,
    deadline_h: float | None = None,
    budget: float | None = None,
) -> list[dict[str, Any]]:
    """For each measured (type, build): time and cost of `work` units on `instances` instances,
    whether that meets the deadline and the budget, and the fewest instances for the deadline."""
    check(work, instances, deadline_h, budget)
    _, spec, rows = load_bench(results, run_id)
    frame = summarize(rows, spec.metric, emulated(results, run_id))
    if frame.empty:
        raise UserError(f"run {run_id} has no measured replicates to plan from")
    # A build run under QEMU measured the emulator, not the type: nothing to plan a job on.
    frame = frame[~frame.emulated]
    if frame.empty:
        raise UserError(
            f"run {run_id} measured its builds only under emulation (QEMU), which says nothing "
            "of the types' speed: bench them on instances that run them natively"
        )
    whole_runs = spec.metric.meaning == "seconds"  # a unit is a run: it is not split
    if whole_runs and work != math.floor(work):
        raise UserError(
            f"--work {work:g}: the run measured seconds per run, so a unit of work is one run: "
            "give a whole number of runs"
        )
    out = [
        _projection(row, work, instances, deadline_h, budget, whole_runs)
        for _, row in frame.iterrows()
    ]
    # A type whose runs failed in part is not recommended while another ran every replicate
    # (the slow runs are the ones that time out: its figures are its fast ones), as the
    # report's answer has it; one that did no work has nothing to plan.
    return sorted(
        out,
        key=lambda r: (
            r["hours"] is None,
            r["failed"] > 0,
            r["usd"] is None,
            r["usd"] or 0,
            r["hours"] or 0,
        ),
    )


def _projection(
    row: Any,
    work: float,
    instances: int,
    deadline_h: float | None,
    budget: float | None,
    whole_runs: bool,
) -> dict[str, Any]:
    """One (type, build)'s time and cost for `work`, as `plan` says them."""
    found: dict[str, Any] = {
        "type": row.type,
        "build": row.build,
        "instances": instances,
        "n": int(row.n),
        "failed": int(row.failed),
        "market": row.market,
        "hours": None,
        "usd": None,
        "meets_deadline": None,
        "meets_budget": None,
        "instances_for_deadline": None,
        "note": "",
    }
    if not math.isfinite(row.seconds_per_unit):  # a rate of 0: no work done in any replicate
        found["note"] = "measured no work done (a rate of 0): nothing to plan from"
        return found
    each_h = row.seconds_per_unit / 3600
    machine_hours = work * each_h
    if not math.isfinite(machine_hours):
        raise UserError(f"--work {work:g}: more work than any plan can count hours for")
    # Each instance launches and stages before its first unit, and is billed for it (EC2's
    # 60 s minimum a launch is less than that): left out, a plan of short work on many
    # instances was hours and dollars short.
    setup_h = SETUP_S / 3600
    # Runs are whole: the busiest instance does the ceiling's share, and no instance count
    # brings the time under one run's.
    busiest = math.ceil(work / instances) * each_h if whole_runs else machine_hours / instances
    wall = setup_h + busiest
    billed = machine_hours + instances * setup_h
    cost = billed * row.usd_per_hour if not math.isnan(row.usd_per_hour) else None
    notes = []
    if row.failed:
        notes.append(f"{int(row.failed)} of its {int(row.n + row.failed)} replicates failed")
    needed = None
    if deadline_h is not None:
        left_h = deadline_h - setup_h  # what an instance has for work once it is ready
        if left_h <= 0:
            notes.append("the deadline is shorter than an instance's setup")
        elif whole_runs and each_h > left_h:
            notes.append("one run takes longer than the deadline")
        else:
            share = math.floor(left_h / each_h) if whole_runs else None
            needed = math.ceil(work / share) if share else math.ceil(machine_hours / left_h)
            needed = max(1, needed)
            if needed > MAX_INSTANCES:
                notes.append(f"the deadline needs more than {MAX_INSTANCES} instances")
                needed = None
    found.update(
        hours=wall,
        usd=cost,
        meets_deadline=None if deadline_h is None else wall <= deadline_h,
        meets_budget=None if budget is None or cost is None else cost <= budget,
        instances_for_deadline=needed,
        note="; ".join(notes),
    )
    return found


def plan_text(rows: list[dict[str, Any]]) -> str:
    def mark(value: bool | None) -> str:
        return "-" if value is None else ("yes" if value else "NO")

    table = [
        {
            "type": r["type"],
            "build": r["build"],
            "n": r["n"],
            "market": r["market"] or "-",
            "instances": r["instances"],
            "hours": "-" if r["hours"] is None else f"{r['hours']:.3g}",
            "USD": "-" if r["usd"] is None else f"{r['usd']:.4g}",
            "deadline": mark(r["meets_deadline"]),
            "budget": mark(r["meets_budget"]),
            "instances for deadline": r["instances_for_deadline"] or "-",
            "note": r["note"],
        }
        for r in rows
    ]
    if not any(r["note"] for r in rows):
        for line in table:
            del line["note"]
    return (
        tabulate(table, headers="keys")
        + f"\nhours and USD include {_minutes(SETUP_S)} an instance to launch and stage (a guess)"
    )


# --- Before a run: what it will launch and spend (fleet bench, fleet tune) -------------------

# Launching an instance, reaching it over SSH, installing the run's packages and staging the
# builds, before its first replicate (about 2-3 minutes on AWS): a guess, said as one.
SETUP_S = 180.0
GUESS_REPLICATE_S = 300.0  # one replicate of a workload never run before, nor declared


def _guess(seconds: float, what: str, declared: str = ", nor expected_runtime") -> str:
    return f"{what}: {_minutes(seconds)} (a guess: no earlier run{declared})"


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:.3g} min" if seconds >= 60 else f"{seconds:.3g} s"


def _table(results_dir: Path, region: str) -> dict[str, Any] | None:
    try:
        return prices.in_use(results_dir, region)
    except prices.PriceError:
        return None


def _measured(
    results: Results, same: Callable[[dict[str, Any]], bool], kinds: tuple[str, ...]
) -> tuple[str, dict[str, float]] | None:
    """The newest run (of `kinds`, whose spec is `same`) with finished replicates: its id and
    the median seconds of a replicate per type ("" for all types together)."""
    for run_id in reversed(results.run_ids()):
        record = results.run(run_id)
        if record is None or record["kind"] not in kinds:
            continue
        try:
            if not same(record["spec"]):
                continue
        except (KeyError, TypeError, ValueError):
            continue  # a run recorded in an older layout: not comparable
        rows = results.replicates(run_id)
        rows = rows[(rows.state == "ok") & rows.seconds.notna()] if len(rows) else rows
        if rows.empty:
            continue
        medians = {str(t): float(g.seconds.median()) for t, g in rows.groupby("instance_type")}
        return run_id, {**medians, "": float(rows.seconds.median())}
    return None


def _cached(results_dir: Path, recipe: Any, family: str, variant: str) -> bool:
    """Whether amibake's artifact cache likely holds this build (same recipe, same family):
    the build then launches nothing. Likely: a new base image would build it again."""
    folder = results_dir / "artifacts" / ("variants" if variant else "")
    sidecar = folder / f"{recipe.name}_{family}{'-' + variant if variant else ''}.manifest.json"
    try:
        manifest = json.loads(sidecar.read_text())
    except (OSError, ValueError):
        return False
    return (
        bool(manifest.get("recipe_sha256") == recipe.digest())
        and (folder / sidecar.name.replace(".manifest.json", ".tar.xz")).exists()
    )


def replicate_seconds(spec: BenchSpec, results: Results) -> tuple[dict[str, float], str]:
    """How long a replicate of the run takes, by type ("": any other type), and the basis:
    the newest earlier run of the same workload that measured some, else the file's
    expected_runtime, else a guess."""
    earlier = _measured(
        results,
        lambda s: (
            BenchSpec.from_json(s).command_line() == spec.command_line()
            and s.get("recipe", "") == spec.recipe
            and s.get("image", "") == spec.image
        ),
        ("bench",),
    )
    if earlier is not None:
        run_id, medians = earlier
        return medians, f"durations: run {run_id} of the same workload measured " + ", ".join(
            f"{t} {_minutes(s)}" for t, s in medians.items() if t
        ) + " a replicate"
    if spec.expected_runtime_s is not None:
        each = spec.expected_runtime_s
        return {"": each}, f"durations: expected_runtime {_minutes(each)} a replicate"
    return {"": GUESS_REPLICATE_S}, _guess(GUESS_REPLICATE_S, "durations") + " a replicate"


def bench_estimate(
    spec: BenchSpec,
    results: Results,
    results_dir: Path,
    region: str,
    todo: Sequence[Any],
    recipes_dir: Path | None = None,
) -> cost.Estimate:
    """What a bench run will launch and spend: one instance per type for its replicates in
    `todo` (the plan, or what a resumed run has left), and the builds not in the cache."""
    table = _table(results_dir, region)
    market = "spot" if spec.spot else "on-demand"
    medians, basis = replicate_seconds(spec, results)
    lines = []
    for instance_type in spec.types:
        count = sum(1 for r in todo if r.instance_type == instance_type)
        if not count:
            continue
        each = medians.get(instance_type, medians[""])
        lines.append(
            cost.Line(
                f"{instance_type}: {count} replicates",
                instance_type,
                1,
                (SETUP_S + count * each) / 3600,
                cost.hourly(table, instance_type, spec.spot),
            )
        )
    notes = [cost.price_basis(table, region, spec.spot), basis]
    notes.append(f"+ {_minutes(SETUP_S)} an instance to launch and stage (a guess)")
    builds = _bench_builds(spec, results_dir, recipes_dir, table, notes) if lines else []
    replicates = sum(1 for _ in todo)
    per = f"{spec.warmups} warm-up{'s' * (spec.warmups != 1)} + {spec.replicates} measured"
    shape = f"{len(spec.builds)} builds x ({per})" if len(spec.builds) > 1 else per
    runs = (
        f"{replicates} replicates ({shape} per type) of {spec.recipe or spec.command} on "
        f"{len(lines)} {market} instance{'s' * (len(lines) != 1)}: "
        f"{', '.join(line.instance_type for line in lines) or 'none'}"
    )
    return cost.Estimate(runs, builds + lines, notes)


def _bench_builds(
    spec: BenchSpec,
    results_dir: Path,
    recipes_dir: Path | None,
    table: dict[str, Any] | None,
    notes: list[str],
) -> list[cost.Line]:
    """The build instances a bench run of a recipe will launch: one per (family, build) that
    the artifact cache does not hold."""
    if not spec.recipe:
        return []
    recipe = recipes.load(spec.recipe, recipes_dir or recipes.RECIPES_DIR)
    families = sorted({t.split(".")[0] for t in spec.types})
    missing = [
        (family, build)
        for family in families
        for build in spec.builds
        if not _cached(results_dir, recipe, family, "" if build == "tuned" else build)
    ]
    if not missing:
        notes.append("builds: all in the artifact cache")
        return []
    each, basis = cost.build_seconds(results_dir, spec.recipe)
    notes.append(basis)
    lines = []
    for family in families:
        mine = [b for f, b in missing if f == family]
        if mine:
            instance_type = catalog.family(family).instance_type("large")
            lines.append(
                cost.Line(
                    f"build {', '.join(mine)} on {instance_type}",
                    instance_type,
                    len(mine),
                    len(mine) * each / 3600,
                    cost.hourly(table, instance_type, True),
                )
            )
    return lines


def tune_estimate(
    spec: TuneSpec, results: Results, results_dir: Path, region: str, trials: int
) -> cost.Estimate:
    """What `trials` trials of a cloud search will launch and spend: each an instance for its
    replicates, and a build where the trial's compile flags are new. Where the type is a
    parameter, every trial is priced as the dearest type: an upper bound."""
    table = _table(results_dir, region)
    types = [str(t) for t in spec.space.params[TYPE].values] if TYPE in spec.space.params else []
    types = types or list(spec.types)
    priced = {t: cost.hourly(table, t, True) for t in types}
    dearest = max(types, key=lambda t: priced[t] or 0.0)
    # The same workload: the recipe, or the image (a tune of an image has no recipe).
    earlier = _measured(
        results,
        lambda s: s.get("recipe", "") == spec.recipe and s.get("image", "") == spec.image,
        ("tune", "bench"),
    )
    if earlier is not None:
        run_id, medians = earlier
        each = medians.get(dearest, medians[""])
        basis = (
            f"durations: run {run_id} of {spec.recipe or spec.image} measured {_minutes(each)} "
            "a replicate"
        )
    elif spec.expected_runtime_s is not None:
        each = spec.expected_runtime_s
        basis = f"durations: expected_runtime {_minutes(each)} a replicate"
    else:
        each = GUESS_REPLICATE_S
        basis = _guess(each, "durations") + " a replicate"
    shown = dearest if len(types) == 1 else f"{dearest}, the dearest of {len(types)} types"
    lines = [
        cost.Line(
            f"{trials} trials x {spec.replicates} replicates on {shown}",
            dearest,
            trials,
            trials * (SETUP_S + spec.replicates * each) / 3600,
            priced[dearest],
        )
    ]
    # The gain's builds, at most: with no compile parameter chosen, one is the standard build.
    builds = gain.most_builds(spec.space) if spec.gain_replicates and spec.recipe else 0
    if builds:
        gain_runs = spec.gain_replicates * builds
        lines.append(
            cost.Line(
                f"then the gain: {spec.gain_replicates} runs of up to {builds} builds side by side",
                dearest,
                1,
                (SETUP_S + gain_runs * each) / 3600,
                priced[dearest],
            )
        )
    extra = max(0, builds - 1)  # the generic build and the standard levels: new builds
    notes = [cost.price_basis(table, region, True), basis]
    notes.append(f"+ {_minutes(SETUP_S)} an instance to launch and stage (a guess)")
    compiled = any(p.stage == "compile" for p in spec.space.params.values())
    new_builds = (trials if compiled else 0) + extra
    if new_builds:
        build_s, build_basis = cost.build_seconds(results_dir, spec.recipe)
        builder = catalog.family(dearest.split(".")[0]).instance_type("large")
        lines.append(
            cost.Line(
                f"up to {new_builds} build{'s' if new_builds != 1 else ''} of new "
                f"compile flags on {builder}",
                builder,
                new_builds,
                new_builds * build_s / 3600,
                cost.hourly(table, builder, True),
            )
        )
        notes.append(build_basis)
    runs = (
        f"{trials} trials of {spec.recipe or spec.image} ({spec.parallel} at a time) on spot "
        "instances"
    )
    return cost.Estimate(runs, lines, notes)
