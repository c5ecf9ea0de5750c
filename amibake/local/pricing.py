"""EC2 prices on the local cloud: the AWS Price List API (GetProducts), which moto does not serve,
and spot price history with prices of the right size (moto answers every type and zone with
$0.00001 stamped 2006-01-02).

Both answer from price_list (real us-east-1 prices, with their source) and from the published
tables of older families the shipped snapshot is also built from (amibake/catalog/sources/), as
AWS's Price List lists every type it sells. A type neither has is, for
GetProducts, a type the Price List does not list (no product: an empty page, as AWS answers a
filter nothing matches), and for spot history moto's answer is left as it was. So `fleet prices
--refresh` on the local cloud takes the path it takes on AWS: it pages through the Price List,
reads the last hour of spot history, and prices what both name.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from functools import cache
from importlib import resources
from typing import Any

from amibake.cloud.regions import LOCATIONS
from amibake.local import price_list

MAX_RESULTS = 100  # GetProducts' page limit (MaxResults 1..100)
# The term and rate codes AWS's Price List gives an on-demand term (fixed strings in its format).
ON_DEMAND_TERM, HOURLY_RATE = "JRTCKXETXF", "6YS6EN2CT7"


@dataclass
class Offer:
    instance_type: str
    vcpus: float
    memory_gib: float
    on_demand: float
    spot: dict[str, float] = field(default_factory=dict)  # zone id -> USD/hour


# The published tables' columns (SkyPilot's vms.csv) -> price_list's.
PUBLISHED = {
    "InstanceType": "instance_type",
    "vCPUs": "vcpus",
    "MemoryGiB": "memory_gib",
    "Price": "on_demand",
    "AvailabilityZone": "zone_id",
    "SpotPrice": "spot",
}


def _rows() -> Iterator[dict[str, str]]:
    """price_list's rows, then the catalog's source tables' rows of price_list's region."""
    yield from csv.DictReader(io.StringIO(price_list.ROWS), fieldnames=price_list.COLUMNS)
    for table in sorted(
        resources.files("amibake.catalog").joinpath("sources").iterdir(), key=lambda t: t.name
    ):
        if not table.name.endswith(".csv"):
            continue
        for row in csv.DictReader(io.StringIO(table.read_text())):
            if row["Region"] == price_list.REGION:
                yield {ours: row[theirs] for theirs, ours in PUBLISHED.items()}


@cache
def offers() -> dict[str, dict[str, Offer]]:
    """Region -> instance type -> its prices, from price_list and the catalog's sources."""
    found: dict[str, Offer] = {}
    for row in _rows():
        name = row["instance_type"]
        offer = found.setdefault(
            name,
            Offer(name, float(row["vcpus"]), float(row["memory_gib"]), float(row["on_demand"])),
        )
        if row["spot"]:
            offer.spot[row["zone_id"]] = float(row["spot"])
    return {price_list.REGION: found}


def product(region: str, offer: Offer) -> dict[str, Any]:
    """One Price List product of a Linux, shared-tenancy, no-software instance, as AWS's
    GetProducts gives it (the fields a reader of on-demand prices uses)."""
    # Stable across the daemon's restarts, as a product's SKU is.
    sku = hashlib.sha256(f"{region} {offer.instance_type}".encode()).hexdigest()[:16].upper()
    memory = f"{offer.memory_gib:g} GiB"
    return {
        "product": {
            "productFamily": "Compute Instance",
            "attributes": {
                "servicecode": "AmazonEC2",
                "instanceType": offer.instance_type,
                "instanceFamily": "",
                "location": LOCATIONS.get(region, region),
                "locationType": "AWS Region",
                "regionCode": region,
                "operatingSystem": "Linux",
                "tenancy": "Shared",
                "preInstalledSw": "NA",
                "licenseModel": "No License required",
                "capacitystatus": "Used",
                "operation": "RunInstances",
                "vcpu": f"{offer.vcpus:g}",
                "memory": memory,
            },
            "sku": sku,
        },
        "serviceCode": "AmazonEC2",
        "publicationDate": f"{price_list.DATE}T00:00:00Z",
        "terms": {
            "OnDemand": {
                f"{sku}.{ON_DEMAND_TERM}": {
                    "offerTermCode": ON_DEMAND_TERM,
                    "sku": sku,
                    "priceDimensions": {
                        f"{sku}.{ON_DEMAND_TERM}.{HOURLY_RATE}": {
                            "unit": "Hrs",
                            "pricePerUnit": {"USD": f"{offer.on_demand:.10f}"},
                            "description": f"${offer.on_demand} per On Demand Linux "
                            f"{offer.instance_type} Instance Hour",
                        }
                    },
                }
            }
        },
    }


class PricingError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def get_products(request: dict[str, Any]) -> dict[str, Any]:
    """GetProducts: the products every TERM_MATCH filter matches (case-insensitively, as AWS
    matches), a page of MaxResults at a time with a NextToken for the rest."""
    if request.get("ServiceCode") != "AmazonEC2":
        # AWS prices other services too; the local cloud only EC2's instances.
        return {"FormatVersion": "aws_v1", "PriceList": []}
    limit = request.get("MaxResults", MAX_RESULTS)
    if not isinstance(limit, int) or not 1 <= limit <= MAX_RESULTS:
        raise PricingError("InvalidParameterException", f"MaxResults must be 1 to {MAX_RESULTS}")
    filters = request.get("Filters") or []
    matched = []
    for region, listed in offers().items():
        for name in sorted(listed):
            attributes = product(region, listed[name])["product"]["attributes"]
            if all(_matches(attributes, f) for f in filters):
                matched.append((region, listed[name]))
    token = request.get("NextToken")
    try:
        start = int(token) if token else 0
    except ValueError:
        raise PricingError("InvalidNextTokenException", "the NextToken is not valid") from None
    page = matched[start : start + limit]
    answer: dict[str, Any] = {
        "FormatVersion": "aws_v1",
        "PriceList": [json.dumps(product(region, offer)) for region, offer in page],
    }
    if start + limit < len(matched):
        answer["NextToken"] = str(start + limit)
    return answer


def _matches(attributes: dict[str, str], rule: dict[str, Any]) -> bool:
    if rule.get("Type") != "TERM_MATCH":
        raise PricingError("InvalidParameterException", f"filter type {rule.get('Type')!r}")
    value = attributes.get(str(rule.get("Field", "")))
    return value is not None and value.lower() == str(rule.get("Value", "")).lower()


def serve(environ: dict[str, Any], start_response: Any) -> list[bytes]:
    """The Price List API's JSON protocol (X-Amz-Target AWSPriceListService.<Action>)."""
    action = environ.get("HTTP_X_AMZ_TARGET", "").rpartition(".")[2]
    length = int(environ.get("CONTENT_LENGTH") or 0)
    raw = environ["wsgi.input"].read(length) if length else b"{}"
    try:
        if action != "GetProducts":
            raise PricingError(
                "UnknownOperationException",
                f"the local cloud's Price List serves GetProducts only, not {action}",
            )
        try:
            request = json.loads(raw or b"{}")
        except ValueError:
            raise PricingError("SerializationException", "the request is not JSON") from None
        body, status = get_products(request), "200 OK"
    except PricingError as exc:
        body, status = {"__type": exc.code, "message": str(exc)}, "400 Bad Request"
    data = json.dumps(body).encode()
    start_response(
        status,
        [("Content-Type", "application/x-amz-json-1.1"), ("Content-Length", str(len(data)))],
    )
    return [data]


def spot_history(region: str, zone_ids: dict[str, str], items: list[dict[str, Any]]) -> list[Any]:
    """moto's spot price history with the prices of the types price_list knows: each zone's
    price, stamped now (the price in effect, which AWS reports for a window's start); a zone it
    has no price for is left out, as AWS lists only the zones a type is sold in. Types it does
    not know keep moto's answer."""
    listed = offers().get(region, {})
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.000Z")
    kept = []
    for item in items:
        offer = listed.get(str(item.get("InstanceType")))
        if offer is None:
            kept.append(item)
            continue
        price = offer.spot.get(zone_ids.get(str(item.get("AvailabilityZone")), ""))
        if price is not None:
            kept.append({**item, "SpotPrice": f"{price:.6f}", "Timestamp": now})
    return kept


def apply() -> None:
    """Give moto's DescribeSpotPriceHistory the prices of price_list (once, in the daemon)."""
    from moto.core.responses import ActionResult
    from moto.ec2.responses.spot_instances import SpotInstances

    original = SpotInstances.describe_spot_price_history
    if getattr(original, "_amibake_priced", False):
        return

    def describe_spot_price_history(self: Any) -> ActionResult:
        answer = original(self)
        result = answer.result
        if not isinstance(result, dict):
            return answer
        zones = getattr(self.ec2_backend, "zones", {}).get(self.region, [])
        zone_ids = {zone.name: zone.zone_id for zone in zones}
        history = spot_history(self.region, zone_ids, list(result.get("SpotPriceHistory", [])))
        return ActionResult({**result, "SpotPriceHistory": history})

    describe_spot_price_history._amibake_priced = True  # type: ignore[attr-defined]
    SpotInstances.describe_spot_price_history = describe_spot_price_history  # type: ignore[method-assign]
