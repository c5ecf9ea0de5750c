"""`fleet report` and `fleet plan`: what a run measured, as a terminal table, CSV files and one
self-contained HTML page with plots; and what N units of work would take on each type.

Only measured replicates count (warm-ups and interrupted attempts are kept in the database but
never scored). Cost per unit of work uses the price of the exact market each replicate ran in.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd
from tabulate import tabulate

from amibake.errors import UserError
from fleet import stats
from fleet.results import Results
from fleet.spec import BenchSpec, Metric

if TYPE_CHECKING:
    from fleet.replay import Comparison

MAX_TIMELINES = 24  # monitor timelines drawn: a readable plot, whatever the run's size
TERMINAL_TRIALS = 10  # a tune report's trials in the terminal; the page and trials.csv hold all


@dataclass
class Report:
    run_id: str
    note: str
    summary: pd.DataFrame
    failures: pd.DataFrame
    text: str
    files: dict[str, Path] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "run_id": self.run_id,
            "note": self.note,
            "summary": self.summary.replace({np.nan: None}).to_dict(orient="records"),
            "failures": self.failures.to_dict(orient="records"),
            "files": {k: str(v) for k, v in self.files.items()},
        }


def _load(results: Results, run_id: str) -> tuple[dict[str, Any], BenchSpec, pd.DataFrame]:
    """A bench run's record, plan and replicates (a tune run has no bench plan)."""
    record = results.require(run_id)
    if record["kind"] != "bench":
        raise UserError(
            f"{run_id} is a fleet {record['kind']} run; this needs a fleet bench run (bench the "
            f"configuration `fleet report {run_id}` recommends to plan from it)"
        )
    return record, BenchSpec.from_json(record["spec"]), results.replicates(run_id)


def summarize(rows: pd.DataFrame, metric: Metric) -> pd.DataFrame:
    """One row per (type, build): median and interval of the metric, its spread, seconds and
    cost per unit of work, and ranks that share a number when intervals overlap."""
    measured = rows[(rows.state == "ok") & (rows.warmup == 0)]
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
        if not math.isnan(price):
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
            }
        )
    frame = pd.DataFrame(out)
    if frame.empty:
        return frame
    speed = {
        r.name: r.rank for r in stats.rank(summaries, lower_is_better=not metric.higher_is_better)
    }
    cheap = {r.name: r.rank for r in stats.rank(costs, lower_is_better=True)}
    keys = frame.type + " " + frame.build
    frame["speed_rank"] = [speed[k] for k in keys]
    frame["cost_rank"] = [cheap.get(k) for k in keys]
    return frame.sort_values(["cost_rank", "speed_rank"], na_position="last").reset_index(drop=True)


def pareto(frame: pd.DataFrame) -> pd.Series:
    """True for the rows no other row beats on both time and cost per unit of work."""
    points = frame[["seconds_per_unit", "usd_per_unit"]].to_numpy(dtype=float)
    front = []
    for i, (t, c) in enumerate(points):
        dominated = any(
            (t2 <= t and c2 <= c) and (t2 < t or c2 < c)
            for j, (t2, c2) in enumerate(points)
            if j != i and not math.isnan(c2)
        )
        front.append(not dominated and not math.isnan(c))
    return pd.Series(front, index=frame.index)


def _table_text(frame: pd.DataFrame, metric: Metric) -> str:
    shown = pd.DataFrame(
        {
            "type": frame.type,
            "build": frame.build,
            "n": frame.n,
            f"median {metric.unit}": frame["median"].map(lambda v: f"{v:.4g}"),
            "95% interval": [
                f"{a:.4g} .. {b:.4g}" for a, b in zip(frame.ci_low, frame.ci_high, strict=True)
            ],
            "cv": [
                f"{c:.1%}{' (noisy)' if n else ''}"
                for c, n in zip(frame.cv, frame.noisy, strict=True)
            ],
            "USD/h": frame.usd_per_hour.map(lambda v: "-" if math.isnan(v) else f"{v:.4f}"),
            "USD per unit": frame.usd_per_unit.map(lambda v: "-" if math.isnan(v) else f"{v:.3g}"),
            "speed rank": frame.speed_rank,
            "cost rank": frame.cost_rank.map(lambda v: "-" if v is None or pd.isna(v) else int(v)),
        }
    )
    return tabulate(shown, headers="keys", showindex=False)


def _pyplot() -> Any:
    """matplotlib's pyplot, drawing to files only (no display here or on a CI machine)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90, bbox_inches="tight")
    import matplotlib.pyplot as plt

    plt.close(figure)
    return base64.b64encode(buffer.getvalue()).decode()


def _plots(frame: pd.DataFrame, rows: pd.DataFrame, metric: Metric) -> dict[str, str]:
    plt = _pyplot()

    labels = list(frame.type + "\n" + frame.build)
    plots: dict[str, str] = {}
    figure, axes = plt.subplots(figsize=(7, 3.5))
    errors = [frame["median"] - frame.ci_low, frame.ci_high - frame["median"]]
    axes.bar(labels, frame["median"], yerr=errors, capsize=4, color="#1f77b4")
    axes.set_ylabel(f"{'throughput' if metric.higher_is_better else 'time'} ({metric.unit})")
    axes.set_title("Median per type and build, with bootstrap 95% intervals")
    plots["Throughput per type"] = _png(figure)

    priced = frame.dropna(subset=["usd_per_unit"])
    if not priced.empty:
        figure, axes = plt.subplots(figsize=(7, 3.5))
        errors = [
            priced.usd_per_unit - priced.usd_per_unit_low,
            priced.usd_per_unit_high - priced.usd_per_unit,
        ]
        axes.bar(
            list(priced.type + "\n" + priced.build),
            priced.usd_per_unit,
            yerr=errors,
            capsize=4,
            color="#ff7f0e",
        )
        axes.set_ylabel("USD per unit of work")
        axes.set_title("Cost per unit of work (price of the market used)")
        plots["Cost per unit of work"] = _png(figure)

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
        plots["Time vs cost (Pareto front)"] = _png(figure)

    with_monitor = rows[(rows.monitor_csv.fillna("") != "") & (rows.state == "ok")]
    drawn = 0
    figure, axes = plt.subplots(figsize=(7, 3.5))
    for _, row in with_monitor.head(MAX_TIMELINES).iterrows():
        path = Path(row.monitor_csv)
        if not path.exists():
            continue
        samples = pd.read_csv(path, usecols=["time_s", "cpu_percent"])
        if samples.empty:
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
        plots["Monitor timelines"] = _png(figure)
    else:
        plt.close(figure)
    return plots


def _page(title: str, note: str, intro: list[str], plots: dict[str, str], tail: list[str]) -> str:
    """One self-contained page: the local-cloud note first, the plots inline as PNG."""
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(title)}</title>",
        "<style>body{font-family:sans-serif;margin:2em;max-width:1100px}"
        "table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ccc;"
        "padding:3px 6px}.note{background:#fff3cd;padding:.5em}img{max-width:100%}</style>",
        "</head><body>",
    ]
    if note:
        parts.append(f"<p class='note'>{html.escape(note)}</p>")
    parts.append(f"<h1>{html.escape(title)}</h1>")
    parts += intro
    for name, png in plots.items():
        escaped = html.escape(name)
        parts.append(f"<h2>{escaped}</h2><img alt='{escaped}' src='data:image/png;base64,{png}'>")
    parts += tail
    parts.append("</body></html>")
    return "\n".join(parts)


def _html(report: Report, plots: dict[str, str], spec: BenchSpec, frame: pd.DataFrame) -> str:
    what = spec.recipe or spec.command
    intro = [
        f"<p>{html.escape(what)}: {len(spec.types)} types, builds {', '.join(spec.builds)}, "
        f"{spec.replicates} replicates after {spec.warmups} warm-up(s); metric "
        f"{html.escape(spec.metric.kind)} ({html.escape(spec.metric.unit)}, "
        f"{'higher' if spec.metric.higher_is_better else 'lower'} is better). Equal ranks "
        "cannot be told apart: their intervals overlap.</p>",
        frame.to_html(index=False, float_format=lambda v: f"{v:.4g}", na_rep="-"),
    ]
    tail = []
    if not report.failures.empty:
        tail = ["<h2>Failed replicates</h2>", report.failures.to_html(index=False)]
    return _page(f"fleet report {report.run_id}", report.note, intro, plots, tail)


def make(
    results: Results,
    run_id: str,
    reports_dir: Path,
    html_page: bool = True,
    prefer: str = "balanced",
) -> Report:
    record = results.run(run_id)
    if record is not None and record["kind"] == "tune":
        return make_tune(results, record, reports_dir, html_page, prefer)
    record, spec, rows = _load(results, run_id)
    if rows.empty:
        raise UserError(f"run {run_id} has no replicates yet; see `fleet status {run_id}`")
    frame = summarize(rows, spec.metric)
    failures = rows[rows.state == "failed"][["instance_type", "build", "replicate", "error"]]
    interrupted = int((rows.state == "interrupted").sum())
    lines = [record["note"]] if record["note"] else []
    lines.append(
        f"run {run_id}: {len(rows[(rows.state == 'ok') & (rows.warmup == 0)])} measured "
        f"replicates, {len(failures)} failed, {interrupted} interrupted and rerun"
    )
    lines.append(_table_text(frame, spec.metric) if not frame.empty else "nothing measured yet")
    noisy = frame[frame.noisy] if not frame.empty else frame
    if not noisy.empty:
        lines.append(
            f"noisy (cv > {stats.HIGH_CV:.0%}): "
            + ", ".join(noisy.type + " " + noisy.build)
            + "; more replicates would tighten the intervals"
        )
    for _, failure in failures.head(5).iterrows():
        lines.append(
            f"failed: {failure.instance_type} {failure.build} #{failure.replicate}: {failure.error}"
        )
    report = Report(run_id, record["note"], frame, failures, "\n".join(lines))
    out = reports_dir / run_id
    out.mkdir(parents=True, exist_ok=True)
    for name, table in (("summary", frame), ("replicates", rows), ("failures", failures)):
        path = out / f"{name}.csv"
        table.to_csv(path, index=False)
        report.files[f"{name}.csv"] = path
    if html_page and not frame.empty:
        plots = _plots(frame, rows, spec.metric)
        page = out / "index.html"
        page.write_text(_html(report, plots, spec, frame))
        report.files["index.html"] = page
        report.text += f"\nreport: {page}"
    return report


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([hm]?)\s*$")


def hours(text: str) -> float:
    match = _DURATION.match(text)
    if not match or float(match.group(1)) <= 0:
        raise UserError(f"--deadline {text!r} is not a duration like 4h or 90m")
    value = float(match.group(1))
    return value / 60 if match.group(2) == "m" else value


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
    if work <= 0 or instances < 1:
        raise UserError("--work must be positive and --instances at least 1")
    if budget is not None and budget <= 0:
        raise UserError("--budget must be a positive amount of USD")
    _, spec, rows = _load(results, run_id)
    frame = summarize(rows, spec.metric)
    if frame.empty:
        raise UserError(f"run {run_id} has no measured replicates to plan from")
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


PREFERENCES = ("time", "cost", "balanced")


def recommend(ok: pd.DataFrame, prefer: str) -> pd.Series | None:
    """The trial to pick for a stated preference: fastest, cheapest, or the best sum of the two
    relative to their bests (balanced). Falls back to the loss where time or cost is unknown."""
    if ok.empty:
        return None
    if prefer not in PREFERENCES:
        raise UserError(f"--prefer {prefer!r} is not one of {', '.join(PREFERENCES)}")
    seconds = ok.seconds.astype(float)
    cost = ok.cost_per_unit.astype(float)
    if prefer == "time" and seconds.notna().any():
        return ok.loc[seconds.idxmin()]
    if prefer == "cost" and cost.notna().any():
        return ok.loc[cost.idxmin()]
    if prefer == "balanced" and seconds.notna().all() and cost.notna().all():
        score = seconds / seconds.min() + cost / cost.min()
        return ok.loc[score.idxmin()]
    return ok.loc[ok.loss.astype(float).idxmin()]


def make_tune(
    results: Results, record: dict[str, Any], reports_dir: Path, html_page: bool, prefer: str
) -> Report:
    import json

    from fleet import tune

    run_id = record["run_id"]
    trials = results.trials(run_id)
    final = trials[trials.state != "asked"].copy()
    if final.empty:
        raise UserError(f"run {run_id} has no finished trials yet; see `fleet status {run_id}`")
    final["order"] = range(1, len(final) + 1)
    ok = final[final.state == "ok"]
    spec = record["spec"]
    lines = [record["note"]] if record["note"] else []
    counts = final.state.value_counts().to_dict()
    tally = ", ".join(f"{n} {state}" for state, n in counts.items())
    lines.append(
        f"tune run {run_id}: {len(final)} trials ({tally}); "
        f"algorithm {spec.get('algorithm', 'tpe')}, objective {spec.get('objective', 'runtime')}"
    )
    chosen = recommend(ok, prefer)
    if chosen is not None:
        best = ok.loc[ok.loss.astype(float).idxmin()]
        interval = json.loads(best.manifest or "{}").get("interval")
        described = tune.in_own_terms(
            spec.get("objective", "runtime"), float(best.loss), best.metric, interval
        )
        lines.append(f"best: {described} at trial {best.trial}: {best.params}")
        lines.append(f"recommended for {prefer}: trial {chosen.trial}: {chosen.params}")
    else:
        lines.append("no feasible trial yet")
    shares = importance(ok)
    if shares:
        lines.append(
            f"parameter importance from {len(ok)} feasible trials (share of the loss's variance "
            "its value explains alone, epsilon squared): "
            + ", ".join(f"{name} {share:.2f}" for name, share in shares.items())
        )
    for _, bad in final[final.state != "ok"].head(5).iterrows():
        lines.append(f"{bad.state}: trial {bad.trial}: {bad.reason}")
    summary_lines = list(lines)  # the page's introduction: all but the table
    shown = final[
        [
            "order",
            "trial",
            "state",
            "loss",
            "metric",
            "seconds",
            "cost_per_unit",
            "params",
            "reason",
        ]
    ].rename(columns={"seconds": "seconds_per_unit"})  # as cost is: per unit of work
    report = Report(
        run_id, record["note"], shown, final[final.state != "ok"][["trial", "state", "reason"]], ""
    )
    if len(shown) > TERMINAL_TRIALS:
        lines.append(f"the last {TERMINAL_TRIALS} of {len(shown)} trials (all in trials.csv):")
    lines.append(
        tabulate(
            # A failed trial's missing figures as blanks, not "nan"
            _blank_missing(shown.drop(columns=["reason"]).tail(TERMINAL_TRIALS)),
            headers="keys",
            showindex=False,
            floatfmt=".4g",
        )
    )
    out = reports_dir / run_id
    out.mkdir(parents=True, exist_ok=True)
    shown.to_csv(out / "trials.csv", index=False)
    report.files["trials.csv"] = out / "trials.csv"
    if html_page and not ok.empty:
        page = out / "index.html"
        plots = _tune_plots(final, ok, spec)
        page.write_text(_tune_html(run_id, record, summary_lines, plots, shown))
        report.files["index.html"] = page
        lines.append(f"report: {page}")
    report.text = "\n".join(lines)
    return report


def _blank_missing(table: pd.DataFrame) -> pd.DataFrame:
    """Missing values as None, which tabulate leaves blank (it prints NaN as "nan")."""
    return table.astype(object).where(table.notna(), None)


def importance(ok: pd.DataFrame) -> dict[str, float]:
    """Each parameter's share of the loss's variance among the feasible trials, from its value
    alone: epsilon squared, the between-values share corrected for the share a parameter of as
    many values explains by chance (plain eta squared credits a many-valued one with noise).
    Mostly distinct values (a continuous parameter) are taken in quartiles; a conditional
    parameter's "not set" is a value.
    Largest first; empty below 4 trials or when every loss is equal."""
    import json

    loss = ok.loss.astype(float)
    total = float(((loss - loss.mean()) ** 2).sum())
    if len(ok) < 4 or total == 0:
        return {}
    params = pd.DataFrame([json.loads(p) for p in ok.params], index=ok.index)
    shares = {}
    for name in params.columns:
        values = params[name]
        numeric = pd.to_numeric(values, errors="coerce")
        if numeric.notna().all() and values.nunique() > len(ok) / 2:  # continuous: few repeats
            groups = pd.qcut(numeric, 4, duplicates="drop").astype(str)
        else:
            groups = values.astype(str)
        levels = groups.nunique()
        if levels < 2 or levels >= len(ok):
            shares[name] = 0.0
            continue
        between = float(((loss.groupby(groups).transform("mean") - loss.mean()) ** 2).sum())
        within = (total - between) / (len(ok) - levels)
        shares[name] = max(0.0, (between - (levels - 1) * within) / total)
    return dict(sorted(shares.items(), key=lambda item: -item[1]))


def _own_terms(trials: pd.DataFrame, objective: str) -> tuple[pd.Series, str, bool]:
    """The trials' losses as the user stated the objective, the axis label, and whether higher
    is better: a rate is searched negated, so its plot shows the rate, not "-104"."""
    from fleet.tune import is_rate

    loss = trials.loss.astype(float)
    scored = trials[loss.notna()]
    if len(scored) and all(map(partial(is_rate, objective), scored.loss, scored.metric)):
        return -loss, "metric (higher is better)", True
    labels = {"runtime": "seconds per unit of work", "cost": "USD per unit of work"}
    return loss, labels.get(objective, "metric") + " (lower is better)", False


def _options_in_order(name: str, seen: pd.Series, spec: dict[str, Any]) -> list[Any]:
    """A parameter's values in the tune file's order (a categorical's list), else numeric
    order: the plot's axis reads 16, 32, 64, 128, not the order trials happened to ask them."""
    declared = spec.get("params", {}).get(name, {}).get("values")
    present = set(seen.astype(str))
    if declared:
        ordered = [v for v in declared if str(v) in present]
        return ordered + sorted(present - {str(v) for v in ordered})
    numbers = pd.to_numeric(seen, errors="coerce")
    if numbers.notna().all():
        return sorted(set(numbers.tolist()))
    return sorted(present)


def _tune_plots(final: pd.DataFrame, ok: pd.DataFrame, spec: dict[str, Any]) -> dict[str, str]:
    import json

    plt = _pyplot()
    objective = str(spec.get("objective", "runtime"))

    plots: dict[str, str] = {}
    figure, axes = plt.subplots(figsize=(7, 3.5))
    values, label, higher = _own_terms(final.where(final.state == "ok"), objective)
    best = values.cummax() if higher else values.cummin()
    axes.plot(final.order, best, drawstyle="steps-post", color="#1f77b4", label="best so far")
    axes.scatter(final.order, values, s=12, color="#7f7f7f", label="trial")
    axes.set_xlabel("trials")
    axes.set_ylabel(label)
    axes.legend()
    axes.set_title("Convergence")
    plots["Convergence"] = _png(figure)

    params = pd.DataFrame([json.loads(p) for p in ok.params], index=ok.index)
    if not params.empty:
        values, label, _ = _own_terms(ok, objective)
        columns = list(params.columns)
        figure, grid = plt.subplots(1, len(columns), figsize=(3 * len(columns), 3), squeeze=False)
        for axes, name in zip(grid[0], columns, strict=True):
            chosen = params[name].dropna()  # a conditional parameter is set on some trials
            kind = spec.get("params", {}).get(name, {}).get("kind")
            if kind in ("uniform", "loguniform"):  # continuous: a number line
                axes.scatter(chosen.astype(float), values[chosen.index], s=12, color="#1f77b4")
                axes.set_xscale("log" if kind == "loguniform" else "linear")
            else:
                order = _options_in_order(name, chosen, spec)
                position = {str(option): index for index, option in enumerate(order)}
                axes.scatter(
                    [position[str(v)] for v in chosen], values[chosen.index], s=12, color="#1f77b4"
                )
                # An empty value is a flag left out.
                axes.set_xticks(range(len(order)), [str(o) if str(o) else "(none)" for o in order])
            axes.set_title(name, fontsize=9)
            axes.tick_params(labelsize=7)
        grid[0][0].set_ylabel(label)
        plots["Result by parameter (partial view)"] = _png(figure)

    priced = ok.dropna(subset=["seconds", "cost_per_unit"])
    if not priced.empty:
        frame = pd.DataFrame(
            {
                "seconds_per_unit": priced.seconds.astype(float),
                "usd_per_unit": priced.cost_per_unit.astype(float),
            }
        )
        front = pareto(frame)
        figure, axes = plt.subplots(figsize=(7, 3.5))
        axes.scatter(frame.seconds_per_unit, frame.usd_per_unit, color="#7f7f7f")
        best = frame[front].sort_values("seconds_per_unit")
        axes.plot(
            best.seconds_per_unit, best.usd_per_unit, "o-", color="#2ca02c", label="Pareto front"
        )
        axes.set_xlabel("seconds per unit of work")
        axes.set_ylabel("USD per unit of work")
        axes.legend()
        plots["Time vs cost (Pareto front)"] = _png(figure)
    return plots


def _tune_html(
    run_id: str,
    record: dict[str, Any],
    lines: list[str],
    plots: dict[str, str],
    shown: pd.DataFrame,
) -> str:
    intro = [f"<p>{html.escape(line)}</p>" for line in lines[1 if record["note"] else 0 :]]
    tail = ["<h2>Trials</h2>" + shown.to_html(index=False, na_rep="-")]
    return _page(f"fleet tune {run_id}", record["note"], intro, plots, tail)


def make_compare(rows: list[Comparison], text: str, out: Path) -> dict[str, Path]:
    """`fleet tune compare`'s page: the convergence of each algorithm (best so far over the
    table's optimum vs trials: the median over seeds, and the band the middle 80% of seeds lie
    in) with the printed table, and every seed's curve as CSV."""
    plt = _pyplot()

    out.mkdir(parents=True, exist_ok=True)
    curves = pd.DataFrame(
        [
            {"algorithm": r.algorithm, "seed": seed, "trial": trial, "best_over_optimum": value}
            for r in rows
            for seed, curve in enumerate(r.curves)
            for trial, value in enumerate(curve, start=1)
        ]
    )
    curves.to_csv(out / "convergence.csv", index=False)
    figure, axes = plt.subplots(figsize=(7, 4))
    for algorithm, frame in curves.groupby("algorithm", sort=False):
        by_trial = frame.groupby("trial").best_over_optimum
        (line,) = axes.plot(by_trial.median().index, by_trial.median(), label=str(algorithm))
        axes.fill_between(
            by_trial.median().index,
            by_trial.quantile(0.1),
            by_trial.quantile(0.9),
            color=line.get_color(),
            alpha=0.15,
        )
    for target in (1.02, 1.05):
        axes.axhline(target, color="#7f7f7f", linestyle=":", linewidth=1)
        axes.text(
            1.01, target, f"{target - 1:.0%}", transform=axes.get_yaxis_transform(), fontsize=8
        )
    axes.set_xlabel("trials")
    axes.set_ylabel("best so far / optimum")
    axes.legend()
    title = "Convergence (median over seeds; band: 10th-90th percentile)"
    page = out / "index.html"
    intro = [f"<pre>{html.escape(text)}</pre>"]
    page.write_text(_page("fleet tune compare", "", intro, {title: _png(figure)}, []))
    return {"index.html": page, "convergence.csv": out / "convergence.csv"}
