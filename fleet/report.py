"""`fleet report`: what a bench run measured, as a terminal table, CSV files and one
self-contained HTML page with plots (a tune run's report is fleet/tune_report.py; both pages are
made by fleet/page.py).

Only measured replicates count (warm-ups and interrupted attempts are kept in the database but
never scored). Cost per unit of work uses the price of the exact market each replicate ran in.
"""

from __future__ import annotations

import html
import logging
import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from tabulate import tabulate

from amibake.errors import UserError
from fleet import stats
from fleet.control import type_errors
from fleet.page import Report, png, pyplot, render_page
from fleet.results import Results
from fleet.spec import FOLDS, BenchSpec, Metric, metric_label
from fleet.stats import pareto
from fleet.tune_report import make_tune

log = logging.getLogger("amibake")

MAX_TIMELINES = 24  # monitor timelines drawn: a readable plot, whatever the run's size


def load_bench(results: Results, run_id: str) -> tuple[dict[str, Any], BenchSpec, pd.DataFrame]:
    """A bench run's record, plan and replicates (a tune run has no bench plan)."""
    record = results.require(run_id)
    if record["kind"] != "bench":
        raise UserError(
            f"{run_id} is a fleet {record['kind']} run; this needs a fleet bench run (bench the "
            f"configuration `fleet report {run_id}` recommends to plan from it)"
        )
    return record, BenchSpec.from_json(record["spec"]), results.replicates(run_id)


def emulated(results: Results, run_id: str) -> set[tuple[str, str]]:
    """The (type, build) pairs that ran under QEMU, as the run's environments recorded them."""
    return {
        (str(env["instance_type"]), str(build))
        for env in results.environments(run_id)
        for build in env.get("emulated") or {}
    }


def types_that_failed(
    results: Results, run_id: str, spec: BenchSpec, rows: pd.DataFrame
) -> pd.DataFrame:
    """Types the run asked for that failed before measuring anything (at launch, staging or
    install): they have no replicate rows, only the reason their run recorded. A report that
    counted failed replicates alone said "0 failed" and never named them."""
    errors = type_errors(results, run_id)
    measured = set(rows[rows.state == "ok"].instance_type) if not rows.empty else set()
    missing = [t for t in spec.types if t in errors and t not in measured]
    return pd.DataFrame(
        {
            "instance_type": missing,
            "build": ["(all)"] * len(missing),
            "replicate": [None] * len(missing),
            "error": [errors[t] for t in missing],
        },
        columns=["instance_type", "build", "replicate", "error"],
    )


def summarize(
    rows: pd.DataFrame, metric: Metric, emulated: set[tuple[str, str]] | None = None
) -> pd.DataFrame:
    """One row per (type, build): median and interval of the metric, its spread, seconds and
    cost per unit of work, and ranks that share a number when intervals overlap. Runs under
    QEMU (`emulated`) are ranked among themselves only: emulation says nothing of a CPU's
    speed."""
    emulated = emulated or set()
    measured = rows[(rows.state == "ok") & (rows.warmup == 0)]
    # A replicate that failed (an error, a timeout) is not in the figures, and the slow runs are
    # the ones that time out: its count goes beside them, and the answer and the page say it.
    failures = (
        rows[(rows.state == "failed") & (rows.warmup == 0)]
        .groupby(["instance_type", "build"])
        .size()
        .to_dict()
    )
    out = []
    summaries: dict[str, stats.Summary] = {}
    costs: dict[str, stats.Summary] = {}
    for (instance_type, build), group in measured.groupby(["instance_type", "build"], sort=True):
        values = group.metric.to_numpy(dtype=float)
        # Fewer resamples for very large groups: the interval is already tight there.
        summary = stats.summarize(values, resamples=2000 if len(values) < 1000 else 400)
        key = f"{instance_type} {build}"
        summaries[key] = summary
        prices = group.price_usd_hour.dropna().to_numpy(dtype=float)
        price = float(np.median(prices)) if len(prices) else math.nan
        # Seconds per unit is monotonic in the metric, so the interval maps end to end.
        spu = sorted(metric.seconds_per_unit(v) for v in (summary.low, summary.high))
        spu_median = metric.seconds_per_unit(summary.median)
        if not math.isnan(price) and math.isfinite(spu_median):  # no work done: no cost per unit
            costs[key] = stats.Summary(
                summary.n,
                stats.cost_per_unit(spu_median, price),
                stats.cost_per_unit(spu[0], price),
                stats.cost_per_unit(spu[1], price),
                summary.cv,
            )
        out.append(
            {
                "type": instance_type,
                "build": build,
                "n": summary.n,
                "median": summary.median,
                "ci_low": summary.low,
                "ci_high": summary.high,
                "cv": summary.cv,
                "noisy": summary.noisy,
                "seconds_per_unit": spu_median,
                "usd_per_hour": price,
                "market": ",".join(sorted(set(group.market.dropna()))),
                "usd_per_unit": costs[key].median if key in costs else math.nan,
                "usd_per_unit_low": costs[key].low if key in costs else math.nan,
                "usd_per_unit_high": costs[key].high if key in costs else math.nan,
                "emulated": (instance_type, build) in emulated,
                # last: summary.csv's columns before it keep their places for scripts that read it
                "failed": int(failures.get((instance_type, build), 0)),
            }
        )
    frame = pd.DataFrame(out)
    if frame.empty:
        return frame
    keys = frame.type + " " + frame.build
    speed: dict[str, int] = {}
    cheap: dict[str, int] = {}
    for group in (set(keys[~frame.emulated]), set(keys[frame.emulated])):
        mine = {k: v for k, v in summaries.items() if k in group}
        speed |= {
            r.name: r.rank for r in stats.rank(mine, lower_is_better=not metric.higher_is_better)
        }
        mine = {k: v for k, v in costs.items() if k in group}
        cheap |= {r.name: r.rank for r in stats.rank(mine, lower_is_better=True)}
    frame["speed_rank"] = [speed[k] for k in keys]
    frame["cost_rank"] = [cheap.get(k) for k in keys]
    return frame.sort_values(
        ["emulated", "cost_rank", "speed_rank"], na_position="last"
    ).reset_index(drop=True)


def work_unit(metric: Metric, unit: str = "") -> str:
    """What one unit of work is: the bench file's `unit` where it names one ("frames"), else in
    the metric's words: a run for a runtime, the numerator of a rate ("frames" of frames/s)."""
    if unit:
        return unit
    if metric.meaning == "seconds":
        return "run"
    numerator, per, _ = metric.unit.rpartition("/")
    return numerator.strip() if per and numerator.strip() else "unit"


SCALES = ((1.0, "1"), (1e3, "1k"), (1e6, "1M"), (1e9, "1G"))


def scale_of(*usd_per_unit: float) -> tuple[float, str]:
    """The one count of units that figures read together are given in (a table's column, a
    figure and its interval): scaled by thousands until the smallest is at least a cent. Each
    figure scaled on its own, a column read "$0.81 per 1 run" above "$9.1 per 1k runs"."""
    finite = [v for v in usd_per_unit if math.isfinite(v) and v > 0]
    smallest = min(finite, default=1.0)
    return next(((c, n) for c, n in SCALES if smallest * c >= 0.01), SCALES[-1])


def per_units(usd_per_unit: float, unit: str, scale: tuple[float, str] | None = None) -> str:
    """A cost per unit of work as people read it: "$0.12 per 1M frames", not "1.2e-07 USD per
    unit"; at `scale` (else its own, `scale_of`), to three significant digits (at two,
    $0.002849 and $0.002751 a run both read "$2.8 per 1k runs" ranked 1 and 2)."""
    count, label = scale or scale_of(usd_per_unit)
    plural = "s" if label != "1" and unit in ("run", "unit") else ""
    return f"${usd_per_unit * count:.3g} per {label} {unit}{plural}"


def answer(frame: pd.DataFrame, metric: Metric, unit: str = "") -> str:
    """The run's result in one line: the cheapest and the fastest per unit of work (natively
    measured), or the ones whose intervals overlap, which the data cannot tell apart."""
    if frame.empty:
        return "answer: nothing measured: no replicate succeeded, so no ranking"
    native = frame[~frame.emulated]
    if native.empty:
        return "answer: nothing measured natively, so no ranking (see the table)"
    unit = work_unit(metric, unit)
    names = native.type + " " + native.build
    parts = []
    for column, what in (("cost_rank", "cheapest"), ("speed_rank", "fastest")):
        first = native[native[column] == 1]
        if first.empty:
            continue  # no prices: no cost ranking
        if len(first) > 1:
            parts.append(f"{what}: cannot tell apart {', '.join(names[first.index])}")
        elif column == "cost_rank":
            row = first.iloc[0]
            parts.append(f"{what}: {names[first.index[0]]} ({per_units(row.usd_per_unit, unit)})")
        else:
            parts.append(f"{what}: {names[first.index[0]]}")
    if parts and (native.n < 2).any():
        parts.append("one replicate: no interval, ranked by single runs")
    ranked_first = native[(native.cost_rank == 1) | (native.speed_rank == 1)]
    for index, row in ranked_first[ranked_first.failed > 0].iterrows():
        parts.append(f"{names[index]}: {_failures(row)}")
    idle = native[native["median"] <= 0] if metric.higher_is_better else native.iloc[:0]
    if not idle.empty:  # a median rate of 0: for ever per unit, so neither cost nor time
        parts.append(f"measured no work done (a rate of 0): {', '.join(names[idle.index])}")
    return "answer: " + ("; ".join(parts) if parts else "nothing ranked")


def _failures(row: pd.Series) -> str:
    tried = int(row.n) + int(row.failed)
    return f"{int(row.failed)} of its {tried} replicates failed, and are not in its figures"


def readable(frame: pd.DataFrame, metric: Metric, unit: str = "") -> pd.DataFrame:
    """The summary as people read it (the terminal's table and the page's): numbers to four
    digits, intervals as ranges, cost per a count of units that reads naturally; summary.csv
    keeps every raw column."""
    unit = work_unit(metric, unit)
    column = scale_of(*frame.usd_per_unit)
    folded = FOLDS.get(metric.aggregate) if metric.kind == "regex" else None
    median = f"median {metric.unit}{f' ({folded} of matches)' if folded else ''}"
    shown = pd.DataFrame(
        {
            "type": frame.type,
            "build": frame.build,
            "n": frame.n,
            median: frame["median"].map(lambda v: f"{v:.4g}"),
            # One replicate has no interval: "x .. x" claimed a certainty it does not have.
            "95% interval": [
                f"{a:.4g} .. {b:.4g}" if n > 1 else "none (n=1)"
                for a, b, n in zip(frame.ci_low, frame.ci_high, frame.n, strict=True)
            ],
            "cv": [
                f"{c:.1%}{' (noisy)' if n else ''}"
                for c, n in zip(frame.cv, frame.noisy, strict=True)
            ],
            "USD/h": frame.usd_per_hour.map(lambda v: "-" if math.isnan(v) else f"{v:.4f}"),
            f"cost ({unit})": frame.usd_per_unit.map(
                lambda v: "-" if math.isnan(v) else per_units(v, unit, column)
            ),
            "speed rank": frame.speed_rank,
            "cost rank": frame.cost_rank.map(lambda v: "-" if v is None or pd.isna(v) else int(v)),
        }
    )
    if frame.failed.any():  # beside n: the runs the figures leave out
        shown.insert(3, "failed", frame.failed)
    if frame.emulated.any():  # ranked apart: say which ranking a row is in
        shown.insert(2, "runs", frame.emulated.map({True: "emulated", False: "native"}))
    return shown


def _table_text(frame: pd.DataFrame, metric: Metric, unit: str = "") -> str:
    return tabulate(readable(frame, metric, unit), headers="keys", showindex=False)


def headline(
    frame: pd.DataFrame, metric: Metric, current: str | None = None, unit: str = ""
) -> str:
    """The page's first words: the type and build to pick (cheapest per unit of work measured
    natively; fastest when nothing has a price), its cost and time per unit with intervals, and
    what it saves against the next best and against the type the user runs today."""
    native = frame[~frame.emulated] if not frame.empty else frame
    if native.empty:
        return "Nothing was measured natively, so nothing is recommended (see the table)."
    unit = work_unit(metric, unit)
    priced = native.dropna(subset=["usd_per_unit"]).sort_values(["cost_rank", "usd_per_unit"])
    if priced.empty:
        best = native.sort_values("speed_rank").iloc[0]
        return f"Fastest: {best.type} {best.build} (no prices: no cost ranking)."
    # The pick ran every replicate: one whose runs failed (a timeout, out of memory) measured
    # cheap on the runs that finished, and is named beside the pick, not as it.
    reliable = priced[priced.failed == 0]
    best = reliable.iloc[0] if not reliable.empty else priced.iloc[0]
    passed_over = priced.loc[: best.name].drop(index=best.name)
    seconds = [metric.seconds_per_unit(v) for v in (best.ci_low, best.ci_high)]
    # One scale for every figure the headline gives, its interval's too.
    scale = scale_of(*priced.usd_per_unit, best.usd_per_unit_low)

    def cost(usd: float) -> str:
        return per_units(usd, unit, scale)

    if best.n > 1:
        said = [
            f"Recommended: {best.type} {best.build}, {cost(best.usd_per_unit)} "
            f"(95%: {cost(best.usd_per_unit_low)} to "
            f"{cost(best.usd_per_unit_high)}), {best.seconds_per_unit:.4g} s per "
            f"{unit} ({min(seconds):.4g} to {max(seconds):.4g})."
        ]
    else:
        said = [
            f"Recommended: {best.type} {best.build}, {cost(best.usd_per_unit)}, "
            f"{best.seconds_per_unit:.4g} s per {unit}, from one replicate: no interval, so "
            "run more replicates before trusting the ranking."
        ]
    if best.failed:
        said.append(f"Every type's runs failed in part: {_failures(best)}.")
    for _, row in passed_over.iterrows():
        said.append(
            f"{row.type} {row.build} measured {cost(row.usd_per_unit)}, but {_failures(row)}."
        )
    tied = priced[(priced.cost_rank == best.cost_rank) & (priced.index != best.name)]
    tied = tied.drop(index=passed_over.index, errors="ignore")
    if not tied.empty:
        said.append(
            "It cannot be told apart from "
            + ", ".join(tied.type + " " + tied.build)
            + " on cost: their intervals overlap."
        )
    # The saving against the next best surely dearer than the pick (its interval wholly above
    # the pick's): against one whose interval overlaps it is noise, whatever its rank.
    dearer = priced.usd_per_unit_low > best.usd_per_unit_high
    others = priced[dearer & ~priced.index.isin(passed_over.index)]
    if not others.empty:
        runner = others.iloc[0]
        saving = 1 - best.usd_per_unit / runner.usd_per_unit
        said.append(f"It costs {saving:.0%} less than the next best, {runner.type} {runner.build}.")
    if current:
        theirs = priced[priced.type == current].sort_values("usd_per_unit")
        if theirs.empty:
            said.append(f"{current} was not measured in this run.")
        elif theirs.iloc[0].name != best.name:
            said.append(_against_current(best, theirs.iloc[0], current, unit))
    return " ".join(said)


def _against_current(best: pd.Series, theirs: pd.Series, current: str, unit: str) -> str:
    """What the pick saves against the type run today, said as a saving only where the intervals
    say so: the page said "-50% less" for a type cheaper on the runs that finished (passed over
    for its failed ones), and "2% less" for one whose interval overlapped the pick's."""
    if theirs.usd_per_unit_low > best.usd_per_unit_high:
        saving = 1 - best.usd_per_unit / theirs.usd_per_unit
        return f"Against {current}, which you run today: {saving:.0%} less per {unit}."
    if theirs.usd_per_unit < best.usd_per_unit:
        cheaper = 1 - theirs.usd_per_unit / best.usd_per_unit
        why = _failures(theirs) if theirs.failed else "their intervals overlap"
        return f"{current}, which you run today, measured {cheaper:.0%} less per {unit}, but {why}."
    return (
        f"Against {current}, which you run today, no saving that is not noise: their intervals "
        "overlap."
    )


# A bar chart's axis ends this far above its tallest bar: an interval of 3 noisy runs can reach
# many times its median (or for ever, a rate's reaching 0), and scaled to it the bars were
# slivers at the bottom of the plot.
BAR_HEADROOM = 1.6


def _bars(axes: Any, labels: list[str], values: Any, low: Any, high: Any, color: str) -> str:
    """Bars with their intervals, the axis ending BAR_HEADROOM above the tallest bar where an
    interval reaches past that; the title's words for it then ('' otherwise)."""
    values, low, high = (np.asarray(v, dtype=float) for v in (values, low, high))
    top = BAR_HEADROOM * float(np.max(values)) if len(values) and np.max(values) > 0 else 0.0
    past = bool(top and np.any(high > top))
    shown = np.minimum(high, top) if past else high
    axes.bar(labels, values, yerr=[values - low, shown - values], capsize=4, color=color)
    if not past:
        return ""
    axes.set_ylim(0, top)
    return "\n(an interval past the top runs off it)"


def timeline(path: Path) -> pd.DataFrame | None:
    """A replicate's monitor samples (time_s, cpu_percent), or None when there are none to draw:
    the file gone, empty, or cut short (an instance reclaimed as it wrote it). Any of those
    failed the whole page with a pandas traceback."""
    try:
        samples = pd.read_csv(path, usecols=["time_s", "cpu_percent"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:  # pandas' EmptyDataError and ParserError are these
        log.warning("%s: no monitor timeline drawn: %s", path, exc)
        return None
    samples = samples.apply(pd.to_numeric, errors="coerce").dropna()
    return None if samples.empty else samples


def _plots(frame: pd.DataFrame, rows: pd.DataFrame, metric: Metric) -> dict[str, str]:
    plt = pyplot()

    labels = list(frame.type + "\n" + frame.build)
    plots: dict[str, str] = {}
    figure, axes = plt.subplots(figsize=(7, 3.5))
    clipped = _bars(axes, labels, frame["median"], frame.ci_low, frame.ci_high, "#1f77b4")
    axes.set_ylabel(f"{'throughput' if metric.higher_is_better else 'time'} ({metric.unit})")
    axes.set_title(f"Median per type and build, with 95% intervals{clipped}")
    plots["Throughput per type"] = png(figure)

    priced = frame.dropna(subset=["usd_per_unit"])
    if not priced.empty:
        figure, axes = plt.subplots(figsize=(7, 3.5))
        clipped = _bars(
            axes,
            list(priced.type + "\n" + priced.build),
            priced.usd_per_unit,
            priced.usd_per_unit_low,
            priced.usd_per_unit_high,
            "#ff7f0e",
        )
        axes.set_ylabel("USD per unit of work")
        axes.set_title(f"Cost per unit of work (price of the market used){clipped}")
        plots["Cost per unit of work"] = png(figure)

        figure, axes = plt.subplots(figsize=(7, 3.5))
        front = pareto(priced)
        axes.scatter(priced.seconds_per_unit, priced.usd_per_unit, color="#7f7f7f")
        best = priced[front].sort_values("seconds_per_unit")
        axes.plot(
            best.seconds_per_unit, best.usd_per_unit, "o-", color="#2ca02c", label="Pareto front"
        )
        for _, row in priced.iterrows():
            axes.annotate(
                f"{row.type} {row.build}", (row.seconds_per_unit, row.usd_per_unit), fontsize=7
            )
        axes.set_xlabel("seconds per unit of work")
        axes.set_ylabel("USD per unit of work")
        axes.legend()
        axes.set_title("Time vs cost")
        plots["Time vs cost (Pareto front)"] = png(figure)

    with_monitor = rows[(rows.monitor_csv.fillna("") != "") & (rows.state == "ok")]
    drawn = 0
    figure, axes = plt.subplots(figsize=(7, 3.5))
    for _, row in with_monitor.head(MAX_TIMELINES).iterrows():
        samples = timeline(Path(row.monitor_csv))
        if samples is None:
            continue
        axes.plot(
            samples.time_s,
            samples.cpu_percent,
            marker="o",
            markersize=2,
            label=f"{row.instance_type} {row.build} #{row.replicate}",
        )
        drawn += 1
    if drawn:
        axes.set_xlabel("seconds")
        axes.set_ylabel("CPU %")
        axes.set_title(f"Monitor timelines ({drawn} of {len(with_monitor)} runs)")
        axes.legend(fontsize=6, ncol=2)
        plots["Monitor timelines"] = png(figure)
    else:
        plt.close(figure)
    return plots


def _html(
    report: Report,
    plots: dict[str, str],
    spec: BenchSpec,
    frame: pd.DataFrame,
    current: str | None = None,
) -> str:
    what = spec.recipe or spec.command
    intro = [
        # The answer first; the facts behind it after (issue 23: the page led with a raw
        # 16-column frame wider than the screen).
        f"<p class='answer'>{html.escape(headline(frame, spec.metric, current, spec.unit))}</p>",
        f"<p>{html.escape(what)}: {len(spec.types)} types, builds {', '.join(spec.builds)}, "
        f"{spec.replicates} replicates after {spec.warmups} warm-up(s); metric "
        f"{html.escape(spec.metric.kind)} ({html.escape(metric_label(spec.metric))}, "
        f"{'higher' if spec.metric.higher_is_better else 'lower'} is better). Equal ranks "
        "cannot be told apart: their intervals overlap. Every raw column is in summary.csv."
        "</p>",
        readable(frame, spec.metric, spec.unit).to_html(index=False),
    ]
    tail = []
    if not report.failures.empty:
        tail = ["<h2>Failed replicates</h2>", report.failures.to_html(index=False)]
    return render_page(f"fleet report {report.run_id}", report.note, intro, plots, tail)


def price_tables(results: Results, run_id: str) -> str:
    """The price tables the run's costs come from, in the order it used them: a cost per unit
    is only as current as its table, and spot prices move hourly."""
    seen: list[tuple[str, str, str]] = []
    for _, kind, detail in results.events(run_id):
        table = (detail.get("region", ""), detail.get("date", ""), detail.get("source", ""))
        if kind == "prices" and table[1] and table not in seen:
            seen.append(table)
    if not seen:
        return ""
    named = "; then ".join(f"{r} table of {d} ({s})" for r, d, s in seen)
    return f"prices: {named}; each replicate costed at its market's hourly price"


def make(
    results: Results,
    run_id: str,
    reports_dir: Path,
    html_page: bool = True,
    prefer: str = "balanced",
    current: str | None = None,
) -> Report:
    record = results.run(run_id)
    if record is not None and record["kind"] == "tune":
        if current is not None:  # it was ignored: a tune's report weighs its trials, not types
            raise UserError(
                f"--current is for bench runs; {run_id} is a tune run, whose report compares its "
                "recommendation with the generic build: drop --current"
            )
        return make_tune(results, record, reports_dir, html_page, prefer)
    record, spec, rows = load_bench(results, run_id)
    if current is not None and current not in spec.types:
        raise UserError(
            f"--current {current} is not one of run {run_id}'s types: {', '.join(spec.types)}"
        )
    lost = types_that_failed(results, run_id, spec, rows)
    if rows.empty and lost.empty:
        raise UserError(f"run {run_id} has no replicates yet; see `fleet status {run_id}`")
    frame = summarize(rows, spec.metric, emulated(results, run_id))
    failed = rows[rows.state == "failed"] if not rows.empty else rows
    failures = pd.concat(
        [lost, failed[["instance_type", "build", "replicate", "error"]]], ignore_index=True
    )
    interrupted = int((rows.state == "interrupted").sum()) if not rows.empty else 0
    lines = [record["note"]] if record["note"] else []
    # Failures first: a type that measured nothing is the first thing a reader must see.
    lines += [f"FAILED: {t.instance_type}: {t.error}" for t in lost.itertuples()]
    measured = len(rows[(rows.state == "ok") & (rows.warmup == 0)]) if not rows.empty else 0
    lines.append(
        f"run {run_id}: {measured} measured replicates, {len(failed)} failed, "
        f"{len(lost)} of {len(spec.types)} types failed entirely, {interrupted} interrupted "
        "and rerun"
    )
    priced = price_tables(results, run_id)
    if priced:
        lines.append(priced)
    if not frame.empty:
        lines.append(_table_text(frame, spec.metric, spec.unit))
        if metric_label(spec.metric) != spec.metric.unit:  # several metrics in one number
            lines.append(f"metric: {metric_label(spec.metric)}")
    else:
        lines.append("nothing measured yet")
    noisy = frame[frame.noisy] if not frame.empty else frame
    if not noisy.empty:
        lines.append(
            f"noisy (cv > {stats.HIGH_CV:.0%}): "
            + ", ".join(noisy.type + " " + noisy.build)
            + "; more replicates would tighten the intervals"
        )
    for _, failure in failed.head(5).iterrows():
        lines.append(
            f"failed: {failure.instance_type} {failure.build} #{failure.replicate}: {failure.error}"
        )
    said = answer(frame, spec.metric, spec.unit)
    lines.append(said)
    if current is not None and not frame.empty:
        lines.append(headline(frame, spec.metric, current, spec.unit))
    report = Report(run_id, record["note"], frame, failures, "\n".join(lines), answer=said)
    out = reports_dir / run_id
    out.mkdir(parents=True, exist_ok=True)
    for name, table in (("summary", frame), ("replicates", rows), ("failures", failures)):
        path = out / f"{name}.csv"
        table.to_csv(path, index=False)
        report.files[f"{name}.csv"] = path
    if html_page and not frame.empty:
        plots = _plots(frame, rows, spec.metric)
        page = out / "index.html"
        page.write_text(_html(report, plots, spec, frame, current))
        report.files["index.html"] = page
        report.text += f"\nreport: {page}"
    return report
