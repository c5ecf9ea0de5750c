"""Run every benchmark, print a table, and write results/bench/<name>.json.

Each benchmark module has ``run(cloud) -> dict`` returning its figures, with a ``goal`` and a
``met`` entry where the issue sets a goal. Nothing here fails a build: figures are reported. A
benchmark that fails is reported as failed with its reason, and the others still run (the exit
status is then 1).
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import tempfile
import traceback
from pathlib import Path

from amibake import config, runner
from amibake.connect import connect
from amibake.local import control

MODULES = [
    "benchmarks.bench_local_cloud",
    "benchmarks.bench_build",
    "benchmarks.bench_bake",
    "benchmarks.bench_faults",
    "benchmarks.bench_monitor",
    "benchmarks.bench_report",
    "benchmarks.bench_tune",
    "benchmarks.bench_search",
    "benchmarks.bench_tuned",
    "benchmarks.bench_rootless",
]


def main(argv: list[str]) -> int:
    names = {m.rsplit(".", 1)[1] for m in MODULES}
    # A full name picks that benchmark alone (bench_tune, not bench_tuned); a part picks all
    # that contain it.
    selected = [
        m
        for m in MODULES
        if not argv or any(a == m.rsplit(".", 1)[1] or (a not in names and a in m) for a in argv)
    ]
    out = Path("results/bench")
    out.mkdir(parents=True, exist_ok=True)
    # `kill` unwinds it as Ctrl-C does: its local cloud goes down with it (a SIGTERM left the
    # daemon holding port 5180, and the next `make bench` could not start).
    with (
        runner.terminate_as_interrupt(),
        tempfile.TemporaryDirectory(prefix="amibake-bench-") as tmp,
    ):
        # A local cloud of its own, so a developer's running one is neither used nor disturbed.
        os.environ.update(
            AMIBAKE_CLOUD="local",
            AMIBAKE_LOCAL_DIR=tmp,
            AMIBAKE_LOCAL_PORT="5180",
            AMIBAKE_LOCAL_SUBNET="127.80.0.0/16",
            AMIBAKE_RESULTS_DIR=str(Path(tmp) / "results"),
        )
        cfg = config.load()
        failed = []
        try:
            cloud = connect(cfg)
            for name in selected:
                short = name.rsplit(".", 1)[1]
                try:
                    figures = importlib.import_module(name).run(cloud)
                except Exception as exc:  # one benchmark's failure is its own, not the run's
                    reason = f"{type(exc).__name__}: {exc}"
                    traceback.print_exc()
                    figures = {"failed": reason}
                    failed.append(f"{short} ({reason})")
                (out / f"{short}.json").write_text(json.dumps(figures, indent=2))
                print(f"== {short}")
                for key, value in figures.items():
                    print(f"  {key}: {value}")
        finally:
            control.down(cfg)
    if failed:
        print(f"failed: {'; '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except KeyboardInterrupt:  # Ctrl-C or kill: its local cloud is down already
        print("benchmarks: interrupted", file=sys.stderr)
        sys.exit(130)
