"""What both CLIs, amibake and fleet, share of argparse: the parser class (one-line errors, with
"did you mean" for a mistyped command, choice or flag), `--version`, the exit codes, the
description and examples of every subcommand's `--help`, and shell completion (shtab).

Nothing here imports the work itself: the catalog and the recipes are read only when a
completion script is asked for.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Iterator, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any, NoReturn

from amibake.errors import UserError

# What main() returns, whichever command ran (amibake.cli.guarded and the handlers): listed in
# both top-level `--help`s and the README.
EXIT_CODES = (
    (0, "success"),
    (1, "a run failed (a build, a bake, a benchmarked type, every trial) or the cloud refused"),
    (2, "bad input or environment: a flag, a file, a setting, credentials, a missing tool"),
    (
        130,
        "interrupted (Ctrl-C or SIGTERM): what the run created is cleaned up first (batch "
        "up's registrations, meant to last, stay: it says so)",
    ),
)
SHELLS = ("bash", "zsh")
# A flag's mistyped name is suggested only when it is this close to a real one (difflib's
# ratio, dashes included): --familly and --dryrun are, --tmpfs-gb (for --tmpfs-reserve-...) not.
CLOSE_FLAG = 0.75
CLOSE_CHOICE = 0.6


def version() -> str:
    """The installed distribution's version: both commands ship in the amibake one."""
    try:
        return metadata.version("amibake")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed: pip install -e .)"


def exit_codes_text(extra: Sequence[tuple[int, str]] = ()) -> str:
    rows = sorted([*EXIT_CODES, *extra])
    return "exit codes:\n" + "\n".join(f"  {code:<4} {text}" for code, text in rows)


def names(text: str) -> list[str]:
    """A comma-separated list of family or instance-type names, as EC2 spells them: lowercase
    (`--family C7I`, `C7i.Large`), blanks dropped (an empty list is refused downstream)."""
    return [name.strip().lower() for name in text.split(",") if name.strip()]


def subcommands(
    parser: argparse.ArgumentParser, path: str = ""
) -> Iterator[tuple[str, argparse.ArgumentParser, str | None]]:
    """Every subcommand below `parser`, depth first: ("local up", its parser, its help)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help for a in action._get_subactions()}
            for name, sub in action.choices.items():
                where = f"{path} {name}".strip()
                yield where, sub, helps.get(name)
                yield from subcommands(sub, where)


class Parser(argparse.ArgumentParser):
    """argparse, with every mistake on one line (a UserError: exit 2, no usage dump) and a
    guess where one is close: argparse 3.11 has no "did you mean"."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        # Descriptions and epilogs are written line by line (examples, exit codes).
        kwargs.setdefault("formatter_class", argparse.RawDescriptionHelpFormatter)
        super().__init__(*args, **kwargs)
        self._given: list[str] | None = None
        self._probing = False

    def error(self, message: str) -> NoReturn:
        if self._probing:
            raise _Probe
        required = ("the following arguments are required", "one of the arguments")
        if message.startswith(required) and self._subparsers is None:
            # `build --familly c7i` said "--family is required": the flag that was mistyped is
            # the mistake, and argparse checks what is required before it looks at extras. (A
            # missing subcommand stays the mistake: `batch --from-bake` lacks `up`.)
            unknown = self._unknown_flags()
            if unknown:
                raise UserError(unrecognized(unknown, self, self.prog))
        raise UserError(f"{message} (see `{self.prog} --help`)")

    def _misplaced(self, given: list[str]) -> None:
        """`amibake --cloud local ls`: a command's option before the command. argparse dropped
        it and read its value as the command ("invalid choice: 'ls'" from `local`)."""
        flag = given[0].split("=", 1)[0] if given and given[0].startswith("--") else ""
        if not flag or self._subparsers is None:
            return
        own = {o for action in self._actions for o in action.option_strings}
        taking = {w for w, sub, _ in subcommands(self) if flag in sub._option_string_actions}
        if flag in own or not taking:
            return
        moved = given[:1] if "=" in given[0] else given[:2]  # the option and its value
        rest = given[len(moved) :]
        if rest and any(w.split()[0] == rest[0] for w in taking):
            meant = f"`{' '.join([self.prog, *rest, *moved])}`"
        else:
            meant = f"e.g. `{self.prog} {sorted(taking)[0]} {' '.join(moved)}`"
        raise UserError(
            f"{flag} goes after the command: {meant} ({self.prog}'s own options are "
            f"{', '.join(sorted(own))})"
        )

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        if action.choices is None or value in action.choices:
            return
        choices = [str(c) for c in action.choices]
        close = difflib.get_close_matches(str(value), choices, n=3, cutoff=CLOSE_CHOICE)
        if close:
            message = f"invalid choice: {value!r}; did you mean {' or '.join(close)}?"
        else:
            message = f"invalid choice: {value!r} (choose from {', '.join(choices)})"
        raise argparse.ArgumentError(action, message)

    def parse_known_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> tuple[argparse.Namespace, list[str]]:
        self._given = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def parse_args(  # type: ignore[override]
        self, args: Sequence[str] | None = None, namespace: argparse.Namespace | None = None
    ) -> argparse.Namespace:
        # argparse finds an unknown flag only back in the top parser, whose help does not list
        # the command's flags: point at the help of the command it was given to.
        self._misplaced(list(sys.argv[1:] if args is None else args))
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            chosen = self._chosen(parsed)
            raise UserError(unrecognized(extras, chosen, chosen.prog))
        return parsed

    def _chosen(self, parsed: argparse.Namespace) -> argparse.ArgumentParser:
        """The innermost subcommand's parser that `parsed` went through."""
        parser: argparse.ArgumentParser = self
        while True:
            action = next(
                (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None
            )
            name = getattr(parsed, action.dest, None) if action and action.dest else None
            if action is None or name not in action.choices:
                return parser
            parser = action.choices[name]

    def _unknown_flags(self) -> list[str]:
        """What is left over when this parser's arguments are parsed with nothing required."""
        if self._given is None:
            return []
        given = self._given
        actions = [(a, a.required) for a in self._actions]
        groups = [(g, g.required) for g in self._mutually_exclusive_groups]
        self._probing = True
        try:
            for action, _ in actions:
                action.required = False
            for group, _ in groups:
                group.required = False
            _, extras = super().parse_known_args(given, argparse.Namespace())
        except (_Probe, UserError):
            return []
        finally:
            self._probing = False
            for action, was in actions:
                action.required = was
            for group, was in groups:
                group.required = was
        return extras if any(_is_flag(word) for word in extras) else []


class _Probe(Exception):
    """A mistake found while looking for unknown flags: the first error stands."""


def _is_flag(word: str) -> bool:
    return word.startswith("-") and word != "-" and not word.lstrip("-")[:1].isdigit()


def unrecognized(extras: list[str], parser: argparse.ArgumentParser, where: str) -> str:
    """The one-line refusal of arguments no parser took, with the flags they may have meant."""
    known = [option for action in parser._actions for option in action.option_strings]
    guesses = []
    for word in filter(_is_flag, extras):
        flag = word.split("=", 1)[0]
        close = difflib.get_close_matches(flag, known, n=1, cutoff=CLOSE_FLAG)
        if close:
            guesses.append((flag, close[0]))
    flags = [w for w in extras if _is_flag(w)]
    if len(guesses) == 1 and len(flags) == 1:
        text = f"unrecognized argument {guesses[0][0]}; did you mean {guesses[0][1]}?"
    else:
        text = f"unrecognized arguments: {' '.join(extras)}"
        if guesses:
            text += "; did you mean " + ", ".join(f"{g} for {f}" for f, g in guesses) + "?"
    return f"{text} (see `{where} --help`)"


def add_version(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--version",
        action="version",
        version=f"%(prog)s {version()}",
        help="print the version and exit",
    )


def document(
    parser: argparse.ArgumentParser, examples: dict[str, list[str]], exit_codes: str
) -> None:
    """Give every subcommand's --help its one-line description (its help in the command list)
    and its examples, and the top-level --help the exit codes."""
    for path, sub, text in subcommands(parser):
        if not sub.description and text:
            sub.description = text
        lines = examples.get(path, [])
        if lines:
            block = ("example:" if len(lines) == 1 else "examples:") + "".join(
                f"\n  {line}" for line in lines
            )
            sub.epilog = f"{sub.epilog}\n\n{block}" if sub.epilog else block
    parser.epilog = exit_codes


# Shell completion: static scripts from the parser (shtab), with the names a flag takes. A flag
# is completed by what its destination names, whichever subcommand it is on.
FAMILIES = "families"
TYPES = "types"
RECIPES = "recipes"
COMPLETED = {
    "family": FAMILIES,
    "families": FAMILIES,
    "type": TYPES,
    "types": TYPES,
    "recipe": RECIPES,
}
FILES = ("file", "replay", "replay_runs", "space")
SHTAB_FILES = {"bash": "_shtab_compgen_files", "zsh": "_files"}


def add_completion(commands: Any, prog: str) -> None:
    """The `completion SHELL` subcommand, on a parser's subcommands."""
    completion = commands.add_parser(
        "completion", help=f"print a shell completion script for {prog} (bash or zsh)"
    )
    completion.add_argument("shell", choices=SHELLS, help="the shell: bash or zsh")


def mark_completions(parser: argparse.ArgumentParser, prog: str) -> None:
    for sub in [parser, *(sub for _, sub, _ in subcommands(parser))]:
        for action in sub._actions:
            kind = COMPLETED.get(action.dest)
            if kind:
                function = f"_{prog}_complete_{kind}"
                action.complete = {"bash": function, "zsh": function}  # type: ignore[attr-defined]
            elif action.dest in FILES:
                action.complete = SHTAB_FILES  # type: ignore[attr-defined]


def completion_words(recipes_dir: Path) -> dict[str, list[str]]:
    """The names completed, from the data the commands check them against."""
    from amibake import catalog, recipes

    families = catalog.families()
    return {
        FAMILIES: sorted(families),
        TYPES: sorted(f.instance_type(size) for f in families.values() for size in f.sizes),
        RECIPES: recipes.available(recipes_dir),
    }


def completion_script(
    parser: argparse.ArgumentParser, prog: str, shell: str, recipes_dir: Path
) -> str:
    import shtab

    words = completion_words(recipes_dir)
    if shell == "bash":
        # A comma-separated list (--family c7i,c7g) completes its last name.
        preamble = "\n".join(
            f'_{prog}_complete_{kind}() {{\n  local head="" word="$1"\n'
            f'  if [[ $word == *,* ]]; then head="${{word%,*}},"; word="${{word##*,}}"; fi\n'
            f'  compgen -P "$head" -W "{" ".join(names)}" -- "$word"\n}}'
            for kind, names in words.items()
        )
    else:
        # _values -s ,: the names of a comma-separated list, one after another.
        preamble = "\n".join(
            f"_{prog}_complete_{kind}() {{\n  _values {'' if kind == RECIPES else '-s , '}"
            f"{kind} {' '.join(names)}\n}}"
            for kind, names in words.items()
        )
    return str(shtab.complete(parser, shell, preamble=preamble))
