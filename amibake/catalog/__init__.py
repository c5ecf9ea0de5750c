"""The catalog: data files shipped with amibake, and thin typed loaders over them."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

from amibake.errors import UnknownNameError

ARCHITECTURES = ("x86_64", "arm64")
# archspec names the 64-bit Arm family aarch64; EC2 and AMIs say arm64.
ARCHSPEC_FAMILY = {"x86_64": "x86_64", "arm64": "aarch64"}


@dataclass(frozen=True)
class Family:
    name: str
    architecture: str
    generations: tuple[str, ...]
    processor: str
    sizes: tuple[str, ...]

    def instance_type(self, size: str) -> str:
        return f"{self.name}.{size}"


class CatalogError(ValueError):
    """The shipped data is malformed: a bug in the data file, caught by its test."""


@cache
def families() -> dict[str, Family]:
    raw = json.loads(resources.files("amibake.catalog").joinpath("families.json").read_text())
    result = {}
    for name, entry in raw["families"].items():
        family = Family(
            name=name,
            architecture=entry["architecture"],
            generations=tuple(entry["generations"]),
            processor=entry["processor"],
            sizes=tuple(entry["sizes"]),
        )
        validate(family)
        result[name] = family
    return result


def validate(family: Family) -> None:
    import archspec.cpu

    if family.architecture not in ARCHITECTURES:
        raise CatalogError(f"{family.name}: architecture {family.architecture!r}")
    if not family.generations or not family.sizes:
        raise CatalogError(f"{family.name}: needs generations and sizes")
    for generation in family.generations:
        target = archspec.cpu.TARGETS.get(generation)
        if target is None:
            raise CatalogError(f"{family.name}: {generation!r} is not an archspec target")
        if target.family.name != ARCHSPEC_FAMILY[family.architecture]:
            raise CatalogError(f"{family.name}: {generation} is not {family.architecture}")


def family(name: str) -> Family:
    known = families()
    if name not in known:
        raise UnknownNameError("family", name, known, "see `amibake families`")
    return known[name]
