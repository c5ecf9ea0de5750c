"""The price snapshot: made by the project's own script from the reference table, with its source
and date; lookups; and `fleet prices`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amibake.cloud import Cloud
from fleet import prices
from fleet.cli import main

TABLE = Path(__file__).resolve().parents[3] / "shared" / "data" / "aws_prices_us-east-1.csv"


def test_the_shipped_snapshot_is_what_the_script_makes_from_the_reference_table(
    tmp_path: Path,
) -> None:
    if not TABLE.exists():
        pytest.fail(f"the reference table {TABLE} is missing (shared/ sits beside the clone)")
    shipped = prices.snapshot()
    out = tmp_path / "snapshot.json"
    code = prices.main(
        [
            "build",
            str(TABLE),
            "--source",
            shipped["source"],
            "--date",
            shipped["date"],
            "--out",
            str(out),
        ]
    )
    assert code == 0
    assert json.loads(out.read_text()) == shipped
    assert shipped["date"] == "2026-11-22" and "skypilot-catalog" in shipped["source"]


def test_lookup_and_the_price_of_the_exact_market() -> None:
    price = prices.lookup("c7i.large")
    assert (price.vcpus, price.memory_gib) == (2, 4)
    assert price.hourly(spot=False) == price.on_demand
    zone, cheapest = min(price.spot.items(), key=lambda kv: kv[1])
    assert price.hourly(spot=True, zone=zone) == cheapest
    assert min(price.spot.values()) <= price.hourly(spot=True) <= max(price.spot.values())
    with pytest.raises(prices.PriceError, match=r"no spot price for c7i\.large in use1-az9"):
        price.hourly(spot=True, zone="use1-az9")


def test_an_unknown_type_names_close_ones() -> None:
    with pytest.raises(prices.PriceError, match=r"no price for c7i.lrage .*did you mean c7i.large"):
        prices.lookup("c7i.lrage")


def test_a_malformed_table_names_file_and_line(tmp_path: Path) -> None:
    bad = tmp_path / "prices.csv"
    bad.write_text(
        "InstanceType,vCPUs,MemoryGiB,Price,SpotPrice,Region,AvailabilityZone\n"
        "c7i.large,2,4,0.1785,0.07,us-east-1,use1-az1\n"
        "c7i.xlarge,4,8,lots,0.14,us-east-1,use1-az1\n"
    )
    with pytest.raises(prices.PriceError, match=r"prices.csv:3: could not convert"):
        prices.build(bad, "test", "2026-01-01", "us-east-1")
    (tmp_path / "cols.csv").write_text("InstanceType,Price\nc7i.large,1\n")
    with pytest.raises(prices.PriceError, match="missing columns"):
        prices.build(tmp_path / "cols.csv", "test", "2026-01-01", "us-east-1")


def test_fleet_prices_prints_the_table_with_its_date(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["prices", "--family", "c7i,c7g"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("EC2 Linux prices, us-east-1, USD/hour, as of 2026-11-22")
    assert "c7g.large" in out and "c7i.48xlarge" in out and "m7i.large" not in out
    assert main(["prices", "--type", "c7x.large"]) == 2
    assert "no price for c7x.large" in capsys.readouterr().err
    assert main(["bench"]) == 2
    assert "name at least one instance type" in capsys.readouterr().err


def test_refresh_reads_the_spot_history_and_says_what_it_kept(
    cloud: Cloud, capsys: pytest.CaptureFixture[str]
) -> None:
    document = prices.refresh(cloud, ["c5a"])
    saved = cloud.config.results_dir / prices.SNAPSHOT
    try:
        assert json.loads(saved.read_text())["generated_by"] == "fleet prices --refresh"
        assert document["source"].startswith("local: EC2 DescribeSpotPriceHistory")
        # The local cloud has no Pricing API: on-demand prices stay the snapshot's, and say so.
        assert "on-demand prices kept from 2026-11-22" in document["note"]
        entry = document["prices"]["c5a.large"]
        assert entry["on_demand"] == prices.snapshot()["prices"]["c5a.large"]["on_demand"]
        assert "no spot price history" not in document["note"]
        assert entry["spot"] and all(p > 0 for p in entry["spot"].values())
        assert main(["prices", "--family", "c5a"]) == 0  # the refreshed table is the one in use
        assert "(local: EC2 DescribeSpotPriceHistory" in capsys.readouterr().out
    finally:
        saved.unlink()
