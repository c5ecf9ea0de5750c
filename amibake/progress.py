"""Progress: for long waits, one line every few seconds on stderr and the same in the log; for
counted work (replicates, trials), one line per thing done with elapsed time and an ETA, and a
redrawn bar where a terminal is attached (rich)."""

from __future__ import annotations

import logging
import sys
import threading
import time
from typing import Any, TextIO

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


def duration(seconds: float) -> str:
    """Seconds as people read a wait: 45s, 3m10s, 2h05m."""
    whole = max(0, round(seconds))
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


class _Bars:
    """The one redrawn display of the process (rich allows one live display at a time): a bar
    per counter in progress, shown while any is. Lines logged meanwhile go to sys.stderr (the
    terminal handler looks it up per record), which rich redirects above the bars."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.display: Any = None
        self.tasks: set[Any] = set()

    def active(self) -> bool:
        return self.display is not None

    def add(self, description: str, total: int, completed: int) -> Any:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as Display

        with self.lock:
            if self.display is None:
                self.display = Display(
                    TextColumn("{task.description}"),
                    BarColumn(),
                    MofNCompleteColumn(),
                    TimeElapsedColumn(),
                    TextColumn("{task.fields[left]}"),
                    console=Console(file=sys.stderr),
                    transient=True,  # the lines above it stay: they are the record
                )
                self.display.start()
            task = self.display.add_task(description, total=total, completed=completed, left="")
            self.tasks.add(task)
            return task

    def update(self, task: Any, **fields: Any) -> None:
        with self.lock:
            if self.display is not None and task in self.tasks:
                # Drawn now, not at the next tick of rich's refresh thread: a count that was
                # removed with its bar before that tick was never shown.
                self.display.update(task, refresh=True, **fields)

    def remove(self, task: Any) -> None:
        with self.lock:
            if self.display is None or task not in self.tasks:
                return
            self.tasks.discard(task)
            self.display.remove_task(task)
            if not self.tasks:
                self.display.stop()
                self.display = None


BARS = _Bars()


def terminal() -> bool:
    """Whether a person watches stderr: then progress is a redrawn bar; else (CI, a pipe, a log
    file) plain lines only."""
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):  # a closed or odd stream
        return False


class Counter:
    """Progress through a known number of things (a bench's replicates, a tune's trials): one
    line per thing done with the time elapsed and, once one is done, the time left at the pace
    so far ("12/16 replicates, 3m10s elapsed, ~1m05s left"); where a terminal is attached, also
    a redrawn bar below the lines, its clock ticking between them."""

    def __init__(self, what: str, total: int, done: int = 0, noun: str = "replicates") -> None:
        self.what = what
        self.total = total
        self.done = done
        self.noun = noun
        self.started = time.monotonic()
        self._first = done  # done before this controller started: not its pace
        self._bar: Any = None
        self._bar_wanted = terminal()

    def text(self) -> str:
        elapsed = time.monotonic() - self.started
        said = f"{self.done}/{self.total} {self.noun}, {duration(elapsed)} elapsed"
        return said + (f", ~{duration(left)} left" if (left := self.left()) is not None else "")

    def left(self) -> float | None:
        """Seconds left at this controller's pace, once it has finished one."""
        finished = self.done - self._first
        if finished <= 0:
            return None
        return (self.total - self.done) * (time.monotonic() - self.started) / finished

    def show(self, description: str = "") -> None:
        """Redraw the bar (on a terminal) with what is going on now; logs nothing."""
        if not self._bar_wanted:
            return
        label = f"{self.what} {description}".strip()
        left = self.left()
        eta = f"~{duration(left)} left" if left is not None else ""
        if self._bar is None:
            self._bar = BARS.add(label, self.total, self.done)
        BARS.update(self._bar, description=label, completed=self.done, left=eta)

    def advance(self, detail: str = "") -> str:
        """One more done: its line, logged once."""
        self.done += 1
        line = self.text() + (f"; {detail}" if detail else "")
        log.info("%s%s", f"[{self.what}] " if self.what else "", line)
        self.show()
        return line

    def close(self) -> None:
        if self._bar is not None:
            BARS.remove(self._bar)
            self._bar = None
