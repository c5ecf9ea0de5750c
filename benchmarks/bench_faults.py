"""Issue 26's figure: what the local cloud's AWS behaviours (--faults aws) cost the demo, against
moto as it is (--faults none): `make demo` itself (builds of three families, two bakes with
their boot tests, Batch up and down, a tune, a bench, reports), run alternately under each, side
by side in one run. Goal: at most 2x at the shortened local delays.

Each demo gets a local cloud and a results directory of its own (so every build is really made,
and a developer's running local cloud is neither used nor disturbed); its output goes to
results/bench/faults-<mode>-<round>.log.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from amibake.cloud import Cloud

ROOT = Path(__file__).resolve().parent.parent
ROUNDS = 2
SEED = 3
GOAL = 2.0
PORTS = {"none": (5181, "127.81.0.0/16"), "aws": (5182, "127.82.0.0/16")}


def _demo(mode: str, directory: Path, log: Path) -> float:
    """One `make demo` under `mode`: seconds, or an error naming its log."""
    port, subnet = PORTS[mode]
    env = {
        **os.environ,
        "AMIBAKE_CLOUD": "local",
        "AMIBAKE_LOCAL_DIR": str(directory / "cloud"),
        "AMIBAKE_LOCAL_PORT": str(port),
        "AMIBAKE_LOCAL_SUBNET": subnet,
        "AMIBAKE_RESULTS_DIR": str(directory / "results"),
        "AMIBAKE_LOCAL_FAULTS": mode,
        "AMIBAKE_LOCAL_FAULTS_SEED": str(SEED),
    }
    started = time.perf_counter()
    with log.open("w") as out:
        done = subprocess.run(
            ["make", "-s", "demo"], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
        )
    if done.returncode != 0:
        raise RuntimeError(f"make demo under --faults {mode} exited {done.returncode}: see {log}")
    return time.perf_counter() - started


def run(_: Cloud) -> dict[str, Any]:
    times: dict[str, list[float]] = {"none": [], "aws": []}
    logs = ROOT / "results" / "bench"
    logs.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="amibake-bench-faults-") as tmp:
        for index in range(ROUNDS):  # alternating: the machine's drift hits both alike
            for mode in times:
                directory = Path(tmp) / f"{mode}-{index}"
                times[mode].append(_demo(mode, directory, logs / f"faults-{mode}-{index}.log"))
    ratio = statistics.median(times["aws"]) / statistics.median(times["none"])
    return {
        "demo_none_median_s": round(statistics.median(times["none"]), 1),
        "demo_aws_median_s": round(statistics.median(times["aws"]), 1),
        "demo_none_s": [round(t, 1) for t in times["none"]],
        "demo_aws_s": [round(t, 1) for t in times["aws"]],
        "aws_over_none_ratio": round(ratio, 2),
        "rounds": ROUNDS,
        "seed": SEED,
        "goal_ratio": GOAL,
        "goal_met": ratio <= GOAL,
    }
