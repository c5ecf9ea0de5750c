"""The last line of a bench: the answer a reader acts on, in people's numbers (issue 27)."""

from __future__ import annotations

import pandas as pd

from fleet.report import answer, headline, per_units, readable, summarize
from fleet.spec import Metric

RUNTIME = Metric()
RATE = Metric(kind="regex", pattern="x", meaning="rate", unit="frames/s")


def _frame(*rows: tuple[str, int, int, float, bool], n: int = 3) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {"type": t, "build": "tuned", "cost_rank": c, "speed_rank": s, "usd_per_unit": u}
            | {"emulated": e, "n": n, "failed": 0, "median": 1.0}
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
    # nothing measured at all: said so, not "see the table" (there is none)
    assert answer(frame.iloc[0:0], RUNTIME) == (
        "answer: nothing measured: no replicate succeeded, so no ranking"
    )


def test_costs_scale_to_read_with_two_digits() -> None:
    assert per_units(0.5, "frames") == "$0.5 per 1 frames"
    assert per_units(3e-6, "run") == "$3 per 1M runs"
    assert per_units(1.2e-7, "frames") == "$0.12 per 1M frames"
    assert per_units(4e-12, "run") == "$0.004 per 1G runs"  # the largest scale, however small


def _summary(*rows: tuple[str, int, float], n: int = 3) -> pd.DataFrame:
    """Runtime rows (seconds per run) as summarize() makes them: type, cost rank, $ per run."""
    return pd.DataFrame(
        [
            {
                "type": t,
                "build": "tuned",
                "emulated": False,
                "cost_rank": rank,
                "speed_rank": 1,
                "usd_per_unit": usd,
                "usd_per_unit_low": usd * 0.9,
                "usd_per_unit_high": usd * 1.1,
                "seconds_per_unit": 2.0,
                "ci_low": 1.9,
                "ci_high": 2.1,
                "n": n,
                "failed": 0,
            }
            for t, rank, usd in rows
        ]
    )


def test_the_page_leads_with_the_pick_its_intervals_and_what_it_saves() -> None:
    frame = _summary(("m.large", 1, 2e-5), ("c.large", 2, 4e-5), ("r.large", 3, 8e-5))
    said = headline(frame, RUNTIME, current="r.large")
    assert said.startswith(
        "Recommended: m.large tuned, $0.02 per 1k runs (95%: $0.018 per 1k runs to $0.022 per "
        "1k runs), 2 s per run (1.9 to 2.1)."
    ), said
    assert "It costs 50% less than the next best, c.large tuned." in said
    assert "Against r.large, which you run today: 75% less per run." in said
    assert "was not measured" in headline(frame, RUNTIME, current="x.large")


def test_the_saving_against_todays_type_is_said_only_where_the_intervals_say_it() -> None:
    """The page said "-50% less" against a type run today that was cheaper on the runs that
    finished (passed over for a failed one), and "2% less" against one it could not tell
    apart from the pick."""
    frame = _summary(("m.large", 1, 2e-5), ("c.large", 1, 2.04e-5))
    said = headline(frame, RUNTIME, current="c.large")
    assert "less per run" not in said.split("which you run today")[1], said
    assert "no saving that is not noise" in said, said
    cheaper = _summary(("a.large", 1, 1e-5), ("m.large", 2, 2e-5))
    cheaper.loc[0, "failed"] = 1  # cheaper on what finished, so passed over
    said = headline(cheaper, RUNTIME, current="a.large")
    assert said.startswith("Recommended: m.large tuned"), said
    assert "-" not in said.split("which you run today")[1], said
    assert "a.large, which you run today, measured 50% less per run, but 1 of its" in said, said


def test_the_page_says_when_the_pick_cannot_be_told_apart() -> None:
    frame = _summary(("m.large", 1, 2e-5), ("c.large", 1, 2.1e-5))
    assert "It cannot be told apart from c.large tuned on cost" in headline(frame, RUNTIME)


def test_one_replicate_is_said_to_have_no_interval() -> None:
    """With n = 1 the page printed "$0.02 (95%: $0.02 to $0.02)": a certainty one run cannot
    give."""
    frame = _summary(("m.large", 1, 2e-5), ("c.large", 2, 4e-5), n=1)
    said = headline(frame, RUNTIME)
    assert said.startswith(
        "Recommended: m.large tuned, $0.02 per 1k runs, 2 s per run, from one replicate: no "
        "interval, so run more replicates before trusting the ranking."
    ), said
    assert "95%" not in said
    ranked = _frame(("m.large", 1, 2, 2.8e-8, False), ("c.xlarge", 2, 1, 5e-8, False), n=1)
    assert answer(ranked, RUNTIME).endswith("; one replicate: no interval, ranked by single runs")
    rows = pd.DataFrame(
        [
            {"instance_type": t, "build": "plain", "state": "ok", "warmup": 0, "metric": m}
            | {"price_usd_hour": 0.1, "market": "spot"}
            for t, m in (("a.large", 2.0), ("b.large", 2.5), ("b.large", 2.7))
        ]
    )
    table = readable(summarize(rows, RUNTIME), RUNTIME)
    shown = dict(zip(table.type, table["95% interval"], strict=True))
    assert shown["a.large"] == "none (n=1)" and " .. " in shown["b.large"], shown


def _runs(*rows: tuple[str, str, float | None]) -> pd.DataFrame:
    """Replicate rows: type, state, seconds (None for a failed run)."""
    return pd.DataFrame(
        [
            {"instance_type": t, "build": "plain", "state": state, "warmup": 0, "metric": m}
            | {"price_usd_hour": 0.1, "market": "spot"}
            for t, state, m in rows
        ]
    )


def test_a_type_whose_replicates_failed_is_named_with_its_failures_not_picked_silently() -> None:
    """Two of b.large's three runs timed out; the one that finished was the fastest run of all.
    The answer called it the cheapest, and the page recommended it, without a word of the two."""
    rows = _runs(
        *(("a.large", "ok", m) for m in (100.0, 101.0, 102.0)),
        ("b.large", "ok", 80.0),
        ("b.large", "failed", None),
        ("b.large", "failed", None),
    )
    frame = summarize(rows, RUNTIME)
    counts = dict(zip(frame.type, frame.failed, strict=True))
    assert counts == {"a.large": 0, "b.large": 2}
    table = readable(frame, RUNTIME)
    assert list(table.columns[:4]) == ["type", "build", "n", "failed"]
    said = answer(frame, RUNTIME)
    assert "b.large plain: 2 of its 3 replicates failed, and are not in its figures" in said, said
    page = headline(frame, RUNTIME)
    assert page.startswith("Recommended: a.large plain"), page
    assert "b.large plain measured $2.22 per 1k runs, but 2 of its 3 replicates failed" in page
    # with no failure, no column and no word of it
    clean = summarize(rows[rows.instance_type == "a.large"], RUNTIME)
    assert "failed" not in readable(clean, RUNTIME).columns
    assert "failed" not in answer(clean, RUNTIME) and "failed" not in headline(clean, RUNTIME)


def test_the_saving_is_against_the_next_best_told_apart_not_a_tied_one() -> None:
    frame = _summary(("m.large", 1, 2e-5), ("c.large", 1, 2.1e-5), ("r.large", 3, 8e-5))
    said = headline(frame, RUNTIME)
    assert "It cannot be told apart from c.large tuned on cost" in said
    assert "It costs 75% less than the next best, r.large tuned." in said, said
    assert "It costs 5% less" not in said
    alone = _summary(("m.large", 1, 2e-5), ("c.large", 1, 2.1e-5))
    assert "less than the next best" not in headline(alone, RUNTIME)


def test_close_costs_read_apart() -> None:
    """At two significant digits both read "$2.8 per 1k runs", ranked 1 and 2."""
    assert per_units(0.002849, "run") == "$2.85 per 1k runs"
    assert per_units(0.002751, "run") == "$2.75 per 1k runs"


def test_a_rate_with_a_replicate_that_did_no_work_gives_no_cost_below_zero() -> None:
    """The t interval on the values reached below 0 around a rate of 0, and the page said
    "95%: $-709 per 1G frames to ..." and ranked it surely cheaper."""
    rows = pd.DataFrame(
        [
            {"instance_type": t, "build": "plain", "state": "ok", "warmup": 0, "metric": m}
            | {"price_usd_hour": 0.1, "market": "spot"}
            for t, m in [("a.large", v) for v in (0.0, 50.0, 52.0)]
            + [("b.large", v) for v in (40.0, 41.0, 42.0)]
        ]
    )
    frame = summarize(rows, RATE)
    assert (frame.ci_low >= 0).all() and (frame.usd_per_unit_low > 0).all(), frame
    first = frame[frame.type == "a.large"].iloc[0]
    assert first.usd_per_unit_low <= first.usd_per_unit <= first.usd_per_unit_high
    assert "$-" not in headline(frame, RATE)


def test_the_saving_is_only_against_a_type_surely_dearer_than_the_pick() -> None:
    """c ranked below b, which is surely dearer than a, yet c's interval overlaps a's: "It costs
    10% less than the next best, c" was noise."""
    frame = _summary(("a.large", 1, 2e-5), ("b.large", 2, 4e-5), ("c.large", 2, 2.1e-5))
    frame.loc[0, ["usd_per_unit_low", "usd_per_unit_high"]] = [1.0e-5, 3.0e-5]
    frame.loc[1, ["usd_per_unit_low", "usd_per_unit_high"]] = [3.5e-5, 4.5e-5]
    frame.loc[2, ["usd_per_unit_low", "usd_per_unit_high"]] = [2.0e-5, 2.2e-5]
    said = headline(frame, RUNTIME)
    assert "It costs 50% less than the next best, b.large tuned." in said, said
    assert "c.large tuned." not in said.split("next best")[-1]


def test_bars_stay_readable_when_an_interval_reaches_far_above_them() -> None:
    """The page's bars are drawn to scale with their intervals: an interval of 3 noisy runs
    reaching 20 times its median (or for ever, a rate's reaching 0) left the bars slivers at
    the bottom of the plot, and the rendered page's test counted too few of their pixels."""
    from fleet.report import BAR_HEADROOM, _bars, pyplot

    plt = pyplot()
    figure, axes = plt.subplots()
    said = _bars(axes, ["a", "b"], [10.0, 8.0], [9.0, 1.0], [11.0, float("inf")], "#1f77b4")
    assert axes.get_ylim() == (0.0, BAR_HEADROOM * 10.0) and "runs off" in said
    plt.close(figure)
    figure, axes = plt.subplots()
    assert _bars(axes, ["a", "b"], [10.0, 8.0], [9.0, 7.0], [11.0, 9.0], "#1f77b4") == ""
    assert axes.get_ylim()[1] < BAR_HEADROOM * 10.0  # matplotlib's own scale, to the intervals
    plt.close(figure)


def test_figures_read_together_are_given_at_one_scale() -> None:
    """Each cost scaled on its own, a column read "$0.1 per 1 run" under "$1 per 1k runs", and
    an interval "$0.0105 per 1 run (95%: $9.45 per 1k runs to ...)"."""
    rows = pd.DataFrame(
        [
            {"instance_type": t, "build": "plain", "state": "ok", "warmup": 0, "metric": m}
            | {"price_usd_hour": 0.1, "market": "spot"}
            for t, m in [("a.large", v) for v in (35.0, 36.0, 37.0)]
            + [("b.large", v) for v in (3500.0, 3600.0, 3700.0)]
        ]
    )
    costs = list(readable(summarize(rows, RUNTIME), RUNTIME)["cost (run)"])
    assert [c.split(" per ")[1] for c in costs] == ["1k runs", "1k runs"], costs
    said = headline(_summary(("m.large", 1, 0.0105), ("c.large", 2, 0.05)), RUNTIME)
    assert said.startswith(
        "Recommended: m.large tuned, $10.5 per 1k runs (95%: $9.45 per 1k runs to $11.6 per 1k "
        "runs)"
    ), said
