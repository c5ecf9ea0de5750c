"""Progress for long waits: one line every few seconds on stderr, and the same in the log."""

from __future__ import annotations

import logging
import sys
import time
from typing import TextIO

log = logging.getLogger("amibake")


class Progress:
    def __init__(self, what: str, every_s: float = 5.0, stream: TextIO | None = None) -> None:
        self.what = what
        self.every_s = every_s
        self.stream = stream if stream is not None else sys.stderr
        self.started = time.monotonic()
        self._last = self.started

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    def tick(self, detail: str) -> None:
        now = time.monotonic()
        if now - self._last >= self.every_s:
            self._last = now
            self._say(f"{self.what}: {detail} ({self.elapsed:.0f}s)")

    def done(self, detail: str = "done") -> None:
        if self.elapsed >= self.every_s:
            self._say(f"{self.what}: {detail} after {self.elapsed:.0f}s")

    def _say(self, line: str) -> None:
        # Once the CLI has configured logging, its handlers reach both terminal and log file.
        if logging.getLogger("amibake").handlers:
            log.info("%s", line)
        else:
            print(line, file=self.stream, flush=True)
