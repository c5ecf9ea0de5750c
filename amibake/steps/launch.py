"""Steps that start the build instance: a launch template with the security defaults, then an
``instant`` EC2 Fleet over every size and subnet pool of the family."""

from __future__ import annotations

import logging
import time
from typing import Any

import botocore.exceptions

from amibake.cloud import tags
from amibake.cloud.calls import error_code, ignore_missing, retry_on, wait_until
from amibake.errors import CloudError
from amibake.runner import RunContext
from amibake.steps.preflight import candidate_sizes
from amibake.steps.state import InstanceState

log = logging.getLogger("amibake")
CAPACITY_ERRORS = {"InsufficientInstanceCapacity", "InsufficientCapacity", "SpotMaxPriceTooLow"}
# The account's quotas, not the pools' capacity: retrying or another size will not help, and the
# user's fix is elsewhere (Service Quotas), so the error must not say "no capacity".
QUOTA_ERRORS = {"MaxSpotInstanceCountExceeded", "VcpuLimitExceeded", "InstanceLimitExceeded"}
CAPACITY_ATTEMPTS = 3
CAPACITY_BACKOFF_S = 0.5


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
        created = self.context.cloud.ec2.create_launch_template(
            LaunchTemplateName=f"{self.context.run_id}-{state.slot}",
            ClientToken=f"{self.context.run_id}-{state.slot}-lt",
            LaunchTemplateData={
                "ImageId": state.base_ami,
                "KeyName": state.key_name,
                "SecurityGroupIds": [state.security_group_id],
                # IMDSv2 only: a token is required for every metadata call.
                "MetadataOptions": {
                    "HttpTokens": "required",
                    "HttpEndpoint": "enabled",
                    "HttpPutResponseHopLimit": 1,
                },
                "BlockDeviceMappings": [
                    {
                        "DeviceName": "/dev/xvda",
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
            lambda: ec2.delete_launch_template(LaunchTemplateId=state.launch_template_id)
        )
        self.context.deleted("launch-template", state.launch_template_id)


class LaunchFleet:
    name = "launch"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def _overrides(self, state: InstanceState) -> list[dict[str, Any]]:
        ec2 = self.context.cloud.ec2
        subnets = self.context.shared(
            "default-subnets",
            lambda: ec2.describe_subnets(Filters=[{"Name": "default-for-az", "Values": ["true"]}])[
                "Subnets"
            ],
        )
        overrides = []
        for priority, size in enumerate(candidate_sizes(state)):
            for subnet in subnets or [{}]:
                override: dict[str, Any] = {
                    "InstanceType": state.family.instance_type(size),
                    "Priority": float(priority),
                }
                if subnet:
                    override["SubnetId"] = subnet["SubnetId"]
                    override["AvailabilityZone"] = subnet["AvailabilityZone"]
                overrides.append(override)
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

    def run(self, state: InstanceState) -> None:
        markets = ["spot"] if state.spot else ["on-demand"]
        if state.spot and state.on_demand_fallback:
            markets.append("on-demand")
        ec2 = self.context.cloud.ec2
        errors: list[str] = []
        codes_seen: set[str] = set()
        started = time.monotonic()
        for market in markets:
            for attempt in range(CAPACITY_ATTEMPTS):
                self.context.check_cancel()
                response = ec2.create_fleet(**self._request(state, market, attempt))
                fleet_id = response.get("FleetId", "")
                if fleet_id:
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
                if state.instance_id:
                    state.phases["launch"] = time.monotonic() - started
                    log.info("launched %s (%s, %s)", state.instance_id, state.instance_type, market)
                    return
                codes = {e.get("ErrorCode", "") for e in response.get("Errors", [])}
                codes_seen |= codes
                errors += [
                    f"{e.get('ErrorCode')}: {e.get('ErrorMessage', '')}"
                    for e in response.get("Errors", [])
                ]
                if not codes & CAPACITY_ERRORS:
                    break
                if attempt < CAPACITY_ATTEMPTS - 1:
                    time.sleep(min(CAPACITY_BACKOFF_S * 2**attempt, 5.0))
        pools = ", ".join(dict.fromkeys(state.pools_tried))
        hint = (
            ""
            if state.on_demand_fallback or not state.spot
            else ("; allow on-demand with --on-demand-fallback")
        )
        refused = "; ".join(dict.fromkeys(errors))
        if codes_seen & QUOTA_ERRORS:
            raise CloudError(
                f"{state.family.name}: the account's EC2 quota refused the launch ({refused}): "
                f"raise the vCPU quota for {' and '.join(markets)} instances in Service Quotas "
                f"(EC2), or end instances that hold it{hint}"
            )
        raise CloudError(
            f"no capacity for {state.family.name} after trying {pools}: "
            f"{refused or 'no instance returned'}{hint}"
        )

    def cleanup(self, state: InstanceState) -> None:
        ec2 = self.context.cloud.ec2
        if state.fleet_id:
            delete_fleet(ec2, state.fleet_id)
            self.context.deleted("fleet", state.fleet_id)
        known = [state.instance_id] if state.instance_id else []
        terminate_launched(self.context, "launch", state.label, known)


def terminate_launched(context: RunContext, step: str, label: str, known: list[str]) -> None:
    """Terminate what a step launched: the ids it got back, and anything carrying its tags.

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
        for r in ec2.describe_instances(Filters=filters)["Reservations"]
        for i in r["Instances"]
    ]
    ids = sorted(set(known) | set(found))
    if not ids:
        return
    ignore_missing(lambda: ec2.terminate_instances(InstanceIds=ids))
    for instance_id in ids:
        wait_until(
            f"{instance_id} to terminate",
            lambda i=instance_id: instance_gone(ec2, i),  # type: ignore[misc]
            timeout_s=600,
        )
        context.deleted("instance", instance_id)


def instance_gone(ec2: Any, instance_id: str) -> bool:
    """Confirmed by describing: terminated, or unknown to EC2."""
    try:
        found = ec2.describe_instances(InstanceIds=[instance_id])
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) == "InvalidInstanceID.NotFound":
            return True
        raise
    instances = [i for r in found["Reservations"] for i in r["Instances"]]
    return all(i["State"]["Name"] == "terminated" for i in instances)


def delete_fleet(ec2: Any, fleet_id: str) -> None:
    """Delete a fleet and the instances it launched (the caller confirms they are gone)."""
    try:
        retry_on(
            {"RequestLimitExceeded"},
            lambda: ec2.delete_fleets(FleetIds=[fleet_id], TerminateInstances=True),
        )
    except botocore.exceptions.ClientError as exc:
        # moto refuses TerminateInstances=True for a fleet holding no instance any more.
        if error_code(exc) != "InvalidParameterCombination":
            raise
        ec2.delete_fleets(FleetIds=[fleet_id], TerminateInstances=False)
