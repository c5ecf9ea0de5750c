"""`--help` of both commands: every option and argument says what it is."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

from amibake.cli import build_parser as amibake_parser
from fleet.cli import build_parser as fleet_parser


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
