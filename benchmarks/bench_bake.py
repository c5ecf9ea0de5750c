"""Issue 4's figures: bake wall time by phase, and the tool's own share of it."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from amibake import pipelines
from amibake.cloud import Cloud
from amibake.remote import Remote
from benchmarks import host_family

FIXTURES = Path(__file__).resolve().parent.parent / "tests" / "recipes"
BAKES = 3


class Waits:
    """Time spent waiting on the cloud (API calls) and on the instance (remote operations)."""

    def __init__(self, cloud: Cloud) -> None:
        self.api = 0.0
        self.remote = 0.0
        self.polling = 0.0  # whole wait loops (their calls and sleeps), counted once
        self._depth = 0
        self._started: dict[int, float] = {}
        self._undo: list[Callable[[], None]] = []
        from amibake.cloud import calls, reach
        from amibake.steps import image, launch, remote_build

        for module, name in (
            (calls, "wait_until"),
            (launch, "wait_until"),
            (image, "wait_until"),
            (image, "reach"),
            (remote_build, "reach"),
            (reach, "reach"),
        ):
            original = getattr(module, name)
            setattr(module, name, self._polled(original))
            self._undo.append(lambda m=module, n=name, o=original: setattr(m, n, o))
        for service in ("ec2", "ssm", "sts"):
            events = cloud.client(service).meta.events
            events.register("before-call.*.*", self._before)
            events.register("after-call.*.*", self._after)
            self._undo.append(
                lambda e=events: (
                    e.unregister("before-call.*.*", self._before),
                    e.unregister("after-call.*.*", self._after),
                )
            )
        for name in ("run", "put", "get"):
            original = getattr(Remote, name)
            setattr(Remote, name, self._timed(original))
            self._undo.append(lambda n=name, o=original: setattr(Remote, n, o))

    def _before(self, context: dict[str, Any], **_: Any) -> None:
        self._started[id(context)] = time.perf_counter()

    def _after(self, context: dict[str, Any], **_: Any) -> None:
        spent = time.perf_counter() - self._started.pop(id(context), time.perf_counter())
        if self._depth == 0:
            self.api += spent

    def _polled(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def polled(*args: Any, **kw: Any) -> Any:
            started = time.perf_counter()
            self._depth += 1
            try:
                return original(*args, **kw)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.polling += time.perf_counter() - started

        return polled

    def _timed(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def timed(remote: Remote, *args: Any, **kw: Any) -> Any:
            started = time.perf_counter()
            try:
                return original(remote, *args, **kw)
            finally:
                if self._depth == 0:
                    self.remote += time.perf_counter() - started

        return timed

    def close(self) -> None:
        for undo in self._undo:
            undo()


def run(cloud: Cloud) -> dict[str, Any]:
    request = pipelines.BuildRequest([host_family()], "trivial", "large", recipes_dir=FIXTURES)
    assert pipelines.build(cloud, request)[0].ok
    walls, shares, phases = [], [], []
    for _ in range(BAKES):
        waits = Waits(cloud)
        started = time.perf_counter()
        try:
            outcome = pipelines.bake(cloud, pipelines.BakeRequest(families=[host_family()]))[0]
        finally:
            waits.close()
        wall = time.perf_counter() - started
        assert outcome.ok, outcome.error
        walls.append(wall)
        shares.append((wall - waits.api - waits.remote - waits.polling) / wall)
        phases.append(outcome.state.phases)  # type: ignore[union-attr]
    names = sorted({k for p in phases for k in p})
    share = statistics.median(shares)
    return {
        "bake_wall_median_s": round(statistics.median(walls), 3),
        "phases_median_s": {
            n: round(statistics.median(p.get(n, 0.0) for p in phases), 3) for n in names
        },
        "tool_own_share": round(share, 3),
        "tool_own_share_goal": 0.05,
        "tool_own_share_goal_met": share < 0.05,
        "bakes": BAKES,
    }
