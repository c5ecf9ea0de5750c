"""What an artifact's machine code needs from a CPU, read from the code itself.

Every executable section of the artifact's ELF files is decoded (iced-x86 for x86-64, capstone
for arm64: each tags an instruction with the CPU features it needs) and the tags are named as
/proc/cpuinfo and archspec name features (`catalog/isa.json`). Whether a machine runs the
artifact is then a question of sets (`amibake.cpu`), never of family or vendor names: a
`-march=znver2` build may use nothing an Icelake lacks.

The scan runs on the controller, on the files the build host sent back, so no host needs a
disassembler. Decoding is linear, as objdump's is: code that jumps into the middle of an
instruction is not followed (compilers do not emit it).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from amibake.catalog import ARCHSPEC_FAMILY
from amibake.errors import UserError

# e_machine of the two architectures EC2 offers (ELF's EM_X86_64, EM_AARCH64).
_MACHINES = {"EM_X86_64": "x86_64", "EM_AARCH64": "arm64"}
_EXECINSTR = 0x4  # SHF_EXECINSTR
# arm64's hint space (HINT #imm: PACIASP, AUTIASP, BTI, ...) runs as NOP on a CPU without the
# feature, which is why -mbranch-protection code runs anywhere.
_HINT_MASK, _HINT = 0xFFFFF01F, 0xD503201F


@dataclass(frozen=True)
class IsaData:
    baseline: frozenset[str]
    names: dict[str, tuple[str, ...]]
    codegen: frozenset[str]
    qemu_binary: str
    qemu_sysroot: str
    qemu_features: frozenset[str]

    def named(self, tag: str) -> tuple[str, ...]:
        """A decoder's tag as cpuinfo names: none for the baseline, its own name lower-cased
        when the table does not know it (never silently taken as present)."""
        if tag in self.baseline:
            return ()
        return self.names.get(tag, (tag.lower(),))


@cache
def data(architecture: str) -> IsaData:
    raw = json.loads(resources.files("amibake.catalog").joinpath("isa.json").read_text())
    entry = raw[architecture]
    return IsaData(
        baseline=frozenset(entry["baseline"]),
        names={tag: tuple(names) for tag, names in entry["names"].items()},
        codegen=frozenset(entry["codegen"]),
        qemu_binary=entry["qemu"]["binary"],
        qemu_sysroot=entry["qemu"]["sysroot"],
        qemu_features=frozenset(entry["qemu"]["features"]),
    )


@cache
def known_features(architecture: str) -> frozenset[str]:
    """Every feature archspec names for some target of the architecture."""
    import archspec.cpu

    family = ARCHSPEC_FAMILY[architecture]
    return frozenset(
        feature
        for target in archspec.cpu.TARGETS.values()
        if target.family.name == family
        for feature in target.features
    )


@dataclass
class Scan:
    """The features a set of ELF files needs, each with one instruction that needs it."""

    architecture: str = ""
    features: dict[str, str] = field(default_factory=dict)
    instructions: int = 0
    programs: list[str] = field(default_factory=list)  # executables (not shared libraries)

    def needs(self, ignoring: Iterable[str] = ()) -> set[str]:
        return set(self.features) - set(ignoring)

    def example(self, features: Iterable[str]) -> str:
        """`avx512f (vaddpd %zmm1,...)`, for a message naming what a CPU lacks."""
        return ", ".join(f"{f} ({self.features[f]})" if f in self.features else f for f in features)


def scan(directory: Path, files: Iterable[str]) -> Scan:
    """Decode the ELF files among `files` (paths under `directory`); others (scripts, data)
    are skipped. Raises UserError for ELF files of two architectures or of one EC2 lacks."""
    result = Scan()
    for relative in files:
        path = directory / relative
        with path.open("rb") as handle:
            if handle.read(4) != b"\x7fELF":
                continue
            handle.seek(0)
            try:
                elf = ELFFile(handle)
            except ELFError as exc:
                raise UserError(f"{relative}: not a valid ELF file ({exc})") from None
            architecture = _MACHINES.get(str(elf["e_machine"]))
            if architecture is None:
                raise UserError(f"{relative} is {elf['e_machine']}: not x86_64 or arm64 code")
            if result.architecture and architecture != result.architecture:
                raise UserError(
                    f"{relative} is {architecture} code beside {result.architecture} code"
                )
            result.architecture = architecture
            if elf["e_type"] == "ET_EXEC" or elf.get_section_by_name(".interp") is not None:
                result.programs.append(relative)
            for section in elf.iter_sections():
                if section["sh_flags"] & _EXECINSTR and section["sh_type"] != "SHT_NOBITS":
                    _decode(architecture, section.data(), section["sh_addr"], result)
    return result


def _decode(architecture: str, code: bytes, address: int, into: Scan) -> None:
    table = data(architecture)
    decoded = _x86_64(code, address) if architecture == "x86_64" else _arm64(code, address)
    for count, tags, text in decoded:
        into.instructions += count
        for tag in tags:
            for name in table.named(tag):
                into.features.setdefault(name, text)


def _x86_64(code: bytes, address: int) -> Iterator[tuple[int, list[str], str]]:
    """(instructions, feature tags, one instruction's text) per distinct instruction code: the
    features depend on the code alone, and a binary has a few hundred distinct codes among its
    hundreds of thousands of instructions."""
    import iced_x86

    tag_names = _enum_names(iced_x86.CpuidFeature)
    decoder = iced_x86.Decoder(64, code, ip=address)
    instruction = iced_x86.Instruction()
    first: dict[int, Any] = {}
    counts: dict[int, int] = {}
    while decoder.can_decode:
        decoder.decode_out(instruction)
        if instruction.code == iced_x86.Code.INVALID:
            continue
        if instruction.code not in first:
            first[instruction.code] = instruction.copy()
            counts[instruction.code] = 0
        counts[instruction.code] += 1
    formatter = iced_x86.Formatter(iced_x86.FormatterSyntax.GAS)
    for code_id, sample in first.items():
        tags = [tag_names[f] for f in sample.cpuid_features()]
        yield counts[code_id], tags, formatter.format(sample)


def _arm64(code: bytes, address: int) -> Iterator[tuple[int, list[str], str]]:
    """As _x86_64, per distinct 32-bit instruction word (arm64 instructions are fixed-size),
    decoded once each: capstone's feature detail is slow, and words repeat."""
    import capstone
    import capstone.aarch64_const

    words: dict[int, int] = {}
    for (word,) in struct.iter_unpack("<I", code[: len(code) // 4 * 4]):
        words[word] = words.get(word, 0) + 1
    engine = capstone.Cs(capstone.CS_ARCH_AARCH64, capstone.CS_MODE_ARM)
    engine.detail = True
    tag_names = _feature_names(capstone)
    for word, count in words.items():
        if word & _HINT_MASK == _HINT:
            yield count, [], "hint"
            continue
        decoded = list(engine.disasm(struct.pack("<I", word), address))
        if not decoded:  # data in a code section, or an encoding capstone does not know
            continue
        instruction = decoded[0]
        tags = [tag_names[g] for g in instruction.groups if g in tag_names]
        yield count, tags, f"{instruction.mnemonic} {instruction.op_str}".strip()


@cache
def _enum_names(enum: Any) -> dict[int, str]:
    return {v: k for k, v in vars(enum).items() if not k.startswith("_") and isinstance(v, int)}


@cache
def _feature_names(capstone: Any) -> dict[int, str]:
    """capstone's AArch64 feature groups by id, named without the AARCH64_FEATURE_HAS prefix."""
    prefix = "AARCH64_FEATURE_HAS"
    constants = vars(capstone.aarch64_const)
    return {v: k.removeprefix(prefix) for k, v in constants.items() if k.startswith(prefix)}
