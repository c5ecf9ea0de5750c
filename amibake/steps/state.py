"""The typed state a build pipeline passes from step to step."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from amibake.catalog import Family
from amibake.cpu import Cpu
from amibake.deadline import Renewal
from amibake.flags import Compiler, Flags
from amibake.instance_kinds import Kind
from amibake.recipes import Recipe
from amibake.remote import Remote
from amibake.sources import Source


@dataclass(kw_only=True)
class InstanceState:
    """What the steps that launch and reach one instance share (build, bake, boot test)."""

    # A build-catalog Family, or (for a workload nothing is built for) an InstanceKind that
    # EC2 described: the launch steps use only name, architecture, sizes and instance_type().
    family: Kind
    size: str
    spot: bool = True
    on_demand_fallback: bool = False
    exact_size: bool = False  # fleet measures one instance type: no second size as a fallback
    base_ami: str = ""
    # The base image's root device, whose volume the launch encrypts (Amazon Linux's /dev/xvda;
    # another base image's may be /dev/sda1, and a mapping of /dev/xvda then added an empty
    # encrypted volume and left the root as the image had it).
    root_device: str = "/dev/xvda"
    key_name: str = ""
    private_key: str = field(default="", repr=False)  # never in a traceback or a test's output
    security_group_id: str = ""
    launch_template_id: str = ""
    fleet_id: str = ""
    instance_id: str = ""
    instance_type: str = ""
    market: str = ""
    pools_tried: list[str] = field(default_factory=list)
    remote: Remote | None = None
    renewal: Renewal | None = None  # the instance's deadline, pushed back while connected
    finished_early: bool = False
    warnings: list[str] = field(default_factory=list)
    phases: dict[str, float] = field(default_factory=dict)  # seconds, by what was done
    attempt: int = 0  # how many times the run started over on a new instance

    def start_over(self) -> None:
        """Forget the instance and what was made for it (all cleaned up by then), to launch
        anew under fresh names."""
        self.key_name = self.private_key = self.security_group_id = ""
        self.launch_template_id = self.fleet_id = self.instance_id = ""
        self.instance_type = self.market = ""
        self.pools_tried = []
        self.remote = self.renewal = None
        self.attempt += 1

    @property
    def label(self) -> str:
        return self.family.name

    @property
    def slot(self) -> str:
        """Unique among the instances of one run: names and idempotency tokens derive from it."""
        return self.family.name if not self.attempt else f"{self.family.name}-{self.attempt}"


@dataclass(frozen=True)
class Variant:
    """A build other than the family's tuned default: the architecture's generic baseline
    and/or extra compiler flags (fleet's compile-time parameters). Appended flags win: gcc
    takes the last -O level and the last of each -m option."""

    name: str = ""
    generic: bool = False
    cflags: str = ""

    @classmethod
    def of_flags(cls, cflags: str) -> Variant:
        """The family's build with `cflags` appended, named by them: the same flags make the same
        variant wherever they come from (a tune trial, its gain, a bake of its recommendation),
        so the artifact cache finds the build made before. No flags: the family's own build."""
        if not cflags:
            return cls()
        return cls(name="t" + hashlib.sha256(cflags.encode()).hexdigest()[:10], cflags=cflags)


@dataclass(kw_only=True)
class BuildState(InstanceState):
    family: Family  # a build targets a catalog family's CPUs
    recipe: Recipe
    source: Source
    artifacts_dir: Path
    expected_compiler: Compiler
    dry_run: bool = False
    cache_key: str = ""
    compiler: Compiler | None = None
    cc: str = "gcc"  # the compiler command: gcc, or a cross gcc when the host differs
    flags: Flags | None = None
    host_cpu: Cpu | None = None  # the build host's
    build_script: str = ""
    work_dir: str = "/shared/amibake-build"
    remote_seconds: float = 0.0
    smoke: str = ""
    smoke_on: str = ""  # "native" or "emulated", when it ran
    smoke_output: str = ""
    isa_features: list[str] = field(default_factory=list)  # what a CPU needs to run it
    isa_examples: dict[str, str] = field(default_factory=dict)  # an instruction per feature
    programs: list[str] = field(default_factory=list)  # its executables (emulation wraps them)
    local_out: Path | None = None  # the build's output, fetched to be scanned and packed
    file_hashes: dict[str, str] = field(default_factory=dict)  # artifact file -> sha256, verified
    manifest: dict[str, Any] = field(default_factory=dict)
    artifact: Path | None = None
    cache_hit: bool = False
    # Held (flock) from the cache check until the artifact is written: see ArtifactCache.
    artifact_lock: IO[bytes] | None = None
    variant: Variant = field(default_factory=Variant)

    @property
    def label(self) -> str:
        suffix = f"-{self.variant.name}" if self.variant.name else ""
        return f"{self.recipe.name}_{self.family.name}{suffix}"

    @property
    def cflags(self) -> str:
        """Everything after the recipe's base flags: the target's, then the variant's."""
        assert self.flags is not None
        return f"{self.flags.cflags} {self.variant.cflags}".strip()
