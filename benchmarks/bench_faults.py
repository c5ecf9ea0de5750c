"""Issue 26's figure: what the local cloud's AWS behaviours (--faults aws) cost a run, against
moto as it is (--faults none): a build and a bake of the trivial recipe, alternating between the
two clouds, side by side in one run. Goal: at most 2x at the shortened local delays."""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from amibake import config, pipelines
from amibake.cloud import Cloud
from amibake.connect import connect
from amibake.local import control
from benchmarks import host_family

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "recipes"
ROUNDS = 3
SEED = 3
GOAL = 2.0


def _cloud(directory: Path, port: int, subnet: str, faults: str) -> Cloud:
    cfg = config.load(
        {
            "cloud": "local",
            "local_dir": str(directory / "cloud"),
            "local_port": port,
            "local_subnet": subnet,
            "local_faults": faults,
            "local_faults_seed": SEED,
            "results_dir": str(directory / "results"),
        },
        environ={},
    )
    return connect(cfg)


def _round(cloud: Cloud) -> float:
    """A fresh build and a bake of it: seconds."""
    for stale in (cloud.config.results_dir / "artifacts").glob("trivial_*"):
        stale.unlink()
    started = time.perf_counter()
    family = host_family()
    built = pipelines.build(
        cloud, pipelines.BuildRequest([family], "trivial", "large", recipes_dir=FIXTURES)
    )[0]
    assert built.ok, built.error
    baked = pipelines.bake(cloud, pipelines.BakeRequest(families=[family]))[0]
    assert baked.ok, baked.error
    return time.perf_counter() - started


def run(_: Cloud) -> dict[str, Any]:
    times: dict[str, list[float]] = {"none": [], "aws": []}
    with tempfile.TemporaryDirectory(prefix="amibake-bench-faults-") as tmp:
        clouds = {
            "none": _cloud(Path(tmp) / "none", 5181, "127.81.0.0/16", "none"),
            "aws": _cloud(Path(tmp) / "aws", 5182, "127.82.0.0/16", "aws"),
        }
        try:
            for _ in range(ROUNDS):  # alternating: the machine's drift hits both alike
                for name, cloud in clouds.items():
                    times[name].append(_round(cloud))
        finally:
            for cloud in clouds.values():
                control.down(cloud.config)
    ratio = statistics.median(times["aws"]) / statistics.median(times["none"])
    return {
        "build_and_bake_none_median_s": round(statistics.median(times["none"]), 2),
        "build_and_bake_aws_median_s": round(statistics.median(times["aws"]), 2),
        "aws_over_none_ratio": round(ratio, 2),
        # The behaviours' delays are mostly fixed per run (an image pending, a NotFound window):
        # on this trivial round they dominate, on the demo's real builds much less.
        "aws_minus_none_s": round(
            statistics.median(times["aws"]) - statistics.median(times["none"]), 2
        ),
        "rounds": ROUNDS,
        "seed": SEED,
        "goal_ratio": GOAL,
        "goal_met": ratio <= GOAL,
    }
