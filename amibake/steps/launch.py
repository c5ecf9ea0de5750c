"""Steps that start the build instance: a launch template with the security defaults, then an
``instant`` EC2 Fleet over every size and subnet pool of the family."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from amibake import deadline
from amibake.cloud import tags
from amibake.cloud.calls import creating, every, ignore_missing, retry_on
from amibake.cloud.ec2 import (
    NEW_INSTANCE_VISIBLE_S,
    delete_fleet,
    terminate_instances,
    zones_offering,
)
from amibake.errors import CloudError
from amibake.runner import RunContext
from amibake.steps.preflight import (
    SPOT_ROLE_ERRORS,
    candidate_sizes,
    ensure_spot_role,
    spot_role_missing,
)
from amibake.steps.state import InstanceState

log = logging.getLogger("amibake")
# No capacity in the pools asked. UnfulfillableCapacity is what spot usually says (osbuild-composer
# #4220, #4413), InsufficientInstanceCapacity what on-demand and some spot requests say.
CAPACITY_ERRORS = {
    "InsufficientInstanceCapacity",
    "InsufficientCapacity",
    "UnfulfillableCapacity",
    "SpotMaxPriceTooLow",
}
# CreateFleet reports throttling inside its Errors with HTTP 200, where botocore's retries never
# see it (aws-parallelcluster-node#579): retried here, and never called "no capacity".
THROTTLING_ERRORS = {"RequestLimitExceeded", "Throttling", "ThrottlingException"}
# EC2's request-rate buckets refill within seconds, a busy account's within minutes.
THROTTLED_WITHIN_S = 180.0
# The launch template (or its key pair or group) made a moment ago and not yet known to EC2 Fleet
# (eventual consistency: tibanna#383 retries it): reported in Errors by an instant fleet, or
# raised. Retried for NOT_YET_VISIBLE_S, then named as what it is, not as "no capacity".
NOT_YET_VISIBLE = {
    "InvalidLaunchTemplateId.NotFound",
    "InvalidLaunchTemplateId.VersionNotFound",
    "InvalidLaunchTemplateName.NotFoundException",
    "InvalidKeyPair.NotFound",
    "InvalidGroup.NotFound",
}
NOT_YET_VISIBLE_S = 60.0
# The account's quotas, not the pools' capacity: retrying or another size will not help, and the
# user's fix is elsewhere (Service Quotas), so the error must not say "no capacity".
QUOTA_ERRORS = {"MaxSpotInstanceCountExceeded", "VcpuLimitExceeded", "InstanceLimitExceeded"}
# Spot pools run dry and refill within tens of seconds to minutes: five tries over the next size
# and every AZ, backing off 0.5, 1, 2, 4 s, before saying "no capacity" (a demo under the local
# cloud's fleet-errors met three dry tries in a row about once in twenty).
CAPACITY_ATTEMPTS = 5
CAPACITY_BACKOFF_S = 0.5


@dataclass
class Patience:
    """How long a refusal that passes is waited out: for `within_s` from when it was first met,
    backing off from CAPACITY_BACKOFF_S to `cap_s` between tries."""

    within_s: float
    cap_s: float
    since: float = 0.0
    tries: int = 0

    def pause(self) -> float | None:
        """The next pause, or None when the wait is over."""
        self.since = self.since or time.monotonic()
        if time.monotonic() - self.since >= self.within_s:
            return None
        self.tries += 1
        return min(CAPACITY_BACKOFF_S * 2.0 ** (self.tries - 1), self.cap_s)


class LaunchTemplate:
    name = "launch-template"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: InstanceState) -> None:
        mine = {**self.context.tags, tags.STEP: "launch", tags.LABEL: state.label}
        instance_tags = [
            tags.specification("instance", mine),
            tags.specification("volume", self.context.tags),
        ]
        with creating("the launch template"):
            created = self.context.cloud.ec2.create_launch_template(
                LaunchTemplateName=f"{self.context.run_id}-{state.slot}",
                ClientToken=f"{self.context.run_id}-{state.slot}-lt",
                LaunchTemplateData={
                    "ImageId": state.base_ami,
                    "KeyName": state.key_name,
                    # Its deadline from boot (amibake.deadline), and a power-off that ends it.
                    "UserData": deadline.user_data(self.context.cloud.config.instance_deadline_min),
                    "InstanceInitiatedShutdownBehavior": "terminate",
                    # amibake's SSH group and the account's; a public IPv4 asked for when SSH
                    # dials it (EC2 Fleet's overrides then put the interface in each subnet).
                    **self.context.network().interfaces(state.security_group_id),  # type: ignore[typeddict-item]
                    # IMDSv2 only: a token is required for every metadata call.
                    "MetadataOptions": {
                        "HttpTokens": "required",
                        "HttpEndpoint": "enabled",
                        "HttpPutResponseHopLimit": 1,
                    },
                    "BlockDeviceMappings": [
                        {
                            "DeviceName": state.root_device,
                            "Ebs": {
                                "Encrypted": True,
                                "DeleteOnTermination": True,
                                "VolumeType": "gp3",
                                "VolumeSize": 30,
                            },
                        }
                    ],
                    "TagSpecifications": instance_tags,  # type: ignore[typeddict-item]
                },
                TagSpecifications=[tags.specification("launch-template", self.context.tags)],  # type: ignore[list-item]
            )
            state.launch_template_id = created["LaunchTemplate"]["LaunchTemplateId"]
            self.context.created("launch-template", state.launch_template_id)

    def cleanup(self, state: InstanceState) -> None:
        if not state.launch_template_id:
            return
        ec2 = self.context.cloud.ec2
        ignore_missing(
            lambda: ec2.delete_launch_template(LaunchTemplateId=state.launch_template_id),
            unseen_for=self.context.unseen_for("launch-template", state.launch_template_id),
        )
        self.context.deleted("launch-template", state.launch_template_id)


class LaunchFleet:
    name = "launch"

    def __init__(self, context: RunContext) -> None:
        self.context = context
        # Every attempt's fleet, with when it was created: EC2 returns a FleetId even when
        # nothing launched, and each must be deleted, not only the last.
        self.fleets: list[tuple[str, float]] = []

    def _overrides(self, state: InstanceState) -> list[dict[str, Any]]:
        """Every candidate size in every subnet of the run (the default ones, or subnet_ids)
        whose AZ offers it: an override in an AZ without its type is refused with
        InvalidFleetConfiguration (us-east-1e has no c5a), and a region offering a type says
        nothing of each of its AZs."""
        ec2 = self.context.cloud.ec2
        subnets = self.context.network().subnets
        types = [state.family.instance_type(size) for size in candidate_sizes(state)]
        zones = self.context.shared(
            f"zones-offering:{','.join(types)}", lambda: zones_offering(ec2, types)
        )
        overrides = []
        for priority, instance_type in enumerate(types):
            for subnet in subnets or [{}]:
                if subnet and subnet["AvailabilityZone"] not in zones.get(instance_type, set()):
                    continue
                override: dict[str, Any] = {
                    "InstanceType": instance_type,
                    "Priority": float(priority),
                }
                if subnet:
                    override["SubnetId"] = subnet["SubnetId"]
                    override["AvailabilityZone"] = subnet["AvailabilityZone"]
                overrides.append(override)
        if not overrides:
            where = ", ".join(sorted(s["AvailabilityZone"] for s in subnets))
            which = "subnet_ids" if self.context.network().configured else "default subnets"
            raise CloudError(
                f"none of {', '.join(types)} is offered in the availability zones of the "
                f"{which} ({where})"
            )
        return overrides

    def _request(self, state: InstanceState, market: str, attempt: int) -> dict[str, Any]:
        overrides = self._overrides(state)
        state.pools_tried += [
            f"{o['InstanceType']}/{o.get('AvailabilityZone', '-')}/{market}" for o in overrides
        ]
        request: dict[str, Any] = {
            "Type": "instant",
            "ClientToken": f"{self.context.run_id}-{state.slot}-{market}-{attempt}",
            "LaunchTemplateConfigs": [
                {
                    "LaunchTemplateSpecification": {
                        "LaunchTemplateId": state.launch_template_id,
                        "Version": "$Latest",
                    },
                    "Overrides": overrides,
                }
            ],
            "TargetCapacitySpecification": {
                "TotalTargetCapacity": 1,
                "DefaultTargetCapacityType": market,
            },
            "TagSpecifications": [tags.specification("fleet", self.context.tags)],
        }
        if market == "spot":
            request["SpotOptions"] = {"AllocationStrategy": "capacity-optimized"}
        else:
            request["OnDemandOptions"] = {"AllocationStrategy": "prioritized"}
        return request

    def _launch(self, state: InstanceState, market: str, attempt: int) -> list[dict[str, str]]:
        """One CreateFleet: its fleet and instances journaled before anything can fail; its
        Errors returned."""
        request = self._request(state, market, attempt)
        with creating("the fleet"):
            response = retry_on(
                NOT_YET_VISIBLE,
                lambda: self.context.cloud.ec2.create_fleet(**request),
                within_s=NOT_YET_VISIBLE_S,
            )
            fleet_id = response.get("FleetId", "")
            if fleet_id:
                self.fleets.append((fleet_id, time.monotonic()))
                state.fleet_id = fleet_id
                self.context.created("fleet", fleet_id)
            for group in response.get("Instances", []):
                for instance_id in group.get("InstanceIds", []):
                    # Recorded first, before anything can fail: gc must be able to find it.
                    self.context.created("instance", instance_id)
                    if not state.instance_id:
                        state.instance_id = instance_id
                        state.instance_type = group.get("InstanceType", "")
                        state.market = market
        errors: list[dict[str, str]] = response.get("Errors", [])
        return errors

    def _pause(self, seconds: float) -> None:
        """Back off, but stop at once when the run is cancelled."""
        self.context.cancel.wait(seconds)
        self.context.check_cancel()

    def run(self, state: InstanceState) -> None:
        markets = ["spot"] if state.spot else ["on-demand"]
        if state.spot and state.on_demand_fallback:
            markets.append("on-demand")
        if state.spot:  # bake and fleet launch without build's preflight
            self.context.shared("spot-role", lambda: ensure_spot_role(self.context.cloud))
        errors: list[str] = []
        codes_seen: set[str] = set()
        started = time.monotonic()
        attempt = 0
        for market in markets:
            capacity_tries = 0
            unseen, throttled = Patience(NOT_YET_VISIBLE_S, 5.0), Patience(THROTTLED_WITHIN_S, 10.0)
            while True:
                self.context.check_cancel()
                refused = self._launch(state, market, attempt)
                attempt += 1
                if state.instance_id:
                    state.phases["launch"] = time.monotonic() - started
                    log.info("launched %s (%s, %s)", state.instance_id, state.instance_type, market)
                    for error in refused:  # pools refused beside the one that launched
                        log.debug("%s: %s", error.get("ErrorCode"), error.get("ErrorMessage"))
                    return
                codes = {e.get("ErrorCode", "") for e in refused}
                codes_seen |= codes
                errors += [f"{e.get('ErrorCode')}: {e.get('ErrorMessage', '')}" for e in refused]
                if codes & SPOT_ROLE_ERRORS:
                    raise spot_role_missing()
                if codes & NOT_YET_VISIBLE:
                    pause = unseen.pause()
                    if pause is None:
                        break
                    log.info("EC2 Fleet does not know the new launch template yet; retrying")
                    self._pause(pause)
                    continue
                if codes & THROTTLING_ERRORS and not codes & QUOTA_ERRORS:
                    pause = throttled.pause()
                    if pause is not None:
                        log.info("CreateFleet throttled (RequestLimitExceeded); retrying")
                        self._pause(pause)
                        continue
                if not codes & CAPACITY_ERRORS:
                    break
                capacity_tries += 1
                if capacity_tries >= CAPACITY_ATTEMPTS:
                    break
                self._pause(min(CAPACITY_BACKOFF_S * 2 ** (capacity_tries - 1), 5.0))
        pools = ", ".join(dict.fromkeys(state.pools_tried))
        hint = (
            ""
            if state.on_demand_fallback or not state.spot
            else ("; allow on-demand with --on-demand-fallback")
        )
        refused_all = "; ".join(dict.fromkeys(errors))
        if codes_seen & QUOTA_ERRORS:
            raise CloudError(
                f"{state.family.name}: the account's EC2 quota refused the launch "
                f"({refused_all}): raise the vCPU quota for {' and '.join(markets)} instances in "
                f"Service Quotas (EC2), or end instances that hold it{hint}"
            )
        if codes_seen & NOT_YET_VISIBLE and not codes_seen & CAPACITY_ERRORS:
            raise CloudError(
                f"{state.family.name}: EC2 Fleet did not find the run's launch template "
                f"{state.launch_template_id} for {NOT_YET_VISIBLE_S:.0f}s ({refused_all}): "
                "if it was deleted meanwhile (amibake gc?), run again"
            )
        if codes_seen and codes_seen <= THROTTLING_ERRORS:
            raise CloudError(
                f"{state.family.name}: EC2 throttled every launch for {THROTTLED_WITHIN_S:.0f}s "
                f"(RequestLimitExceeded): the account's request rate is spent; try again later"
            )
        other = codes_seen - CAPACITY_ERRORS - THROTTLING_ERRORS - NOT_YET_VISIBLE
        # An override EC2 will not launch (Unsupported, InvalidParameterValue, ...) and no pool
        # short of capacity; beside pools that were, a type missing in one AZ is common.
        if other and not codes_seen & CAPACITY_ERRORS:
            raise CloudError(
                f"EC2 Fleet refused {state.family.name} after trying {pools}, not for capacity "
                f"({refused_all}): {', '.join(sorted(other))} is what to look at"
            )
        raise CloudError(
            f"no capacity for {state.family.name} after trying {pools}: "
            f"{refused_all or 'no instance returned'}{hint}"
        )

    def cleanup(self, state: InstanceState) -> None:
        ec2 = self.context.cloud.ec2
        fleets = list(self.fleets)
        if state.fleet_id and state.fleet_id not in {f for f, _ in fleets}:
            fleets.append((state.fleet_id, time.monotonic()))
        failures = []
        for fleet_id, created in fleets:
            try:
                delete_fleet(ec2, fleet_id, unseen_for_s=unseen_for(created))
                self.context.deleted("fleet", fleet_id)
            except Exception as exc:  # the others, and the instances, are still to go
                failures.append(f"fleet {fleet_id}: {exc}")
        known = [state.instance_id] if state.instance_id else []
        terminate_launched(self.context, "launch", state.label, known)
        if failures:
            raise CloudError("; ".join(failures))


def unseen_for(created: float) -> float:
    """How much longer a resource created at `created` (time.monotonic()) may be NotFound."""
    return max(0.0, NEW_INSTANCE_VISIBLE_S - (time.monotonic() - created))


def terminate_launched(context: RunContext, step: str, label: str, known: list[str]) -> None:
    """Terminate what a step launched: the ids it got back, and anything carrying its tags;
    journaled as deleted once EC2 describes each terminated (a NotFound right after the launch
    is EC2 not seeing it yet: the instance may well be running).

    The tags cover an instance whose id never reached the step (a failure between the launch
    call returning and the id being stored), so even then nothing outlives the run.
    """
    ec2 = context.cloud.ec2
    filters = [
        {"Name": f"tag:{tags.RUN_ID}", "Values": [context.run_id]},
        {"Name": f"tag:{tags.STEP}", "Values": [step]},
        {"Name": f"tag:{tags.LABEL}", "Values": [label]},
        {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]},
    ]
    found = [
        i["InstanceId"]
        for r in every(ec2, "describe_instances", "Reservations", Filters=filters)
        for i in r["Instances"]
    ]
    # A known id was launched by this run: NotFound is EC2 not seeing it yet. One found by
    # describing is seen already.
    ids = {i: 0.0 for i in found} | {i: NEW_INSTANCE_VISIBLE_S for i in known}
    if not ids:
        return
    terminate_instances(ec2, dict(sorted(ids.items())))
    for instance_id in sorted(ids):
        context.deleted("instance", instance_id)
