"""`--help` of both commands: every option and argument says what it is."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Iterator
from pathlib import Path

import pytest

from amibake.cli import build_parser as amibake_parser
from amibake.cli import main as amibake
from amibake.errors import AmibakeError
from fleet.cli import build_parser as fleet_parser
from fleet.cli import main as fleet


def undocumented(parser: argparse.ArgumentParser, path: str) -> Iterator[str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from undocumented(sub, f"{path} {name}")
        elif action.help is None:
            yield f"{path} {'/'.join(action.option_strings) or action.dest}"


def test_every_option_and_argument_has_help() -> None:
    missing = [
        *undocumented(amibake_parser(), "amibake"),
        *undocumented(fleet_parser(), "fleet"),
    ]
    assert missing == [], f"no help text for: {', '.join(missing)}"


def test_an_unknown_flag_points_at_the_help_of_its_command(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert amibake(["build", "--family", "c7i", "--tmpfs-gb", "1"]) == 2
    assert capsys.readouterr().err == (
        "amibake: error: unrecognized arguments: --tmpfs-gb 1 (see `amibake build --help`)\n"
    )
    assert amibake(["local", "up", "--bogus"]) == 2
    assert "(see `amibake local up --help`)" in capsys.readouterr().err
    assert fleet(["report", "last", "--nope"]) == 2
    assert "--nope (see `fleet report --help`)" in capsys.readouterr().err


def test_the_top_level_help_describes_the_product_to_a_user(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for main, name in ((amibake, "amibake"), (fleet, "fleet")):
        with pytest.raises(SystemExit):
            main(["--help"])
        lines = capsys.readouterr().out.split("\n\n")
        description = lines[1].replace("\n", " ")
        assert description.startswith(f"{name}: "), description
        assert "EC2" in description, description
        # Not the module's notes to its developers.
        assert "argument parsing" not in description, description


def test_every_subcommand_has_a_description_and_an_example_that_parses() -> None:
    """Issue 27: each `--help` below the top says what the command does in one line and shows
    it used; each example is a real command line, which the parser takes as it is."""
    from amibake.cliutil import subcommands

    problems = []
    for prog, build in (("amibake", amibake_parser), ("fleet", fleet_parser)):
        for path, sub, _ in subcommands(build()):
            where = f"{prog} {path}"
            description = sub.description or ""
            if not description.strip() or "\n" in description.strip():
                problems.append(f"{where}: no one-line description")
            epilog = sub.epilog or ""
            _, found, block = epilog.rpartition("example")
            examples = [line.strip() for line in block.splitlines()[1:] if line.strip()]
            if not found or not examples:
                problems.append(f"{where}: no example in --help")
            for example in examples:
                words = shlex.split(example.split(" > ")[0])
                if words[: len(where.split())] != where.split():
                    problems.append(f"{where}: example {example!r} is of another command")
                    continue
                try:
                    build().parse_args(words[1:])
                except AmibakeError as exc:
                    problems.append(f"{where}: example {example!r} does not parse: {exc}")
    assert problems == [], "\n".join(problems)


def test_the_examples_name_only_commands_that_exist() -> None:
    """A renamed command would leave its examples behind, shown nowhere."""
    from amibake.cli import EXAMPLES as AMIBAKE_EXAMPLES
    from amibake.cliutil import subcommands
    from fleet.cli import EXAMPLES as FLEET_EXAMPLES

    for examples, build in ((AMIBAKE_EXAMPLES, amibake_parser), (FLEET_EXAMPLES, fleet_parser)):
        paths = {path for path, _, _ in subcommands(build())}
        assert set(examples) <= paths, set(examples) - paths


def test_the_top_level_help_lists_the_exit_codes_main_returns(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from amibake.errors import CloudError, EnvironmentProblem, UserError
    from amibake.runner import Interrupted

    codes = {0, CloudError.exit_code, UserError.exit_code, EnvironmentProblem.exit_code}
    codes |= {Interrupted.exit_code}
    assert codes == {0, 1, 2, 130}
    for main, extra in ((amibake, {3}), (fleet, set())):
        with pytest.raises(SystemExit):
            main(["--help"])
        _, _, listed = capsys.readouterr().out.partition("\nexit codes:\n")
        found = {int(line.split()[0]) for line in listed.splitlines() if line.strip()}
        assert found == codes | extra, listed


def test_the_readme_lists_the_same_exit_codes() -> None:
    from amibake.cliutil import EXIT_CODES

    readme = (Path(__file__).parent.parent / "README.md").read_text()
    _, found, section = readme.partition("\n### Exit codes\n")
    assert found, "README.md has no Exit codes section"
    section = section.split("\n#", 1)[0]
    rows = {
        int(cells[1])
        for cells in (line.split("|") for line in section.splitlines())
        if len(cells) > 2 and cells[1].strip().isdigit()
    }
    assert rows == {code for code, _ in EXIT_CODES} | {3}, section


def test_version_is_the_installed_packages_on_one_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from importlib.metadata import version

    for main, name in ((amibake, "amibake"), (fleet, "fleet")):
        with pytest.raises(SystemExit) as exited:
            main(["--version"])
        assert exited.value.code == 0
        assert capsys.readouterr().out == f"{name} {version('amibake')}\n"
