"""A replay tune builds nothing: instance types outside the build catalog (a GPU type, an old
one) are values of params.instance_type like any other, read as features by their names."""

from __future__ import annotations

from pathlib import Path

import pytest

from fleet.cli import main
from fleet.results import Results

TABLE = """instance_type,threads,metric
c7a.large,1,10.0
c7a.large,2,6.0
g4dn.xlarge,1,4.0
g4dn.xlarge,2,3.0
m4.large,1,12.0
m4.large,2,8.0
"""


@pytest.mark.parametrize("algorithm", ["grid", "gp", "tpe"])
def test_a_replay_tune_spans_types_outside_the_build_catalog(
    algorithm: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    (tmp_path / "space.csv").write_text(TABLE)
    tune_file = tmp_path / "t.toml"
    tune_file.write_text(
        f'replay = "space.csv"\nobjective = "runtime"\ntrials = 6\nalgorithm = "{algorithm}"\n'
        '[params.instance_type]\nkind = "categorical"\n'
        'values = ["c7a.large", "g4dn.xlarge", "m4.large"]\n'
        '[params.threads]\nkind = "int"\nlow = 1\nhigh = 2\nstage = "run"\n'
    )
    assert main(["tune", str(tune_file)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "'instance_type': 'g4dn.xlarge', 'threads': 2" in out, out
    results = Results(tmp_path / "results" / "fleet.sqlite")
    (run_id,) = results.run_ids()
    assert results.trials(run_id).trial.nunique() == 6
