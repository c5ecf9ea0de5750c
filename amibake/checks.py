"""Numbers and names from users, checked where they come in (a flag, a file, the environment).

Each check returns what is wrong, worded to follow the setting's name ("replicates: " + it), or
'' when the value is good: the caller knows where the value came from and how to name it, and
the limits and their reasons are the same wherever a value arrives.

TOML and Python's float() take ``nan`` and ``inf``, which compare false with every bound and so
passed checks like ``x > 0``; an unbounded count (``replicates = 99999999999999``) was recorded
and could never be read back. A value checked here is finite, in its range and of its kind.
"""

from __future__ import annotations

import math
import re
from typing import Any

# A name that becomes part of a path, on this machine and on an instance: a recipe's.
PLAIN_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")


def integer(value: Any, low: int, high: int | None = None, why: str = "") -> str:
    """An int (never a bool, nor a float: 2.5 replicates is a typo) within [low, high]; `why`
    says why the cap is where it is."""
    wanted = f"an integer of at least {low}"
    if high is not None:
        wanted = f"an integer from {low} to {high}"
    if isinstance(value, bool) or not isinstance(value, int):
        return f"must be {wanted}, not {value!r}"
    if value < low:
        return f"must be {wanted}, not {_shown(value)}"
    if high is not None and value > high:
        return f"must be {wanted}, not {_shown(value)}" + (f": {why}" if why else "")
    return ""


def number(
    value: Any,
    *,
    above: float | None = None,
    at_least: float | None = None,
    at_most: float | None = None,
    why: str = "",
) -> str:
    """A finite int or float (never a bool) above `above` or at least `at_least`, and at most
    `at_most`; `why` says why the cap is where it is."""
    bounds = []
    if above is not None:
        bounds.append(f"above {above:g}")
    if at_least is not None:
        bounds.append(f"at least {at_least:g}")
    if at_most is not None:
        bounds.append(f"at most {at_most:g}")
    wanted = " and ".join(["a finite number", *bounds]).replace(" and ", " ", 1)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return f"must be {wanted}, not {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"must be {wanted}, not {value}"
    shown = _shown(value)
    if (above is not None and value <= above) or (at_least is not None and value < at_least):
        return f"must be {wanted}, not {shown}"
    if at_most is not None and value > at_most:
        return f"must be {wanted}, not {shown}" + (f": {why}" if why else "")
    return ""


# A word a shell on an instance reads as written: no quote, $, `, \, ;, &, |, <, >, parentheses,
# blank or glob. Flags and arguments that go into a build script's CFLAGS="..." or a replicate's
# command line are such words: anything else ran as a command there (as root, in a build).
SHELL_WORD = re.compile(r"[A-Za-z0-9_=,./+:@%^-]+")


# A workload's option name, as --NAME on its command line and {NAME} in a recipe's command.
FLAG_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")


def shell_words(text: str) -> str:
    """'' when every blank-separated word of `text` is a SHELL_WORD; else which one is not."""
    odd = [word for word in text.split() if not SHELL_WORD.fullmatch(word)]
    if not odd:
        return ""
    return (
        f"{odd[0]!r} has a character the instance's shell reads (a quote, $, `, \\, ;, &, |, <, "
        ">, parentheses, a glob)"
    )


def plain_name(value: Any) -> str:
    """Letters, digits, - and _, starting with a letter or digit: a name, never a path."""
    if isinstance(value, str) and PLAIN_NAME.fullmatch(value):
        return ""
    return f"{value!r} is not a plain name (letters, digits, - and _; no / or ..)"


def _shown(value: int | float) -> str:
    """A number as a message shows it: 10**400 (no float can hold it) by its size."""
    if isinstance(value, float):
        return f"{value:g}"
    text = str(value)
    return text if len(text) <= 20 else f"{text[:3]}... ({len(text.lstrip('-'))} digits)"
