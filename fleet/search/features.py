"""Configurations as numbers a model can learn from.

An instance type is not an unordered name: AWS names it `<class><generation><attributes>.<size>`
(https://docs.aws.amazon.com/ec2/latest/instancetypes/instance-type-names.html), so `c7a.2xlarge`
says compute-optimised (2 GiB per vCPU), 7th generation, AMD, 8 vCPUs. The price catalog, where it
knows the type, gives the exact vCPUs, memory and price. Numbers (threads, block sizes, node
counts) are numbers: near values perform alike.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from functools import cache
from typing import Any

import numpy as np

from amibake.errors import UserError
from fleet.space import TYPE, Param, Space

FAMILY = re.compile(r"^(?P<cls>[a-z]+?)(?P<gen>\d+)(?P<attrs>[a-z-]*)$")
# GiB of memory per vCPU by class letter, where the catalog does not know the type.
MEMORY_PER_VCPU = {"c": 2.0, "m": 4.0, "r": 8.0, "x": 16.0, "z": 8.0, "t": 4.0, "i": 8.0, "d": 8.0}
TYPE_FEATURES = (
    "log2_vcpus", "log2_gib_per_vcpu", "generation", "amd", "graviton", "intel",
    "log_usd_per_vcpu_hour",
)  # fmt: skip


@dataclass(frozen=True)
class TypeFacts:
    family: str
    cls: str
    generation: int
    processor: str  # amd | graviton | intel; "" where only the catalog knows the type
    vcpus: float | None  # None for a family alone
    gib_per_vcpu: float
    usd_per_vcpu_hour: float | None


def size_vcpus(size: str) -> float | None:
    """vCPUs of a size name by AWS's convention (large 2, xlarge 4, Nxlarge 4N); None for one
    the convention does not size (metal)."""
    fixed = {"nano": 2.0, "micro": 2.0, "small": 2.0, "medium": 1.0, "large": 2.0, "xlarge": 4.0}
    if size in fixed:
        return fixed[size]
    # metal-48xl: the whole host of a 48xlarge, sized as one
    found = re.fullmatch(r"(?:metal-)?(\d+)xl(?:arge)?", size)
    return 4.0 * int(found.group(1)) if found else None


def _price(name: str) -> Any:
    from fleet.prices import PriceError, lookup

    try:
        return lookup(name)
    except PriceError:
        return None


@cache
def facts(name: str) -> TypeFacts | None:
    """What a type's (`c7a.2xlarge`) or family's (`c7a`) name and the catalog say; None when
    neither explains it (a name that follows no convention the search knows, a size such as
    `metal` the convention does not size, and no price in the catalog for it)."""
    family, _, size = name.partition(".")
    found = FAMILY.match(family)
    price = _price(name) if size else None
    if found is None and price is None:
        return None
    cls, attrs = (found["cls"], found["attrs"]) if found else ("", "")
    processor = (
        "" if found is None else "amd" if "a" in attrs else "graviton" if "g" in attrs else "intel"
    )
    vcpus = size_vcpus(size) if size else None
    if size and vcpus is None and price is None:
        return None
    gib_per_vcpu = MEMORY_PER_VCPU.get(cls[:1], 4.0)
    usd: float | None = None
    if price is not None:
        vcpus, gib_per_vcpu = price.vcpus, price.memory_gib / price.vcpus
        usd = price.on_demand / price.vcpus
    generation = int(found["gen"]) if found else 0
    return TypeFacts(family, cls, generation, processor, vcpus, gib_per_vcpu, usd)


def explains(name: str) -> bool:
    return facts(name) is not None


def _type_row(name: str) -> list[float]:
    known = facts(name)
    if known is None:
        return [math.nan] * len(TYPE_FEATURES)
    return [
        math.log2(known.vcpus) if known.vcpus else math.nan,
        math.log2(known.gib_per_vcpu),
        float(known.generation),
        float(known.processor == "amd"),
        float(known.processor == "graviton"),
        float(known.processor == "intel"),
        math.log(known.usd_per_vcpu_hour) if known.usd_per_vcpu_hour else math.nan,
    ]


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _kind(param: Param) -> str:
    """How a parameter is turned into numbers."""
    if param.kind in ("uniform", "loguniform"):
        return "log" if param.kind == "loguniform" else "number"
    values = param.options()
    if param.name == TYPE or (values and all(isinstance(v, str) and explains(v) for v in values)):
        return "type"
    if values and all(_is_number(v) for v in values):
        low, high = min(values), max(values)
        return "log" if low > 0 and high / low >= 8 else "number"
    if values and all(isinstance(v, str) and size_vcpus(v) for v in values):
        return "size"
    return "onehot"


# Columns of a type's row that say how big it is (ordered: a start design stays mid-size on
# them); the others say what it is (class, generation, processor: spread over them).
TYPE_SIZE_COLUMNS = (0,)
# With a scale parameter (a node count) beside the instance type, the cluster's totals: what a
# cluster's time, memory wall and price follow (time ~ a + b/(nodes x vCPUs x speed) + c log n;
# it fails where a node's share of the memory does not fit; it costs nodes x price).
TOTALS = ("log2_total_vcpus", "log2_total_gib", "log_total_usd_per_hour")


def unexplained(space: Space) -> UserError | None:
    """The refusal for an instance type the search is to read as features but neither its name
    nor the catalog explains, naming where the space gives it; None when every one is read."""
    for name, param in space.params.items():
        if param.kind != "categorical" or name != TYPE:
            continue
        for value in param.options():
            if not explains(str(value)):
                return UserError(
                    f"{space.origin(name)}: params.{name}: {value!r} is neither named as AWS "
                    "names types (FAMILY.SIZE, such as c7a.2xlarge) nor priced in the catalog, "
                    "so the search cannot read its class, processor and size: refresh the "
                    "catalog (`fleet prices --refresh`), or search it with algorithm = "
                    '"tpe", "random" or "grid"'
                )
    return None


class Encoder:
    """Configurations of a space -> rows of numbers, each column scaled to [0, 1] over the
    candidates (so that distances and a model's length scales mean the same on every axis). A
    parameter a configuration does not have (a conditional one) reads as -0.5: apart from every
    real value.

    `sized` marks the ordered columns (numbers, sizes, node counts, totals): a start design
    takes the middle of them and spreads over the rest."""

    def __init__(self, space: Space) -> None:
        refused = unexplained(space)
        if refused is not None:
            raise refused
        self.space = space
        self.kinds = {name: _kind(param) for name, param in space.params.items()}
        self.levels = {
            name: list(space.params[name].options())
            for name, kind in self.kinds.items()
            if kind == "onehot"
        }
        types = [name for name, kind in self.kinds.items() if kind == "type"]
        scales = [name for name, param in space.params.items() if param.scale]
        self.totals = (types[0], scales[0]) if len(types) == 1 and scales else None
        sized: list[bool] = []
        for name, kind in self.kinds.items():
            if kind == "type":
                sized += [i in TYPE_SIZE_COLUMNS for i in range(len(TYPE_FEATURES))]
            elif kind == "onehot":
                sized += [False] * len(self.levels[name])
            else:
                sized.append(True)
        if self.totals:
            sized += [True] * len(TOTALS)
        self.sized = np.array(sized, dtype=bool)
        self.low: np.ndarray | None = None
        self.span: np.ndarray | None = None

    def _raw(self, params: dict[str, Any]) -> list[float]:
        row: list[float] = []
        for name, kind in self.kinds.items():
            value = params.get(name)
            if kind == "type":
                row += _type_row(str(value)) if value is not None else [math.nan] * 7
            elif kind == "onehot":
                row += [float(value == level) for level in self.levels[name]]
            elif value is None:
                row.append(math.nan)
            elif kind == "size":
                row.append(math.log2(size_vcpus(str(value)) or 1.0))
            elif kind == "log":
                row.append(math.log(float(value)))
            else:
                row.append(float(value))
        if self.totals:
            row += self._totals(params)
        return row

    def _totals(self, params: dict[str, Any]) -> list[float]:
        assert self.totals is not None
        kind, scale = self.totals
        known = facts(str(params.get(kind)))
        count = params.get(scale)
        if known is None or known.vcpus is None or not isinstance(count, int | float):
            return [math.nan] * len(TOTALS)
        vcpus = float(count) * known.vcpus
        if vcpus <= 0:
            return [math.nan] * len(TOTALS)
        usd = math.log(vcpus * known.usd_per_vcpu_hour) if known.usd_per_vcpu_hour else math.nan
        return [math.log2(vcpus), math.log2(vcpus * known.gib_per_vcpu), usd]

    def fit(self, candidates: list[dict[str, Any]]) -> np.ndarray:
        raw = np.array([self._raw(c) for c in candidates], dtype=float)
        with np.errstate(all="ignore"):
            self.low = np.nanmin(raw, axis=0)
            high = np.nanmax(raw, axis=0)
        self.low = np.where(np.isnan(self.low), 0.0, self.low)
        span = np.where(np.isnan(high), 1.0, high) - self.low
        self.span = np.where(span > 0, span, 1.0)
        return self.encode_raw(raw)

    def encode(self, configurations: list[dict[str, Any]]) -> np.ndarray:
        return self.encode_raw(np.array([self._raw(c) for c in configurations], dtype=float))

    def encode_raw(self, raw: np.ndarray) -> np.ndarray:
        assert self.low is not None and self.span is not None, "fit first"
        scaled = (raw - self.low) / self.span
        return np.where(np.isnan(scaled), -0.5, scaled)
