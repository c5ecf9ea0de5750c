"""Logging: the terminal and a file under results/logs/, from one logger tree ("amibake")."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

FORMAT = "%(asctime)s %(levelname)s %(message)s"


def to_terminal(verbose: bool = False) -> None:
    root = logging.getLogger("amibake")
    if any(getattr(h, "_amibake_terminal", False) for h in root.handlers):
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("amibake: %(message)s"))
    handler._amibake_terminal = True  # type: ignore[attr-defined]
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
