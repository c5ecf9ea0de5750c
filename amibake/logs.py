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


PROGRAMS = ("amibake", "fleet")


def to_terminal(verbose: bool = False, program: str | None = None) -> None:
    """Log to the terminal, each line prefixed with the running program's name: `program`, by
    default the package of the CLI calling (fleet's commands say "fleet:", though they log
    through amibake's logger tree). Installed once; a later call from another program (two
    CLIs run in one process, as in tests) takes its prefix."""
    if program is None:
        caller = sys._getframe(1).f_globals.get("__name__", "").split(".")[0]
        program = caller if caller in PROGRAMS else "amibake"
    root = logging.getLogger("amibake")
    formatter = logging.Formatter(f"{program}: %(message)s")
    for installed in root.handlers:
        if isinstance(installed, _Terminal):
            installed.setFormatter(formatter)
            return
    handler = _Terminal()
    handler.setFormatter(formatter)
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
