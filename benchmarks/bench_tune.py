"""Issue 6's search figures, on a real table: the kernels' matmul run-time space (threads x
block x size, 220 configurations) measured exhaustively once on this machine and saved, then
`fleet tune compare` over 30 seeds; and the search's own overhead per trial at 300 trials.

Goals: TPE within 2% of the optimum using at most 10% of the grid's evaluations in at least 80%
of seeds; TPE at 30 trials at least as good as random at 60; under 50 ms a trial at 300 trials.
"""

from __future__ import annotations

import csv
import itertools
import json
import random
import re
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from amibake import recipes
from amibake.cloud import Cloud
from fleet import tune
from fleet.results import Results

TABLE = Path("results/bench/kernels_matmul_space.csv")  # delete it to measure again
NOISE = TABLE.with_suffix(".noise.json")
THREADS = (1, 2)
BLOCKS = (8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256)
SIZES = tuple(range(2, 12))
SEEDS = 30
ROUNDS = 3


def _measure_space(tmp: Path) -> None:
    source = recipes.load("kernels").source_path
    assert source is not None
    binary = tmp / "kernels"
    subprocess.run(
        ["gcc", "-O3", "-march=native", "-ffp-contract=off", "-fopenmp", "-o", str(binary),
         str(source / "kernels.c"), "-lm"],
        check=True,
    )  # fmt: skip
    configs = list(itertools.product(THREADS, BLOCKS, SIZES))
    rates: dict[tuple[int, int, int], list[float]] = {c: [] for c in configs}
    shuffle = random.Random(0).shuffle
    # Rounds over every configuration, each in a new order: this machine's speed drifted +-9%
    # between minutes (15 rounds measured), and measured in grid order, a slow minute would
    # have marked a whole run of neighbouring configurations slow.
    for _ in range(ROUNDS):
        order = configs[:]
        shuffle(order)
        for threads, block, size in order:
            out = subprocess.run(
                [str(binary), "--only", "matmul", "--threads", str(threads), "--block",
                 str(block), "--size", str(size)],
                check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
            rate = re.search(r"throughput=([0-9.]+)", out)
            assert rate is not None, out
            rates[(threads, block, size)].append(float(rate.group(1)))
    TABLE.parent.mkdir(parents=True, exist_ok=True)
    partial = TABLE.with_suffix(".part")
    with partial.open("w", newline="") as handle:
        writer = csv.writer(handle)
        # metric: negated GFLOP/s, so that lower is better as fleet tune minimises.
        writer.writerow(["threads", "block", "size", "metric"])
        for config in configs:
            writer.writerow([*config, -float(np.median(rates[config]))])
    # How far one run strays from its configuration's mean, for the report to set beside the
    # goal's 2%: the table's optimum is only as sharp as this.
    cv = float(np.median([np.std(r) / np.mean(r) for r in rates.values()]))
    NOISE.write_text(json.dumps({"rounds": ROUNDS, "per_run_cv_median": round(cv, 4)}))
    partial.replace(TABLE)


def run(cloud: Cloud) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        measured_now = not TABLE.exists()
        if measured_now:
            _measure_space(Path(tmp))
        spec = tune.from_dict(tune.space_from_table(TABLE, "metric"), str(TABLE))
        spec.startup_trials = 5
        evaluator = tune.ReplayEvaluator(TABLE, spec)
        grid = spec.space.size()
        tenth = max(1, grid // 10)
        small = tune.compare(spec, evaluator, ["tpe", "random"], SEEDS, 60)
        tpe, rand = small
        tpe_tenth = tune.compare(spec, evaluator, ["tpe"], SEEDS, tenth)[0]
        within = sum(1 for t in tpe_tenth.to_2pct if t is not None)
        near = evaluator.near_optimum(0.02)
        tpe30 = tune.compare(spec, evaluator, ["tpe"], SEEDS, 30)[0]
        # Overhead: a 300-trial TPE search through the database, the evaluation a lookup.
        results = Results(Path(tmp) / "fleet.sqlite")
        spec.trials = 300
        run_id = tune.start(results, spec, "local", "us-east-1")
        started = time.perf_counter()
        tune.search(spec, evaluator, results, run_id)
        per_trial = (time.perf_counter() - started) / 300
    return {
        "table": str(TABLE),
        "table_measured_in_this_run": measured_now,
        "configurations": grid,
        "seeds": SEEDS,
        "tpe_budget_10pct_of_grid": tenth,
        "tpe_within_2pct_at_10pct_seeds": f"{within}/{SEEDS}",
        "tpe_within_2pct_goal_met": within >= 0.8 * SEEDS,
        # The target's size: a table with few configurations near its optimum is a needle.
        "configurations_within_2pct": near,
        # One run's spread around its configuration's mean (median over configurations).
        "table_per_run_cv_median": (
            json.loads(NOISE.read_text())["per_run_cv_median"] if NOISE.exists() else None
        ),
        "blind_draw_chance_within_2pct_at_10pct": round(tune.blind_chance(grid, near, tenth), 3),
        "tpe_at_30_median_best_over_optimum": round(float(np.median(tpe30.ratios)), 4),
        "random_at_60_median_best_over_optimum": round(float(np.median(rand.ratios)), 4),
        "tpe_30_vs_random_60_goal_met": float(np.median(tpe30.ratios))
        <= float(np.median(rand.ratios)),
        "tpe_at_60_median_best_over_optimum": round(float(np.median(tpe.ratios)), 4),
        "overhead_ms_per_trial_at_300": round(per_trial * 1000, 2),
        "overhead_goal_ms": 50,
        "overhead_goal_met": per_trial < 0.05,
    }
