"""Spot takes instances back: an interruption notice, then, two minutes later, the instance
terminated with Server.SpotInstanceTermination. It can come at any time after launch: while the
product connects, stages or installs, not only while a workload runs.

Sources: the EC2 user guide, "Spot Instance interruption notices" (the instance-action on IMDS,
two minutes before) and "Spot Instance interruptions" (the state reason
Server.SpotInstanceTermination). Locally the notice comes within seconds of launch and the
termination five seconds after it (amibake.local.gateway RECLAIM_AFTER_S), same order of events.
"""

from __future__ import annotations

import logging
import re
import threading

from amibake.local.faults import Behaviour, Faults, Reply, Request

log = logging.getLogger("amibake.local")
# Share of spot instances taken back: a storm (AWS's Spot Instance Advisor puts most pools under
# 5% a month), so that every run meets some.
RECLAIMED = 0.1
NOTICE_AFTER_S = (0.2, 3.0)  # from launch: before the first replicate, often
_INSTANCE = re.compile(r"<(?:instanceId|item)>(i-[0-9a-f]+)</(?:instanceId|item)>")


def _spot(request: Request) -> bool:
    if request.action == "CreateFleet":
        return (
            str(request.params.get("TargetCapacitySpecification.DefaultTargetCapacityType"))
            == "spot"
        )
    return str(request.params.get("InstanceMarketOptions.MarketType", "")) == "spot"


def _after(faults: Faults, request: Request, reply: Reply) -> Reply:
    if (
        request.service != "ec2"
        or not reply.ok
        or request.action not in ("RunInstances", "CreateFleet")
    ):
        return reply
    if not _spot(request):
        return reply
    for instance in sorted(set(_INSTANCE.findall(reply.body.decode()))):
        n = faults.ordinal("spot-instance", instance)
        if not faults.chance(RECLAIMED, "spot", n, "reclaimed"):
            continue
        faults.count(BEHAVIOUR.name, "spot instance reclaimed")
        delay = faults.between(*NOTICE_AFTER_S, "spot", n, "notice")
        timer = threading.Timer(delay, _reclaim, (faults, instance))
        timer.daemon = True
        timer.start()
    return reply


def _reclaim(faults: Faults, instance: str) -> None:
    try:
        faults.hooks["reclaim"](instance)
    except Exception as exc:  # already terminated by its run: nothing to take back
        log.info("spot reclaim of %s skipped: %s", instance, exc)


BEHAVIOUR = Behaviour(
    name="spot-reclaim",
    source="EC2 user guide: Spot Instance interruption notices; Spot Instance interruptions",
    after=_after,
)
