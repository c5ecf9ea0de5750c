"""The price snapshot: made by the project's own script from the reference table, with its source
and date; lookups; and `fleet prices`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pandas as pd
import pytest

from amibake.cloud import Cloud
from amibake.connect import connect
from fleet import prices, report, spec
from fleet.cli import main
from fleet.results import Results
from fleet.spec import Metric

TABLE = Path(__file__).resolve().parents[3] / "shared" / "data" / "aws_prices_us-east-1.csv"
MORE = (
    Path(prices.__file__).resolve().parents[1]
    / "amibake/catalog/sources/aws_prices_more_families_us-east-1.csv"
)


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
            str(MORE),
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


def test_a_type_in_two_tables_is_refused(tmp_path: Path) -> None:
    """Read in turn, the first table's on-demand price stood beside the last one's spot prices."""
    header = "InstanceType,vCPUs,MemoryGiB,Price,SpotPrice,Region,AvailabilityZone\n"
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    first.write_text(header + "c7i.large,2,4,0.0893,0.03,us-east-1,use1-az1\n")
    second.write_text(
        header + "m7i.large,2,8,0.1008,0.04,us-east-1,use1-az1\n"
        "c7i.large,2,4,0.1000,0.05,us-east-1,use1-az1\n"
    )
    with pytest.raises(prices.PriceError, match=r"b.csv:3: c7i.large is priced in .*a.csv too"):
        prices.build([first, second], "test", "2026-01-01", "us-east-1")
    both = prices.build([first, second.with_name("b.csv")], "test", "2026-01-01", "eu-west-1")
    assert both["prices"] == {}  # another region's rows are not read, nor compared


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
        prices.build([bad], "test", "2026-01-01", "us-east-1")
    (tmp_path / "cols.csv").write_text("InstanceType,Price\nc7i.large,1\n")
    with pytest.raises(prices.PriceError, match="missing columns"):
        prices.build([tmp_path / "cols.csv"], "test", "2026-01-01", "us-east-1")


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
    saved = prices.saved(cloud.config.results_dir, "us-east-1")
    try:
        assert json.loads(saved.read_text())["generated_by"] == "fleet prices --refresh"
        assert document["source"].startswith("local: EC2 DescribeSpotPriceHistory")
        # The local cloud's Price List and spot history answer with us-east-1's real prices (the
        # snapshot's own source), not moto's $0.00001: nothing was kept, nothing is missing.
        assert "Pricing API" not in document["note"], document["note"]
        assert "no spot price history" not in document["note"]
        entry = document["prices"]["c5a.large"]
        shipped = prices.snapshot()["prices"]["c5a.large"]
        assert entry["on_demand"] == shipped["on_demand"]
        assert entry["spot"] and all(entry["spot"][z] == shipped["spot"][z] for z in entry["spot"])
        assert main(["prices", "--family", "c5a"]) == 0  # the refreshed table is the one in use
        assert "(local: EC2 DescribeSpotPriceHistory" in capsys.readouterr().out
    finally:
        saved.unlink()


def test_the_local_price_list_lists_the_older_families_the_snapshot_has(cloud: Cloud) -> None:
    # The snapshot is built from two tables and AWS prices every type of both, so the local
    # cloud must too: it gave c4 moto's $0.00001 spot price, and a refresh saved that as c4's.
    document = prices.refresh(cloud, ["c4"])
    saved = prices.saved(cloud.config.results_dir, "us-east-1")
    try:
        assert "Pricing API" not in document["note"], document["note"]
        shipped = prices.snapshot()["prices"]
        older = sorted(t for t in shipped if t.split(".")[0] == "c4")
        assert older and set(older) <= set(document["prices"])
        for name in older:
            entry = document["prices"][name]
            assert entry["on_demand"] == shipped[name]["on_demand"], name
            assert entry["spot"] and all(
                entry["spot"][z] == shipped[name]["spot"][z] for z in entry["spot"]
            ), name
    finally:
        saved.unlink()


def test_a_region_is_priced_from_its_own_table_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # fleet ships us-east-1's prices: another region's are not those, so nothing prices with them.
    with pytest.raises(prices.PriceError, match=r"no prices for eu-west-1: fleet ships us-east-1"):
        prices.in_use(tmp_path, "eu-west-1")
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path))
    assert main(["prices", "--region", "eu-west-1"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "fleet: error: no prices for eu-west-1: fleet ships us-east-1's only; read eu-west-1's "
        "with `fleet prices --refresh --region eu-west-1`\n"
    )
    bench = ["bench", "--types", "c5a.large", "--command", "echo 1", "--region", "eu-west-1"]
    assert main(bench) == 2
    err = capsys.readouterr().err
    assert "no prices for eu-west-1" in err and "or pass --allow-missing-price" in err, err
    # A tune that spends money is refused before its first trial; one measuring time is not.
    tune_file = tmp_path / "t.toml"
    tune_file.write_text(
        'recipe = "kernels"\ntypes = ["c5a.large"]\nobjective = "cost"\n'
        '[params.threads]\nkind = "int"\nlow = 1\nhigh = 2\nstage = "run"\n'
    )
    assert main(["tune", str(tune_file), "--region", "eu-west-1"]) == 2
    err = capsys.readouterr().err
    assert "no prices for eu-west-1" in err and "leave money out of the search" in err, err
    assert Results(tmp_path / "fleet.sqlite").run_ids() == []  # refused before any record
    # A refreshed table is its own region's: it leaves the other regions' as they were.
    prices.saved(tmp_path, "eu-west-1").write_text(
        json.dumps(dict(prices.snapshot(), region="eu-west-1", date="2026-11-23 10:00 UTC"))
    )
    assert prices.in_use(tmp_path, "eu-west-1")["date"] == "2026-11-23 10:00 UTC"
    assert prices.in_use(tmp_path, "us-east-1") == prices.snapshot()
    # A damaged or hand-edited table is named, with how to read it again; never a traceback.
    table = prices.saved(tmp_path, "eu-west-1")
    for damaged in ("{", '{"prices": 5, "date": "x"}', '{"prices": {"c5a.large": {}}}'):
        table.write_text(damaged)
        assert main(["prices", "--region", "eu-west-1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"fleet: error: {table} is damaged (") and err.endswith(
            "read it again with `fleet prices --refresh --region eu-west-1`\n"
        ), err


def test_a_first_refresh_in_a_region_keeps_no_other_regions_price(
    cloud: Cloud, monkeypatch: pytest.MonkeyPatch
) -> None:
    there = connect(replace(cloud.config, region="eu-west-1"))
    saved = prices.saved(cloud.config.results_dir, "eu-west-1")
    # The local cloud's Price List has no eu-west-1 price, and there is none to keep.
    with pytest.raises(
        prices.PriceError,
        match="no eu-west-1 prices read: on-demand prices left out: the Pricing API lists no "
        r"type in EU \(Ireland\)",
    ):
        prices.refresh(there, ["c5a"])
    assert not saved.exists()
    # A Pricing API that prices one type: the table is that type, at this region's prices.
    asked: list[str] = []

    def price_list(pricing: object, location: str) -> dict[str, prices.Listed]:
        asked.append(location)
        return {"c5a.large": prices.Listed(0.0871, 2, 4), "c6a.large": prices.Listed(0.0864, 2, 4)}

    monkeypatch.setattr(prices, "_price_list", price_list)
    document = prices.refresh(there, ["c5a"])
    try:
        assert set(asked) == {"EU (Ireland)"}
        assert list(document["prices"]) == ["c5a.large"] and document["region"] == "eu-west-1"
        entry = document["prices"]["c5a.large"]
        shipped = prices.snapshot()["prices"]["c5a.large"]
        assert entry["on_demand"] == 0.0871
        assert entry["spot"] and set(entry["spot"]).isdisjoint(shipped["spot"]), entry["spot"]
        assert "types without an on-demand price in eu-west-1 left out" in document["note"]
        assert prices.in_use(cloud.config.results_dir, "eu-west-1") == document
        # Another family later: added to the region's table, which keeps what it had.
        added = prices.refresh(there, ["c6a"])
        assert list(added["prices"]) == ["c5a.large", "c6a.large"]
        assert added["prices"]["c5a.large"] == entry and added["prices"]["c6a.large"]["spot"]
    finally:
        saved.unlink()
    assert not prices.saved(cloud.config.results_dir, "us-east-1").exists()


def test_sizes_sort_by_size_not_alphabetically() -> None:
    sizes = ["metal", "12xlarge", "2xlarge", "xlarge", "large", "medium", "metal-48xl", "48xlarge"]
    ordered = sorted((f"c7i.{s}" for s in sizes), key=prices.size_key)
    assert [t.split(".")[1] for t in ordered] == [
        "medium",
        "large",
        "xlarge",
        "2xlarge",
        "12xlarge",
        "48xlarge",
        "metal",
        "metal-48xl",
    ]
    assert prices.size_key("c5.metal") < prices.size_key("c7i.large")  # by family first


def test_fleet_prices_lists_sizes_in_order_memory_in_gib_vcpus_whole(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["prices", "--family", "c5"]) == 0
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("c5.")]
    listed = [line.split()[0] for line in table]
    assert listed[:4] == ["c5.large", "c5.xlarge", "c5.2xlarge", "c5.4xlarge"], listed
    assert listed.index("c5.9xlarge") < listed.index("c5.12xlarge") < listed.index("c5.metal")
    row = next(line.split() for line in table if line.startswith("c5.12xlarge "))
    assert row[1:3] == ["48", "96"]  # not 48.0, not 96.0000
    assert prices.gib(3.75) == "3.75" and prices.gib(96.0) == "96" and prices.gib(0.5) == "0.5"
    assert main(["prices", "--type", "c5.xlarge", "--json"]) == 0
    listed_json = json.loads(capsys.readouterr().out)["prices"][0]
    assert (listed_json["vcpus"], listed_json["memory_gib"]) == (4, 8)  # numbers in --json


# Costs per unit of work in the bench file's unit, and a folded metric said to be one.
RUNTIME = Metric()
RATE = Metric(kind="regex", pattern="x", meaning="rate", unit="frames/s")
KERNELS = Metric("regex", "throughput=([0-9.]+)", "rate", "geomean", "geomean throughput")


def _summary(metric: Metric) -> pd.DataFrame:
    """One row as report.summarize() makes it."""
    row = {
        "type": "m.large",
        "build": "tuned",
        "emulated": False,
        "n": 3,
        "failed": 0,
        "median": 2.0,
    }
    row |= {"ci_low": 1.9, "ci_high": 2.1, "cv": 0.01, "noisy": False, "usd_per_hour": 0.1}
    row |= {"usd_per_unit": 2e-5, "usd_per_unit_low": 1.8e-5, "usd_per_unit_high": 2.2e-5}
    row |= {"seconds_per_unit": 2.0, "cost_rank": 1, "speed_rank": 1}
    return pd.DataFrame([row])


def test_the_bench_files_unit_names_the_cost_in_the_answer_and_the_table(tmp_path: Path) -> None:
    frame = _summary(RUNTIME)
    assert report.answer(frame, RUNTIME, unit="frames") == (
        "answer: cheapest: m.large tuned ($0.02 per 1k frames); fastest: m.large tuned"
    )
    shown = report.readable(frame, RUNTIME, unit="frames")
    assert shown["cost (frames)"].iloc[0] == "$0.02 per 1k frames"
    assert report.headline(frame, RUNTIME, unit="frames").startswith(
        "Recommended: m.large tuned, $0.02 per 1k frames"
    )
    assert report.work_unit(RATE, "images") == "images" and report.work_unit(RATE) == "frames"
    assert report.work_unit(KERNELS) == "unit" and report.per_units(2e-5, "unit").endswith("units")
    bench_file = tmp_path / "bench.toml"
    bench_file.write_text('types = ["c5a.large"]\ncommand = "true"\nunit = " frames "\n')
    assert spec.load(bench_file, {}).unit == "frames"
    assert spec.load(None, {"types": ["c5a.large"], "command": "true"}).unit == ""


def test_a_geomean_of_several_metrics_is_labelled_as_one() -> None:
    shown = report.readable(_summary(KERNELS), KERNELS)
    assert "median geomean throughput (geomean of matches)" in shown.columns
    assert spec.metric_label(KERNELS) == (
        "geomean throughput (geomean of every match of throughput=([0-9.]+), one number from "
        "several)"
    )
    assert spec.metric_label(RATE) == "frames/s"  # one value: nothing folded


def test_a_spot_run_of_a_type_without_a_spot_price_is_refused(tmp_path: Path) -> None:
    """A refresh that found no spot history for a type writes it with no spot prices. A spot
    bench of it was accepted, then left it out of the ranking without a word."""
    import json

    from amibake.catalog.prices import saved
    from amibake.errors import UserError
    from fleet import bench

    table = prices.snapshot()
    unspotted, priced = sorted(table["prices"])[:2]
    table["prices"][unspotted]["spot"] = {}
    path = saved(tmp_path, table["region"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(table))
    with pytest.raises(
        UserError, match=rf"^no spot price for {unspotted} in the .*\(--on-demand\)"
    ):
        bench.price_lookup([priced, unspotted], False, tmp_path, table["region"], spot=True)
    price_of = bench.price_lookup([unspotted], False, tmp_path, table["region"], spot=False)
    assert price_of(unspotted, False, "") == table["prices"][unspotted]["on_demand"]
    # With --allow-missing-price it runs, unpriced: what the user asked for.
    allowed = bench.price_lookup([unspotted], True, tmp_path, table["region"], spot=True)
    assert allowed(unspotted, True, "") is None
