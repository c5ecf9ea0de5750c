"""Bench files read as people write them."""

from __future__ import annotations

from pathlib import Path

from fleet import spec


def test_a_bench_file_names_types_and_families_in_any_case(tmp_path: Path) -> None:
    (tmp_path / "b.toml").write_text(
        'types = ["C7i.Large"]\nfamilies = ["C7G"]\nsizes = ["XLarge"]\ncommand = "echo"\n'
    )
    assert spec.load(tmp_path / "b.toml", {}).types == ("c7i.large", "c7g.xlarge")
