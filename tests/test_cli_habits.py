"""The command-line habits people expect of both CLIs (issue 27): shell completion, names in any
case, "did you mean", and every configuration problem said at once. `--help`, its examples,
`--version` and the exit codes are in test_cli_help.py; the one-line refusals in
test_bad_input.py."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from amibake import catalog, config, recipes
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


def script(main: object, shell: str, capsys: pytest.CaptureFixture[str]) -> str:
    assert callable(main)
    assert main(["completion", shell]) == 0
    out = capsys.readouterr().out
    assert out.strip(), f"no {shell} script"
    return str(out)


def complete(script_path: Path, prog: str, *words: str) -> list[str]:
    """What bash offers for the last word of `prog words...`, as bash-completion would ask."""
    line = " ".join(f"'{w}'" for w in (prog, *words))
    body = (
        f"source {script_path}\n"
        f"COMP_WORDS=({line}); COMP_CWORD={len(words)}\n"
        f'_shtab_{prog}; printf "%s\\n" "${{COMPREPLY[@]}}"\n'
    )
    done = subprocess.run(
        ["bash", "--norc", "--noprofile", "-c", body],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    return [w for w in done.stdout.splitlines() if w]


def starting(prefix: str) -> list[str]:
    """The catalog's families with that prefix: data, not this machine's CPU."""
    return sorted(name for name in catalog.families() if name.startswith(prefix))


def test_bash_completes_family_names_from_the_catalog(
    isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = isolated / "amibake.bash"
    path.write_text(script(amibake, "bash", capsys))
    offered = complete(path, "amibake", "build", "--family", "c7")
    assert {"c7i", "c7g"} <= set(offered), offered
    assert sorted(offered) == starting("c7")
    # The last name of a list is completed, the ones before kept.
    assert sorted(complete(path, "amibake", "bake", "--family", "c7i,c7")) == [
        f"c7i,{name}" for name in starting("c7")
    ]
    assert "build" in complete(path, "amibake", "bu")
    assert "--family" in complete(path, "amibake", "build", "--fam")
    assert complete(path, "amibake", "build", "--recipe", "k") == ["kernels"]
    assert complete(path, "amibake", "source", "has", "z") == ["zstd"]


def test_bash_completes_fleets_types_families_and_recipes(
    isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = isolated / "fleet.bash"
    path.write_text(script(fleet, "bash", capsys))
    family = catalog.family("c7g")
    types = complete(path, "fleet", "bench", "--types", "c7g.")
    assert sorted(types) == sorted(family.instance_type(size) for size in family.sizes), types
    assert sorted(complete(path, "fleet", "prices", "--family", "c7")) == starting("c7")
    assert sorted(complete(path, "fleet", "bench", "--recipe", "")) == recipes.available()
    assert "tune" in complete(path, "fleet", "tu")


def test_the_recipes_completed_are_those_of_the_configured_folder(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = isolated / "my-recipes" / "lammps"
    mine.mkdir(parents=True)
    (mine / "recipe.toml").write_text('name = "lammps"\n')
    monkeypatch.setenv("AMIBAKE_RECIPES_DIR", str(mine.parent))
    path = isolated / "amibake.bash"
    path.write_text(script(amibake, "bash", capsys))
    assert complete(path, "amibake", "build", "--recipe", "") == ["lammps"]


def test_the_zsh_script_is_zsh_and_completes_the_same_names(
    isolated: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for main, prog in ((amibake, "amibake"), (fleet, "fleet")):
        text = script(main, "zsh", capsys)
        assert text.startswith(f"#compdef {prog}\n")
        # --family's completer, and its definition listing every family of the catalog.
        assert f":_{prog}_complete_families" in text
        definition = text.split(f"_{prog}_complete_families() {{", 1)[1].split("}", 1)[0]
        assert set(definition.split()) >= set(catalog.families()), definition
        if shutil.which("zsh"):
            path = isolated / f"_{prog}"
            path.write_text(text)
            subprocess.run(["zsh", "-n", str(path)], check=True, timeout=30)


def test_family_and_type_names_are_taken_in_any_case(
    isolated: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    assert fleet(["prices", "--type", "C7i.Large", "C7G.LARGE", "--json"]) == 0
    listed = [row["type"] for row in json.loads(capsys.readouterr().out)["prices"]]
    # Lower-cased, and listed family by family as `fleet prices` always lists them.
    assert listed == ["c7g.large", "c7i.large"]
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
