"""A CPU, and whether it runs a program natively, under QEMU's user-mode emulator, or not at all.

What a program needs is a set of features: exactly, from its instructions (`amibake.isa`), or
before it is built, predicted from its family's target (the target's features that gcc emits from
plain C). A CPU runs it natively when it has them all; else, when QEMU for the program's
architecture is installed and emulates them all, under QEMU (slower: marked emulated, never
ranked against native runs); else not at all, naming what is missing. Virtual machines hide
kernel-only flags (pku, flush_l1d, even rdseed), which is why no decision here reads a family,
vendor or target name as proof.

A CPU is data (`Cpu.of_target("icelake")`), so every rule is tested on CPUs this machine is not.
"""

from __future__ import annotations

import platform
import shlex
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import archspec.cpu

from amibake import isa
from amibake.catalog import ARCHSPEC_FAMILY, Family, families
from amibake.flags import family_target

# Linux's /proc/cpuinfo names for features that archspec (which reads CPUID) names otherwise.
CPUINFO_ALIASES = {"pni": "sse3"}
# uname -m -> EC2's architecture name.
MACHINES = {"x86_64": "x86_64", "amd64": "x86_64", "aarch64": "arm64", "arm64": "arm64"}
# /proc/cpuinfo's "CPU implementer" of Arm's own cores (Neoverse: every Graviton), as archspec
# names the vendor.
_ARM_IMPLEMENTERS = {"0x41": "ARM"}


def normalized(flags: set[str] | frozenset[str]) -> frozenset[str]:
    return frozenset(CPUINFO_ALIASES.get(flag, flag) for flag in flags)


# Features a target's CPUs have, and its gcc -march enables, that archspec's list leaves out:
# GCC's manual puts AVX-VNNI and AVX512-FP16 under -march=sapphirerapids, and an m7i's
# /proc/cpuinfo shows both (ggml-org/llama.cpp#2555). Without them a correct c7i build (gcc 12
# turns int8 dot products into vpdpbusd) was refused as beyond its target.
# Likewise every Zen has SHA and ADX and every Zen 2 on RDPID (GCC's manual under -march=znver1
# and znver2; an EPYC 7R32's /proc/cpuinfo shows sha_ni, adx and rdpid): a c5a build that used
# SHA-NI intrinsics was refused as beyond zen2. Zen 3 and Zen 4 inherit them as descendants.
ARCHSPEC_OMITS = {
    "sapphirerapids": frozenset({"avx_vnni", "avx512_fp16"}),
    "zen": frozenset({"sha_ni", "adx"}),
    "zen2": frozenset({"rdpid"}),
}


def target_features(target: archspec.cpu.Microarchitecture) -> frozenset[str]:
    """What a CPU of the target has, in /proc/cpuinfo's names: archspec's list and what it
    leaves out (ARCHSPEC_OMITS), for the target and its ancestors."""
    extra = [ARCHSPEC_OMITS.get(t.name, frozenset()) for t in (target, *target.ancestors)]
    return normalized(frozenset(target.features)).union(*extra)


@dataclass(frozen=True)
class Cpu:
    architecture: str  # x86_64 or arm64, as EC2 says
    features: frozenset[str]  # archspec's names
    vendor: str = ""  # GenuineIntel, AuthenticAMD, ARM; "" when unknown
    model: str = ""  # for messages
    emulators: frozenset[str] = field(default_factory=frozenset)  # architectures QEMU runs here

    @classmethod
    def from_cpuinfo(
        cls,
        machine: str,
        flags: str,
        vendor: str = "",
        model: str = "",
        emulators: frozenset[str] = frozenset(),
    ) -> Cpu:
        """From what a machine reports: `uname -m`, the flags (or Features) line of
        /proc/cpuinfo, its vendor and model."""
        return cls(
            architecture=MACHINES.get(machine.strip(), machine.strip()),
            features=normalized(set(flags.split())),
            vendor=_ARM_IMPLEMENTERS.get(vendor.strip(), vendor.strip()),
            model=model.strip(),
            emulators=emulators,
        )

    @classmethod
    def of_target(cls, name: str, emulators: frozenset[str] = frozenset()) -> Cpu:
        """A CPU with exactly an archspec target's features: CPUs as data, for tests."""
        target = archspec.cpu.TARGETS[name]
        architecture = {v: k for k, v in ARCHSPEC_FAMILY.items()}[target.family.name]
        vendor = "" if target.vendor == "generic" else target.vendor
        return cls(architecture, frozenset(target.features), vendor, name, emulators)

    @property
    def microarchitecture(self) -> str:
        """The newest archspec target of its vendor (or a generic level) whose features this
        CPU has, but for those hypervisors hide (HIDDEN_BY_HYPERVISORS): what it really is. By
        archspec's own reading a Genoa guest was x86_64_v4, and its runs were recorded so."""
        family = ARCHSPEC_FAMILY.get(self.architecture, self.architecture)
        runnable = [
            t
            for t in archspec.cpu.TARGETS.values()
            if t.family.name == family
            and not set(t.features) - self.features - HIDDEN_BY_HYPERVISORS
            and t.vendor in ("generic", self.vendor)
        ]
        # A vendor's own model before a generic level (x86_64_v4 is an ancestor of Icelake's).
        best = max(
            runnable,
            key=lambda t: (t.vendor != "generic", len(t.ancestors), len(t.features), t.name),
            default=None,
        )
        return best.name if best else family


# Shell printing what Cpu.from_facts reads, one KEY=VALUE a line: the same on a build host, a
# bench instance and a booted image (emulators: the QEMU binaries on its PATH).
FACTS_SCRIPT = """echo "machine=$(uname -m)"
echo "vendor=$(grep -m1 -E '^(vendor_id|CPU implementer)' /proc/cpuinfo | cut -d: -f2)"
echo "model=$(grep -m1 -E '^(model name|CPU part)' /proc/cpuinfo | cut -d: -f2)"
echo "flags=$(grep -m1 -E '^(flags|Features)' /proc/cpuinfo | cut -d: -f2)"
echo "emulators=$(for q in qemu-x86_64-static qemu-aarch64-static; do
  command -v "$q" >/dev/null && printf '%s ' "$q"; done)\""""


def facts(text: str) -> dict[str, str]:
    """KEY=VALUE lines (FACTS_SCRIPT's and others') as a dict; other lines are ignored."""
    found = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.isidentifier():
            found[key] = value.strip()
    return found


def from_facts(found: dict[str, str]) -> Cpu:
    """The CPU FACTS_SCRIPT described."""
    binaries = set(found.get("emulators", "").split())
    return Cpu.from_cpuinfo(
        found.get("machine", ""),
        found.get("flags", ""),
        found.get("vendor", ""),
        found.get("model", ""),
        frozenset(a for a in ("x86_64", "arm64") if isa.data(a).qemu_binary in binaries),
    )


def wrap_programs(programs: list[str], emulator: str) -> str:
    """Shell, run in an artifact's directory, that puts each program behind a wrapper running
    it under `emulator`: whatever starts it (a recipe's command, a script, a pipeline) then
    runs it emulated, as binfmt_misc would, which a container or a user cannot register."""
    lines = []
    for program in programs:
        folder, _, name = program.rpartition("/")
        hidden = f"{folder}/.{name}.emulated" if folder else f".{name}.emulated"
        lines.append(
            f"mv {shlex.quote(program)} {shlex.quote(hidden)} && "
            f'printf \'#!/bin/sh\\nexec %s "$(dirname "$0")/%s" "$@"\\n\' '
            f"{shlex.quote(emulator)} {shlex.quote(hidden.rpartition('/')[2])} "
            f"> {shlex.quote(program)} && chmod 755 {shlex.quote(program)}"
        )
    return " && ".join(lines) or ":"


def command_in(directory: str, command: str, programs: list[str], verdict: Verdict) -> str:
    """Shell running `command` in an artifact's directory as `verdict` says: there, natively;
    emulated, in a copy beside it whose programs are wrapped (the artifact stays as built)."""
    if verdict.how != "emulated":
        return f"cd {shlex.quote(directory)} && {command}"
    copy = shlex.quote(f"{directory.rstrip('/')}.emulated")
    return (
        f"rm -rf {copy} && cp -a {shlex.quote(directory)} {copy} && cd {copy} && "
        f"{{ {wrap_programs(programs, verdict.emulator)}; }} && {command}"
    )


def installed_emulators() -> frozenset[str]:
    """The architectures whose QEMU user-mode emulator is on this machine's PATH."""
    return frozenset(
        architecture
        for architecture in ("x86_64", "arm64")
        if shutil.which(isa.data(architecture).qemu_binary)
    )


def this_machine() -> Cpu:
    """This machine's CPU, from /proc/cpuinfo, with the emulators installed here."""
    fields: dict[str, str] = {}
    cpuinfo = Path("/proc/cpuinfo")
    text = cpuinfo.read_text() if cpuinfo.exists() else ""
    for line in text.splitlines():
        if not line.strip():
            if fields:
                break  # the first processor says it for all
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return Cpu.from_cpuinfo(
        platform.machine(),
        fields.get("flags") or fields.get("Features", ""),
        fields.get("vendor_id") or fields.get("CPU implementer", ""),
        fields.get("model name", ""),
        installed_emulators(),
    )


@dataclass(frozen=True)
class Verdict:
    how: str  # "native", "emulated" or "no"
    reason: str = ""  # why not native: what is missing, and why emulation does not help
    emulator: str = ""  # the command line a program runs under, when emulated
    missing: tuple[str, ...] = ()  # what stops it: features neither the CPU nor QEMU has

    def naming(self, examples: dict[str, str]) -> str:
        """The reason, with an instruction that needs each missing feature (a build's
        manifest records one per feature, `isa_examples`)."""
        shown = [f"{f}: {examples[f]}" for f in self.missing if f in examples]
        return self.reason + (f" (it uses {'; '.join(shown)})" if shown else "")

    @property
    def runs(self) -> bool:
        return self.how != "no"


def emulator_command(architecture: str, on: str) -> str:
    """How a program of `architecture` runs under QEMU on a machine of architecture `on`: -cpu
    max for every feature QEMU has; on another architecture, the loader and libraries from the
    cross sysroot (Debian's libc6-*-cross packages)."""
    table = isa.data(architecture)
    sysroot = f" -L {table.qemu_sysroot}" if architecture != on else ""
    return f"{table.qemu_binary} -cpu max{sysroot}"


def verdict(architecture: str, needs: set[str] | frozenset[str], cpu: Cpu) -> Verdict:
    """How `cpu` runs a program of `architecture` that needs these features."""
    table = isa.data(architecture)
    if architecture == cpu.architecture:
        lacking = sorted(set(needs) - cpu.features)
        if not lacking:
            return Verdict("native")
        reason = f"lacks {', '.join(lacking)}"
    else:
        reason = f"is {cpu.architecture}, not {architecture}"
    missing = tuple(lacking) if architecture == cpu.architecture else tuple(sorted(needs))
    if architecture not in cpu.emulators:
        install = "" if architecture == cpu.architecture else " (install qemu-user-static)"
        return Verdict("no", f"{reason}, and has no {table.qemu_binary}{install}", "", missing)
    beyond = sorted(set(needs) - table.qemu_features)
    if beyond:
        cannot = ", ".join(beyond)
        reason = f"{reason}, and {table.qemu_binary} does not emulate {cannot}"
        return Verdict("no", reason, "", tuple(beyond))
    return Verdict("emulated", reason, emulator_command(architecture, cpu.architecture))


def predicted_needs(family: Family) -> frozenset[str]:
    """What the family's tuned build is expected to need before it is built: its target's
    features that gcc emits from plain C. The build's own scan is the answer once it exists."""
    target = family_target(family)
    return normalized(frozenset(target.features)) & isa.data(family.architecture).codegen


@dataclass(frozen=True)
class Choice:
    family: Family
    verdict: Verdict
    basis: str  # "built" (the artifact's instructions) or "predicted" (the family's target)


# Flags of archspec's targets that say what the kernel or the hardware's security state is, not
# an instruction a compiler emits, and that hypervisors hide from their guests: a Genoa VM
# shows no pku or flush_l1d, and was ranked as if older than zen2 (its zen4 family fell behind
# c5a and Intel's). So are instructions a hypervisor may keep from its guests and no compiler
# emits from plain C: RDSEED (a Zen 2 guest without it was given c6a), WAITPKG, CLDEMOTE and AMX
# (a Sapphire Rapids guest without them was given c6i, and its runs labelled icelake). The
# generation key below ignores them; what runs is decided by the instructions (verdict), never
# by these.
HIDDEN_BY_HYPERVISORS = frozenset(
    {"pku", "flush_l1d", "rdseed", "waitpkg", "cldemote", "amx_tile", "amx_int8", "amx_bf16"}
)


def families_for(cpu: Cpu, built: dict[str, set[str]] | None = None) -> list[Choice]:
    """Every family, with how `cpu` runs its tuned build, best first: natively before emulated
    before not at all; then the CPU's own architecture, then families whose target's every
    feature it has (its own generation or an older one: a zen3 build may run on a zen2, but is
    not tuned for it), then its vendor, then the newest target. `built` maps a family to its
    artifact's features, which replace the prediction."""
    built = built or {}
    choices = []
    for family in families().values():
        if family.name in built:
            needs, basis = frozenset(built[family.name]), "built"
        else:
            needs, basis = predicted_needs(family), "predicted"
        choices.append(Choice(family, verdict(family.architecture, needs, cpu), basis))

    def rank(choice: Choice) -> tuple[int, bool, bool, bool, int, str]:
        target = family_target(choice.family)
        return (
            ("native", "emulated", "no").index(choice.verdict.how),
            choice.family.architecture != cpu.architecture,
            bool(normalized(frozenset(target.features)) - cpu.features - HIDDEN_BY_HYPERVISORS),
            not cpu.vendor or target.vendor != cpu.vendor,
            -len(target.ancestors),
            choice.family.name,
        )

    return sorted(choices, key=rank)


def best_family(
    machine: Cpu, built: dict[str, set[str]] | None = None, architecture: str | None = None
) -> str | None:
    """The family whose tuned build `machine` runs best (families_for's first that runs), of
    `architecture` where given, or None when it runs none: what `amibake families --host
    --first`, the demo, the benchmarks and the test suite take for this machine (and, of the
    other architecture, for their cross builds run under QEMU)."""
    return next(
        (
            c.family.name
            for c in families_for(machine, built)
            if c.verdict.runs and architecture in (None, c.family.architecture)
        ),
        None,
    )
