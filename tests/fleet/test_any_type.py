"""Any instance type EC2 offers, for a workload nothing is built for (issue 23): GPU and
Inferentia types benched on the local cloud with their prices and what EC2 says they carry;
a build on a family outside the build catalog refused naming the catalog; a type EC2 does not
offer refused before anything is launched."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from amibake import instance_kinds
from amibake.catalog import prices as shipped
from amibake.cloud import Cloud
from amibake.config import Config
from amibake.errors import UserError
from amibake.instance_kinds import InstanceKind
from amibake.steps import preflight
from fleet import bench, spec
from fleet.cli import main
from tests.fleet.test_bench import assert_nothing_left

GPU, INFERENTIA = "g5.xlarge", "inf2.xlarge"
# us-east-1's Linux on-demand prices of the two (AWS's price list), and spot prices per zone as
# `fleet prices --refresh` reads them from DescribeSpotPriceHistory. The local cloud's Price List
# (amibake/local/price_list.py) does not sell these two, so the test writes the refreshed table
# that command would have saved on AWS.
REFRESHED: dict[str, dict[str, Any]] = {
    GPU: {"vcpus": 4.0, "memory_gib": 16.0, "on_demand": 1.006,
          "spot": {"use1-az1": 0.41, "use1-az2": 0.43, "use1-az4": 0.45}},
    INFERENTIA: {"vcpus": 4.0, "memory_gib": 16.0, "on_demand": 0.7582,
                 "spot": {"use1-az1": 0.21, "use1-az2": 0.23}},
}  # fmt: skip


def own_results(cloud: Cloud, results_dir: Path) -> Cloud:
    """The session's local cloud, with results (and so the price table in use) of the test's
    own: a refreshed table must not price other tests' runs."""
    config: Config = cloud.config
    return Cloud(
        config=replace(config, results_dir=results_dir),
        session=cloud.session,
        endpoint_url=cloud.endpoint_url,
    )


def refreshed_prices(cloud: Cloud) -> None:
    table = json.loads(json.dumps(shipped.snapshot()))
    table["prices"].update(REFRESHED)
    table["generated_by"] = "fleet prices --refresh"
    out = cloud.config.results_dir / f"prices_{cloud.config.region}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(table))


def bench_spec(**overrides: Any) -> spec.BenchSpec:
    base: dict[str, Any] = {
        "command": "echo value=1",
        "metric": "value=([0-9.]+)",
        "replicates": 1,
        "warmups": 0,
    }
    return spec.load(None, {**base, **overrides})


@pytest.mark.e2e
def test_gpu_and_inferentia_types_benched_priced_and_described(
    cloud: Cloud,
    local_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mine = own_results(cloud, tmp_path / "results")
    refreshed_prices(mine)
    # In any case, as AWS's CLIs take them.
    run_spec = bench_spec(types=["G5.XLarge", INFERENTIA], concurrency=2)
    assert run_spec.types == (GPU, INFERENTIA)
    results = bench.results_db(mine.config.results_dir)
    run_id = bench.create(mine, run_spec, results)
    summary = bench.execute(mine, run_id, results)
    assert all(t["ok"] for t in summary["types"].values()), summary
    rows = results.replicates(run_id)
    rows = rows[rows.state == "ok"]
    assert set(rows.instance_type) == {GPU, INFERENTIA}
    assert (rows.metric == 1.0).all()
    for instance_type, entry in REFRESHED.items():
        priced = rows[rows.instance_type == instance_type].price_usd_hour
        # Spot, in the zone it landed in, or the zones' median where the table lacks that one.
        allowed = {*entry["spot"].values(), statistics.median(entry["spot"].values())}
        assert all(any(abs(p - a) < 1e-9 for a in allowed) for p in priced), list(priced)
    facts = {e["instance_type"]: e for e in results.environments(run_id)}
    assert facts[GPU]["gpus"] and "A10G" in facts[GPU]["gpus"][0]
    assert facts[GPU]["accelerators"] == []
    assert (
        facts[INFERENTIA]["accelerators"] and "Inferentia2" in facts[INFERENTIA]["accelerators"][0]
    )
    assert facts[INFERENTIA]["gpus"] == []
    assert facts[GPU]["described_vcpus"] == 4 and facts[GPU]["described_memory_mib"] == 16384
    # Each from the ECS-optimized AMI with its accelerator's driver, as AWS publishes them: the
    # plain one has no NVIDIA or Neuron driver.
    for instance_type, kind in (("gpu", GPU), ("neuron", INFERENTIA)):
        parameter = preflight.ACCELERATED_AMI_PARAMETER[instance_type]
        expected = mine.ssm.get_parameter(Name=parameter)["Parameter"]["Value"]
        assert facts[kind]["ami"] == expected, (kind, facts[kind]["ami"], expected)
    assert_nothing_left(mine, results, run_id, local_dir)
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(mine.config.results_dir))
    assert main(["report", run_id]) == 0
    out = capsys.readouterr().out
    assert GPU in out and INFERENTIA in out


def test_described_kinds_carry_architecture_and_devices(cloud: Cloud) -> None:
    gpu = instance_kinds.describe(cloud, GPU)
    assert isinstance(gpu, InstanceKind)
    assert (gpu.name, gpu.sizes, gpu.architecture) == ("g5", ("xlarge",), "x86_64")
    assert gpu.instance_type("xlarge") == GPU
    assert instance_kinds.describe(cloud, "g5g.xlarge").architecture == "arm64"
    inferentia = instance_kinds.describe(cloud, INFERENTIA)
    assert len(inferentia.accelerators) == 1 and not inferentia.gpus
    # Described once a run: the second ask is the first answer.
    assert instance_kinds.describe(cloud, GPU) is gpu
    # A catalog type stays its catalog family, with the generations its builds target.
    assert not isinstance(instance_kinds.kind_of(cloud, "c5a.large"), InstanceKind)


def test_a_type_ec2_names_but_the_region_does_not_offer_is_refused_before_launch(
    cloud: Cloud, tmp_path: Path
) -> None:
    # cc2.8xlarge is in EC2's API model (a retired type) and spec-checks; the region says no.
    mine = own_results(cloud, tmp_path / "results")
    run_spec = bench_spec(types=["cc2.8xlarge"], allow_missing_price=True)
    results = bench.results_db(mine.config.results_dir)
    run_id = bench.create(mine, run_spec, results)
    with pytest.raises(UserError, match="EC2 in us-east-1 does not offer it"):
        bench.execute(mine, run_id, results)
    assert results.environments(run_id) == []


def test_a_recipe_on_a_family_outside_the_build_catalog_is_refused_naming_the_catalog() -> None:
    with pytest.raises(UserError) as caught:
        spec.load(None, {"types": [GPU], "recipe": "kernels"})
    message = str(caught.value)
    assert "\n" not in message
    assert "amibake/catalog/families.json" in message
    assert "architecture" in message and "archspec" in message and "sizes" in message
    assert 'command = "..."' in message
    # The same type with a command is in.
    assert spec.load(None, {"types": [GPU], "command": "true"}).types == (GPU,)


def test_a_type_ec2_does_not_sell_is_refused_with_the_names_meant() -> None:
    with pytest.raises(
        UserError, match=r"unknown instance type 'g5\.xlarg'.*did you mean g5\.xlarge"
    ):
        spec.load(None, {"types": ["g5.xlarg"], "command": "true"})
