"""Instance types outside the build catalog: what a launch needs of a type nothing is built for.

The build catalog (catalog/families.json) lists the families amibake can build for: each with the
CPU generations its target is made from. A workload that needs no build (a plain command) can run
on any type the region offers, GPU (g5, p4d) and Inferentia (inf2) ones included. For those, the
launch steps get an InstanceKind instead of a catalog Family: the same name, architecture, sizes
and instance_type(size), read from EC2's DescribeInstanceTypes (once per type and cloud in a run),
with the GPUs and accelerators the type carries.

Which names EC2 knows at all is read offline from the EC2 API model botocore ships (its
InstanceType enumeration) and the price table: a typo is refused with "did you mean" before any
cloud is asked.
"""

from __future__ import annotations

import difflib
import re
import threading
from dataclasses import dataclass
from functools import cache
from typing import Any

import botocore.exceptions

from amibake import catalog, service_models
from amibake.catalog import Family
from amibake.catalog import prices as price_table
from amibake.errors import UserError

CATALOG_FILE = "amibake/catalog/families.json"


@dataclass(frozen=True)
class InstanceKind:
    """One instance type as EC2 describes it, shaped as a catalog Family for the launch steps
    (name, architecture, sizes, instance_type(size)): a type that no build targets."""

    name: str  # the family part of the type's name: "g5" of g5.xlarge
    architecture: str  # x86_64 | arm64, as AMIs name it
    sizes: tuple[str, ...]
    vcpus: int = 0
    memory_mib: int = 0
    gpus: tuple[str, ...] = ()  # "1 x NVIDIA A10G (22888 MiB)"
    accelerators: tuple[str, ...] = ()  # "1 x AWS Inferentia2 (32768 MiB)"

    def instance_type(self, size: str) -> str:
        return f"{self.name}.{size}"

    def facts(self) -> dict[str, Any]:
        """What the run's environment record keeps of the type as EC2 described it."""
        return {
            "described_vcpus": self.vcpus,
            "described_memory_mib": self.memory_mib,
            "gpus": list(self.gpus),
            "accelerators": list(self.accelerators),
        }


Kind = Family | InstanceKind


@cache
def ec2_names() -> frozenset[str]:
    """Every instance type name EC2's API knows (any region), from botocore's EC2 model, and the
    price table's: offline, so a typo is refused before a cloud is asked."""
    model = service_models.service_model("ec2")
    names = set(model.shape_for("InstanceType").enum)
    return frozenset(names | set(price_table.snapshot()["prices"]))


def in_catalog(instance_type: str) -> bool:
    family_name, _, size = instance_type.partition(".")
    family = catalog.families().get(family_name)
    return family is not None and size in family.sizes


# AWS's family names: class letters, generation, then attributes (c7gn: g Graviton, n network).
_FAMILY = re.compile(r"^(?P<cls>[a-z]+?)(?P<gen>\d+)(?P<attrs>[a-z]*)")


def architecture(instance_type: str) -> str:
    """A type's architecture without asking a cloud: its catalog family's, else by AWS's naming,
    where a Graviton family carries a "g" among its attributes (c7g, m6gd, g5g, im4gn; the "g"
    that starts g5 is its class) and a1 was the first. For a search space's check of which
    architectures its types span, before any cloud is asked (a launch describes the type)."""
    family_name = instance_type.partition(".")[0]
    known = catalog.families().get(family_name)
    if known is not None:
        return known.architecture
    found = _FAMILY.match(family_name)
    graviton = family_name == "a1" or (found is not None and "g" in found["attrs"])
    return "arm64" if graviton else "x86_64"


def suggestions(instance_type: str, extra: frozenset[str] = frozenset()) -> list[str]:
    return difflib.get_close_matches(instance_type, sorted(ec2_names() | extra), n=3, cutoff=0.6)


def not_for_builds(instance_type: str) -> str:
    """Why a build cannot target a type whose family is not in the build catalog, in one line."""
    family_name = instance_type.partition(".")[0]
    return (
        f"{instance_type}: family {family_name} is not in the build catalog ({CATALOG_FILE}), "
        f"so nothing can be built for it: an entry there needs its architecture, its archspec "
        f"target (generations) and its sizes; or benchmark a prebuilt workload on it: "
        f'`fleet bench` with command = "..." instead of a recipe'
    )


def _architecture(described: dict[str, Any]) -> str:
    offered = described.get("ProcessorInfo", {}).get("SupportedArchitectures", [])
    return "arm64" if "arm64" in offered and "x86_64" not in offered else "x86_64"


def _devices(entries: list[dict[str, Any]]) -> tuple[str, ...]:
    return tuple(
        f"{d.get('Count', 0)} x {d.get('Manufacturer', '')} {d.get('Name', '')}".replace("  ", " ")
        + (f" ({d['MemoryInfo']['SizeInMiB']} MiB)" if "MemoryInfo" in d else "")
        for d in entries
    )


def from_description(described: dict[str, Any]) -> InstanceKind:
    name, _, size = str(described["InstanceType"]).partition(".")
    # Inferentia is described twice (the older field, and NeuronInfo): one of them, not both.
    accelerators = described.get("InferenceAcceleratorInfo", {}).get("Accelerators") or (
        described.get("NeuronInfo", {}).get("NeuronDevices", [])
    )
    return InstanceKind(
        name=name,
        architecture=_architecture(described),
        sizes=(size,),
        vcpus=int(described.get("VCpuInfo", {}).get("DefaultVCpus", 0)),
        memory_mib=int(described.get("MemoryInfo", {}).get("SizeInMiB", 0)),
        gpus=_devices(described.get("GpuInfo", {}).get("Gpus", [])),
        accelerators=_devices(accelerators),
    )


# Described once per type and cloud for the life of the process (a run, or a tune's trials).
_described: dict[tuple[str, str, str], InstanceKind] = {}
_lock = threading.Lock()


def describe(cloud: Any, instance_type: str) -> InstanceKind:
    """The type as the cloud's DescribeInstanceTypes has it; a UserError naming the region when
    the region does not offer it."""
    key = (str(cloud.endpoint_url or ""), cloud.config.region, instance_type)
    with _lock:
        if key in _described:
            return _described[key]
    try:
        found = cloud.ec2.describe_instance_types(InstanceTypes=[instance_type])["InstanceTypes"]
    except botocore.exceptions.ClientError as exc:
        if "InvalidInstanceType" not in str(exc):
            raise
        found = []
    if not found:
        close = suggestions(instance_type)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise UserError(
            f"unknown instance type {instance_type!r}: EC2 in {cloud.config.region} does not "
            f"offer it{hint}"
        )
    kind = from_description(found[0])
    with _lock:
        _described[key] = kind
    return kind


def kind_of(cloud: Any, instance_type: str) -> Kind:
    """The catalog family of a type it lists, else the type as the cloud describes it."""
    if in_catalog(instance_type):
        return catalog.family(instance_type.partition(".")[0])
    return describe(cloud, instance_type)
