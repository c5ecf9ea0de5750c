"""`fleet tune` with an image (issue 23): run-time parameters only (nothing is compiled), the
instance type a parameter across x86_64 and Graviton, on the local cloud with the tests' pushed
two-architecture image. A compile-stage parameter, a gain to measure, or run parameters with no
{args} to take them are refused in one line, exit 2, nothing recorded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amibake.cloud import Cloud
from fleet.cli import main
from fleet.results import Results
from tests.container import image as test_image


@pytest.fixture(scope="module")
def image(cloud: Cloud, tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(test_image.push_to_ecr(cloud, tmp_path_factory.mktemp("image"), "tune/work"))


def tune_file(image: str, extra: str = "") -> str:
    return f"""image = "{image}"
command = "work {{args}}"
objective = "metric"
algorithm = "grid"
trials = 4
replicates = 1
{extra}
[metric]
kind = "file"
meaning = "rate"
unit = "iterations/s"

[params.instance_type]
kind = "categorical"
values = ["c5a.large", "c7g.large"]

[params.n]
kind = "categorical"
values = [200000, 400000]
stage = "run"
"""


@pytest.mark.e2e
def test_an_image_is_tuned_over_run_parameters_and_the_instance_type(
    cloud: Cloud,
    image: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    path = tmp_path / "tune.toml"
    path.write_text(tune_file(image))
    assert main(["tune", str(path), "--json", "--yes"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["trials"] == 4 and out["gain"] is None and out["bake"] is None
    chosen = out["recommended"]["params"]
    assert chosen["instance_type"] in ("c5a.large", "c7g.large") and chosen["n"] in (200000, 400000)
    results = Results(tmp_path / "results" / "fleet.sqlite")
    rows = results.replicates(out["run_id"])
    # Under --faults aws a spot reclaim records a replicate interrupted and runs it again.
    assert set(rows.state) <= {"ok", "interrupted"}
    ok = rows[rows.state == "ok"]
    assert len(ok) == 4 and set(ok.instance_type) == {"c5a.large", "c7g.large"}
    facts = results.environments(out["run_id"])
    assert {f["image"]["platform"] for f in facts} == {"linux/amd64", "linux/arm64"}
    # One image for the whole search, as its first trial's tag named it (a resume pulls it too).
    pinned = {d["digest"] for _, kind, d in results.events(out["run_id"]) if kind == "image"}
    assert {f["image"]["digest"] for f in facts} == pinned and len(pinned) == 1, (facts, pinned)
    # Nothing was built: no artifact, no build instance.
    assert not list((tmp_path / "results").glob("**/*.tar.xz"))


@pytest.mark.parametrize(
    ("change", "said"),
    [
        ('[params.opt]\nkind = "categorical"\nvalues = ["-O2", "-O3"]\nstage = "compile"\n',
         "an image has nothing to compile"),
        ("gain_replicates = 3\n", "an image has none"),
    ],
)  # fmt: skip
def test_what_an_image_cannot_tune_is_refused_in_one_line(
    change: str,
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    reference = "123456789012.dkr.ecr.us-east-1.amazonaws.com/tune/work:v1"
    text = tune_file(reference)
    text = text.replace("replicates = 1\n", "replicates = 1\n" + change, 1)
    path = tmp_path / "tune.toml"
    path.write_text(text)
    assert main(["tune", str(path), "--yes"]) == 2
    err = capsys.readouterr().err.strip()
    assert said in err and len(err.splitlines()) == 1, err
    assert (
        not (tmp_path / "results" / "fleet.sqlite").exists()
        or not Results(tmp_path / "results" / "fleet.sqlite").run_ids()
    )


def test_run_parameters_need_args_in_the_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    reference = "123456789012.dkr.ecr.us-east-1.amazonaws.com/tune/work:v1"
    path = tmp_path / "tune.toml"
    path.write_text(tune_file(reference).replace('"work {args}"', '"work"'))
    assert main(["tune", str(path), "--yes"]) == 2
    assert "has no {args}" in capsys.readouterr().err
