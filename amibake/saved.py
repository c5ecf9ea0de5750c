"""Files the tools write under results/ and read back (results/amis.json, artifact manifests,
refreshed price tables): a damaged or hand-edited one is named, with how to make it again,
never a traceback."""

from __future__ import annotations

import fcntl
import json
import os
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
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


def write_whole(path: Path, text: str) -> None:
    """The file written whole or not at all: a reader (another command, another thread) sees
    the old text or the new, never half of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.part")
    partial.write_text(text)
    os.replace(partial, path)


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """An exclusive lock on `path` (a file beside it, `.NAME.lock`) for a read, change and write
    back: held by one process, or one thread, at a time (flock on a file opened anew)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(f".{path.name}.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield
