"""The command-line habits people expect of both CLIs (issue 27): names in any case, "did you
mean", and every configuration problem said at once. `--help`, its examples, `--version` and
the exit codes are in test_cli_help.py; the one-line refusals in test_bad_input.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from amibake import config
from amibake.cli import main as amibake
from amibake.errors import ConfigError, UserError
from fleet.cli import main as fleet


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No amibake.toml and no AMIBAKE_* setting but the results folder: the user's own
    configuration stays out of these tests."""
    import os

    for name in [n for n in os.environ if n.startswith("AMIBAKE_")]:
        monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    return tmp_path


def test_family_and_type_names_are_taken_in_any_case(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    assert fleet(["prices", "--type", "C7i.Large", "C7G.LARGE", "--json"]) == 0
    listed = [row["type"] for row in json.loads(capsys.readouterr().out)["prices"]]
    assert listed == ["c7i.large", "c7g.large"]
    assert fleet(["prices", "--family", "C7I", "--json"]) == 0
    listed = [row["type"] for row in json.loads(capsys.readouterr().out)["prices"]]
    assert listed and all(t.startswith("c7i.") for t in listed), listed

    from amibake import pipelines

    asked: list[list[str]] = []

    def prepare(request: pipelines.BuildRequest, *_: object) -> None:
        asked.append(request.families)
        raise UserError("stopped before any cloud")

    monkeypatch.setattr(pipelines, "prepare", prepare)
    assert amibake(["build", "--family", "C7I, c7G", "--cloud", "local"]) == 2
    assert asked == [["c7i", "c7g"]]


def test_a_mistyped_flag_is_named_with_the_flag_meant(capsys: pytest.CaptureFixture[str]) -> None:
    """argparse checked --family was missing before it looked at --familly."""
    for argv, said in (
        (["build", "--familly", "c7i"], "unrecognized argument --familly; did you mean --family?"),
        (["build", "--family=c7i", "--dryrun"], "unrecognized argument --dryrun; did you mean"),
        (["batch", "up", "--from-bakes"], "unrecognized argument --from-bakes; did you mean"),
        (["biuld"], "argument command: invalid choice: 'biuld'; did you mean build?"),
    ):
        assert amibake(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"amibake: error: {said}") and err.count("\n") == 1, err
    # Nothing close: the flags left over, as before, and where to look.
    assert fleet(["plan", "last", "--wrk", "1", "--frobnicate"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "fleet: error: unrecognized arguments: --wrk 1 --frobnicate; did you mean --work for "
        "--wrk? (see `fleet plan --help`)\n"
    ), err


def test_every_configuration_problem_is_said_at_once(tmp_path: Path) -> None:
    toml = tmp_path / "amibake.toml"
    toml.write_text('colud = "local"\nregoin = "eu-west-1"\n')
    with pytest.raises(ConfigError) as caught:
        config.load(toml_path=toml, environ={"AMIBAKE_MAX_ATEMPTS": "3"})
    assert caught.value.problems == [
        f"{toml}: unknown setting 'colud'; did you mean cloud?",
        f"{toml}: unknown setting 'regoin'; did you mean region?",
        "AMIBAKE_MAX_ATEMPTS is not a setting; did you mean AMIBAKE_MAX_ATTEMPTS?",
    ]
    # A file that cannot be read stops no other layer from being checked.
    toml.write_text("region = \n")
    with pytest.raises(ConfigError) as caught:
        config.load(toml_path=toml, environ={"AMIBAKE_LOCAL_PORT": "x"})
    assert [p.split(":")[0] for p in caught.value.problems] == [str(toml), "AMIBAKE_LOCAL_PORT"]
    named = {"AMIBAKE_CONFIG": str(tmp_path / "missing.toml"), "AMIBAKE_SPOT": "perhaps"}
    with pytest.raises(ConfigError) as caught:
        config.load(environ=named)
    assert len(caught.value.problems) == 2, caught.value.problems
    assert caught.value.problems[0].startswith("AMIBAKE_CONFIG names")
