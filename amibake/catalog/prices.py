"""Prices as data: the EC2 price snapshot (on-demand, and spot per zone) that fleet ranks runs
with and `amibake ls` prices instances with, and AWS's storage list prices (EBS gp3, EBS
snapshots, S3 Standard) for volumes, snapshots and buckets. Both are us-east-1's, each with its
source and date; a table of another region is refreshed by `fleet prices --refresh`."""

from __future__ import annotations

import json
import statistics
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

SNAPSHOT = "prices_us-east-1.json"  # made by `python -m fleet.prices build` (make prices)
STORAGE = "storage_prices_us-east-1.json"
HOURS_A_MONTH = 730  # AWS's month in its prices: 365 days x 24 hours / 12
GIB = 2**30


def _read(name: str) -> dict[str, Any]:
    return json.loads(resources.files("amibake.catalog").joinpath(name).read_text())  # type: ignore[no-any-return]


def saved(results_dir: Path, region: str) -> Path:
    """Where `fleet prices --refresh` keeps a region's table: one file per region."""
    return results_dir / f"prices_{region}.json"


def checked(document: Any) -> dict[str, Any]:
    """A price table, its numbers checked (a KeyError, TypeError or ValueError says it is
    not one)."""
    for entry in document["prices"].values():
        spot = entry["spot"].values()
        for value in (entry["on_demand"], entry["vcpus"], entry["memory_gib"], *spot):
            float(value)
    str(document["date"])
    return document  # type: ignore[no-any-return]


@cache
def snapshot() -> dict[str, Any]:
    """The EC2 price snapshot: {"region", "source", "date", "prices": {type: {...}}}."""
    return _read(SNAPSHOT)


@cache
def storage() -> dict[str, Any]:
    """The storage prices: {"region", "date", "prices": {"ebs-gp3"|...: {usd_per_gb_month,
    what, source}}}."""
    return _read(STORAGE)


def instance_hourly(instance_type: str, spot: bool, region: str) -> float | None:
    """USD an hour for the type in the region: on-demand, or spot as the median over the zones
    (a running spot instance pays its zone's price, which moves hourly); None when the snapshot
    has no price for it (another region's, or a type it does not list)."""
    table = snapshot()
    entry = table["prices"].get(instance_type) if table["region"] == region else None
    if entry is None:
        return None
    if spot:
        return float(statistics.median(entry["spot"].values())) if entry["spot"] else None
    return float(entry["on_demand"])


def storage_monthly(kind: str, size_bytes: float, region: str) -> float | None:
    """USD a month to store `size_bytes` as `kind` (ebs-gp3, ebs-snapshot, s3-standard) in the
    region; None for a region or kind the table does not price."""
    table = storage()
    entry = table["prices"].get(kind) if table["region"] == region else None
    if entry is None:
        return None
    return float(entry["usd_per_gb_month"]) * size_bytes / GIB
