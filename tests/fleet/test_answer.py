"""The last line of a bench: the answer a reader acts on, in people's numbers (issue 27)."""

from __future__ import annotations

import pandas as pd

from fleet.report import answer, per_units
from fleet.spec import Metric

RUNTIME = Metric()
RATE = Metric(kind="regex", pattern="x", meaning="rate", unit="frames/s")


def _frame(*rows: tuple[str, int, int, float, bool]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"type": t, "build": "tuned", "cost_rank": c, "speed_rank": s, "usd_per_unit": u}
            | {"emulated": e}
            for t, c, s, u, e in rows
        ]
    )


def test_the_cheapest_and_the_fastest_are_named_with_the_cost_per_unit_of_work() -> None:
    frame = _frame(("m.large", 1, 2, 2.8e-8, False), ("c.xlarge", 2, 1, 5e-8, False))
    assert answer(frame, RUNTIME) == (
        "answer: cheapest: m.large tuned ($0.028 per 1M runs); fastest: c.xlarge tuned"
    )
    assert answer(frame, RATE).startswith("answer: cheapest: m.large tuned ($0.028 per 1M frames)")


def test_overlapping_intervals_are_said_to_be_indistinguishable() -> None:
    frame = _frame(("a.large", 1, 1, 1e-6, False), ("b.large", 1, 1, 1.1e-6, False))
    assert answer(frame, RUNTIME) == (
        "answer: cheapest: cannot tell apart a.large tuned, b.large tuned; "
        "fastest: cannot tell apart a.large tuned, b.large tuned"
    )


def test_emulated_runs_rank_nothing() -> None:
    frame = _frame(("g.large", 1, 1, 1e-6, True))
    assert answer(frame, RUNTIME).startswith("answer: nothing measured natively")


def test_costs_scale_to_read_with_two_digits() -> None:
    assert per_units(0.5, "frames") == "$0.5 per 1 frames"
    assert per_units(3e-6, "run") == "$3 per 1M runs"
    assert per_units(1.2e-7, "frames") == "$0.12 per 1M frames"
    assert per_units(4e-12, "run") == "$0.004 per 1G runs"  # the largest scale, however small
