"""Issue 22's goals for `fleet tune`'s default search, each reported as figure and goal:

1. Noise: on the kernels suite's recorded runs (benchmarks/data/kernels_suite_runs.csv, 40 runs
   of each of 220 configurations), 22 evaluations with noisy replay, 30 seeds: the
   recommendation's true mean within 5% of the best in >= 27/30 seeds and within 2% at the
   median; its interval covers its true mean in >= 27/30.
2. Few runs: on cluster tables (family x size x nodes, benchmarks/cluster_tables.py: generated
   from a performance model written down there, with memory cliffs and failures; seven tables
   of four shapes, one laid out by total vCPUs as published tables are), 9 evaluations, 30
   seeds: median <= 1.05 of the optimum and worst tenth <= 1.15 on every table. Beside them, 72
   more tables drawn from the model's ranges over the four shapes, on which the searches are
   compared (a search of 9 steps follows nearly one path on a table).
3. The default at 9 evaluations beats random at 18 on both kinds of table.
4. Overhead per trial under 50 ms at 300 trials.
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from amibake.cloud import Cloud
from benchmarks import cluster_tables
from fleet import stats, tune
from fleet.noisy_replay import compare_noisy
from fleet.replay import ReplayEvaluator, compare, space_from_table
from fleet.search import engines
from fleet.space import parse
from fleet.tune_spec import TuneSpec

DATA = Path(__file__).resolve().parent / "data"
RUNS = DATA / "kernels_suite_runs.csv"
SEEDS = 30
GENERATED_SEEDS = 10
# 24 types x 16 node counts: 384 configurations, enough for 300 trials
TYPES = [
    f"{f}.{s}"
    for f in ("c6i", "c7a", "c7g", "m7i", "r7g", "m6i")
    for s in ("large", "xlarge", "2xlarge", "4xlarge")
]
KERNELS_SPACE = {
    "threads": {"kind": "categorical", "values": [1, 2]},
    "block": {"kind": "categorical", "values": [8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]},
    "size": {"kind": "categorical", "values": list(range(2, 12))},
}


def noise(default: str) -> dict[str, Any]:
    spec = TuneSpec(parse(KERNELS_SPACE, "kernels", "", []), objective="metric")
    runs = ((default, 22), (default, 9), ("random", 18), ("tpe", 22))
    scores = {  # each engine's own start for the budget (startup None), as fleet tune's
        (algo, budget): compare_noisy(RUNS, spec, [algo], SEEDS, budget, None)[0]
        for algo, budget in runs
    }
    main = scores[(default, 22)]
    median = float(np.median(main.ratios))
    return {
        "noise_within_5pct_seeds": main.within(0.05),
        "noise_within_2pct_seeds": main.within(0.02),
        "noise_median_ratio": round(median, 4),
        "noise_interval_covers_seeds": sum(main.covered),
        "noise_goal_met": main.within(0.05) >= 27 and median <= 1.02 and sum(main.covered) >= 27,
        "noise_tpe_22_median_ratio": round(float(np.median(scores[("tpe", 22)].ratios)), 4),
        "noise_default_9_median_ratio": round(float(np.median(scores[(default, 9)].ratios)), 4),
        "noise_random_18_median_ratio": round(float(np.median(scores[("random", 18)].ratios)), 4),
        "noise_default_9_beats_random_18": float(np.median(scores[(default, 9)].ratios))
        < float(np.median(scores[("random", 18)].ratios)),
    }


def _cluster_search(path: Path) -> tuple[tune.TuneSpec, ReplayEvaluator]:
    raw = space_from_table(path, "usd")
    raw["params"] = {k: v for k, v in raw["params"].items() if k in ("instance_type", "nodes")}
    spec = tune.from_dict(raw, str(path))
    return spec, ReplayEvaluator(path, spec)


def _median_p90(ratios: list[float]) -> tuple[float, float]:
    return float(np.median(ratios)), float(stats.quantile(ratios, 0.9))


def few_runs(default: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    met, beats = True, True
    with tempfile.TemporaryDirectory() as tmp:
        for path in cluster_tables.write(Path(tmp)):
            spec, evaluator = _cluster_search(path)
            ours = compare(spec, evaluator, [default], SEEDS, 9)[0]
            chance = compare(spec, evaluator, ["random"], SEEDS, 18)[0]
            name = path.stem.removeprefix("cluster_")
            median, p90 = _median_p90(ours.ratios)
            random_median = float(np.median(chance.ratios))
            out[f"cluster_{name}_median"] = round(median, 3)
            out[f"cluster_{name}_p90"] = round(p90, 3)
            out[f"cluster_{name}_random18_median"] = round(random_median, 3)
            for other in ("gp", "forest"):
                score = compare(spec, evaluator, [other], SEEDS, 9)[0]
                out[f"cluster_{name}_{other}9_median_p90"] = [
                    round(v, 3) for v in _median_p90(score.ratios)
                ]
            met &= median <= 1.05 and p90 <= 1.15
            beats &= median < random_median
    out["few_runs_goal_met"] = met
    out["cluster_default_9_beats_random_18"] = beats
    return out


def generated(default: str) -> dict[str, Any]:
    """Goal 2 on GENERATED tables drawn from the same model's ranges (3 x 24, 10 seeds each): on
    how many each search meets it, its mean median and mean worst tenth, and random at 18 beside
    them. The seven tables above are seven paths; a choice between searches is made here."""
    algorithms = (default, "gp", "forest", "random@18")  # auto is the blend on these
    scores: dict[str, list[tuple[float, float]]] = {a: [] for a in algorithms}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in (1, 2, 3):
            for path in cluster_tables.write(
                Path(tmp) / str(seed), cluster_tables.generated(24, seed)
            ):
                spec, evaluator = _cluster_search(path)
                for entry in algorithms:
                    algorithm, _, budget = entry.partition("@")
                    score = compare(
                        spec, evaluator, [algorithm], GENERATED_SEEDS, int(budget or 9)
                    )[0]
                    scores[entry].append(_median_p90(score.ratios))
    out: dict[str, Any] = {"generated_tables": len(scores[default])}
    for entry, rows in scores.items():
        table = np.array(rows)
        label = entry.replace("@", "")
        out[f"generated_{label}_goal_met_tables"] = int(
            np.sum((table[:, 0] <= 1.05) & (table[:, 1] <= 1.15))
        )
        out[f"generated_{label}_mean_median_p90"] = [
            round(float(table[:, 0].mean()), 3),
            round(float(table[:, 1].mean()), 3),
        ]
    ours, chance = np.array(scores[default]), np.array(scores["random@18"])
    out["generated_default_9_beats_random_18_tables"] = int(np.sum(ours[:, 0] < chance[:, 0]))
    out.update(more_tables(default))
    return out


def more_tables(default: str) -> dict[str, Any]:
    """Goal 2 for the default on 144 tables from table seeds 4-9. Table seeds 1-3 (above) are
    where most of the search's constants were chosen (fleet/search/model.py); 4-9 entered only
    a few of those choices (TYPED_CENTRE, LOCAL_EVERY, KIND_LENGTH, CURVE_FROM), so how far the
    choices carry to tables they were less fitted to, as a public table's must, shows here. On
    2026-12-04, 106 of 144 met it against 59 of table seeds 1-3's 72; with runs short of memory
    doubted (fleet/search/model.py, DOUBTFUL_NOISE), 113 against 61."""
    met = tables = 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(4, 10):
            for path in cluster_tables.write(
                Path(tmp) / str(seed), cluster_tables.generated(24, seed)
            ):
                spec, evaluator = _cluster_search(path)
                score = compare(spec, evaluator, [default], GENERATED_SEEDS, 9)[0]
                median, p90 = _median_p90(score.ratios)
                met += median <= 1.05 and p90 <= 1.15
                tables += 1
    return {"more_generated_tables": tables, "more_generated_goal_met_tables": met}


def published(default: str) -> dict[str, Any]:
    """Goal 2 on the same tables as a public dataset would give them
    (cluster_tables.published: the columns under names of their own, families the price
    catalog lacks), searched as `fleet tune compare --replay T.csv --objective-column cost`
    reads them: the seven, and the generated ones (on how many the goal is met). Twice: with
    the table's price column (`hourly`, which the search reads as each run's price), and
    without it (`unpriced`: the prices estimated from the types' names)."""
    out: dict[str, Any] = {}
    for priced in (True, False):
        label = "published" if priced else "published_unpriced"
        met = 0
        with tempfile.TemporaryDirectory() as tmp:
            named = cluster_tables.write(Path(tmp) / "named", as_published=True, priced=priced)
            many = [
                path
                for seed in (1, 2, 3)
                for path in cluster_tables.write(
                    Path(tmp) / str(seed),
                    cluster_tables.generated(24, seed),
                    as_published=True,
                    priced=priced,
                )
            ]
            for path in [*named, *many]:
                raw = space_from_table(path, "cost")
                assert raw.get("price_column") == ("hourly" if priced else None), raw
                spec = tune.from_dict(raw, str(path))
                assert sorted(spec.space.params) == ["instance_type", "workers"], spec.space.params
                evaluator = ReplayEvaluator(path, spec)
                seeds = SEEDS if path in named else GENERATED_SEEDS
                median, p90 = _median_p90(compare(spec, evaluator, [default], seeds, 9)[0].ratios)
                if path in named:
                    name = path.stem.removeprefix("cluster_")
                    out[f"{label}_{name}_median_p90"] = [round(median, 3), round(p90, 3)]
                else:
                    met += median <= 1.05 and p90 <= 1.15
        out[f"{label}_generated_goal_met_tables"] = met
        out[f"{label}_generated_tables"] = len(many)
    return out


def _per_trial_ms(algorithm: str, space: Any, loss: Any) -> float:
    engine = engines.make(algorithm, space, 0, 20, 300)
    wobble = random.Random(0)
    started = time.perf_counter()
    for _ in range(300):
        asked = engine.ask()
        assert asked is not None
        trial, params = asked
        engine.tell(trial, loss(params) + wobble.random() * 0.1)
    return round((time.perf_counter() - started) / 300 * 1000, 1)


def overhead(default: str) -> dict[str, Any]:
    """Per trial at 300 trials, on a numeric space (the default searches it with the Gaussian
    process) and on instance types x nodes (with the blend)."""
    numeric = parse({**KERNELS_SPACE, "x": {"kind": "uniform", "low": 0, "high": 1}}, "o", "", [])
    typed = parse(
        {
            "instance_type": {"kind": "categorical", "values": TYPES},
            "nodes": {"kind": "categorical", "values": list(range(1, 17))},
        },
        "o", "", [],
    )  # fmt: skip
    out: dict[str, Any] = {}
    for algorithm in (default, "tpe"):
        out[f"overhead_{algorithm}_ms_per_trial"] = _per_trial_ms(
            algorithm, numeric, lambda p: -p["threads"] * p["x"]
        )
    out[f"overhead_{default}_typed_ms_per_trial"] = _per_trial_ms(
        default, typed, lambda p: p["nodes"] * (1 + len(p["instance_type"]))
    )
    out["overhead_goal_met"] = (
        out[f"overhead_{default}_ms_per_trial"] < 50
        and out[f"overhead_{default}_typed_ms_per_trial"] < 50
    )
    return out


def run(_: Cloud) -> dict[str, Any]:
    default = engines.DEFAULT
    figures: dict[str, Any] = {"default_algorithm": default, "seeds": SEEDS}
    figures.update(noise(default))
    figures.update(few_runs(default))
    figures.update(generated(default))
    figures.update(published(default))
    figures.update(overhead(default))
    figures["default_9_beats_random_18_goal_met"] = bool(
        figures["noise_default_9_beats_random_18"] and figures["cluster_default_9_beats_random_18"]
    )
    return figures
