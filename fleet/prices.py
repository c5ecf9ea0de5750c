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
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from amibake.catalog import prices as shipped_prices
from amibake.catalog.prices import saved
from amibake.cloud.regions import LOCATIONS
from amibake.saved import read_json

SNAPSHOT = shipped_prices.SNAPSHOT  # the shipped table, in amibake/catalog/ (amibake ls reads it)


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
        if not self.spot:
            raise PriceError(f"no spot price for {self.instance_type} in the price table")
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


# The sizes below large, in their order; from xlarge up a size is a multiple of xlarge.
SMALL_SIZES = ("nano", "micro", "small", "medium", "large")


def size_key(instance_type: str) -> tuple[str, float, str]:
    """Sort key of a type by family, then size as EC2 grows them: large < xlarge < 2xlarge <
    ... < 48xlarge < metal (metal-24xl < metal-48xl), not alphabetically (12xlarge < 2xlarge)."""
    family, _, size = instance_type.partition(".")
    if size in SMALL_SIZES:
        return family, SMALL_SIZES.index(size) - len(SMALL_SIZES), size
    if size.endswith("xlarge"):
        multiple = size.removesuffix("xlarge") or "1"
        if multiple.isdigit():
            return family, float(multiple), size
    if size.startswith("metal"):
        return family, float("inf"), size
    return family, float("inf"), size  # a size EC2 may add: last, by name


def by_size(chosen: list[Price]) -> list[Price]:
    return sorted(chosen, key=lambda p: size_key(p.instance_type))


def gib(value: float) -> str:
    """Memory as people write it: 96, 3.75, 0.5 (GiB), never 96.0000."""
    return f"{value:g}"


def rows(chosen: list[Price]) -> list[dict[str, Any]]:
    """`fleet prices`'s rows (its --json too), types by family then size, vCPUs as integers."""
    return [
        {
            "type": p.instance_type,
            "vcpus": int(p.vcpus),
            "memory_gib": p.memory_gib,
            "on_demand": p.on_demand,
            "spot_min": min(p.spot.values()) if p.spot else None,
            "spot_median": round(p.spot_median, 4) if p.spot else None,
            "spot_by_zone": p.spot,
        }
        for p in by_size(chosen)
    ]


def table_text(listed: list[dict[str, Any]]) -> str:
    """`fleet prices`'s table: prices to four decimals, memory as GiB are written (96, 3.75)."""
    from tabulate import tabulate

    shown = [
        {**{k: v for k, v in r.items() if k != "spot_by_zone"}, "memory_gib": gib(r["memory_gib"])}
        for r in listed
    ]
    # Memory is text: tabulate would read "96" back as a number and print it to four decimals.
    align = ("left", "right", "right", "right", "right", "right")
    return tabulate(shown, headers="keys", floatfmt=".4f", disable_numparse=[2], colalign=align)


def build(tables: list[Path], source: str, date: str, region: str) -> dict[str, Any]:
    """A snapshot document from tables with InstanceType, vCPUs, MemoryGiB, Price, SpotPrice,
    Region, AvailabilityZone columns (one row per type and zone), read in turn."""
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
    came_from: dict[str, Path] = {}
    for table in tables:
        with table.open(newline="") as handle:
            reader = csv.DictReader(handle)
            missing = needed - set(reader.fieldnames or [])
            if missing:
                raise PriceError(f"{table}: missing columns {', '.join(sorted(missing))}")
            for line, row in enumerate(reader, start=2):
                if row["Region"] != region:
                    continue
                # A type is one table's: two tables' prices of it would mix field by field.
                first = came_from.setdefault(row["InstanceType"], table)
                if first != table:
                    raise PriceError(
                        f"{table}:{line}: {row['InstanceType']} is priced in {first} too: give "
                        "each type in one table"
                    )
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
        "generated_by": "python -m fleet.prices build " + " ".join(t.name for t in tables),
        "note": "Spot prices move hourly: this is a default for offline use, not a quote.",
        "prices": {t: prices[t] for t in sorted(prices)},
    }


def snapshot() -> dict[str, Any]:
    return shipped_prices.snapshot()


def lookup(instance_type: str, document: dict[str, Any] | None = None) -> Price:
    document = snapshot() if document is None else document
    table = document["prices"]
    if instance_type not in table:
        close = difflib.get_close_matches(instance_type, table, n=3, cutoff=0.6)
        hint = f"; did you mean {', '.join(close)}?" if close else ""
        region = document.get("region", "")
        # A type the table lacks may be one it never had (a GPU type): a refresh prices every
        # type the region sells.
        refresh = f"`fleet prices --refresh{f' --region {region}' if region else ''}`"
        raise PriceError(
            f"no price for {instance_type} in the {document['date']} snapshot{hint} "
            f"({refresh} reads every type the region sells)"
        )
    entry = table[instance_type]
    return Price(
        instance_type, entry["vcpus"], entry["memory_gib"], entry["on_demand"], dict(entry["spot"])
    )


def in_use(results_dir: Path, region: str) -> dict[str, Any]:
    """The table a run in `region` prices with: that region's last `fleet prices --refresh`,
    else the shipped snapshot when it is that region's. Never another region's: prices differ
    between regions, and a ranking by cost per unit would be the other region's."""
    refreshed = saved(results_dir, region)
    if refreshed.exists():
        return read_json(
            refreshed,
            f"read it again with `fleet prices --refresh --region {region}`",
            shipped_prices.checked,
            PriceError,
        )
    shipped = snapshot()
    if shipped["region"] != region:
        raise PriceError(
            f"no prices for {region}: fleet ships {shipped['region']}'s only; read {region}'s "
            f"with `fleet prices --refresh --region {region}`"
        )
    return shipped


def provenance(results_dir: Path, region: str) -> dict[str, str]:
    """Which table a run in `region` prices with, as its report names it: region, date and
    source ({} when there is none: a run that accepted no prices)."""
    try:
        table = in_use(results_dir, region)
    except PriceError:
        return {}
    return {k: str(table.get(k, "")) for k in ("region", "date", "source")}


# The Price List's product filters of a plain Linux instance: shared tenancy, no pre-installed
# software or licence, capacity that is used (not a reservation's unused remainder).
LINUX = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
}


@dataclass(frozen=True)
class Listed:
    """One type's on-demand offer in the Price List, with its vCPUs and memory."""

    on_demand: float
    vcpus: float
    memory_gib: float


def _memory_gib(text: str) -> float:
    """The Price List's memory attribute ("16 GiB", "0.5 GiB", "1,952 GiB") in GiB."""
    return float(text.split()[0].replace(",", "")) if text else 0.0


def _price_list(pricing: Any, location: str) -> dict[str, Listed]:
    """Every instance type the Price List sells in `location` at a Linux on-demand price: one
    paged scan (about ten pages on AWS) instead of one call per type, which also finds the
    types outside the shipped table (GPU, Inferentia, older or newer ones)."""
    filters = {**LINUX, "location": location}
    found: dict[str, Listed] = {}
    pages = pricing.get_paginator("get_products").paginate(
        ServiceCode="AmazonEC2",
        Filters=[{"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in filters.items()],
        PaginationConfig={"PageSize": 100},
    )
    for page in pages:
        for item in page.get("PriceList", []):
            product = json.loads(item) if isinstance(item, str) else item
            attributes = product.get("product", {}).get("attributes", {})
            instance_type = attributes.get("instanceType")
            if not instance_type or instance_type in found:
                continue
            usd = _hourly_usd(product)
            if usd is None:
                continue
            try:
                vcpus = float(attributes.get("vcpu", 0))
                memory = _memory_gib(str(attributes.get("memory", "")))
            except ValueError:
                continue  # a product whose size is not numbers is not one to price runs with
            found[instance_type] = Listed(usd, vcpus, memory)
    return found


def _hourly_usd(product: dict[str, Any]) -> float | None:
    for term in product.get("terms", {}).get("OnDemand", {}).values():
        for dimension in term.get("priceDimensions", {}).values():
            usd = dimension.get("pricePerUnit", {}).get("USD")
            if usd is not None and float(usd) > 0:
                return float(usd)
    return None


SPOT_NAMES = 100  # instance types named in one DescribeSpotPriceHistory request


def refresh(cloud: Any, families: list[str], now: datetime | None = None) -> dict[str, Any]:
    """Current prices: on-demand from the Price List (only served from us-east-1), spot per zone
    from the last hour of spot price history. Every type the Price List sells in the region
    is priced (of `families` when given), those outside the shipped table too: a GPU type a
    bench names is priced by a refresh. Saved under results/ as the region's table in use.
    Whatever the cloud cannot answer keeps the region's previous value, and the note says so;
    in a region with no table yet there is none to keep, and a type the cloud does not price
    is left out (the shipped table gives only the types and their sizes)."""
    now = now or datetime.now(UTC)
    region = cloud.config.region
    try:
        base: dict[str, Any] | None = in_use(cloud.config.results_dir, region)
    except PriceError:
        base = None  # the region has no table yet
    ours = base["prices"] if base else {}  # the region's own prices, kept where the cloud is mute
    notes = []
    kept = f"kept from {base['date']}" if base else "left out"
    pricing = cloud.client("pricing", region="us-east-1")  # the Price List's own region
    location = LOCATIONS.get(region)
    listed: dict[str, Listed] = {}
    try:
        if location is None:
            raise PriceError(f"no Pricing API location known for {region}")
        listed = _price_list(pricing, location)
    except Exception as exc:  # any refusal: keep the previous on-demand prices, and say why
        notes.append(f"on-demand prices {kept}: the Pricing API said: {exc}")
    else:
        if not listed:
            notes.append(f"on-demand prices {kept}: the Pricing API lists no type in {location}")
    # Every type fleet knows, with its vCPUs and memory; a type not in `ours` has no price yet.
    catalogue = {**snapshot()["prices"], **ours}
    known = set(catalogue) | set(listed)
    types = sorted(t for t in known if not families or t.split(".")[0] in families)
    if not types:
        where = f" nor in {location}'s Price List" if listed else ""
        raise PriceError(f"no instance type of {','.join(families)} in the price table{where}")
    ec2 = cloud.ec2
    zone_ids = {
        z["ZoneName"]: z.get("ZoneId", z["ZoneName"])
        for z in ec2.describe_availability_zones()["AvailabilityZones"]
    }
    newest: dict[tuple[str, str], tuple[datetime, float]] = {}
    # By name, a hundred types a request: the region's whole history would be every type it
    # offers in every zone, most of them of no use here.
    for first in range(0, len(types), SPOT_NAMES):
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=types[first : first + SPOT_NAMES],
            ProductDescriptions=["Linux/UNIX"],
            StartTime=now - timedelta(hours=1),
            EndTime=now,
        )
        for page in pages:
            for item in page["SpotPriceHistory"]:
                key = (
                    item["InstanceType"],
                    zone_ids.get(item["AvailabilityZone"], item["AvailabilityZone"]),
                )
                if key not in newest or item["Timestamp"] > newest[key][0]:
                    newest[key] = (item["Timestamp"], float(item["SpotPrice"]))
    table = {}
    unpriced = 0
    for instance_type in types:
        offer = listed.get(instance_type)
        if instance_type in catalogue:
            entry = dict(catalogue[instance_type])
        elif offer is not None:
            entry = {"vcpus": offer.vcpus, "memory_gib": offer.memory_gib}
        else:
            continue
        spot = {z: p for (t, z), (_, p) in newest.items() if t == instance_type}
        if instance_type not in ours:  # its prices are another region's: only the cloud's count
            if offer is None:
                unpriced += 1
                continue
            entry["spot"] = spot
        else:
            entry["spot"] = spot or entry["spot"]
        entry["on_demand"] = offer.on_demand if offer is not None else entry["on_demand"]
        table[instance_type] = entry
    if not newest:
        notes.append(f"no spot price history in the last hour: spot prices {kept}")
    if unpriced and table:
        notes.append(f"{unpriced} types without an on-demand price in {region} left out")
    if not table:
        raise PriceError(f"no {region} prices read: {'; '.join(notes)}")
    origin = base or snapshot()  # its provenance fields, overwritten below; its note if none new
    document = {
        **origin,
        "region": region,
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "source": f"{cloud.config.cloud}: EC2 DescribeSpotPriceHistory and the AWS Pricing API",
        "generated_by": "fleet prices --refresh",
        "note": "; ".join(notes) or origin.get("note", ""),
        "prices": {**ours, **table},
    }
    out = saved(cloud.config.results_dir, region)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Whole or not at all: a refresh stopped mid-write must not leave half a table in use.
    partial = out.with_suffix(".json.partial")
    partial.write_text(json.dumps(document, indent=1) + "\n")
    partial.replace(out)
    return document


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fleet.prices")
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser("build", help="build the shipped snapshot from a price table")
    make.add_argument("tables", type=Path, nargs="+", metavar="table")
    make.add_argument("--source", required=True, help="where the table came from")
    make.add_argument("--date", required=True, help="when its prices were taken (YYYY-MM-DD)")
    make.add_argument("--region", default="us-east-1")
    shipped = Path(shipped_prices.__file__).parent / SNAPSHOT
    make.add_argument("--out", type=Path, default=shipped)
    args = parser.parse_args(argv)
    try:
        document = build(args.tables, args.source, args.date, args.region)
    except (PriceError, OSError) as exc:
        print(f"fleet.prices: error: {exc}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps(document, indent=1) + "\n")
    print(f"wrote {args.out}: {len(document['prices'])} instance types, prices of {args.date}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
