"""The search core (fleet/search/): instance types as features, the model-based engines, the
recommendation through noise, and noisy replay. Tables here are given as data: nothing depends
on this machine."""

from __future__ import annotations

import itertools
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import pytest

from amibake.errors import UserError
from fleet.noisy_replay import RunsReplay, compare_noisy, run_search
from fleet.search import engines
from fleet.search import model as search_model
from fleet.search.evaluation import Evaluation
from fleet.search.features import Encoder, estimated_usd_per_vcpu_hour, facts
from fleet.search.model import ModelSearch
from fleet.search.recommend import recommend
from fleet.space import key as space_key
from fleet.space import parse
from fleet.tune_spec import TuneSpec

GRID = {
    "x": {"kind": "categorical", "values": list(range(20))},
    "y": {"kind": "int", "low": 0, "high": 19},
}

# Three families x four sizes x four node counts, as data
VCPUS = {"large": 2, "xlarge": 4, "2xlarge": 8, "4xlarge": 16}
CLUSTER = {
    "instance_type": {
        "kind": "categorical",
        "values": [f"{f}.{s}" for f in ("c7g", "m7i", "r7g") for s in VCPUS],
    },
    "nodes": {"kind": "categorical", "values": [1, 2, 4, 8]},
}


def bowl(params: dict[str, Any]) -> float:
    return float((params["x"] - 13) ** 2 + 2 * (params["y"] - 4) ** 2 + 10.0)


def run(
    algorithm: str, evaluate: Any, budget: int, seed: int = 0
) -> list[tuple[dict[str, Any], float | None]]:
    space = parse(GRID, "t", "", [])
    engine = engines.make(algorithm, space, seed, 3, budget)
    seen = []
    for _ in range(budget):
        asked = engine.ask()
        assert asked is not None
        trial, params = asked
        loss = evaluate(params)
        engine.tell(trial, loss)
        seen.append((params, loss))
    return seen


def test_an_instance_type_reads_as_aws_names_it() -> None:
    amd = facts("c7a.2xlarge")
    assert amd is not None and (amd.vcpus, amd.processor, amd.generation) == (8, "amd", 7)
    assert amd.gib_per_vcpu == 2 and amd.usd_per_vcpu_hour is not None  # the catalog knows it
    graviton = facts("r7g.large")
    assert graviton is not None and (graviton.processor, graviton.gib_per_vcpu) == ("graviton", 8)
    family = facts("c6i")
    assert family is not None and (family.vcpus, family.processor) == (None, "intel")
    # Not in the catalog, named by the convention: still read, its price estimated.
    unknown = facts("m9z.12xlarge")
    assert unknown is not None and unknown.vcpus == 48
    assert unknown.usd_per_vcpu_hour == estimated_usd_per_vcpu_hour(4.0, "intel", 9)
    assert facts("not-a-type") is None and facts("c7a.huge") is None


def test_types_become_ordered_features() -> None:
    space = parse(
        {"instance_type": {"kind": "categorical", "values": ["c7a.large", "c7a.4xlarge", "r7g.large"]},
         "nodes": {"kind": "categorical", "values": [1, 2, 4, 8]}},
        "t", "", [],
    )  # fmt: skip
    encoder = Encoder(space)
    rows = encoder.fit(list(space.grid()))
    assert rows.shape[0] == 12 and rows.min() >= -0.5 and rows.max() <= 1.0
    small, large = encoder.encode([{"instance_type": "c7a.large", "nodes": 1},
                                   {"instance_type": "c7a.4xlarge", "nodes": 8}])  # fmt: skip
    assert (large >= small).sum() > (large < small).sum()  # more vCPUs, more nodes: larger


@pytest.mark.parametrize("algorithm", ["gp", "forest"])
def test_a_model_finds_a_bowl_s_bottom_sooner_than_chance(algorithm: str) -> None:
    hits = {name: 0 for name in (algorithm, "random")}
    for seed in range(6):
        for name in hits:
            seen = run(name, bowl, 15, seed)
            hits[name] += min(loss for _, loss in seen if loss is not None) <= 13.0
    assert hits[algorithm] >= 5 and hits[algorithm] > hits["random"], hits


@pytest.mark.parametrize("algorithm", ["auto", "gp", "forest", "blend", "tpe", "random", "grid"])
def test_every_engine_suggests_the_same_given_the_same_seed(algorithm: str) -> None:
    first = run(algorithm, bowl, 8, seed=3)
    assert run(algorithm, bowl, 8, seed=3) == first
    assert len({space_key(p) for p, _ in first}) == 8  # no configuration twice here


def test_a_model_s_step_runs_its_linear_algebra_on_one_thread(monkeypatch: Any) -> None:
    from threadpoolctl import threadpool_info, threadpool_limits

    # A thread per core fighting a busy machine made a step 3.5 times slower
    seen: list[set[int]] = []
    choose = ModelSearch._choose

    def counting(self: ModelSearch) -> Any:
        seen.append({pool["num_threads"] for pool in threadpool_info()})
        return choose(self)

    monkeypatch.setattr(ModelSearch, "_choose", counting)
    with threadpool_limits(limits=2):  # more than one, on any machine
        run("blend", bowl, 4)
        after = {pool["num_threads"] for pool in threadpool_info()}
    assert seen and all(threads == {1} for threads in seen), seen
    assert after == {2}, "a step's limit outlived the step"


# hyperopt's engines race in a wrapper (fleet/search/racing.py): asking no configuration twice,
# they recommended one lucky run under noise, without an interval.
RACERS = ["gp", "tpe", "random"]


@pytest.mark.parametrize("algorithm", RACERS)
def test_a_deterministic_table_is_replicated_once_then_explored(algorithm: str) -> None:
    seen = run(algorithm, bowl, 15)
    repeats = len(seen) - len({space_key(p) for p, _ in seen})
    assert repeats == 1  # the noise check: the same figure twice, so no racing
    # An engine told its evaluator is a lookup (a replay table) spends no trial on the check.
    engine = engines.make(algorithm, parse(GRID, "t", "", []), 0, 3, 15, noisy=False)
    looked_up = engines.one_at_a_time(engine, lambda _, p: Evaluation("ok", loss=bowl(p)), 15)
    asked = [space_key(p) for p, _ in looked_up]
    assert len(asked) == 15 and len(set(asked)) == 15, asked


@pytest.mark.parametrize("algorithm", RACERS)
def test_noisy_measurements_are_raced_and_recommended_with_an_interval(algorithm: str) -> None:
    noise = random.Random(0)

    def noisy(params: dict[str, Any]) -> float:
        return bowl(params) * (1 + noise.gauss(0, 0.05))

    seen = run(algorithm, noisy, 24)
    repeats = len(seen) - len({space_key(p) for p, _ in seen})
    assert repeats >= 4  # the last third replicates the finalists
    chosen = recommend(seen)
    assert chosen is not None and chosen.runs >= 2 and chosen.low is not None
    assert chosen.low <= chosen.loss <= chosen.high  # type: ignore[operator]


def test_failures_are_a_wall_the_search_learns() -> None:
    def walled(params: dict[str, Any]) -> float | None:
        return None if params["x"] < 8 else bowl(params)  # out of memory below 8

    seen = run("gp", walled, 15)
    later = [loss for _, loss in seen[5:]]
    assert sum(loss is None for loss in later) <= 3, seen


@pytest.mark.parametrize("seed", range(4))
def test_a_search_whose_runs_all_fail_moves_to_larger_clusters(seed: int) -> None:
    # out of memory below 512 GiB in all: 4 of 48 configurations run; a start design that
    # stays mid-size after failures spent all nine trials failing
    space = parse(CLUSTER, "t", "", [])
    gib = {"c7g": 2, "m7i": 4, "r7g": 8}

    def memory(params: dict[str, Any]) -> float:
        family, size = params["instance_type"].split(".")
        return float(params["nodes"] * VCPUS[size] * gib[family])

    engine = engines.make("auto", space, seed, 4, 9)
    losses = []
    for _ in range(9):
        trial, params = engine.ask()  # type: ignore[misc]
        total = memory(params)
        losses.append(None if total < 512 else total * (1 + 0.1 * params["nodes"]))
        engine.tell(trial, losses[-1])
    assert any(loss is not None for loss in losses), losses


@pytest.mark.parametrize("model", ["gp", "blend"])
def test_one_run_of_a_family_says_how_it_does_at_every_size(model: str) -> None:
    # cost = the family's price of speed x a bowl on the cluster's total vCPUs (best at 32): the
    # bowl learnt on m7i and one run each of c7g and r7g place the cheapest untried
    # configuration at c7g on 32 vCPUs; a kernel over all columns at once predicted an m7i
    family = {"c7g": 1.0, "m7i": 1.6, "r7g": 2.2}

    def total(params: dict[str, Any]) -> int:
        return VCPUS[params["instance_type"].split(".")[1]] * int(params["nodes"])

    def cost(params: dict[str, Any]) -> float:
        return family[params["instance_type"].split(".")[0]] * (
            total(params) / 32 + 32 / total(params)
        )

    search = ModelSearch(parse(CLUSTER, "t", "", []), 0, 4, 9, model)
    for i, params in enumerate(search.candidates):
        kind = params["instance_type"]
        if (kind.startswith("m7i") and params["nodes"] in (1, 8)) or (
            kind in ("c7g.large", "r7g.4xlarge") and params["nodes"] == 1
        ):
            search.runs[i] = [cost(params)]
    untried = [i for i in range(len(search.candidates)) if i not in search.runs]
    expected = search._posterior(untried)
    assert expected is not None
    mean = expected[0]
    best = search.candidates[untried[int(np.argmin(mean))]]
    assert best["instance_type"].startswith("c7g") and total(best) == 32, best


def test_a_family_never_run_stays_in_doubt() -> None:
    # m7i run at eight shapes and c7g at one: at every shape, r7g (never run) is in half as
    # much doubt again as either (1.8-4.9 times), so that expected improvement goes to a
    # family the start did not reach, not only to the shapes of the ones it did (the kernel's
    # part over what a type is; its length, KIND_LENGTH, is measured in bench_search)
    search = ModelSearch(parse(CLUSTER, "t", "", []), 0, 4, 9, "gp")
    for i, params in enumerate(search.candidates):
        kind = params["instance_type"]
        if (kind.startswith("m7i") and params["nodes"] in (1, 4)) or (
            kind == "c7g.xlarge" and params["nodes"] == 2
        ):
            search.runs[i] = [10.0 + VCPUS[kind.split(".")[1]] * params["nodes"] / 8]
    untried = [i for i in range(len(search.candidates)) if i not in search.runs]
    expected = search._posterior(untried)
    assert expected is not None
    doubt = {
        (search.candidates[i]["instance_type"], search.candidates[i]["nodes"]): sd
        for i, sd in zip(untried, expected[1], strict=True)
    }
    for size, nodes in itertools.product(VCPUS, (2, 8)):
        unseen = doubt[(f"r7g.{size}", nodes)]
        for family in ("c7g", "m7i"):
            if (f"{family}.{size}", nodes) in doubt:
                assert unseen > 1.5 * doubt[(f"{family}.{size}", nodes)], (size, nodes, family)


def test_a_run_short_of_memory_does_not_condemn_its_family(monkeypatch: Any) -> None:
    # cost = the family's price of speed x a bowl on the cluster's vCPUs (best at 32), tripled
    # below 64 GiB in all (a memory wall): m7i run at 64-256 GiB, c7g once at 16 GiB (12.75,
    # tripled by the wall). c7g is the cheapest family where memory suffices (2.0 at 32 vCPUs):
    # its one run, short of memory and dearer than the incumbent, is heard but not believed, so
    # c7g with enough memory is expected cheaper and held in more doubt than were it believed
    family = {"c7g": 1.0, "m7i": 1.6, "r7g": 2.2}
    gib_per_vcpu = {"c7g": 2, "m7i": 4, "r7g": 8}

    def cluster(params: dict[str, Any]) -> tuple[str, int, int]:
        kind, size = params["instance_type"].split(".")
        vcpus = VCPUS[size] * int(params["nodes"])
        return kind, vcpus, vcpus * gib_per_vcpu[kind]

    def cost(params: dict[str, Any]) -> float:
        kind, vcpus, gib = cluster(params)
        return family[kind] * (vcpus / 32 + 32 / vcpus) * (3.0 if gib < 64 else 1.0)

    ran = {("m7i.2xlarge", 2), ("m7i.4xlarge", 2), ("m7i.4xlarge", 4), ("m7i.xlarge", 8)}
    ran.add(("c7g.xlarge", 2))

    def posterior(noise: float) -> tuple[float, float]:
        monkeypatch.setattr(search_model, "DOUBTFUL_NOISE", noise)
        search = ModelSearch(parse(CLUSTER, "t", "", []), 0, 4, 9, "gp")
        for i, params in enumerate(search.candidates):
            if (params["instance_type"], params["nodes"]) in ran:
                search.runs[i] = [cost(params)]
        untried = [i for i in range(len(search.candidates)) if i not in search.runs]
        expected = search._posterior(untried)
        assert expected is not None
        rows, y, _, _ = search._training()
        doubt = search._doubt(rows, y)
        assert doubt is not None
        doubted = {
            (search.candidates[r]["instance_type"], search.candidates[r]["nodes"])
            for r, d in zip(rows, doubt, strict=True)
            if d > 1e-6
        }
        mean, sd = expected[0], expected[1]
        fits = [
            j
            for j, i in enumerate(untried)
            if cluster(search.candidates[i])[0] == "c7g" and cluster(search.candidates[i])[2] >= 64
        ]
        # the runs with less memory than the incumbent's (m7i.4xlarge x 2) that cost more; not
        # m7i.4xlarge x 4, dearer with more
        shorter = {("c7g.xlarge", 2), ("m7i.2xlarge", 2)}
        assert doubted == (shorter if noise > 1e-6 else set()), doubted
        return float(np.exp(mean[fits].min())), float(sd[fits].mean())

    doubtful = search_model.DOUBTFUL_NOISE
    believed, believed_sd = posterior(search_model.NO_NOISE)
    heard, heard_sd = posterior(doubtful)
    assert heard < 0.85 * believed and heard_sd > 1.2 * believed_sd, (
        believed, heard, believed_sd, heard_sd,
    )  # fmt: skip


def test_the_recommendation_does_not_trust_one_lucky_run() -> None:
    steady = {"c": "steady"}
    lucky = {"c": "lucky"}
    observations = [(steady, v) for v in (10.0, 10.4, 9.8, 10.1, 10.2)] + [(lucky, 10.0)]
    chosen = recommend(observations)
    assert chosen is not None and chosen.params == steady and chosen.runs == 5
    assert chosen.low is not None and chosen.low < 10.1 < chosen.high  # type: ignore[operator]
    # No configuration twice: the best single run, without an interval it could not measure.
    alone = recommend([(steady, 10.0), (lucky, 9.9)])
    assert alone is not None and alone.params == lucky and alone.low is None
    assert "noise is unknown" in alone.basis
    assert recommend([(steady, None)]) is None
    # The interval's noise is named as it was taken: the pool's, or the configuration's own
    # runs where they spread wider (the basis said "pooled over 8" for an interval of 3 runs).
    assert "noise pooled over 4 replicates" in (chosen.basis or "")
    wide = [(steady, v) for v in (10.0, 14.0, 7.0)] + [(lucky, v) for v in (12.0, 12.1)]
    spread = recommend(wide)
    assert spread is not None and spread.params == steady, spread
    assert "its own runs' spread, wider than the 3 replicates' pooled noise" in spread.basis


def test_a_configuration_whose_runs_broke_a_constraint_is_not_recommended() -> None:
    """Runs of 11, 5, 5, 5 under min_rate = 10: the three infeasible ones were left out, and
    the configuration recommended on its one run that passed, ahead of a steady one."""
    spotty, steady = {"b": 16}, {"b": 8}
    observations = [(spotty, -11.0), (spotty, None), (spotty, None), (spotty, None)]
    observations += [(steady, v) for v in (-10.5, -10.6, -10.4)]
    chosen = recommend(observations)
    assert chosen is not None and chosen.params == steady, chosen
    # Nothing but such configurations: the best of them, rather than nothing.
    only = recommend([(spotty, -11.0), (spotty, None)])
    assert only is not None and only.params == spotty


def _runs_table(tmp_path: Path, rows: list[dict[str, Any]]) -> Path:
    path = tmp_path / "runs.csv"
    pd.DataFrame(rows).to_csv(path, index=False)
    return path


def _noisy_bowl(xs: int, ys: int, runs: int, seed: int) -> list[dict[str, Any]]:
    """`runs` recorded runs of each point of the bowl, 5% noise on each."""
    noise = random.Random(seed)
    return [
        {"run": r, "x": x, "y": y, "metric": bowl({"x": x, "y": y}) * (1 + noise.gauss(0, 0.05))}
        for x, y in itertools.product(range(xs), range(ys))
        for r in range(runs)
    ]


def test_noisy_replay_draws_runs_and_scores_the_recommendation(tmp_path: Path) -> None:
    path = _runs_table(tmp_path, _noisy_bowl(20, 20, 6, seed=1))
    space = parse(GRID, "t", "", [])
    replay = RunsReplay(path, TuneSpec(space, objective="metric"), seed=0)
    draws = {replay(0, {"x": 13, "y": 4}).loss for _ in range(20)}
    assert len(draws) > 1  # runs drawn, not one figure
    assert isinstance(replay(0, {"x": 99, "y": 0}), Evaluation)
    score = compare_noisy(path, TuneSpec(space, objective="metric"), ["gp"], 4, 20, 3)[0]
    assert all(math.isfinite(r) and r >= 1.0 for r in score.ratios)
    assert score.intervals == 4


def test_noisy_replay_draws_each_recorded_run_before_any_again(tmp_path: Path) -> None:
    """Two runs a configuration, drawn with replacement: one replicate in two was the very run
    drawn before, the search's noise check took the twin figures for no noise, and the interval
    was zero wide (6 of 12 seeds), missing the true mean."""
    rows = _noisy_bowl(10, 8, 2, seed=2)
    path = _runs_table(tmp_path, rows)
    space = parse(GRID, "t", "", []).holding(
        [{"x": x, "y": y} for x, y in itertools.product(range(10), range(8))]
    )
    spec = TuneSpec(space, objective="metric")
    replay = RunsReplay(path, spec, seed=0)
    recorded = sorted(row["metric"] for row in rows if (row["x"], row["y"]) == (3, 5))
    assert sorted(replay(0, {"x": 3, "y": 5}).loss for _ in range(2)) == recorded  # type: ignore[type-var]
    chosen = [
        run_search("gp", space, RunsReplay(path, spec, seed=s), s, 20, None) for s in range(8)
    ]
    widths = [
        c.high - c.low for c in chosen if c is not None and c.low is not None and c.high is not None
    ]
    assert len(widths) == 8 and min(widths) > 0, widths


def test_a_configuration_reads_back_from_hyperopt_s_own_record_of_it() -> None:
    # what the hyperopt engine records for a configuration it picks itself (a narrowed space's
    # draws kept missing): a conditional child, an ordinal, a categorical of strings
    import hyperopt

    raw = {
        "opt": {"kind": "categorical", "values": ["-O2", "-O3"]},
        "width": {"kind": "categorical", "values": [128, 256, 512],
                  "when": {"param": "opt", "in": ["-O3"]}},
        "threads": {"kind": "int", "low": 1, "high": 4},
    }  # fmt: skip
    space = parse(raw, "t", "", [])
    configurations = list(space.grid())
    assert len(configurations) == 4 * (1 + 3)
    for chosen in configurations:
        vals = space.hyperopt_values(chosen)
        values = {label: v[0] for label, v in vals.items() if v}
        sample = hyperopt.space_eval(space.hyperopt(), values)
        assert space.active(space.from_sample(sample)) == chosen, (chosen, vals)


@pytest.mark.parametrize("algorithm", ["random", "tpe", "auto"])
def test_noisy_replay_of_a_partial_table_runs_what_it_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, algorithm: str
) -> None:
    # 20 x 20 in the space; the table holds the 40 configurations with x + y < 8 or x = y
    held = [(x, y) for x, y in itertools.product(range(20), range(20)) if x + y < 8 or x == y]
    rows = [{"run": r, "x": x, "y": y, "metric": bowl({"x": x, "y": y}) + r} for x, y in held
            for r in range(2)]  # fmt: skip
    path = _runs_table(tmp_path, rows)
    space = parse(GRID, "t", "", [])
    assert (
        len(RunsReplay(path, TuneSpec(space, objective="metric")).configurations())
        == len(held)
        == 52
    )
    reasons = []
    draw = RunsReplay.__call__

    def recorded(self: RunsReplay, trial: int, params: dict[str, Any]) -> Evaluation:
        evaluation = draw(self, trial, params)
        reasons.append(evaluation.reason)
        return evaluation

    monkeypatch.setattr(RunsReplay, "__call__", recorded)
    compare_noisy(path, TuneSpec(space, objective="metric"), [algorithm], 3, 30, 3)
    assert len(reasons) == 90 and set(reasons) == {""}, set(reasons)


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([{"x": 1, "y": 1, "metric": 1.0}], ":1: a runs table needs a run (or round) column"),
        ([{"run": 0, "x": 1, "metric": 1.0}], ":1: the runs table has no column y"),
        ([{"run": 0, "x": 1, "y": 1, "metric": 1.0}, {"run": None, "x": 2, "y": 1, "metric": 2.0}],
         ":3: a configuration with no run"),
        ([{"run": 0, "x": 1, "y": 1, "metric": "-inf"}], ":2: metric '-inf' is not a finite number"),
    ],
)  # fmt: skip
def test_a_bad_runs_table_is_refused_with_its_line(
    tmp_path: Path, rows: list[dict[str, Any]], message: str
) -> None:
    path = _runs_table(tmp_path, rows)
    with pytest.raises(UserError, match=None) as caught:
        RunsReplay(path, TuneSpec(parse(GRID, "t", "", []), objective="metric"))
    assert message in str(caught.value), caught.value
