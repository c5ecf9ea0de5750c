"""Family -> CPU target -> compiler flags, from archspec.

The target is the newest microarchitecture that every CPU generation of the family can run (c5
lands on Skylake or Cascade Lake, so c5 builds for skylake_avx512). Flags come from archspec for
the compiler version found on the build host; when that compiler cannot target the CPU (zen4
needs gcc 12.3+), the best ancestor it can target is used instead, and the result says so.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import archspec.cpu

from amibake.catalog import Family
from amibake.errors import UserError

_COMPILER = re.compile(r"^(gcc|clang)@(\d+(?:\.\d+){0,2})$")


@dataclass(frozen=True)
class Compiler:
    name: str
    version: str

    @classmethod
    def parse(cls, text: str) -> Compiler:
        match = _COMPILER.match(text.strip())
        if not match:
            raise UserError(f"compiler {text!r} is not NAME@VERSION, e.g. gcc@12.2 or clang@17")
        return cls(match.group(1), match.group(2))

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def series(self) -> str:
        """major.minor: archspec's ranges ("10.3:12.2") exclude "12.2.0" but mean to include it,
        and its flags never differ by patch level."""
        return ".".join(self.version.split(".")[:2])


@dataclass(frozen=True)
class Flags:
    family: str
    target: str  # the family's target: the newest microarchitecture all its CPUs run
    used: str  # what the flags are for: the target, or the ancestor the compiler can do
    compiler: Compiler
    cflags: str

    @property
    def fell_back(self) -> bool:
        return self.used != self.target

    @property
    def warning(self) -> str | None:
        if not self.fell_back:
            return None
        return (
            f"{self.compiler} cannot target {self.target} (family {self.family}); "
            f"using {self.used} instead: upgrade the compiler for full speed"
        )


def _depth(target: archspec.cpu.Microarchitecture) -> int:
    return len(target.ancestors)


def family_target(family: Family) -> archspec.cpu.Microarchitecture:
    """The newest microarchitecture every generation of the family runs."""
    candidates: set[str] | None = None
    for generation in family.generations:
        target = archspec.cpu.TARGETS[generation]
        runs = {target.name, *(a.name for a in target.ancestors)}
        candidates = runs if candidates is None else candidates & runs
    assert candidates, f"{family.name}: generations share no target"
    # The newest is the one with the longest ancestry; name breaks a tie deterministically.
    return max((archspec.cpu.TARGETS[n] for n in candidates), key=lambda t: (_depth(t), t.name))


# Flags archspec's spelling of a target for an older compiler leaves out, though the target's
# CPUs have them (its own feature list names them) and that compiler takes them: for gcc before
# 12.3, zen4 is -march=znver3 plus AVX-512 flags without VPOPCNTDQ, BF16 and GFNI, so a c7a
# build (AL2023's gcc is 11) never used vpopcntq on a Genoa. And one a compiler's spelling
# enables though the target's CPUs lack it: gcc before 12.3 turned on AVX512-VP2INTERSECT under
# -march=sapphirerapids (gcc commit d644dfe3 took it out: no Sapphire Rapids has it), so a c7i
# build could use an instruction no c7i runs.
ARCHSPEC_OMITS = {
    ("zen4", "-march=znver3"): "-mavx512vpopcntdq -mavx512bf16 -mgfni",
    ("sapphirerapids", "-march=sapphirerapids"): "-mno-avx512vp2intersect",
}


def for_family(family: Family, compiler: Compiler) -> Flags:
    target = family_target(family)
    ladder = [target, *sorted(target.ancestors, key=lambda t: (-_depth(t), t.name))]
    for candidate in ladder:
        try:
            cflags = candidate.optimization_flags(compiler.name, compiler.series)
        except archspec.cpu.UnsupportedMicroarchitecture:
            continue
        if not cflags and candidate.vendor != "generic":
            continue
        for (name, spelled), extra in ARCHSPEC_OMITS.items():
            if candidate.name == name and spelled in cflags.split():
                cflags = f"{cflags} {extra}"
        return Flags(family.name, target.name, candidate.name, compiler, cflags)
    raise UserError(f"{compiler} cannot target any microarchitecture of family {family.name}")


# The baseline every CPU of the architecture runs: what a "generic" build targets.
GENERIC_TARGET = {"x86_64": "x86_64", "arm64": "aarch64"}


def for_build(family: Family, compiler: Compiler, generic: bool = False) -> Flags:
    """The family's tuned flags, or with ``generic`` the architecture's baseline (a portable
    build to compare the tuned one against)."""
    if not generic:
        return for_family(family, compiler)
    target = archspec.cpu.TARGETS[GENERIC_TARGET[family.architecture]]
    cflags = target.optimization_flags(compiler.name, compiler.series)
    return Flags(family.name, target.name, target.name, compiler, cflags)
