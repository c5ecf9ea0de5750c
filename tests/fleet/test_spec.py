"""Bench files read as people write them."""

from __future__ import annotations

from pathlib import Path

import pytest

from amibake.errors import UserError
from fleet import spec


def test_a_bench_file_names_types_and_families_in_any_case(tmp_path: Path) -> None:
    (tmp_path / "b.toml").write_text(
        'types = ["C7i.Large"]\nfamilies = ["C7G"]\nsizes = ["XLarge"]\ncommand = "echo"\n'
    )
    assert spec.load(tmp_path / "b.toml", {}).types == ("c7i.large", "c7g.xlarge")


def test_metric_regex_on_the_command_line_keeps_the_file_s_meaning(tmp_path: Path) -> None:
    """--metric-regex replaced the file's whole [metric]: its seconds became a rate (the
    default), and the slowest type ranked first."""
    (tmp_path / "b.toml").write_text(
        'types = ["c5a.large"]\ncommand = "app"\n[metric]\nkind = "regex"\n'
        'pattern = "t=([0-9.]+)"\nmeaning = "seconds"\nunit = "s"\n'
    )
    metric = spec.load(tmp_path / "b.toml", {"metric": {"kind": "regex", "pattern": "e=(\\d+)"}})
    assert metric.metric.pattern == "e=(\\d+)"
    assert (metric.metric.meaning, metric.metric.unit) == ("seconds", "s")


def test_another_kind_than_the_recipe_s_takes_none_of_its_keys() -> None:
    """runtime over a recipe's regex kept its unit: seconds headed "geomean throughput"."""
    recipe = {"kind": "regex", "pattern": "x=(\\d+)", "aggregate": "geomean", "unit": "ops/s"}
    runtime = spec.metric_from({"kind": "runtime"}, recipe)
    assert (runtime.kind, runtime.unit, runtime.aggregate) == ("runtime", "s", "last")
    assert spec.metric_from({"unit": "x/s"}, recipe).pattern == "x=(\\d+)"  # same kind: merged


def test_a_metric_file_of_inf_or_nan_is_no_result() -> None:
    """It was recorded ok, and every report of the run failed with a traceback after."""
    metric = spec.Metric(kind="file", meaning="rate", unit="x/s")
    for written in ("inf\n", "nan", "-inf 3"):
        with pytest.raises(ValueError, match="no finite number"):
            metric.parse("", 1.0, written)
    assert metric.parse("", 1.0, "7.25\n") == 7.25


def test_booleans_in_args_and_timeouts_under_a_second_are_refused(tmp_path: Path) -> None:
    """true went in as "--verbose True"; 0.4 killed every replicate at once."""
    for body, says in (
        ("args = { verbose = true, n = 3 }\n", "args.verbose is True: give a string or a number"),
        ("timeout_s = 0.4\n", "timeout_s: must be 1 or more"),
    ):
        (tmp_path / "b.toml").write_text('types = ["c5a.large"]\ncommand = "app {args}"\n' + body)
        with pytest.raises(UserError, match=says):
            spec.load(tmp_path / "b.toml", {})


def test_a_metric_in_another_time_than_seconds_is_costed_in_seconds() -> None:
    """A metric's unit was never read: a seconds metric in ms cost 1000 times too much per
    unit, a rate per minute 60 times too little. A unit that names no time is refused."""
    millis = spec.metric_from({"kind": "regex", "pattern": "t=(\\d+)", "meaning": "seconds",
                               "unit": "ms"}, {})  # fmt: skip
    assert millis.seconds_per_unit(250.0) == pytest.approx(0.25)
    per_op = spec.Metric(kind="file", meaning="seconds", unit="ns/op")
    assert per_op.seconds_per_unit(2e9) == pytest.approx(2.0)
    per_minute = spec.Metric(kind="file", meaning="rate", unit="frames/min")
    assert per_minute.seconds_per_unit(600.0) == pytest.approx(0.1)
    assert spec.Metric(kind="file", meaning="rate", unit="iterations").seconds_per_unit(4) == 0.25
    assert spec.Metric().seconds_per_unit(3.0) == 3.0  # a runtime: seconds per run
    for unit, meaning in (("cycles", "seconds"), ("frames/run", "rate")):
        with pytest.raises(ValueError, match=rf"metric.unit '{unit}' names no time"):
            spec.metric_from({"kind": "file", "meaning": meaning, "unit": unit}, {})
