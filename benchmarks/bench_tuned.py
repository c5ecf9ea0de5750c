"""Issue 6's payoff figure: the best kernels configuration `fleet tune` finds in 40 trials on the
local cloud, against the best of -O2, -O3 and -O3 -march=native, measured side by side here
(alternating, several rounds). Goal: at least 1.10x geometric mean, identical checksums."""

from __future__ import annotations

import json
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from amibake import recipes
from amibake.archive import unpack
from amibake.cloud import Cloud
from benchmarks import host_family
from fleet import bench, evaluators, tune
from fleet.trial import CloudEvaluator

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "kernels.tune.toml"
TRIALS = 40
ROUNDS = 7
STANDARDS = {"-O2": "-O2", "-O3": "-O3", "-O3 -march=native": "-O3 -march=native"}
BASE = "-ffp-contract=off -fopenmp"  # what every kernels build gets (the recipe's base flags)
LINE = re.compile(r"kernel=(\w+) checksum=(\S+) seconds=\S+ throughput=([0-9.]+)")


def _run(binary: Path, args: str) -> dict[str, tuple[str, float]]:
    out = subprocess.run(
        [str(binary), *args.split()], check=True, capture_output=True, text=True
    ).stdout
    return {name: (checksum, float(rate)) for name, checksum, rate in LINE.findall(out)}


def _geomean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(values))))


def run(cloud: Cloud) -> dict[str, Any]:
    cfg = cloud.config
    # One trial at a time: two in flight on this 2-core machine contend for the cores, and the
    # search then learns that threads do not help (measured: it picked --threads 1 and lost
    # 0.79x to -O3 -march=native run uncontended).
    # On this machine's own family (asked at run time): -march=native is this CPU's best, so
    # the search's flags must be tuned for it too.
    types = [f"{host_family()}.large"]
    spec = tune.load(EXAMPLE, {"trials": TRIALS, "parallel": 1, "types": types})
    results = bench.results_db(cfg.results_dir)
    run_id = tune.start(results, spec, cfg.cloud, cfg.region)
    evaluator = evaluators.evaluator(spec, cfg)
    assert isinstance(evaluator, CloudEvaluator)
    outcome = tune.search(spec, evaluator, results, run_id)
    assert outcome.best is not None, "no feasible trial"
    params = outcome.best["params"]
    cflags = spec.space.cflags(params)
    args = spec.space.args(params)
    trials = results.trials(run_id)
    row = trials[(trials.trial == outcome.best["trial"]) & (trials.state == "ok")].iloc[0]
    manifest = json.loads(row.manifest)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        sidecar = next(
            p
            for p in (cfg.results_dir / "artifacts").rglob("*.manifest.json")
            if json.loads(p.read_text()).get("artifact_sha256") == manifest.get("artifact_sha256")
        )
        artifact = sidecar.with_name(sidecar.name.replace(".manifest.json", ".tar.xz"))
        with tarfile.open(artifact) as archive:
            unpack(archive, folder / "tuned")
        binaries = {"tuned": folder / "tuned" / "bin" / "kernels"}
        source = recipes.load("kernels").source_path
        assert source is not None
        for name, flags in STANDARDS.items():
            binary = folder / name.replace(" ", "_")
            subprocess.run(
                ["gcc", *BASE.split(), *flags.split(), "-o", str(binary),
                 str(source / "kernels.c"), "-lm"],
                check=True,
            )  # fmt: skip
            binaries[name] = binary
        rates: dict[str, dict[str, list[float]]] = {n: {} for n in binaries}
        checksums: dict[str, dict[str, str]] = {}
        for _ in range(ROUNDS):  # alternate, so drift on the machine hits every build alike
            for name, binary in binaries.items():
                measured = _run(binary, args if name == "tuned" else "")
                for kernel, (checksum, rate) in measured.items():
                    rates[name].setdefault(kernel, []).append(rate)
                    checksums.setdefault(name, {})[kernel] = checksum
    medians = {n: {k: float(np.median(v)) for k, v in r.items()} for n, r in rates.items()}
    scores = {n: _geomean(list(m.values())) for n, m in medians.items()}
    best_standard = max(STANDARDS, key=lambda n: scores[n])
    kernels = sorted(medians["tuned"])
    speedup = _geomean([medians["tuned"][k] / medians[best_standard][k] for k in kernels])
    identical = all(checksums[n] == checksums["tuned"] for n in STANDARDS)
    return {
        "tune_run": run_id,
        "trials": TRIALS,
        "best_cflags": cflags,
        "best_args": args,
        "best_standard": best_standard,
        "per_kernel_ratio": {
            k: round(medians["tuned"][k] / medians[best_standard][k], 3) for k in kernels
        },
        "speedup_geomean": round(speedup, 3),
        "goal": 1.10,
        "checksums_identical": identical,
        "goal_met": speedup >= 1.10 and identical,
        "rounds": ROUNDS,
    }
