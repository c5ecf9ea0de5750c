"""The real zstd release, built with family flags on the local cloud (about 40 s here)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amibake import pipelines, recipes, sources
from amibake.cloud import Cloud
from amibake.errors import UserError


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
