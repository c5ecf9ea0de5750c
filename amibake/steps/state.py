"""The typed state a build pipeline passes from step to step."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amibake.catalog import Family
from amibake.flags import Compiler, Flags
from amibake.recipes import Recipe
from amibake.remote import Remote
from amibake.sources import Source


@dataclass
class BuildState:
    family: Family
    recipe: Recipe
    source: Source
    size: str
    spot: bool
    on_demand_fallback: bool
    artifacts_dir: Path
    expected_compiler: Compiler
    dry_run: bool = False
    # Filled in as steps run.
    base_ami: str = ""
    cache_key: str = ""
    key_name: str = ""
    private_key: str = ""
    security_group_id: str = ""
    launch_template_id: str = ""
    fleet_id: str = ""
    instance_id: str = ""
    instance_type: str = ""
    market: str = ""
    pools_tried: list[str] = field(default_factory=list)
    remote: Remote | None = None
    compiler: Compiler | None = None
    cc: str = "gcc"  # the compiler command: gcc, or a cross gcc when the host differs
    objdump: str = "objdump"
    flags: Flags | None = None
    cpu_flags: set[str] = field(default_factory=set)  # the build host's, from /proc/cpuinfo
    build_script: str = ""
    work_dir: str = "/shared/amibake-build"
    remote_seconds: float = 0.0
    smoke: str = ""
    isa_features: list[str] = field(default_factory=list)
    manifest: dict[str, Any] = field(default_factory=dict)
    artifact: Path | None = None
    cache_hit: bool = False
    finished_early: bool = False
    warnings: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"{self.recipe.name}_{self.family.name}"
