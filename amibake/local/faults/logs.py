"""CloudWatch Logs' GetLogEvents as AWS answers it: empty pages, each with a new
nextForwardToken, before events that follow; and the last events of a stream arriving late.

Sources: the CloudWatch Logs API reference, GetLogEvents: a page may hold no events and still
not be the end ("an empty page ... may have more events"; keep reading with nextForwardToken),
and "If you have reached the end of the stream, it returns the same token you passed in" (the
only sign of the end). Log events are delivered asynchronously: an event put is not at once in
what GetLogEvents returns (PutLogEvents, and the awslogs driver's buffering for a container's
output).

Locally: a share of streams answer 1 to 3 empty pages on their first reads, and a share hold
their events from some point on back for 1 to 4 s after the stream is first read. Held events
are not in the stream yet, so a read that reaches them finds the stream's end as it stands
then: the token passed in comes back, as AWS answers before late events are ingested (a reader
that takes that end for the whole output loses the job's last lines). The tokens given are
moto's, written with one more leading zero: the same place in the stream, and a token unlike
the one passed in.
"""

from __future__ import annotations

from typing import Any

from amibake.local.faults import Behaviour, Faults, Reply, Request

EMPTY = 0.5  # share of streams whose first reads are empty pages
EMPTIES = (1, 3)  # how many
LATE = 0.4  # share of streams whose later events arrive late
LATE_S = (1.0, 4.0)  # how late, from the stream's first read


def _same_place(token: str | None) -> str:
    """A forward token for the place `token` stands for (moto's f/<index of the last event
    read>), spelt differently from it."""
    if not token:
        return f"f/{-1:057d}"  # before the first event
    digits = token[2:]
    return f"f/{int(digits):0{len(digits) + 1}d}"


def _after(faults: Faults, request: Request, reply: Reply) -> Reply:
    if request.service != "logs" or request.action != "GetLogEvents" or not reply.ok:
        return reply
    token = request.params.get("nextToken")
    forward = token.startswith("f/") if token else bool(request.params.get("startFromHead"))
    if not forward:
        return reply
    group, stream = request.params.get("logGroupName"), request.params.get("logStreamName")
    key = f"{request.account}\0{group}\0{stream}"
    n = faults.ordinal("log-stream", key)
    data: dict[str, Any] = reply.json()
    streams = faults.remember("logs:streams")
    with faults.lock:
        mine = streams.setdefault(key, {"empties": 0, "first": faults.now()})
    if faults.chance(EMPTY, "stream", n, "empty"):
        empties = round(faults.between(EMPTIES[0] - 0.49, EMPTIES[1] + 0.49, "stream", n, "count"))
        if mine["empties"] < empties:
            mine["empties"] += 1
            faults.count(BEHAVIOUR.name, "empty page")
            return reply.with_json({**data, "events": [], "nextForwardToken": _same_place(token)})
    events = data.get("events") or []
    if not events or not faults.chance(LATE, "stream", n, "late"):
        return reply
    start = int(str(data.get("nextBackwardToken", "b/0"))[2:])  # moto's: the page's first index
    if "hidden_from" not in mine:  # the point from which events are late, fixed on first sight
        mine["hidden_from"] = start + int(faults.draw("stream", n, "cut") * len(events))
    until = mine["first"] + faults.between(*LATE_S, "stream", n, "late-by")
    if faults.now() >= until:
        return reply
    kept = events[: max(0, mine["hidden_from"] - start)]
    if len(kept) == len(events):
        return reply
    faults.count(BEHAVIOUR.name, "late events held back")
    if not kept and token:  # the end for now: the token sent comes back
        return reply.with_json({**data, "events": [], "nextForwardToken": token})
    following = f"f/{start + len(kept) - 1:056d}" if kept else _same_place(token)
    return reply.with_json({**data, "events": kept, "nextForwardToken": following})


BEHAVIOUR = Behaviour(
    name="logs-pages",
    source="CloudWatch Logs API reference, GetLogEvents (empty pages; the end is the same token)",
    after=_after,
)
