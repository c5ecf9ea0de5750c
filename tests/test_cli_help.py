"""`--help` of both commands: every option and argument says what it is."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from amibake.cli import build_parser as amibake_parser
from amibake.cli import main as amibake
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
