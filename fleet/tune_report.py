"""`fleet report` of a tune run: the best configuration with its interval, the recommendation for
a stated preference, each parameter's importance, the convergence, result-by-parameter and
time-vs-cost plots; and `fleet tune compare`'s page."""

from __future__ import annotations

import html
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd
from tabulate import tabulate

from amibake.errors import UserError
from fleet import gain, recommended
from fleet.page import Report, png, pyplot, render_page
from fleet.results import Results
from fleet.search.engines import DEFAULT
from fleet.stats import pareto

if TYPE_CHECKING:
    from fleet.replay import Comparison
    from fleet.tune_spec import TuneSpec

TERMINAL_TRIALS = 10  # a tune report's trials in the terminal; the page and trials.csv hold all
# Below this many feasible trials per parameter, a parameter's share of the variance is a hint,
# not a finding: with 4 trials and 4 parameters, each value was seen once or twice.
IMPORTANCE_TRIALS_PER_PARAM = 5

PREFERENCES = ("time", "cost", "balanced")


def recommend(ok: pd.DataFrame, prefer: str) -> dict[str, Any] | None:
    """The configuration to pick for a stated preference: fastest, cheapest, or the best sum of
    the two relative to their bests (balanced), each by its trials' mean through the noise as
    the recommendation is (fleet/search/recommend.py). Falls back to the loss where time or cost
    is unknown. The trial with the best single figure was named before: one lucky run of 0.90
    among 1.30 beat three steady runs of 1.00."""
    import json

    from fleet.search.recommend import recommend as through_noise

    if ok.empty:
        return None
    if prefer not in PREFERENCES:
        raise UserError(f"--prefer {prefer!r} is not one of {', '.join(PREFERENCES)}")
    seconds = ok.seconds.astype(float)
    cost = ok.cost_per_unit.astype(float)
    if prefer == "time" and seconds.notna().any():
        figure = seconds
    elif prefer == "cost" and cost.notna().any():
        figure = cost
    elif prefer == "balanced" and seconds.notna().all() and cost.notna().all():
        figure = seconds / seconds.min() + cost / cost.min()
    else:
        figure = ok.loss.astype(float)
    known = figure.notna()
    chosen = through_noise(
        (json.loads(text), float(value))
        for text, value in zip(ok.params[known], figure[known], strict=True)
    )
    if chosen is None:
        return None
    trials = [int(t) for t, text in zip(ok.trial, ok.params, strict=True)
              if json.loads(text) == chosen.params]  # fmt: skip
    return {
        "params": json.dumps(chosen.params),
        "trials": trials,
        "basis": chosen.basis,
    }


def make_tune(
    results: Results, record: dict[str, Any], reports_dir: Path, html_page: bool, prefer: str
) -> Report:
    import json

    from fleet import tune

    run_id = record["run_id"]
    details: dict[str, Any] = {}
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
        # A file that names none ran the default (auto): "tpe" named a search that did not run.
        f"algorithm {spec.get('algorithm', DEFAULT)}, objective {spec.get('objective', 'runtime')}"
    )
    chosen = recommend(ok, prefer)
    if chosen is not None:
        best = ok.loc[ok.loss.astype(float).idxmin()]
        interval = json.loads(best.manifest or "{}").get("interval")
        described = tune.in_own_terms(
            spec.get("objective", "runtime"), float(best.loss), best.metric, interval
        )
        lines.append(f"best: {described} at trial {best.trial}: {best.params}")
        details["best"] = {
            "trial": int(best.trial),
            "loss": float(best.loss),
            "metric": None if pd.isna(best.metric) else float(best.metric),
            "params": json.loads(best.params),
            "described": described,
        }
        through_noise = tune.recommendation(results, run_id)
        if through_noise is not None:
            objective = spec.get("objective", "runtime")
            lines.append(f"recommended: {tune.recommendation_text(objective, through_noise)}")
            ready = ready_line(spec, run_id, through_noise["params"])
            lines.append(ready)
            details["recommended"] = {**through_noise, "use": ready}
            tied = told_apart_from(ok, through_noise)
            if tied:
                lines.append(
                    f"it cannot be told apart from trial{'s' if len(tied) > 1 else ''} "
                    + ", ".join(str(t["trial"]) for t in tied)
                    + " (their intervals overlap its own): "
                    + "; ".join(str(t["params"]) for t in tied[:3])
                    + ("; ..." if len(tied) > 3 else "")
                )
            details["recommended"]["cannot_tell_apart"] = tied
            measured = gain.recorded(results, run_id)
            if measured and measured.get("params") != through_noise["params"]:
                # An earlier recommendation's (a resumed search changed it): not this one's.
                measured = {"error": f"not yet for this recommendation (`fleet tune --resume "
                            f"{run_id}` measures it)"}  # fmt: skip
            lines.extend(gain.lines(measured))
            details["gain"] = measured
            # The hand-over to `amibake bake --from-tune` (fleet/recommended.py), written anew.
            searched = _searched(spec, run_id)
            written = (
                recommended.write(
                    results.path.parent,
                    run_id,
                    searched,
                    through_noise["params"],
                    gain.lines(measured),
                )
                if searched is not None
                else None
            )
            if written is not None:
                bake = f"amibake bake --from-tune {run_id}"
                lines.append(f"bake it: {bake} (the recipe built with these flags, in an image)")
                details["recommended"]["bake"] = bake
        if prefer != "balanced" or through_noise is None:
            # A preference asked for (the fastest or cheapest configuration, by its mean), or
            # no noise-aware recommendation to give. By default the one above stands alone: a
            # second "recommended" line from single runs named the luckiest one (winner's curse).
            numbers = ", ".join(str(t) for t in chosen["trials"])
            lines.append(
                f"recommended for {prefer}: {chosen['params']} (trial"
                f"{'s' if len(chosen['trials']) > 1 else ''} {numbers}; {chosen['basis']})"
            )
    else:
        lines.append("no feasible trial yet")
    shares = importance(ok)
    if shares:
        lines.append(
            f"parameter importance from {len(ok)} feasible trials (share of the loss's variance "
            "its value explains alone, epsilon squared): "
            + ", ".join(f"{name} {share:.2f}" for name, share in shares.items())
        )
        needed = IMPORTANCE_TRIALS_PER_PARAM * len(shares)
        if len(ok) < needed:
            lines.append(
                f"  (a hint, not a finding: {len(ok)} feasible trials for {len(shares)} "
                f"parameters; about {needed} would support it)"
            )
        details["importance"] = {
            "shares": shares,
            "trials": len(ok),
            "supported": len(ok) >= needed,
        }
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
    report.details = details
    chosen_now = details.get("recommended")
    report.answer = (
        f"recommended: {tune.recommendation_text(spec.get('objective', 'runtime'), chosen_now)}"
        if chosen_now
        else "no feasible trial"
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
        if shares:
            plots.update(_importance_plot(shares, len(ok)))
        page.write_text(_tune_html(run_id, record, summary_lines, plots, shown))
        report.files["index.html"] = page
        lines.append(f"report: {page}")
    report.text = "\n".join(lines)
    return report


def _searched(spec: dict[str, Any], run_id: str) -> TuneSpec | None:
    """A cloud search's spec from its record; None for a replay (no build) or a record that no
    longer parses (its recipe gone, say)."""
    from fleet.tune_spec import from_dict

    if spec.get("replay"):
        return None
    try:
        return from_dict(spec, f"run {run_id}")
    except UserError:
        return None


def told_apart_from(ok: pd.DataFrame, recommended: dict[str, Any]) -> list[dict[str, Any]]:
    """The other configurations whose interval of the loss overlaps the recommendation's: the
    measurements cannot say which of them is better. None without an interval."""
    import json

    interval = recommended.get("interval")
    if not interval:
        return []
    low, high = sorted(interval)
    tied: dict[str, dict[str, Any]] = {}
    for _, trial in ok.iterrows():
        params = json.loads(trial.params)
        theirs = json.loads(trial.manifest or "{}").get("interval")
        if params == recommended["params"] or not theirs:
            continue
        if min(theirs) <= high and low <= max(theirs):
            tied.setdefault(
                json.dumps(params, sort_keys=True), {"trial": int(trial.trial), "params": params}
            )
    return list(tied.values())


def ready_line(spec: dict[str, Any], run_id: str, params: dict[str, Any]) -> str:
    """The recommendation as something to paste: the compile-stage parameters as the flags they
    add to the family's tuned ones, the run-stage ones as the workload's arguments."""
    from fleet.space import TYPE
    from fleet.tune_spec import from_dict

    try:
        space = from_dict(spec, f"run {run_id}").space
    except UserError:  # its replay table moved, say: the parameters as they are
        return f"use: {params}"
    cflags, args = space.cflags(params), space.args(params)
    parts = []
    if cflags:
        parts.append(f'build with CFLAGS="<the family\'s tuned flags> {cflags}"')
    if args:
        parts.append(f'run with "{args}"')
    if TYPE in params:
        parts.append(f"on {params[TYPE]}")
    return "use: " + ("; ".join(parts) if parts else f"{params}")


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
    from fleet.search.record import is_rate

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


def _importance_plot(shares: dict[str, float], trials: int) -> dict[str, str]:
    """Each parameter's share of the loss's variance as a bar; below the trial count that
    supports it, the bars are pale and the title says they are a hint."""
    plt = pyplot()
    needed = IMPORTANCE_TRIALS_PER_PARAM * len(shares)
    supported = trials >= needed
    names = list(shares)[::-1]  # largest on top
    figure, axes = plt.subplots(figsize=(7, 0.5 + 0.4 * len(names)))
    axes.barh(names, [shares[n] for n in names], color="#1f77b4", alpha=1.0 if supported else 0.35)
    axes.set_xlim(0, 1)
    axes.set_xlabel("share of the loss's variance its value explains alone (epsilon squared)")
    title = f"Parameter importance ({trials} feasible trials)"
    if not supported:
        title += f": a hint, not a finding (about {needed} would support it)"
    return {title: png(figure)}


def _tune_plots(final: pd.DataFrame, ok: pd.DataFrame, spec: dict[str, Any]) -> dict[str, str]:
    import json

    plt = pyplot()
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
    plots["Convergence"] = png(figure)

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
        plots["Result by parameter (partial view)"] = png(figure)

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
        plots["Time vs cost (Pareto front)"] = png(figure)
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
    return render_page(f"fleet tune {run_id}", record["note"], intro, plots, tail)


def make_compare(rows: list[Comparison], text: str, out: Path) -> dict[str, Path]:
    """`fleet tune compare`'s page: the convergence of each algorithm (best so far over the
    table's optimum vs trials: the median over seeds, and the band the middle 80% of seeds lie
    in) with the printed table, and every seed's curve as CSV."""
    plt = pyplot()

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
    page.write_text(render_page("fleet tune compare", "", intro, {title: png(figure)}, []))
    return {"index.html": page, "convergence.csv": out / "convergence.csv"}
