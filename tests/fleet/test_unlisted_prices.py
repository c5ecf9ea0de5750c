"""Prices of instance types outside the shipped price table (issue 23): `fleet prices --refresh`
reads them from the region's Price List and spot price history, and a bench on such a type is
priced by it; a type nothing prices is refused in one line naming `fleet prices --refresh`,
never benched at a cost of zero or NaN. On the local cloud, whose Price List (amibake/local/
pricing.py) lists g4dn.xlarge and not g5.xlarge, as AWS's may list a type or not."""

from __future__ import annotations

import json
import math
import statistics
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from amibake import cost
from amibake.cloud import Cloud
from amibake.local import pricing
from fleet import bench, prices, report
from fleet.cli import main
from fleet.results import Results
from tests.fleet.test_any_type import bench_spec, own_results
from tests.fleet.test_bench import assert_nothing_left

LISTED = "g4dn.xlarge"  # a GPU type the local Price List sells: outside the shipped table
UNLISTED = "g5.xlarge"  # a type EC2 offers that the local Price List does not list


@pytest.fixture
def results_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The test's own results, so that the table its refresh saves prices no other test."""
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    return tmp_path / "results"


def test_the_types_used_here_are_outside_the_shipped_table() -> None:
    shipped = prices.snapshot()["prices"]
    assert LISTED not in shipped and UNLISTED not in shipped
    listed = pricing.offers()["us-east-1"]
    assert LISTED in listed and UNLISTED not in listed


def test_the_local_price_list_pages_filters_and_prices_as_aws_does(cloud: Cloud) -> None:
    client = cloud.session.client(
        "pricing", region_name="us-east-1", endpoint_url=cloud.endpoint_url
    )
    virginia = {**prices.LINUX, "location": "US East (N. Virginia)"}

    def filters(**extra: str) -> list[dict[str, str]]:
        return [
            {"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in {**virginia, **extra}.items()
        ]

    one = client.get_products(ServiceCode="AmazonEC2", Filters=filters(instanceType=LISTED))
    assert len(one["PriceList"]) == 1 and "NextToken" not in one
    product = json.loads(one["PriceList"][0])
    assert product["product"]["attributes"]["vcpu"] == "4"
    assert product["product"]["attributes"]["memory"] == "16 GiB"
    assert prices._hourly_usd(product) == 0.526
    none = client.get_products(ServiceCode="AmazonEC2", Filters=filters(instanceType=UNLISTED))
    assert none["PriceList"] == []
    # The whole location takes pages, each with the token for the next: none lost or repeated.
    first = client.get_products(ServiceCode="AmazonEC2", Filters=filters(), MaxResults=100)
    assert len(first["PriceList"]) == 100 and first["NextToken"]
    seen = prices._price_list(client, "US East (N. Virginia)")
    assert len(seen) == len(pricing.offers()["us-east-1"]) > 100
    assert seen[LISTED] == prices.Listed(0.526, 4.0, 16.0)
    assert prices._price_list(client, "EU (Ireland)") == {}


def test_spot_history_of_a_listed_type_is_its_price_now_not_mocks(cloud: Cloud) -> None:
    now = datetime.now(UTC)
    history = cloud.ec2.describe_spot_price_history(
        InstanceTypes=[LISTED],
        ProductDescriptions=["Linux/UNIX"],
        StartTime=now - timedelta(hours=1),
        EndTime=now,
    )["SpotPriceHistory"]
    zone_ids = {
        z["ZoneName"]: z["ZoneId"]
        for z in cloud.ec2.describe_availability_zones()["AvailabilityZones"]
    }
    expected = pricing.offers()["us-east-1"][LISTED].spot
    assert history
    for item in history:
        assert float(item["SpotPrice"]) == expected[zone_ids[item["AvailabilityZone"]]]
        assert now - item["Timestamp"] < timedelta(minutes=5)


def test_an_unpriced_type_is_refused_naming_the_refresh_and_nothing_is_recorded(
    cloud: Cloud, results_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for instance_type in (LISTED, UNLISTED):
        assert main(["bench", "--types", instance_type, "--command", "echo 1", "--yes"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert f"no price for {instance_type}" in err and "fleet prices --refresh" in err, err
        assert main(["prices", "--type", instance_type]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "`fleet prices --refresh --region us-east-1`" in err, err
    assert Results(results_dir / "fleet.sqlite").run_ids() == []
    # After a refresh, the type the Price List sells is priced; the other is still refused,
    # with the same way out (a later refresh, once AWS lists it), and still nothing is run.
    assert main(["prices", "--refresh", "--type", LISTED]) == 0
    out = capsys.readouterr().out
    assert LISTED in out and "0.5260" in out, out
    assert main(["bench", "--types", UNLISTED, "--command", "echo 1", "--yes"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "fleet prices --refresh" in err, err
    assert Results(results_dir / "fleet.sqlite").run_ids() == []


def test_a_family_outside_the_shipped_table_is_refreshed_by_name(
    cloud: Cloud, results_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["prices", "--refresh", "--family", "g4dn"]) == 0
    out = capsys.readouterr().out
    assert LISTED in out and "c5a.large" not in out
    table = prices.in_use(results_dir, "us-east-1")
    assert table["prices"][LISTED]["on_demand"] == 0.526
    assert table["prices"][LISTED]["spot"] == pricing.offers()["us-east-1"][LISTED].spot
    # A family nobody sells is named, in one line.
    assert main(["prices", "--refresh", "--family", "zz9"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no instance type of zz9" in err, err


@pytest.mark.e2e
def test_a_type_outside_the_table_is_benched_at_the_refreshed_price(
    cloud: Cloud, local_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    mine = own_results(cloud, tmp_path / "results")
    prices.refresh(mine, [])  # `fleet prices --refresh`: every type the region sells
    refreshed = prices.in_use(mine.config.results_dir, "us-east-1")["prices"][LISTED]
    assert refreshed["on_demand"] == 0.526 and refreshed["spot"]
    results = bench.results_db(mine.config.results_dir)
    run_spec = bench_spec(types=[LISTED], replicates=2)
    run_id = bench.create(mine, run_spec, results)
    summary = bench.execute(mine, run_id, results)
    assert all(t["ok"] for t in summary["types"].values()), summary
    rows = results.replicates(run_id)
    rows = rows[rows.state == "ok"]
    assert len(rows) == 2
    # Spot, in the zone it landed in, or the zones' median where the table lacks that zone.
    allowed = {*refreshed["spot"].values(), statistics.median(refreshed["spot"].values())}
    for price in rows.price_usd_hour:
        assert any(abs(price - a) < 1e-9 for a in allowed), price
    # What the report ranks by: a cost per unit of work, finite and above zero.
    summary_row = report.summarize(results.replicates(run_id), run_spec.metric).iloc[0]
    for key in ("usd_per_unit", "usd_per_unit_low", "usd_per_unit_high"):
        assert math.isfinite(summary_row[key]) and summary_row[key] > 0, summary_row
    # The report names the table that priced it: the refreshed one, not the shipped snapshot.
    table = prices.in_use(mine.config.results_dir, "us-east-1")
    made = report.make(results, run_id, mine.config.results_dir / "reports", html_page=False)
    assert f"prices: us-east-1 table of {table['date']} ({table['source']})" in made.text
    assert prices.snapshot()["date"] not in made.text.split("prices: ")[1].split("\n")[0]
    assert_nothing_left(mine, results, run_id, local_dir)


def test_an_estimate_with_an_unpriced_type_leaves_it_out_and_names_the_refresh() -> None:
    estimate = cost.Estimate(
        "2 replicates",
        [
            cost.Line("c5a.large: 1 replicate", "c5a.large", 1, 0.5, 0.077),
            cost.Line(f"{UNLISTED}: 1 replicate", UNLISTED, 1, 0.5, None),
        ],
    )
    assert estimate.usd == pytest.approx(0.5 * 0.077)  # the priced line only, not NaN
    text = estimate.text()
    assert f"(without {UNLISTED}: no price; `fleet prices --refresh`" in text, text
