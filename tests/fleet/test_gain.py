"""The tune recommendation's gain over the generic build and the best standard level: which builds
run, how the ratio and its interval come out, what a budget or a failure leaves recorded. The
cloud part (builds and runs on the local cloud) is in test_tune.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from amibake.errors import AmibakeError
from amibake.steps.state import Variant
from fleet import gain, stats
from fleet.results import Results
from fleet.space import parse
from fleet.spec import Metric

LEVELS = {
    "opt": {"kind": "categorical", "values": ["-O2", "-O3"], "stage": "compile"},
    "unroll": {"kind": "categorical", "values": ["", "-funroll-loops"], "stage": "compile"},
    "threads": {"kind": "int", "low": 1, "high": 2, "stage": "run"},
}


class Bench:
    """Builds side by side, as data: each build's rate drawn around a given mean."""

    def __init__(self, means: dict[str, float], fail: str = "") -> None:
        self.metric = Metric(kind="metric", pattern="x", meaning="rate")
        self.means, self.fail = means, fail
        self.asked: list[dict[str, Variant]] = []

    def side_by_side(
        self, label: str, trial: int, params: dict[str, Any], variants: dict[str, Variant], n: int
    ) -> tuple[dict[str, np.ndarray], float]:
        self.asked.append(variants)
        if self.fail:
            raise AmibakeError(self.fail)
        noise = np.random.default_rng(0)
        return {b: self.means[b] * (1 + 0.01 * noise.standard_normal(n)) for b in variants}, 0.5


def test_the_contenders_are_the_generic_build_and_each_standard_level() -> None:
    space = parse(LEVELS, "t.toml", "", ["c7g.large"])
    chosen = gain.contenders(space, {"opt": "-O2", "unroll": "-funroll-loops", "threads": 2})
    assert [c.build for c in chosen] == ["recommended", "generic", "standard-O2", "standard-O3"]
    assert chosen[0].variant.cflags == "-O2 -funroll-loops"  # the search's own build
    assert chosen[1].variant.generic and not chosen[1].variant.cflags
    assert [c.variant.cflags for c in chosen[2:]] == ["-O2", "-O3"]
    # No level in the space: the family's standard build, the recipe's own flags.
    plain = parse({"threads": LEVELS["threads"]}, "t.toml", "", ["c7g.large"])
    chosen = gain.contenders(plain, {"threads": 1})
    assert [(c.build, c.variant) for c in chosen[1:]] == [
        ("generic", Variant(name="generic", generic=True)),
        ("standard", Variant()),
    ]
    assert gain.builds(plain, {"threads": 1}) == 2  # the recommendation is the standard build
    # The estimate's bound, before anything is recommended: with compile flags but no level,
    # the recommendation, the generic and the standard build; with levels, each level too.
    assert gain.most_builds(plain) == 2
    unrolled = parse({"unroll": LEVELS["unroll"]}, "t.toml", "", ["c7g.large"])
    assert gain.most_builds(unrolled) == 3
    assert gain.most_builds(space) == 4


def test_the_gain_is_over_the_best_standard_level_with_an_interval() -> None:
    space = parse(LEVELS, "t.toml", "", ["c7g.large"])
    params = {"opt": "-O2", "unroll": "-funroll-loops", "threads": 2}
    means = {"recommended": 120.0, "generic": 60.0, "standard-O2": 100.0, "standard-O3": 110.0}
    found, usd = gain.measure(Bench(means), space, params, 5, "gain")
    assert usd == 0.5
    generic, standard = found
    assert (generic.kind, standard.kind) == ("generic", "standard")
    # Rates: the recommendation's time per unit is half the generic build's.
    assert generic.ratio == pytest.approx(2.0, rel=0.03) and generic.low < 2.0 < generic.high
    # The best standard level is -O3 (the faster one), 120/110 over it.
    assert standard.against == "the standard level -O3"
    assert standard.ratio == pytest.approx(120 / 110, rel=0.03)
    assert "50% less per unit of work" in generic.text()


def test_a_standard_level_that_is_the_recommendation_runs_once_and_gains_nothing() -> None:
    space = parse(LEVELS, "t.toml", "", ["c7g.large"])
    bench = Bench({"recommended": 100.0, "generic": 50.0, "standard-O2": 90.0})
    found, _ = gain.measure(bench, space, {"opt": "-O3", "unroll": "", "threads": 1}, 3, "gain")
    assert list(bench.asked[0]) == ["recommended", "generic", "standard-O2"]
    standard = next(g for g in found if g.kind == "standard")
    # -O3 alone is the recommendation: the best standard level, by definition no gain.
    assert standard.same_build and standard.text() == "it is the standard level -O3 itself"


def test_overlapping_builds_are_said_to_be_indistinguishable() -> None:
    told = gain.Gain("the generic build", "generic", 1.01, 0.97, 1.05, 5).text()
    assert "cannot be told apart" in told and "less per unit" not in told
    # A recommendation the standard level beats is said to be slower, not "-25% less".
    told = gain.Gain("the standard level -O3", "standard", 0.8, 0.7, 0.9, 5).text()
    assert "SLOWER: 25% more per unit of work; use the standard level -O3" in told


def test_a_ratio_interval_covers_the_true_ratio_and_refuses_nonsense() -> None:
    rng = np.random.default_rng(1)
    slow, fast = 10 * (1 + 0.05 * rng.standard_normal(9)), 8 * (1 + 0.05 * rng.standard_normal(9))
    summary = stats.ratio(slow, fast)
    assert summary.low < 10 / 8 < summary.high and summary.n == 9
    assert stats.ratio([2.0], [1.0]).median == 2.0
    for bad in (([], [1.0]), ([1.0], [0.0]), ([float("nan")], [1.0])):
        with pytest.raises(ValueError):
            stats.ratio(*bad)


def test_the_gain_waits_for_money_the_budget_has_and_records_why(tmp_path: Path) -> None:
    results = Results(tmp_path / "f.sqlite")
    results.create_run("ft-0123456789", "tune", {}, "local", "us-east-1", "")
    space = parse(LEVELS, "t.toml", "", ["c7g.large"])
    params = {"opt": "-O2", "unroll": "", "threads": 1}
    bench = Bench({})
    # 3 runs of 3 builds (-O2 alone is the recommendation's build) at $0.01 a run: $0.09, with
    # $0.05 left.
    detail = gain.of_run(results, "ft-0123456789", bench, space, params, 3, 0.05, 0.01)
    assert bench.asked == [] and "more than the $0.0500 the money budget leaves" in detail["error"]
    assert gain.recorded(results, "ft-0123456789") == detail
    assert gain.lines(detail)[0].startswith("gain not measured: 3 runs of 3 builds")
    # A failed build is recorded as the reason, and what it cost so far.
    failing = Bench({}, fail="the generic build failed: no compiler")
    detail = gain.of_run(results, "ft-0123456789", failing, space, params, 3, None, 0.01)
    assert detail["error"] == "the generic build failed: no compiler"
    # Measured once, kept: a resumed run does not measure it again.
    means = {"recommended": 2.0, "generic": 1.0, "standard-O2": 2.0, "standard-O3": 1.5}
    done = gain.of_run(results, "ft-0123456789", Bench(means), space, params, 3, None, 0.01)
    again = Bench(means)
    assert gain.of_run(results, "ft-0123456789", again, space, params, 3, None, 0.01) == done
    assert again.asked == [] and [g["kind"] for g in done["gains"]] == ["generic", "standard"]


def test_a_cloud_tune_measures_its_gain_bakes_its_winner_and_leaves_nothing(
    cloud: Any,
    local_dir: Path,
    tmp_path: Path,
    host_family: str,
    capsys: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue 27: the recommendation's gain over the generic build and the best standard level,
    with intervals, in the run's output, report and --json; its runs take turns on one
    instance after the search, and everything they launched is gone. Then tune -> bake is one
    command: `amibake bake --from-tune` bakes the recommended build."""

    from amibake import config
    from amibake.journal import Journal
    from fleet import bench
    from fleet.cli import main
    from tests.helpers import tagged_alive, wait_until_clean

    # Its own results: the image it bakes is not in the session's record of images baked.
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    path = tmp_path / "t.toml"
    path.write_text(
        f'recipe = "kernels"\ntypes = ["{host_family}.large"]\nalgorithm = "grid"\ntrials = 2\n'
        'objective = "metric"\nreplicates = 1\ngain_replicates = 2\n'
        '[params.opt]\nkind = "categorical"\nvalues = ["-O2", "-O3"]\nstage = "compile"\n'
        '[params.size]\nkind = "categorical"\nvalues = [16]\nstage = "run"\n'
    )
    assert main(["tune", str(path), "--yes", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    measured = out["gain"]
    assert "error" not in measured, measured
    assert [g["kind"] for g in measured["gains"]] == ["generic", "standard"]
    for found in measured["gains"]:
        assert 0 < found["low"] <= found["ratio"] <= found["high"] and found["n"] in (0, 2)
    results = bench.results_db(config.load().results_dir)
    runs = results.replicates(out["run_id"])
    side = runs[runs.trial == gain.GAIN_TRIAL]
    # The recommendation's level is one of the two standard ones: three builds, two runs each,
    # in turns (recommended, generic, the other level, recommended, ...).
    assert side.groupby("build").size().to_dict() == {
        "recommended": 2,
        "generic": 2,
        f"standard{'-O2' if out['recommended']['params']['opt'] == '-O3' else '-O3'}": 2,
    }
    assert set(side.state) == {"ok"}
    # Its runs' controller ran after the search ended: the run is finished all the same, and
    # status counts what the gain spent.
    from fleet import control

    state = control.status(results, out["run_id"])
    assert state["state"] == "finished" and state["spent_usd"] == pytest.approx(out["spent_usd"])
    # The gain's instance is paid for, and counted in what the run spent.
    assert measured["usd"] > 0 and out["spent_usd"] >= measured["usd"]
    assert main(["report", "last", "--no-html", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gain"] == measured
    assert main(["report", "last", "--no-html"]) == 0
    text = capsys.readouterr().out
    assert "gain over the generic build: " in text and "gain over the best standard level" in text
    journal = Journal(config.load().results_dir / "journal.sqlite")
    for amibake_run in [
        d["amibake_run"] for _, k, d in results.events(out["run_id"]) if k == "controller"
    ]:
        assert tagged_alive(cloud, amibake_run) == [] and journal.alive(amibake_run) == []
    assert wait_until_clean(local_dir) == []

    # The recommended build, baked: the trial's own artifact (same flags, same variant), in an
    # image whose boot test ran it.
    from amibake.cli import main as amibake

    flags = out["recommended"]["params"]["opt"]
    assert f"bake it: amibake bake --from-tune {out['run_id']}" in text
    assert amibake(["bake", "--from-tune", "last", "--yes", "--json"]) == 0
    (baked,) = json.loads(capsys.readouterr().out)
    assert baked["ok"] and baked["boot_test"]["staged"], baked
    variant = Variant.of_flags(flags).name
    assert baked["artifacts"] == [f"kernels_{host_family}-{variant}.tar.xz"]
    manifest = json.loads(
        (
            tmp_path / "results" / "artifacts" / "variants"
            / f"kernels_{host_family}-{variant}.manifest.json"
        ).read_text()
    )  # fmt: skip
    assert manifest["cflags"].endswith(flags), manifest["cflags"]
    images = cloud.ec2.describe_images(ImageIds=[baked["image_id"]])["Images"]
    assert images and images[0]["State"] == "available"
    cloud.ec2.deregister_image(ImageId=baked["image_id"])
    for mapping in images[0]["BlockDeviceMappings"]:
        if "Ebs" in mapping:
            cloud.ec2.delete_snapshot(SnapshotId=mapping["Ebs"]["SnapshotId"])


def test_bake_from_tune_refuses_what_it_cannot_bake_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    from amibake.cli import main as amibake

    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path))
    tunes = tmp_path / "tunes"
    cases = [
        (["--from-tune", "last"], f"no tune run has a recommendation in {tunes}"),
        (["--from-tune", "ft-12"], "--from-tune 'ft-12': a tune run is ft- and 10 hex digits"),
        (["--from-tune", "ft-0123456789"], "tune run ft-0123456789 has no recommendation in"),
        (["--from-tune", "last", "--family", "c7i"], "leave out --family, --build and --base-ami"),
    ]
    tunes.mkdir()
    (tunes / "ft-abcdefabcd.json").write_text('{"run_id": "ft-abcdefabcd"}')  # fields missing
    for argv, expected in cases[1:]:
        assert amibake(["bake", *argv, "--cloud", "local"]) == 2, argv
        err = capsys.readouterr().err
        assert err.startswith("amibake: error: ") and expected in err and err.count("\n") == 1, err
    assert amibake(["bake", "--from-tune", "ft-abcdefabcd", "--cloud", "local"]) == 2
    assert "ft-abcdefabcd.json is damaged" in capsys.readouterr().err
    # Its flags go into the bake's build script as written: a shell's words ran as root there.
    fields = {"run_id": "ft-abcdefabcd", "recipe": "kernels", "instance_type": "c7g.large",
              "family": "c7g", "args": ""}  # fmt: skip
    (tunes / "ft-abcdefabcd.json").write_text(json.dumps({**fields, "cflags": "-O2 $(id>/tmp/x)"}))
    assert amibake(["bake", "--from-tune", "ft-abcdefabcd", "--cloud", "local"]) == 2
    err = capsys.readouterr().err
    assert (
        "ft-abcdefabcd.json is damaged (ValueError: cflags: '$(id>/tmp/x)' has a character" in err
    )
    # A number where text goes passed str() and failed the bake with a traceback.
    (tunes / "ft-abcdefabcd.json").write_text(json.dumps({**fields, "cflags": 5}))
    assert amibake(["bake", "--from-tune", "ft-abcdefabcd", "--cloud", "local"]) == 2
    err = capsys.readouterr().err
    assert "ft-abcdefabcd.json is damaged (ValueError: cflags: 5 is not text" in err, err
    (tunes / "ft-abcdefabcd.json").unlink()
    assert amibake(["bake", *cases[0][0], "--cloud", "local"]) == 2
    assert cases[0][1] in capsys.readouterr().err
    assert not (tmp_path / "amis.json").exists()  # nothing baked, nothing recorded


def test_the_hand_over_is_rewritten_only_when_the_recommendation_changes(tmp_path: Path) -> None:
    """`bake --from-tune last` takes the newest file: a report that rewrote an unchanged one made
    "last" the run last reported, not the newest recommendation."""
    import os

    from fleet import recommended, tune

    spec = tune.from_dict({"recipe": "kernels", "types": ["c7g.large"], "params": LEVELS}, "t.toml")
    params = {"opt": "-O3", "unroll": "", "threads": 2}
    path = recommended.write(tmp_path, "ft-0123456789", spec, params)
    assert path is not None
    os.utime(path, (1, 1))
    assert recommended.write(tmp_path, "ft-0123456789", spec, params) == path
    assert path.stat().st_mtime == 1  # unchanged: not rewritten
    recommended.write(tmp_path, "ft-0123456789", spec, {**params, "threads": 1})
    assert path.stat().st_mtime > 1
    written = json.loads(path.read_text())
    assert (written["family"], written["cflags"], written["args"]) == ("c7g", "-O3", "--threads 1")
