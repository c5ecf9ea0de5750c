"""What an artifact's machine code needs from a CPU, read from the code itself.

Every executable section of the artifact's ELF files is decoded (iced-x86 for x86-64, capstone
for arm64: each tags an instruction with the CPU features it needs) and the tags are named as
/proc/cpuinfo and archspec name features (`catalog/isa.json`). Whether a machine runs the
artifact is then a question of sets (`amibake.cpu`), never of family or vendor names: a
`-march=znver2` build may use nothing an Icelake lacks.

The scan runs on the controller, on the files the build host sent back, so no host needs a
disassembler. Decoding is linear, as objdump's is: code that jumps into the middle of an
instruction is not followed (compilers do not emit it).

Code that runs only once a CPU check has passed does not count: the functions an IFUNC
resolver returns (glibc's memcpy, strlen... variants in a static program, gcc's target_clones
in any), which run only where the resolver found their features, and the C runtime's own
guarded code (_GUARDED: glibc's trampolines, lock elision and memory tagging, libgcc's outline
atomics and unwinder). Without that a static program of baseline code read as needing AVX-512
and RTM on x86-64 and SVE and MTE on arm64, which no EC2 CPU has all of: it was judged to run
nowhere. This needs the symbol table; a stripped program is read whole.
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
from elftools.elf.relocation import RelocationSection
from elftools.elf.sections import SymbolTableSection

from amibake.catalog import ARCHSPEC_FAMILY
from amibake.errors import UserError

# e_machine of the two architectures EC2 offers (ELF's EM_X86_64, EM_AARCH64).
_MACHINES = {"EM_X86_64": "x86_64", "EM_AARCH64": "arm64"}
_EXECINSTR = 0x4  # SHF_EXECINSTR
# arm64's hint space (HINT #imm: PACIASP, AUTIASP, BTI, ...) runs as NOP on a CPU without the
# feature, which is why -mbranch-protection code runs anywhere.
_HINT_MASK, _HINT = 0xFFFFF01F, 0xD503201F
# R_X86_64_IRELATIVE, R_AARCH64_IRELATIVE: a slot filled with what its resolver returns.
_IRELATIVE = {"x86_64": 37, "arm64": 1032}
EVERYTHING = None  # a guarded function whose every feature is the CPU check's to grant
# The C runtime's code that runs only once a CPU check has passed: the features the check
# grants, and the functions (name prefixes). What else such a function uses still counts.
# fmt: off
_GUARDED: tuple[tuple[frozenset[str] | None, tuple[str, ...]], ...] = (
    # glibc's ld.so: start-up picks the lazy-binding and TLS trampolines that save registers
    # with the best XSAVE form the CPU has (sysdeps/x86_64/dl-machine.h).
    (EVERYTHING, ("_dl_runtime_resolve_", "_dl_runtime_profile_", "_dl_tlsdesc_dynamic_")),
    # XGETBV once CPUID says the OS saves the registers: glibc's (sysdeps/x86/cpu-features.c)
    # and libgcc's, which target_clones' resolvers ask (cpuinfo.c).
    (frozenset({"xsave"}), ("update_active", "get_available_features", "__cpu_indicator_init")),
    # glibc's lock elision, switched on only where CPUID says RTM (sysdeps/x86/elide.h).
    (frozenset({"rtm"}), ("__lll_lock_elision", "__lll_unlock_elision", "__lll_trylock_elision",
                          "__lll_timedlock_elision")),
    # glibc's malloc tags memory only where the kernel says MTE (mtag_enabled).
    (frozenset({"mte"}), ("__libc_mtag_", "_int_", "__libc_malloc", "__libc_calloc",
                          "__libc_realloc", "__libc_free", "__libc_memalign", "_mid_memalign",
                          "malloc", "tag_new_usable")),
    # libgcc's outline atomics: LSE where HWCAP says so, else load/store-exclusive loops.
    (frozenset({"atomics"}), ("__aarch64_cas", "__aarch64_swp", "__aarch64_ldadd",
                              "__aarch64_ldclr", "__aarch64_ldeor", "__aarch64_ldset")),
    # libgcc's unwinder reads SVE's vector length only for a frame whose CFI names it, which
    # only SVE code's frames do.
    (frozenset({"sve"}), ("execute_stack_op", "uw_update_context", "_Unwind_GetGR")),
)
# fmt: on
Guard = tuple[int, int, frozenset[str] | None]  # [start, end), the features it grants there


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
            guards = guarded(elf, architecture)
            # The code each guard grants the same features, decoded as one (a decoder's start
            # costs more than its instructions in a static program's hundreds of pieces):
            # pieces start and end at function boundaries, which are instructions'.
            code: dict[frozenset[str], tuple[int, list[bytes]]] = {}
            for section in elf.iter_sections():
                if section["sh_flags"] & _EXECINSTR and section["sh_type"] != "SHT_NOBITS":
                    start = section["sh_addr"]
                    for begin, end, grants in _pieces(start, start + section["sh_size"], guards):
                        if grants is not EVERYTHING:
                            piece = section.data()[begin - start : end - start]
                            code.setdefault(grants, (begin, []))[1].append(piece)
            for grants, (address, pieces) in code.items():
                found = Scan()
                _decode(architecture, b"".join(pieces), address, found)
                result.instructions += found.instructions
                for feature, text in found.features.items():
                    if feature not in grants:
                        result.features.setdefault(feature, text)
    return result


def guarded(elf: ELFFile, architecture: str) -> list[Guard]:
    """The functions, sorted by address, that run only once a CPU check passed (see the module's
    doc): each IFUNC resolver's possible answers (read from the addresses its code loads), which
    the check grants everything, and the C runtime's guarded code (_GUARDED). Empty without a
    symbol table."""
    symbols = elf.get_section_by_name(".symtab")
    if not isinstance(symbols, SymbolTableSection):
        return []
    functions: dict[int, int] = {}  # start -> end
    resolvers: set[int] = set()
    found: list[Guard] = []
    for symbol in symbols.iter_symbols():
        kind, start, size = symbol["st_info"]["type"], symbol["st_value"], symbol["st_size"]
        if kind not in ("STT_FUNC", "STT_LOOS") or not size:  # STT_LOOS: STT_GNU_IFUNC
            continue
        functions[start] = max(functions.get(start, 0), start + size)
        if kind == "STT_LOOS":
            resolvers.add(start)
        for grants, prefixes in _GUARDED:
            if symbol.name.startswith(prefixes):
                found.append((start, start + size, grants))
                break
    for section in elf.iter_sections():
        if isinstance(section, RelocationSection) and section.is_RELA():
            resolvers |= {
                r["r_addend"]
                for r in section.iter_relocations()
                if r["r_info_type"] == _IRELATIVE[architecture]
            }
    targets: set[int] = set()
    for resolver in resolvers:
        end = functions.get(resolver)
        code = _bytes_at(elf, resolver, end) if end else b""
        loaded = _x86_64_addresses if architecture == "x86_64" else _arm64_addresses
        targets |= {a for a in loaded(code, resolver) if a in functions and a not in resolvers}
    found += [(t, functions[t], EVERYTHING) for t in targets]
    return sorted(found, key=lambda g: (g[0], g[1]))


def _bytes_at(elf: ELFFile, start: int, end: int) -> bytes:
    for section in elf.iter_sections():
        base = section["sh_addr"]
        if section["sh_flags"] & _EXECINSTR and base <= start and end <= base + section["sh_size"]:
            return bytes(section.data()[start - base : end - base])
    return b""


def _pieces(start: int, end: int, guards: list[Guard]) -> Iterator[Guard]:
    """[start, end) cut at the guarded functions (sorted; where two overlap, the first wins):
    each piece with the features its guard grants (none outside any)."""
    at = start
    for begin, finish, grants in guards:
        begin, finish = max(begin, at), min(finish, end)
        if finish <= begin:
            continue
        if begin > at:
            yield at, begin, frozenset()
        yield begin, finish, grants
        at = finish
    if at < end:
        yield at, end, frozenset()


def _x86_64_addresses(code: bytes, address: int) -> Iterator[int]:
    """The addresses x86-64 code loads: RIP-relative operands (lea f(%rip)) and immediates
    (mov $f, %eax in code that is not position-independent)."""
    import iced_x86

    for instruction in iced_x86.Decoder(64, code, ip=address):
        if instruction.is_ip_rel_memory_operand:
            yield instruction.ip_rel_memory_address
        for operand in range(instruction.op_count):
            if instruction.op_kind(operand) in _immediate_kinds():
                yield instruction.immediate(operand)


def _arm64_addresses(code: bytes, address: int) -> Iterator[int]:
    """The addresses arm64 code forms: ADRP's page plus a later ADD's offset, or ADR."""
    import capstone
    import capstone.aarch64_const as a64

    engine = capstone.Cs(capstone.CS_ARCH_AARCH64, capstone.CS_MODE_ARM)
    engine.detail = True
    pages: dict[int, int] = {}  # register -> page ADRP put there
    for instruction in engine.disasm(code, address):
        operands = instruction.operands
        if instruction.mnemonic in ("adrp", "adr") and len(operands) == 2:
            pages[operands[0].reg] = operands[1].imm
            if instruction.mnemonic == "adr":
                yield operands[1].imm
        elif (
            instruction.mnemonic == "add"
            and len(operands) == 3
            and operands[1].type == a64.AARCH64_OP_REG
            and operands[1].reg in pages
            and operands[2].type == a64.AARCH64_OP_IMM
        ):
            yield pages[operands[1].reg] + operands[2].imm


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
def _immediate_kinds() -> frozenset[int]:
    """iced's operand kinds that can hold an address (32 or 64 bits wide)."""
    import iced_x86

    kinds = iced_x86.OpKind
    return frozenset(
        (kinds.IMMEDIATE32, kinds.IMMEDIATE64, kinds.IMMEDIATE32TO64, kinds.IMMEDIATE8TO64)
    )


@cache
def _enum_names(enum: Any) -> dict[int, str]:
    return {v: k for k, v in vars(enum).items() if not k.startswith("_") and isinstance(v, int)}


@cache
def _feature_names(capstone: Any) -> dict[int, str]:
    """capstone's AArch64 feature groups by id, named without the AARCH64_FEATURE_HAS prefix."""
    prefix = "AARCH64_FEATURE_HAS"
    constants = vars(capstone.aarch64_const)
    return {v: k.removeprefix(prefix) for k, v in constants.items() if k.startswith(prefix)}
