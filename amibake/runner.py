"""Runs a pipeline's steps and unwinds their cleanups, whatever happens.

Like Packer's multistep: a step's cleanup is registered as soon as its ``run`` *starts* (so a
half-done step still cleans up what it recorded), and cleanups run in reverse order on success,
failure, Ctrl-C and SIGTERM. A cleanup that fails is logged with how to finish by hand, and the
unwinding goes on. With ``keep_on_error`` a failed run keeps its resources for debugging.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any, Generic, Protocol, TypeVar

from amibake.cloud.calls import STOP_SIGNALS
from amibake.cloud.ec2 import NEW_RESOURCE_VISIBLE_S
from amibake.cloud.network import Network
from amibake.cloud.network import find as find_network
from amibake.cloud.session import Cloud
from amibake.errors import AmibakeError
from amibake.journal import Journal

log = logging.getLogger("amibake")
S = TypeVar("S")
T = TypeVar("T")
S_contra = TypeVar("S_contra", contravariant=True)


class Interrupted(AmibakeError):
    """The run was cancelled (Ctrl-C, SIGTERM, or a sibling run asked all to stop)."""

    exit_code = 130


class Rerun(AmibakeError):
    """The runner must start over on fresh resources: the instance got a spot interruption
    notice. Raised by a step; the runner unwinds first, as for any failure."""


class CleanupFailed(AmibakeError):
    """The run's work may have succeeded, but something it created could not be removed."""


class Step(Protocol[S_contra]):
    """A step may set ``local_only = True`` when its cleanup frees only this process's own state
    (a file lock): ``keep_on_error`` keeps the cloud's resources, and such a step is unwound
    even then."""

    name: str

    def run(self, state: S_contra) -> None: ...

    def cleanup(self, state: S_contra) -> None: ...


def new_run_id() -> str:
    return "ab-" + uuid.uuid4().hex[:12]


@dataclass
class RunContext:
    """What every step of one run shares: where it runs, how it records, when it must stop."""

    run_id: str
    cloud: Cloud
    journal: Journal
    tags: dict[str, str]
    log_dir: Path
    cancel: threading.Event = field(default_factory=threading.Event)
    keep_on_error: bool = False
    failed: list[str] = field(default_factory=list)  # labels whose run ended in an error
    _shared: dict[str, Any] = field(default_factory=dict, repr=False)
    _shared_lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def shared(self, key: str, fetch: Callable[[], T]) -> T:
        """A lookup every instance of this run needs alike (the default VPC, its subnets): made
        once, by whichever asks first while the others wait; a failure is not remembered."""
        with self._shared_lock:
            if key not in self._shared:
                self._shared[key] = fetch()
            value: T = self._shared[key]
            return value

    def network(self) -> Network:
        """The run's subnets, VPC and the account's groups (amibake.cloud.network), looked up
        once for all its instances."""
        return self.shared("network", lambda: find_network(self.cloud.ec2, self.cloud.config))

    def check_cancel(self) -> None:
        if self.cancel.is_set():
            raise Interrupted("interrupted")

    def created(self, kind: str, resource_id: str) -> None:
        self.journal.created(
            self.run_id, kind, resource_id, self.cloud.config.region, self.cloud.config.cloud
        )

    def deleted(self, kind: str, resource_id: str) -> None:
        self.journal.deleted(kind, resource_id)

    def unseen_for(self, kind: str, resource_id: str) -> float:
        """How much longer EC2 may answer NotFound for a resource this run made (eventual
        consistency after its creation): what its delete allows (calls.ignore_missing)."""
        made = [
            r.created
            for r in self.journal.resources(self.run_id)
            if r.kind == kind and r.resource_id == resource_id
        ]
        if not made:
            return 0.0
        return max(0.0, NEW_RESOURCE_VISIBLE_S - (time.time() - made[-1]))


# Every run context open in this process. Ctrl-C reaches only the main thread; a caller that runs
# whole runs on worker threads (fleet tune's trials in flight) stops them all with cancel_all().
_open: dict[str, RunContext] = {}
_open_lock = threading.Lock()


# Set by cancel_all until allow_runs: a run opened meanwhile starts cancelled. A trial on a
# worker thread between two runs (its build's and its measurement's) when Ctrl-C came was in no
# open run, opened its next one uncancelled, and launched after the interrupt.
_stopping = threading.Event()


def opened(context: RunContext) -> None:
    with _open_lock:
        _open[context.run_id] = context
        if _stopping.is_set():
            context.cancel.set()


def closed(context: RunContext) -> None:
    with _open_lock:
        _open.pop(context.run_id, None)


def cancel_all() -> int:
    """Ask every open run to stop and unwind, and every run opened from now until allow_runs()
    to stop before its first step; returns how many open runs were asked."""
    with _open_lock:
        _stopping.set()
        for context in _open.values():
            context.cancel.set()
        return len(_open)


def allow_runs() -> None:
    """Runs opened from now on run again (the caller of cancel_all has stopped what it ran)."""
    _stopping.clear()


# Called after each step completes, with the step's name: tests kill runs here.
Boundary = Callable[[str], None]


class Runner(Generic[S]):
    def __init__(
        self,
        context: RunContext,
        steps: Sequence[Step[S]],
        on_boundary: Boundary | None = None,
        label: str = "",
        rerun_if: Callable[[BaseException], Rerun | None] | None = None,
    ) -> None:
        self.context = context
        self.steps = steps
        self.on_boundary = on_boundary
        # Tells a failure that is a rerun in disguise (spot took the instance back mid-step,
        # and the step saw a dropped connection) before the runner decides what to keep.
        self.rerun_if = rerun_if
        # Several runners share a run (one per family): the label tells their lines apart.
        self.prefix = f"[{context.run_id}{' ' + label if label else ''}]"

    def run(self, state: S) -> S:
        started: list[Step[S]] = []
        failure: BaseException | None = None
        try:
            for step in self.steps:
                self.context.check_cancel()
                if getattr(state, "finished_early", False):
                    break
                log.info("%s %s", self.prefix, step.name)
                started.append(step)
                step.run(state)
                if self.on_boundary is not None:
                    self.on_boundary(step.name)
        except BaseException as exc:
            failure = exc
            rerun = None if self.rerun_if is None else self.rerun_if(exc)
            if rerun is not None:
                failure = rerun
                raise rerun from exc
            raise
        finally:
            # A rerun is not the run's failure: what it leaves is unwound, as the attempt
            # after it unwinds its own, or --keep-on-error kept the first attempt's launch
            # template, security group and key pair beside a run that then succeeded.
            if (
                failure is not None
                and self.context.keep_on_error
                and not isinstance(failure, Rerun)
            ):
                log.warning(
                    "[%s] failed; resources kept for debugging (--keep-on-error). Clean up with: "
                    "amibake gc --run-id %s",
                    self.context.run_id,
                    self.context.run_id,
                )
                # Kept for debugging is what is in the cloud. A lock this process holds would
                # only make its next run of the same artifact (fleet tune's next trial) wait.
                with _no_interrupts():
                    self._unwind([s for s in started if getattr(s, "local_only", False)], state)
            else:
                with _no_interrupts():
                    failures = self._unwind(started, state)
                if failures and failure is None:
                    # A run that leaves something behind has not succeeded.
                    raise CleanupFailed(
                        f"{'; '.join(failures)}; finish by hand with: "
                        f"amibake gc --run-id {self.context.run_id}"
                    )
        return state

    def _unwind(self, started: list[Step[S]], state: S) -> list[str]:
        failures = []
        for step in reversed(started):
            try:
                step.cleanup(state)
            except (Exception, KeyboardInterrupt) as exc:
                failures.append(f"cleanup of {step.name} failed: {exc or type(exc).__name__}")
                # Even an interrupt here must not abandon the cleanups still to come.
                log.error(
                    "%s cleanup of %s failed: %s; finish by hand with: amibake gc --run-id %s",
                    self.prefix,
                    step.name,
                    exc or type(exc).__name__,
                    self.context.run_id,
                )
        return failures


@contextlib.contextmanager
def _no_interrupts() -> Iterator[None]:
    """While cleaning up, a Ctrl-C or a SIGTERM (`kill`, which terminate_as_interrupt turns into
    one) must not abandon the cleanup half-way: raised inside a step's cleanup, it stopped that
    step between deleting a fleet and terminating its instance. It is held, and delivered once
    the cleanup is over, so the run still stops as asked."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def still_cleaning(signum: int, frame: FrameType | None) -> None:
        held.append(signum)
        log.warning("still cleaning up; stopping once it is done (resources would leak if now)")

    previous = {signum: signal.signal(signum, still_cleaning) for signum in STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler if handler is not None else signal.SIG_DFL)
        if held:
            signal.raise_signal(held[0])


@contextlib.contextmanager
def terminate_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM and SIGHUP like Ctrl-C (STOP_SIGNALS), so `kill` or a closed terminal
    unwinds a run as cleanly as the keyboard does."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def raise_interrupt(signum: int, frame: FrameType | None) -> Any:
        raise KeyboardInterrupt

    others = [s for s in STOP_SIGNALS if s != signal.SIGINT]
    # A signal ignored when the process started (nohup's SIGHUP) stays ignored.
    previous = {
        s: signal.signal(s, raise_interrupt)
        for s in others
        if signal.getsignal(s) != signal.SIG_IGN
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
