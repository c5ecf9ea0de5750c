"""Steps that create nothing: check everything that can be checked before spending money, and
stop early when the artifact cache already holds this exact build."""

from __future__ import annotations

import fcntl
import hashlib
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import botocore.exceptions

from amibake import flags
from amibake.catalog import Family
from amibake.cloud import Cloud
from amibake.cloud.calls import error_code, every, no_default_vpc, wait_until
from amibake.cloud.ec2 import describe_instance_types, zones_offering
from amibake.cloud.network import Network
from amibake.cloud.network import find as find_network
from amibake.cloud.tags import RUN_ID
from amibake.errors import CloudError, UserError
from amibake.flags import family_target
from amibake.instance_kinds import Kind
from amibake.runner import RunContext
from amibake.sources import sha256_of
from amibake.steps.state import BuildState, InstanceState, Variant

log = logging.getLogger("amibake")

BASE_AMI_PARAMETER = {
    "x86_64": "/aws/service/ecs/optimized-ami/amazon-linux-2023/recommended/image_id",
    "arm64": "/aws/service/ecs/optimized-ami/amazon-linux-2023/arm64/recommended/image_id",
}
# The ECS-optimized AMIs with the accelerators' drivers: a GPU type (g5, p4d) on the plain one
# has no NVIDIA driver, so `docker run --gpus` and any CUDA program fail; an Inferentia or
# Trainium type needs the Neuron driver. x86_64 only, as AWS publishes them.
ACCELERATED_AMI_PARAMETER = {
    "gpu": "/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id",
    "neuron": "/aws/service/ecs/optimized-ami/amazon-linux-2023/neuron/recommended/image_id",
}


def base_ami_parameter(kind: Kind) -> str:
    """The SSM parameter naming the base AMI an instance of `kind` launches from."""
    gpus = getattr(kind, "gpus", ())
    accelerators = getattr(kind, "accelerators", ())
    if kind.architecture == "x86_64" and gpus:
        return ACCELERATED_AMI_PARAMETER["gpu"]
    if kind.architecture == "x86_64" and any(
        "Inferentia" in a or "Trainium" in a for a in accelerators
    ):
        return ACCELERATED_AMI_PARAMETER["neuron"]
    return BASE_AMI_PARAMETER[kind.architecture]


def candidate_sizes(state: InstanceState) -> list[str]:
    """The requested size first, then the next larger one as a second capacity pool (unless
    the caller measures that exact type)."""
    sizes = list(state.family.sizes)
    if state.size not in sizes:
        raise UserError(
            f"size {state.size!r} is not offered for {state.family.name}; "
            f"choose one of {', '.join(sizes)}"
        )
    at = sizes.index(state.size)
    return sizes[at : at + (1 if state.exact_size else 2)]


# Spot needs this service-linked role in the account. The EC2 console makes it on a first spot
# request; with the API "you must ensure that this role exists" (EC2 user guide, Service-linked
# role for Spot Instances), or EC2 tries to create it with the caller's credentials, and a caller
# without iam:CreateServiceLinkedRole gets the launch refused (kops#16475, cdk-github-runners#182).
SPOT_SERVICE = "spot.amazonaws.com"
SPOT_ROLE_PATH = f"/aws-service-role/{SPOT_SERVICE}/"
SPOT_ROLE_ERRORS = {"AuthFailure.ServiceLinkedRoleCreationNotPermitted"}
DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation"}


def spot_role_missing() -> UserError:
    return UserError(
        "spot launches need the service-linked role AWSServiceRoleForEC2Spot, which this "
        "account lacks: create it once with 'aws iam create-service-linked-role "
        f"--aws-service-name {SPOT_SERVICE}' (or grant iam:CreateServiceLinkedRole for "
        f"{SPOT_SERVICE}), or launch with --on-demand"
    )


def ensure_spot_role(cloud: Cloud, *, dry_run: bool = False) -> None:
    """The account has spot's service-linked role (AWSServiceRoleForEC2Spot), made here if
    missing, as the EC2 console does; if this caller may not make it, one line says how to.
    Looked up by its path, as clouds spell its name differently. It belongs to the account, not
    the run: never journaled or deleted (as Batch's own role)."""
    iam = cloud.client("iam")
    # Every page: IAM "might return fewer results, even when there are more" (ListRoles).
    if any(every(iam, "list_roles", "Roles", PathPrefix=SPOT_ROLE_PATH)):
        return
    if dry_run:  # creates nothing: says what the launch will do
        log.warning("the account has no AWSServiceRoleForEC2Spot: the launch will create it")
        return
    try:
        iam.create_service_linked_role(AWSServiceName=SPOT_SERVICE)
        log.info("created the spot service-linked role (AWSServiceRoleForEC2Spot)")
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) in DENIED:
            raise spot_role_missing() from exc
        # Another run (or a trial beside this one) made it between the lookup and now: AWS
        # says InvalidInput "has been taken in this account", moto EntityAlreadyExists.
        if error_code(exc) not in ("InvalidInput", "EntityAlreadyExists"):
            raise


def spot_role_for(cloud: Cloud, states: Sequence[InstanceState]) -> None:
    """Spot's service-linked role, made if the run's launches need it: called once every check
    has passed, so bad input never creates it. A dry run creates nothing: it only says what the
    launch would lack. (The launch step ensures it too, for runs that skip preflight_all.)"""
    if any(s.spot for s in states):
        ensure_spot_role(cloud, dry_run=any(getattr(s, "dry_run", False) for s in states))


@dataclass
class Lookups:
    """What the launches of a run look up alike, asked once for all of them: eight families
    asked for the same AMI parameter, offerings and instance types eight times (24 of a run's
    161 calls), calls that count against the account's request rate on AWS."""

    base_amis: dict[str, str]  # SSM parameter -> AMI id
    memory: dict[str, int]  # instance type -> MiB
    # subnet_ids' network: where a launch must go without a default VPC (None: the default's)
    network: Network | None = None
    zones: dict[str, set[str]] = field(default_factory=dict)  # instance type -> AZs offering it
    # AMI id -> its root device, whose volume the launch encrypts (Amazon Linux's /dev/xvda;
    # another base image's may be /dev/sda1, where a mapping of /dev/xvda added an empty
    # encrypted volume and left the root as the image had it)
    root_devices: dict[str, str] = field(default_factory=dict)

    @property
    def offered(self) -> set[str]:
        """The instance types offered in the region: in some AZ of it."""
        return set(self.zones)


def look_up(cloud: Cloud, states: Sequence[InstanceState]) -> Lookups:
    """One call for each kind of fact, covering every state. If one fails, each state asks on
    its own, so that the error (a CloudError) names the family it concerns."""
    types = sorted({s.family.instance_type(z) for s in states for z in candidate_sizes(s)})
    parameters = sorted({base_ami_parameter(s.family) for s in states if not s.base_ami})
    # Named subnets are checked (they exist, in one VPC) before anything is made.
    network = find_network(cloud.ec2, cloud.config) if cloud.config.subnet_ids else None
    try:
        base_amis = {}
        if parameters:  # by parameter: a GPU type's AMI is not its architecture's plain one
            found = cloud.ssm.get_parameters(Names=parameters)["Parameters"]
            base_amis = {p["Name"]: p["Value"] for p in found}
        zones = {t: z for t, z in zones_offering(cloud.ec2, types).items() if z}
        memory = {
            t["InstanceType"]: t["MemoryInfo"]["SizeInMiB"]
            for t in describe_instance_types(cloud.ec2, types)
        }
        images = sorted({*base_amis.values(), *(s.base_ami for s in states if s.base_ami)})
        root_devices = {
            str(i["ImageId"]): str(i["RootDeviceName"])
            for i in (cloud.ec2.describe_images(ImageIds=images)["Images"] if images else [])
            if i.get("RootDeviceName")
        }
    except botocore.exceptions.ClientError as exc:
        if len(states) == 1:
            raise CloudError(f"preflight for {states[0].family.name}: {exc}") from exc
        parts = [look_up(cloud, [state]) for state in states]  # raises, naming the family
        return Lookups(
            {a: i for part in parts for a, i in part.base_amis.items()},
            {t: m for part in parts for t, m in part.memory.items()},
            network,
            {t: z for part in parts for t, z in part.zones.items()},
            {i: d for part in parts for i, d in part.root_devices.items()},
        )
    return Lookups(base_amis, memory, network, zones, root_devices)


def preflight_instance(
    cloud: Cloud, state: InstanceState, lookups: Lookups | None = None
) -> dict[str, int]:
    """The checks any launch needs: base AMI, types offered, a DryRun launch. Returns the memory
    (MiB) of each candidate type. `lookups` are the run's shared ones, else made here."""
    family = state.family
    types = [family.instance_type(s) for s in candidate_sizes(state)]
    if lookups is None:
        lookups = look_up(cloud, [state])
    if not state.base_ami:
        parameter = base_ami_parameter(family)
        if parameter not in lookups.base_amis:
            raise CloudError(f"preflight for {family.name}: no SSM parameter {parameter}")
        state.base_ami = lookups.base_amis[parameter]
    state.root_device = lookups.root_devices.get(state.base_ami, state.root_device)
    if not lookups.offered & set(types):
        raise UserError(f"none of {', '.join(types)} is offered in {cloud.config.region}")
    tried = next(t for t in types if t in lookups.offered)
    subnet = ""
    if lookups.network is not None:
        # A subnet in an AZ offering the type, as the launch picks (EC2 refuses a launch in an
        # AZ without it, Unsupported): the first of subnet_ids had refused the dry run of a
        # launch that would have gone ahead in another. The first size one of them can launch;
        # none: a UserError naming the subnets and the zones.
        network = lookups.network
        zones = {z for t in types for z in lookups.zones.get(t, set())}
        in_reach = [
            t
            for t in types
            if {s["AvailabilityZone"] for s in network.subnets} & lookups.zones.get(t, set())
        ]
        tried = in_reach[0] if in_reach else tried
        subnet = network.subnets_in(lookups.zones.get(tried, set()) if in_reach else zones)[0]
    try:
        # Tagged as the real launch is: a policy that requires the run's tag on what amibake
        # creates (amibake iam-policy) refuses an untagged launch, dry or not.
        tagged = [
            {"ResourceType": kind, "Tags": [{"Key": RUN_ID, "Value": "preflight"}]}
            for kind in ("instance", "volume")
        ]
        cloud.ec2.run_instances(
            DryRun=True,
            ImageId=state.base_ami,
            InstanceType=tried,
            MinCount=1,
            MaxCount=1,
            TagSpecifications=tagged,
            **({"SubnetId": subnet} if subnet else {}),
        )
    except botocore.exceptions.ClientError as exc:
        if error_code(exc) == "VPCIdNotSpecified":
            raise no_default_vpc(cloud.config.region) from exc
        if error_code(exc) != "DryRunOperation":
            raise CloudError(f"dry-run launch of {tried} refused: {exc}") from exc
    return {t: lookups.memory[t] for t in types if t in lookups.memory}


def preflight(cloud: Cloud, state: BuildState, lookups: Lookups | None = None) -> None:
    """Everything that can be checked against the cloud without creating anything."""
    memory = preflight_instance(cloud, state, lookups)
    recipe = state.recipe
    smallest = min(memory.values()) if memory else 0
    if recipe.tmpfs_max_mb and smallest and recipe.tmpfs_max_mb > smallest:
        first = state.family.instance_type(candidate_sizes(state)[0])
        raise UserError(
            f"{recipe.file}: build.tmpfs_max_mb {recipe.tmpfs_max_mb} is larger than the "
            f"memory of {first} ({smallest} MiB); lower it or pick a larger --size"
        )
    state.cache_key = cache_key(state)


# What a manifest holds: 2 since the ISA scan decodes every instruction (isa_features as what a
# CPU needs, programs for emulation). An artifact cached with an older manifest is built again.
MANIFEST_FORMAT = 2


# The compilers whose flags for a family stand in the cache key: the build host's compiler is
# known only once it runs, but amibake's own spelling of a target's flags (flags.for_family:
# archspec's, and what it adds or takes away) is known now, and a change to it (AVX512-VP2INTERSECT
# taken out of c7i's) left the artifacts built with the old flags as cache hits.
KEYED_COMPILERS = ("gcc@10.2.1", "gcc@11.4.1", "gcc@12.2.0", "gcc@13.2.0", "gcc@14.2.0")


def cache_key(state: BuildState) -> str:
    # The base AMI fixes the compiler the build will get; amibake's tables, its flags for it.
    inputs: dict[str, object] = {
        "manifest": MANIFEST_FORMAT,
        "recipe": state.recipe.digest(),
        "source": state.source.sha256,
        "target": family_target(state.family).name,
        "flags": [_flags_for(state.family, c) for c in KEYED_COMPILERS],
        "base_ami": state.base_ami,
    }
    if state.variant != Variant():
        inputs["variant"] = {"generic": state.variant.generic, "cflags": state.variant.cflags}
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _flags_for(family: Kind, compiler: str) -> str:
    if not isinstance(family, Family):  # a type outside the build catalog: its target alone
        return ""
    try:
        return flags.for_family(family, flags.Compiler.parse(compiler)).cflags
    except UserError:  # no target of the family that compiler knows
        return ""


class ArtifactCache:
    """The same inputs never build twice: a matching, intact artifact ends the run here."""

    name = "artifact-cache"
    local_only = True  # its cleanup releases the artifact's file lock, nothing in the cloud

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: BuildState) -> None:
        if state.dry_run:
            return
        self._lock(state)
        manifest_path = state.artifacts_dir / f"{state.label}.manifest.json"
        artifact = state.artifacts_dir / f"{state.label}.tar.xz"
        if not manifest_path.exists() or not artifact.exists():
            return
        try:
            manifest = json.loads(manifest_path.read_text())
        except json.JSONDecodeError:
            return
        if manifest.get("cache_key") != state.cache_key:
            return
        if manifest.get("artifact_sha256") != sha256_of(artifact):
            log.warning("%s does not match its manifest; rebuilding", artifact)
            return
        state.manifest = manifest
        state.artifact = artifact
        state.cache_hit = True
        if manifest.get("smoke"):  # what the build that made the artifact saw
            state.smoke = f"{manifest['smoke']} (when built)"
        state.finished_early = True
        log.info("cache hit: %s (key %s)", artifact, state.cache_key[:12])
        release_artifact(state)

    def _lock(self, state: BuildState) -> None:
        """Own the artifact's files until Fetch has written them. Two runs building the same
        artifact at once (fleet tune's trials in flight, or two shells) wrote the same files:
        measured, one fetch failed and the other's archive was corrupt. The second now waits,
        then finds the first's build in the cache."""
        locks = state.artifacts_dir / ".locks"
        locks.mkdir(parents=True, exist_ok=True)
        handle = (locks / f"{state.label}.lock").open("wb")

        def acquired() -> bool:
            self.context.check_cancel()
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False

        try:  # as long as a build may take; progress shows what it waits for
            wait_until(f"another run building {state.label}", acquired, timeout_s=6 * 3600)
        except BaseException:
            handle.close()
            raise
        state.artifact_lock = handle

    def cleanup(self, state: BuildState) -> None:
        release_artifact(state)  # a run that failed before Fetch


def release_artifact(state: BuildState) -> None:
    if state.artifact_lock is not None:
        state.artifact_lock.close()  # closing the file releases its flock
        state.artifact_lock = None
