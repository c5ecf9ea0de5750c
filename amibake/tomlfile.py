"""Reading a user's TOML file (amibake.toml, a recipe, a bench or tune file): the one reader, so
every such file fails the same way, on one line that names it: unreadable, not UTF-8 (TOML is
UTF-8 by definition; a file saved as Latin-1 raised UnicodeDecodeError), or not TOML (with the
line TOML gives)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any

from amibake.errors import UserError


def read_text(path: Path, what: str) -> str:
    """A user's text file, as UTF-8; a one-line UserError naming it otherwise."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise UserError(f"{path}: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        # A byte-order mark (Windows editors save one) is no part of the text; tomllib refused
        # it as "Invalid statement (at line 1, column 1)".
        return raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise UserError(
            f"{path}:{line}: the {what} is not UTF-8 text (byte {raw[exc.start]:#04x}); "
            "save it as UTF-8"
        ) from None


def present(path: Path) -> bool:
    """Whether something is at `path`; True when the question is refused (a folder this user
    may not enter), so that reading it says why in one line instead of a PermissionError."""
    try:
        return path.exists()
    except OSError:
        return True


def read(path: Path, what: str) -> tuple[str, dict[str, Any]]:
    """A TOML file's text (for line numbers in later errors) and data."""
    text = read_text(path, what)
    try:
        return text, tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise UserError(f"{path}: {exc}") from None
