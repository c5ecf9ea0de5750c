"""Logging: the terminal and a file under results/logs/, from one logger tree ("amibake")."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(message)s"


class _Terminal(logging.Handler):
    """Writes to sys.stderr as it is when a record comes, not as it was when installed: the
    handler is installed once per process, and a replaced stderr (a test's capture, since
    closed) would otherwise turn every later record into a 'Logging error' traceback."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            sys.stderr.write(self.format(record) + "\n")
            sys.stderr.flush()
        except Exception:
            self.handleError(record)


def to_terminal(verbose: bool = False) -> None:
    root = logging.getLogger("amibake")
    if any(isinstance(h, _Terminal) for h in root.handlers):
        return
    handler = _Terminal()
    handler.setFormatter(logging.Formatter("amibake: %(message)s"))
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if verbose else logging.INFO)


def to_file(path: Path) -> logging.Handler:
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter(FORMAT))
    root = logging.getLogger("amibake")
    root.addHandler(handler)
    if root.level == logging.NOTSET or root.level > logging.INFO:
        root.setLevel(logging.INFO)
    return handler


@contextmanager
def run_log(path: Path) -> Iterator[Path]:
    """While open, everything logged also goes to `path`: a run's log under results/logs/ (a
    resumed run's appends to it)."""
    handler = to_file(path)
    try:
        yield path
    finally:
        logging.getLogger("amibake").removeHandler(handler)
        handler.close()
