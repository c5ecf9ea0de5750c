"""Files the tools write under results/ and read back (results/amis.json, artifact manifests,
refreshed price tables): a damaged or hand-edited one is named, with how to make it again,
never a traceback."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from amibake.errors import UserError

T = TypeVar("T")


def read_json(
    path: Path,
    remedy: str,
    shape: Callable[[Any], T],
    error: Callable[[str], Exception] = UserError,
) -> T:
    """`shape` of the file's JSON: it reads the fields its caller needs, so a missing or
    mistyped one is found here, as the damage it is, rather than later as a KeyError."""
    try:
        return shape(json.loads(path.read_text()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise error(f"{path} is damaged ({type(exc).__name__}: {exc}); {remedy}") from None
