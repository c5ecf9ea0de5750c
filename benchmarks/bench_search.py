"""Issue 22's goals for `fleet tune`'s default search, each reported as figure and goal:

1. Noise: on the kernels suite's recorded runs (benchmarks/data/kernels_suite_runs.csv, 40 runs
   of each of 220 configurations), 22 evaluations with noisy replay, 30 seeds: the
   recommendation's true mean within 5% of the best in >= 27/30 seeds and within 2% at the
   median; its interval covers its true mean in >= 27/30.
2. Few runs: on cluster tables (family x size x nodes, benchmarks/cluster_tables.py: generated
   from a performance model written down there, with memory cliffs and failures; six tables of
   three shapes), 9
   evaluations, 30 seeds: median <= 1.05 of the optimum and worst tenth <= 1.15 on every table.
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
from fleet import tune
from fleet.noisy_replay import compare_noisy
from fleet.replay import ReplayEvaluator, compare, space_from_table
from fleet.search import engines
from fleet.space import parse

DATA = Path(__file__).resolve().parent / "data"
RUNS = DATA / "kernels_suite_runs.csv"
SEEDS = 30
KERNELS_SPACE = {
    "threads": {"kind": "categorical", "values": [1, 2]},
    "block": {"kind": "categorical", "values": [8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256]},
    "size": {"kind": "categorical", "values": list(range(2, 12))},
}


def noise(default: str) -> dict[str, Any]:
    space = parse(KERNELS_SPACE, "kernels", "", [])
    scores = {
        (algorithm, budget): compare_noisy(RUNS, space, "metric", [algorithm], SEEDS, budget, 5)[0]
        for algorithm, budget in ((default, 22), (default, 9), ("random", 18), ("tpe", 22))
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


def few_runs(default: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    met, beats = True, True
    with tempfile.TemporaryDirectory() as tmp:
        for path in cluster_tables.write(Path(tmp)):
            raw = space_from_table(path, "usd")
            raw["params"] = {
                k: v for k, v in raw["params"].items() if k in ("instance_type", "nodes")
            }
            spec = tune.from_dict(raw, str(path))
            evaluator = ReplayEvaluator(path, spec)
            ours = compare(spec, evaluator, [default], SEEDS, 9)[0]
            chance = compare(spec, evaluator, ["random"], SEEDS, 18)[0]
            # the forest beside it: better on these deterministic tables, worse under noise
            forest = (
                compare(spec, evaluator, ["forest"], SEEDS, 9)[0] if default != "forest" else ours
            )
            name = path.stem.removeprefix("cluster_")
            median, p90 = float(np.median(ours.ratios)), float(np.quantile(ours.ratios, 0.9))
            random_median = float(np.median(chance.ratios))
            out[f"cluster_{name}_median"] = round(median, 3)
            out[f"cluster_{name}_p90"] = round(p90, 3)
            out[f"cluster_{name}_random18_median"] = round(random_median, 3)
            out[f"cluster_{name}_forest9_median_p90"] = [
                round(float(np.median(forest.ratios)), 3),
                round(float(np.quantile(forest.ratios, 0.9)), 3),
            ]
            met &= median <= 1.05 and p90 <= 1.15
            beats &= median < random_median
    out["few_runs_goal_met"] = met
    out["cluster_default_9_beats_random_18"] = beats
    return out


def overhead(default: str) -> dict[str, Any]:
    space = parse({**KERNELS_SPACE, "x": {"kind": "uniform", "low": 0, "high": 1}}, "o", "", [])
    out: dict[str, Any] = {}
    for algorithm in (default, "tpe"):
        engine = engines.make(algorithm, space, 0, 20, 300)
        wobble = random.Random(0)
        started = time.perf_counter()
        for _ in range(300):
            asked = engine.ask()
            assert asked is not None
            trial, params = asked
            engine.tell(trial, -params["threads"] * params["x"] + wobble.random() * 0.1)
        out[f"overhead_{algorithm}_ms_per_trial"] = round(
            (time.perf_counter() - started) / 300 * 1000, 1
        )
    out["overhead_goal_met"] = out[f"overhead_{default}_ms_per_trial"] < 50
    return out


def run(_: Cloud) -> dict[str, Any]:
    default = engines.DEFAULT
    figures: dict[str, Any] = {"default_algorithm": default, "seeds": SEEDS}
    figures.update(noise(default))
    figures.update(few_runs(default))
    figures.update(overhead(default))
    figures["default_9_beats_random_18_goal_met"] = bool(
        figures["noise_default_9_beats_random_18"] and figures["cluster_default_9_beats_random_18"]
    )
    return figures
