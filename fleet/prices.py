"""EC2 prices: the snapshot fleet ships with, how it is made, and lookups.

The snapshot is built by this module from a published price table (``python -m fleet.prices
build``, or ``make prices``), and records where the numbers came from and when. Spot prices move
hourly: the snapshot is a default for offline use, not a quote.
"""

from __future__ import annotations

import argparse
import csv
import difflib
import json
import statistics
import sys
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

SNAPSHOT = "prices_us-east-1.json"


class PriceError(Exception):
    """A price that is not there, or a table that is not a price table."""


@dataclass(frozen=True)
class Price:
    instance_type: str
    vcpus: float
    memory_gib: float
    on_demand: float  # USD per hour
    spot: dict[str, float]  # availability zone id -> USD per hour

    @property
    def spot_median(self) -> float:
        return statistics.median(self.spot.values())

    def hourly(self, spot: bool, zone: str | None = None) -> float:
        """The price of the exact market: spot in that zone (median if none given), or on-demand."""
        if not spot:
            return self.on_demand
        if zone is None:
            return self.spot_median
        if zone not in self.spot:
            raise PriceError(
                f"no spot price for {self.instance_type} in {zone}; known: {', '.join(self.spot)}"
            )
        return self.spot[zone]


def build(table: Path, source: str, date: str, region: str) -> dict[str, Any]:
    """A snapshot document from a table with InstanceType, vCPUs, MemoryGiB, Price, SpotPrice,
    Region, AvailabilityZone columns (one row per type and zone)."""
    needed = {
        "InstanceType",
        "vCPUs",
        "MemoryGiB",
        "Price",
        "SpotPrice",
        "Region",
        "AvailabilityZone",
    }
    prices: dict[str, dict[str, Any]] = {}
    with table.open(newline="") as handle:
        reader = csv.DictReader(handle)
        missing = needed - set(reader.fieldnames or [])
        if missing:
            raise PriceError(f"{table}: missing columns {', '.join(sorted(missing))}")
        for line, row in enumerate(reader, start=2):
            if row["Region"] != region:
                continue
            try:
                entry = prices.setdefault(
                    row["InstanceType"],
                    {
                        "vcpus": float(row["vCPUs"]),
                        "memory_gib": float(row["MemoryGiB"]),
                        "on_demand": float(row["Price"]),
                        "spot": {},
                    },
                )
                if row["SpotPrice"]:
                    entry["spot"][row["AvailabilityZone"]] = float(row["SpotPrice"])
            except ValueError as exc:
                raise PriceError(f"{table}:{line}: {exc}") from None
    return {
        "region": region,
        "source": source,
        "date": date,
        "generated_by": f"python -m fleet.prices build {table.name}",
        "note": "Spot prices move hourly: this is a default for offline use, not a quote.",
        "prices": {t: prices[t] for t in sorted(prices)},
    }


@cache
def snapshot() -> dict[str, Any]:
    data = resources.files("fleet.catalog").joinpath(SNAPSHOT).read_text()
    return json.loads(data)  # type: ignore[no-any-return]


def lookup(instance_type: str, document: dict[str, Any] | None = None) -> Price:
    document = snapshot() if document is None else document
    table = document["prices"]
    if instance_type not in table:
        close = difflib.get_close_matches(instance_type, table, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        raise PriceError(f"no price for {instance_type} in the {document['date']} snapshot{hint}")
    entry = table[instance_type]
    return Price(
        instance_type, entry["vcpus"], entry["memory_gib"], entry["on_demand"], dict(entry["spot"])
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleet.prices")
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="build the shipped snapshot from a price table")
    make.add_argument("table", type=Path)
    make.add_argument("--source", required=True, help="where the table came from")
    make.add_argument("--date", required=True, help="when its prices were taken (YYYY-MM-DD)")
    make.add_argument("--region", default="us-east-1")
    make.add_argument("--out", type=Path, default=Path(__file__).parent / "catalog" / SNAPSHOT)
    args = parser.parse_args(argv)
    try:
        document = build(args.table, args.source, args.date, args.region)
    except (PriceError, OSError) as exc:
        print(f"fleet.prices: error: {exc}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.out}: {len(document['prices'])} instance types, prices of {args.date}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
