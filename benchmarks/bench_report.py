"""Issue 5's report figure: `fleet report` (tables, plots, CSV, HTML) on 10,000 and 100,000
replicate rows, and how its time grows between them. Goal: under 10 s at 100,000 rows."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from amibake.cloud import Cloud
from fleet import report, spec
from fleet.results import ReplicateRow, Results

TYPES = [
    f"{family}.{size}"
    for family in ("c5a", "c6a", "c7a", "c6i", "c7i")
    for size in ("large", "xlarge", "2xlarge", "4xlarge")
]
BUILDS = ("tuned", "generic")
GOAL_S = 10.0


def _fill(results: Results, run_id: str, rows: int) -> None:
    bench_spec = spec.load(
        None, {"types": TYPES, "command": "work {args}", "builds": None, "warmups": 0}
    )
    results.create_run(run_id, "bench", bench_spec.to_json(), "local", "us-east-1")
    rng = np.random.default_rng(1)
    per_group = rows // (len(TYPES) * len(BUILDS))
    records = []
    for t, instance_type in enumerate(TYPES):
        for b, build in enumerate(BUILDS):
            values = rng.normal(10 + t + 3 * b, 0.4, per_group)
            records += [
                ReplicateRow(
                    instance_type,
                    build,
                    i,
                    False,
                    "ok",
                    float(v),
                    float(v),
                    0,
                    market="spot",
                    zone="use1-az1",
                    price_usd_hour=0.1 + t / 10,
                )
                for i, v in enumerate(values)
            ]
    results.record_many(run_id, records)


def _time(rows: int, tmp: Path) -> float:
    results = Results(tmp / f"fleet-{rows}.sqlite")
    run_id = f"fb-bench{rows}"
    _fill(results, run_id, rows)
    started = time.perf_counter()
    made = report.make(results, run_id, tmp / "reports")
    elapsed = time.perf_counter() - started
    assert len(made.summary) == len(TYPES) * len(BUILDS)
    results.close()
    return elapsed


def run(cloud: Cloud) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        small = _time(10_000, Path(tmp))
        large = _time(100_000, Path(tmp))
    return {
        "rows_10k_s": round(small, 3),
        "rows_100k_s": round(large, 3),
        "growth_10k_to_100k": round(large / small, 2),
        "groups": len(TYPES) * len(BUILDS),
        "goal_s": GOAL_S,
        "goal_met": large < GOAL_S,
    }
