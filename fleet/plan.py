"""`fleet plan`: what N units of work would take, in time and money, on each type and build a
bench run measured, against a deadline and a budget."""

from __future__ import annotations

import math
import re
from typing import Any

from tabulate import tabulate

from amibake import checks
from amibake.errors import UserError
from fleet.report import emulated, load_bench, summarize
from fleet.results import Results

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([hm]?)\s*$")
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
    out = []
    for _, row in frame.iterrows():
        machine_hours = work * row.seconds_per_unit / 3600
        wall = machine_hours / instances
        cost = machine_hours * row.usd_per_hour if not math.isnan(row.usd_per_hour) else None
        out.append(
            {
                "type": row.type,
                "build": row.build,
                "instances": instances,
                "hours": wall,
                "usd": cost,
                "meets_deadline": None if deadline_h is None else wall <= deadline_h,
                "meets_budget": None if budget is None or cost is None else cost <= budget,
                "instances_for_deadline": (
                    None if deadline_h is None else max(1, math.ceil(machine_hours / deadline_h))
                ),
            }
        )
    return sorted(out, key=lambda r: (r["usd"] is None, r["usd"] or 0, r["hours"]))


def plan_text(rows: list[dict[str, Any]]) -> str:
    def mark(value: bool | None) -> str:
        return "-" if value is None else ("yes" if value else "NO")

    table = [
        {
            "type": r["type"],
            "build": r["build"],
            "instances": r["instances"],
            "hours": f"{r['hours']:.3g}",
            "USD": "-" if r["usd"] is None else f"{r['usd']:.4g}",
            "deadline": mark(r["meets_deadline"]),
            "budget": mark(r["meets_budget"]),
            "instances for deadline": r["instances_for_deadline"] or "-",
        }
        for r in rows
    ]
    return tabulate(table, headers="keys")
