"""A run from outside: what it has done (`fleet status`), and stopping it with everything it
created (`fleet kill`), whether its controller is still alive or was SIGKILLed."""

from __future__ import annotations

import logging
import os
import signal
import socket
import time
from collections.abc import Callable
from typing import Any

import botocore.exceptions

from amibake import batch, cost, gc, inventory
from amibake.cloud import Cloud
from amibake.cloud.calls import error_code
from amibake.errors import UserError
from amibake.journal import Journal
from amibake.procs import process_alive, same_process, started
from amibake.runner import RunContext
from fleet.results import Results

log = logging.getLogger("amibake")
# The controller's own cleanup: terminating and waiting on instances, or on Batch jobs (up to
# amibake.batch.JOBS_STOPPING_S) and then deleting their compute environment.
STOP_TIMEOUT_S = 300.0
# How long a SIGKILLed controller has to be gone: at once, unless it is in uninterruptible sleep
# (a hung disk or NFS read), where the kill waits until the call returns.
KILL_WAIT_S = 30.0
# How long a controller started on another machine is taken to run: as long as gc keeps its
# resources (their amibake:expires).
ELSEWHERE_S = inventory.TAG_TTL.total_seconds()


# Events that say whether a run is running: a controller started ("controller": a bench's or a
# tune trial's instances, "searching": a tune search), or the run ended. Others are bookkeeping.
STARTED = ("claimed", "controller", "searching")
ENDED = ("finished", "failed", "stopped", "killed")


def this_process() -> dict[str, Any]:
    """What a controller's event says of the process running it: pid, when it started (a pid
    another process takes later is not taken for the controller: fleet kill signalled it) and
    the machine."""
    pid = os.getpid()
    return {"pid": pid, "pid_started": started(pid), "host": socket.gethostname()}


def _live(detail: dict[str, Any]) -> bool:
    """The event's process still runs on this machine (and is the one that wrote it)."""
    if detail.get("host") != socket.gethostname() or "pid" not in detail:
        return False
    return same_process(int(detail["pid"]), detail.get("pid_started"))


def _identity(detail: dict[str, Any]) -> tuple[Any, Any, Any]:
    """Which process wrote the event: its pid, that process's start and the machine."""
    return detail.get("pid"), detail.get("pid_started"), detail.get("host")


Events = list[tuple[float, str, dict[str, Any]]]


def _unreleased(events: Events, counts: Callable[[float, dict[str, Any]], bool]) -> list[int]:
    """The indexes of the starts that `counts` (given the event's time and detail) and whose
    process has not released the run since (a resume that stopped before its controller
    started: a price missing, a build failed, the cost not approved; its process may live on)."""
    released = [(i, _identity(d)) for i, (_, k, d) in enumerate(events) if k == "released"]
    return [
        i
        for i, (at, kind, detail) in enumerate(events)
        if kind in STARTED
        and counts(at, detail)
        and not any(j > i and who == _identity(detail) for j, who in released)
    ]


def _standing(events: Events) -> list[int]:
    """The starts still standing: those whose process lives on this machine, unreleased."""
    return _unreleased(events, lambda at, detail: _live(detail))


def _last_end(events: Events) -> int:
    return max((i for i, (_, kind, _) in enumerate(events) if kind in ENDED), default=-1)


def controller(results: Results, run_id: str) -> dict[str, Any] | None:
    """The run's controller, if it is alive on this machine: of the controllers started since
    the run last ended, the first still standing. Two resumes that claim the run at once (each
    found none) both read the same one back: the first to claim runs, the other refuses."""
    events = results.events(run_id)
    standing = [i for i in _standing(events) if i > _last_end(events)]
    return events[standing[0]][2] if standing else None


def elsewhere(results: Results, run_id: str) -> dict[str, Any] | None:
    """A controller of the run started on another machine (a results dir shared between
    machines) since the run last ended, within the time its resources' amibake:expires gives
    it, and not released: whether it lives cannot be told from here. None when there is none."""
    events = results.events(run_id)
    here = socket.gethostname()

    def away(at: float, detail: dict[str, Any]) -> bool:
        return detail.get("host") not in (None, here) and time.time() - at < ELSEWHERE_S

    found = [i for i in _unreleased(events, away) if i > _last_end(events)]
    return {**events[found[0]][2], "at": events[found[0]][0]} if found else None


def _refuse_elsewhere(results: Results, run_id: str, doing: str) -> None:
    found = elsewhere(results, run_id)
    if found is not None:
        when = time.strftime("%Y-%m-%d %H:%M", time.gmtime(found["at"]))
        raise UserError(
            f"run {run_id} was started on {found['host']} (pid {found.get('pid')}, {when} UTC) "
            f"and has not ended as far as its record says: {doing} it there (taken for dead "
            f"{ELSEWHERE_S / 3600:.0f}h after it started)"
        )


def _lifecycle(events: Events) -> list[tuple[float, str]]:
    """The run's starts and ends, but a claim no longer standing: it ran nothing, and made a
    finished run read "stopped" and `fleet kill` record it killed."""
    standing = set(_standing(events))
    return [
        (at, kind)
        for i, (at, kind, _) in enumerate(events)
        if kind in ENDED or (kind in STARTED and (kind != "claimed" or i in standing))
    ]


# The runs this process has claimed (take_over), until it releases them.
_claimed: list[tuple[Results, str]] = []


def release_claims() -> None:
    """This process gives up the runs it claimed, as the command that claimed them ends (its
    own controller's end says the rest): in a process that lives on (a notebook, a test),
    a claim left standing refused every later resume of the run."""
    while _claimed:
        results, run_id = _claimed.pop()
        results.event(run_id, "released", **this_process())


def type_errors(results: Results, run_id: str) -> dict[str, str]:
    """Why each type that failed as a whole failed (at launch, staging, install), as the run's
    last controller recorded it when it ended."""
    errors: dict[str, str] = {}
    for _, kind, detail in results.events(run_id):
        if kind in ("failed", "finished"):
            errors = dict(detail.get("errors") or {})  # the last controller's word
    return errors


def status(results: Results, run_id: str) -> dict[str, Any]:
    from fleet.spec import BenchSpec

    record = results.require(run_id)
    # The run's state is its last lifecycle event (a tune search's "spent" per trial is not).
    events = results.events(run_id)
    lifecycle = _lifecycle(events)
    last = lifecycle[-1][1] if lifecycle else "created"
    # When it started and ended, and what it spent, each of its controllers together (a bench
    # records its spend as it ends; a killed controller's is unknown: it never said).
    when = {
        "created": record["created"],
        "ended": lifecycle[-1][0] if lifecycle and last in ENDED else None,
    }
    live = controller(results, run_id)
    state = "running" if last in STARTED else last
    if state == "running" and live is None:
        state = "stopped"  # the controller died without a word: SIGKILL, a crash, a reboot
    rows = results.replicates(run_id)
    replicates = BenchSpec.from_json(record["spec"]).planned if record["kind"] == "bench" else 0
    done = rows[rows.state.isin(["ok", "failed"])] if len(rows) else rows
    # Each planned replicate once: a spot rerun's warm-ups, run again on the new instance, made
    # "38/36 replicates finished".
    if len(done):
        done = done.drop_duplicates(["instance_type", "build", "replicate", "warmup"])
    per_type: dict[str, dict[str, int]] = {}
    for _, row in rows.iterrows():
        counts = per_type.setdefault(row.instance_type, {"ok": 0, "failed": 0, "interrupted": 0})
        counts[row.state] = counts.get(row.state, 0) + 1
    if record["kind"] == "tune":
        search = _search(results, run_id, record["spec"])
        if state == "finished" and search["best"] is None:
            state = "failed"  # every trial failed or was infeasible: nothing was found
        return {
            "run_id": run_id,
            "kind": "tune",
            "state": state,
            **when,
            "controller_pid": live["pid"] if live else None,
            "note": record["note"],
            **search,
        }
    spent = sum(d.get("spent", 0.0) for _, k, d in events if k in ENDED)
    if state == "running" and len(rows):
        # A controller records its spend as it ends: while it runs, "$0.0000 spent" beside its
        # own progress line's dollars. Its replicates' time at their price, at least, is known.
        priced = rows.dropna(subset=["seconds", "price_usd_hour"])
        spent += float((priced.seconds * priced.price_usd_hour).sum()) / 3600
    # Every type asked for is shown, failures first: one that failed as a whole (no replicate
    # row) was missing from status altogether.
    lost = {
        t: e for t, e in type_errors(results, run_id).items() if not per_type.get(t, {}).get("ok")
    }
    per_type = {
        **{t: {"ok": 0, "failed entirely": 1} for t in lost if t not in per_type},
        **dict(sorted(per_type.items(), key=lambda kv: kv[1].get("ok", 0) > 0)),
    }
    return {
        "run_id": run_id,
        "kind": record["kind"],
        "state": state,
        **when,
        "spent_usd": spent,
        "spent_so_far": state == "running",
        "planned": replicates,
        "finished": len(done),
        "interrupted": int((rows.state == "interrupted").sum()) if len(rows) else 0,
        "failed": int((rows.state == "failed").sum()) if len(rows) else 0,
        "controller_pid": live["pid"] if live else None,
        "types": per_type,
        "type_errors": lost,
        "note": record["note"],
    }


def _search(results: Results, run_id: str, spec: dict[str, Any]) -> dict[str, Any]:
    """A tune run's progress: trials asked and finished (by state) against its budget, money
    spent, the best trial so far and the recommendation through the noise (what `fleet tune`
    and `fleet report` name: the best trial alone is the luckiest, winner's curse)."""
    from fleet.search.record import (
        budget_changes,
        in_own_terms,
        recommendation,
        recommendation_text,
        run_spend,
    )

    trials = results.trials(run_id)
    final = trials[trials.state != "asked"] if len(trials) else trials
    ok = final[final.state == "ok"] if len(final) else final
    top = ok.loc[ok.loss.astype(float).idxmin()] if len(ok) else None
    objective = str(spec.get("objective", "runtime"))
    chosen = recommendation(results, run_id) if top is not None else None
    return {
        "trials_budget": int({**spec, **budget_changes(results, run_id)}.get("trials", 20)),
        "trials_asked": int((trials.state == "asked").sum()) if len(trials) else 0,
        "trials_finished": {str(k): int(n) for k, n in final.state.value_counts().items()},
        # The trials, and the gain measured after them (fleet/gain.py).
        "spent_usd": run_spend(results, run_id),
        "best_loss": float(top.loss) if top is not None else None,
        "best": in_own_terms(objective, float(top.loss), top.metric) if top is not None else None,
        "recommended": None if chosen is None else recommendation_text(objective, chosen),
    }


def status_line(s: dict[str, Any]) -> str:
    """A run in `fleet status`'s list: id, kind, state and how far it got."""
    if s["kind"] == "tune":
        failed = s["trials_finished"].get("failed", 0)
        progress = f"{sum(s['trials_finished'].values())}/{s['trials_budget']} trials" + (
            f" ({failed} failed)" if failed else ""
        )
    else:
        progress = f"{s['finished']}/{s['planned']} replicates"
    return (
        f"{s['run_id']}  {s['kind']:5}  {s['state']:11}  {_when(s['created'])}  "
        f"{cost.dollars(s['spent_usd']):>9}  {progress}"
    )


def _when(at: float) -> str:
    """A run's date and time as people read them here: local time, to the minute."""
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(at))


def _span(s: dict[str, Any]) -> str:
    """Started, and ended (or for how long it has run)."""
    started = _when(s["created"])
    if s["ended"] is None and s["state"] == "stopped":
        return f"started {started}; its controller stopped without a word"
    if s["ended"] is None:
        return f"started {started}, running for {(time.time() - s['created']) / 60:.0f} min"
    return (
        f"started {started}, ended {_when(s['ended'])} ({(s['ended'] - s['created']) / 60:.1f} min)"
    )


def status_text(s: dict[str, Any]) -> str:
    if s["kind"] == "tune":
        finished = s["trials_finished"]
        tally = ", ".join(f"{n} {state}" for state, n in finished.items())
        lines = [
            f"run {s['run_id']} (tune): {s['state']}; {sum(finished.values())}/"
            f"{s['trials_budget']} trials finished{f' ({tally})' if tally else ''}, "
            f"{s['trials_asked']} asked; {cost.dollars(s['spent_usd'])} spent"
            + ("; none feasible yet" if s["recommended"] is None else ""),
            f"  {_span(s)}",
        ]
        if s["recommended"] is not None:
            lines.append(f"  recommended so far: {s['recommended']}")
        if s["state"] == "stopped":
            lines.append(f"finish it with: fleet tune --resume {s['run_id']}")
        return "\n".join(lines)
    lines = [
        f"run {s['run_id']} ({s['kind']}): {s['state']}; {s['finished']}/{s['planned']} "
        f"replicates finished, {s['failed']} failed, {s['interrupted']} interrupted and rerun; "
        f"{'at least ' if s.get('spent_so_far') else ''}{cost.dollars(s['spent_usd'])} spent"
        f"{' so far (its replicates; the whole when it ends)' if s.get('spent_so_far') else ''}",
        f"  {_span(s)}",
    ]
    for instance_type, counts in s["types"].items():
        why = s.get("type_errors", {}).get(instance_type)
        lines.append(
            f"  {instance_type}: "
            + ", ".join(f"{n} {what}" for what, n in counts.items() if n or what == "ok")
            + (f" (FAILED: {why})" if why else "")
        )
    if s["state"] == "stopped":
        lines.append(f"finish it with: fleet bench --resume {s['run_id']}")
    return "\n".join(lines)


def take_over(cloud: Cloud | None, results: Results, run_id: str) -> None:
    """Before a controller starts on a recorded run: refuse while another one runs it (both
    would run the same replicates or ask the same trials), then remove what a dead one left
    (a SIGKILL, a crash) so that nothing it launched outlives it. No cloud: nothing to remove
    (a replayed search)."""
    me = this_process()
    _refuse_another(results, run_id, me)
    # Its sweep would take another machine's live controller's instances and files.
    _refuse_elsewhere(results, run_id, "resume")
    # Claimed before anything else: builds and preflight take minutes before the controller's
    # own event, and a second resume (or fleet kill) found no controller then, swept this
    # one's live build and ran the same replicates. Read back, as two may claim at once.
    results.event(run_id, "claimed", **me)
    _claimed.append((results, run_id))
    _refuse_another(results, run_id, me)
    if cloud is None:
        return
    deleted, failures = sweep(cloud, results, run_id)
    if deleted:
        log.info("[%s] removed what an earlier controller left: %s", run_id, "; ".join(deleted))
    if failures:
        raise UserError(f"could not remove what an earlier controller left: {'; '.join(failures)}")


def _refuse_another(results: Results, run_id: str, me: dict[str, Any]) -> None:
    live = controller(results, run_id)
    # this very process's own claim, from a run of it before, is no other controller
    if live is not None and _identity(live) != _identity(me):
        raise UserError(
            f"run {run_id} is running already (pid {live['pid']}): follow it with fleet status "
            f"{run_id}, or stop it with fleet kill {run_id}"
        )


def kill(cloud: Cloud, results: Results, run_id: str) -> dict[str, Any]:
    """Stop the controller (SIGTERM: it unwinds as on Ctrl-C), then remove whatever any of the
    run's controllers left, found by tag and journal as `amibake gc` does."""
    live = controller(results, run_id)
    said = "not running"
    if live is None:
        _refuse_elsewhere(results, run_id, "kill")  # no signal reaches it from here
    if live is not None:
        pid = int(live["pid"])
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        while process_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if process_alive(pid):
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + KILL_WAIT_S
            while process_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.2)
            if process_alive(pid):
                # Its resources count as a live run's (gc keeps them) for as long as it is
                # there: swept now, nothing would go, and "killed" would be said of a run
                # still holding instances.
                return {
                    "run_id": run_id,
                    "controller": f"pid {pid} did not exit at SIGKILL",
                    "state": "running",
                    "deleted": [],
                    "failures": [
                        f"pid {pid} did not exit within {KILL_WAIT_S:.0f}s of SIGKILL (in "
                        f"uninterruptible sleep, state D in `ps -o stat= -p {pid}`: a hung disk "
                        f"or network mount), so its run's resources were left: run fleet kill "
                        f"{run_id} again once it is gone"
                    ],
                }
            said = f"pid {pid} did not stop in {STOP_TIMEOUT_S:.0f}s and was killed"
        else:
            said = f"pid {pid} stopped"
    deleted, failures = sweep(cloud, results, run_id)
    # A run that had ended (finished, failed, stopped) keeps its outcome: kill then only swept
    # what it may have left, and "killed" would rewrite what happened.
    lifecycle = [k for _, k in _lifecycle(results.events(run_id))]
    ended = bool(lifecycle) and lifecycle[-1] in ENDED and live is None
    results.event(run_id, "swept" if ended else "killed", controller=said, deleted=len(deleted))
    return {
        "run_id": run_id,
        "controller": said,
        "state": lifecycle[-1] if ended else "killed",
        "deleted": deleted,
        "failures": failures,
    }


# The events that name an amibake run of a fleet run's: its controllers' (bench.measure), and the
# builds it ran for its artifacts (a bench's, a tune's trials'), each recorded as it opens.
AMIBAKE_RUNS = ("controller", "build")


def recording_builds(
    results: Results, run_id: str, opened: list[str]
) -> Callable[[RunContext], None]:
    """An on_open for amibake's build pipeline: the build's run recorded in the fleet run's,
    before it makes anything, so that `fleet kill` and a resume sweep what a SIGKILL left of
    it (they found only the controllers', and a build's instance ran on until `amibake gc`);
    its id appended to `opened`, for what its instances cost."""

    def record(context: RunContext) -> None:
        results.event(run_id, "build", amibake_run=context.run_id)
        opened.append(context.run_id)

    return record


def sweep(cloud: Cloud, results: Results, run_id: str) -> tuple[list[str], list[str]]:
    """Delete what the run's controllers left (found by tag and journal, as `amibake gc`);
    returns what was deleted and what could not be."""
    journal = Journal(cloud.config.results_dir / "journal.sqlite")
    deleted: list[str] = []
    failures: list[str] = []
    try:
        for amibake_run in sorted(
            {d["amibake_run"] for _, k, d in results.events(run_id) if k in AMIBAKE_RUNS}
        ):
            leftovers = gc.find(cloud, journal, run_id=amibake_run)
            gone, failed = gc.delete(cloud, journal, leftovers)
            deleted += [x.describe() for x in gone]
            failures += failed
    finally:
        journal.close()
    deleted += _sweep_bucket(cloud, results, run_id)
    return deleted, failures


def _sweep_bucket(cloud: Cloud, results: Results, run_id: str) -> list[str]:
    """The run's files in the Batch job bucket (payloads, monitor CSVs), if it used Batch: a
    bench's, or a tune's, whose trials are measured as its own run's jobs (fleet/{tune}/...)."""
    from fleet.spec import BenchSpec

    record = results.require(run_id)
    if record["kind"] == "bench":
        executor = BenchSpec.from_json(record["spec"]).executor
    else:
        executor = str(record["spec"].get("executor", "ssh"))
    if executor != "batch":
        return []
    bucket = batch.job_bucket(cloud)
    if bucket is None or not batch.check_owned(cloud, bucket):
        return []
    try:
        count = batch.delete_prefix(cloud, bucket, f"fleet/{run_id}/")
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) == "NoSuchBucket":
            return []
        raise
    return [f"{count} files under s3://{bucket}/fleet/{run_id}/"] if count else []
