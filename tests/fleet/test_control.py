"""`fleet kill` tells the truth about a run: it stops a live one and records it killed, but a
run that had already ended keeps its outcome (issue 27: kill relabelled a finished run)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from amibake.cloud import Cloud
from fleet import bench, control, spec

BENCH = 'types = ["c5a.large"]\ncommand = "echo {args}"\n'  # a type as data: nothing runs


def _spec(tmp_path: Path) -> dict[str, object]:
    (tmp_path / "bench.toml").write_text(BENCH)
    return spec.load(tmp_path / "bench.toml", {}).to_json()


@pytest.mark.parametrize("ended", ["finished", "failed", "stopped"])
def test_kill_after_a_run_ended_keeps_its_outcome(cloud: Cloud, tmp_path: Path, ended: str) -> None:
    results = bench.results_db(tmp_path / "results")
    results.create_run("fb-0000000001", "bench", _spec(tmp_path), "local", cloud.config.region)
    results.event("fb-0000000001", "controller", pid=os.getpid(), amibake_run="ab-000000000001")
    results.event("fb-0000000001", ended)
    outcome = control.kill(cloud, results, "fb-0000000001")
    assert outcome["state"] == ended and outcome["failures"] == []
    kinds = [k for _, k, _ in results.events("fb-0000000001")]
    assert kinds[-1] == "swept" and "killed" not in kinds, kinds


def test_kill_of_a_run_whose_controller_died_records_it_killed(
    cloud: Cloud, tmp_path: Path
) -> None:
    """A controller SIGKILLed mid-run never wrote its end: kill is what ended it."""
    results = bench.results_db(tmp_path / "results")
    results.create_run("fb-0000000002", "bench", _spec(tmp_path), "local", cloud.config.region)
    results.event("fb-0000000002", "controller", pid=2**22 + 7, amibake_run="ab-000000000002")
    outcome = control.kill(cloud, results, "fb-0000000002")
    assert outcome["state"] == "killed"
    assert [k for _, k, _ in results.events("fb-0000000002")][-1] == "killed"
