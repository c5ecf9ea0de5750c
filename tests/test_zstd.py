"""The real zstd release, built with family flags on the local cloud (about 40 s here), and
benchmarked by fleet with its recipe's own [bench] command."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amibake import pipelines, recipes, sources
from amibake.cloud import Cloud
from amibake.errors import UserError
from fleet import bench, spec


def test_zstd_builds_with_the_family_flags_and_round_trips(cloud: Cloud, local_dir: Path) -> None:
    try:
        source = sources.resolve(recipes.load("zstd"))
    except UserError as exc:
        pytest.skip(f"zstd source not in the cache, so zstd is not built here: {exc}")
    outcome = pipelines.build(
        cloud, pipelines.BuildRequest(["c5a"], "zstd", "large", recipes_dir=recipes.RECIPES_DIR)
    )[0]
    assert outcome.ok, outcome.error
    assert outcome.state is not None and outcome.state.artifact is not None
    manifest = json.loads(outcome.state.artifact.with_name("zstd_c5a.manifest.json").read_text())
    assert manifest["source_sha256"] == source.sha256
    assert "-march=znver2" in manifest["cflags"]
    assert list(manifest["files"]) == ["bin/zstd"]
    assert manifest["smoke"] == "passed"  # a 4 MiB round trip through the built binary


def test_fleet_benchmarks_zstd_with_its_recipes_parameters(cloud: Cloud) -> None:
    # The recipe's command is `bin/zstd -b{level} -i{seconds}`: with its placeholders left as
    # they were, zstd printed its usage and every replicate failed.
    try:
        sources.resolve(recipes.load("zstd"))
    except UserError as exc:
        pytest.skip(f"zstd source not in the cache, so zstd is not benchmarked here: {exc}")
    bench_spec = spec.load(
        None, {"types": ["c5a.large"], "recipe": "zstd", "replicates": 1, "warmups": 0}
    )
    assert bench_spec.command_line() == "bin/zstd -b3 -i2"  # the recipe's defaults
    results = bench.results_db(cloud.config.results_dir)
    run_id = bench.create(cloud, bench_spec, results)
    summary = bench.execute(cloud, run_id, results)
    rows = results.replicates(run_id)
    assert list(rows.state) == ["ok"], (summary, list(rows.get("error", [])))
    assert rows.metric[0] > 1  # MB/s compressed at level 3, read from zstd's own report
