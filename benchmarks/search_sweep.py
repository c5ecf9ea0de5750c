"""Issue 22's goal 2 for one search over many tables at once, for choosing between variants of
it (not part of `make bench`, whose bench_search reports the goals):

    PYTHONPATH=. .venv/bin/python -m benchmarks.search_sweep [--algorithm auto] [--set NAME=VALUE]

The tables: 360 generated ones (table seeds 1-3 and 4-6 in catalog and published form, 7-9 in
catalog form; 10 search seeds each) and the seven named ones in three forms (catalog, published
with prices, published without; 30 seeds each). A search of 9 steps follows nearly one path on a
table, so a variant is judged by how many tables meet the goal, in a pool of two processes.
`--set model.RETRIES=2` sets a constant of fleet/search/<module> for the run; `--budget 12` the
evaluations of each search. About two minutes a variant on a fast 2-core host."""

from __future__ import annotations

import argparse
import ast
import importlib
import multiprocessing
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import bench_search, cluster_tables
from fleet import tune
from fleet.replay import ReplayEvaluator, compare, space_from_table

# (label, table seeds, published form, priced)
GENERATED = (
    ("T1-3", (1, 2, 3), False, True),
    ("T1-3 published", (1, 2, 3), True, True),
    ("T4-6", (4, 5, 6), False, True),
    ("T4-6 published", (4, 5, 6), True, True),
    ("T7-9", (7, 8, 9), False, True),
)
NAMED = (("named", False, True), ("named published", True, True), ("named unpriced", True, False))


def _search(path: Path, published: bool) -> tuple[tune.TuneSpec, ReplayEvaluator]:
    if not published:
        return bench_search._cluster_search(path)
    spec = tune.from_dict(space_from_table(path, "cost"), str(path))
    return spec, ReplayEvaluator(path, spec)


Job = tuple[str, str, bool, int, str, int]  # label, table, published, seeds, algorithm, budget


def _score(job: Job) -> tuple[str, str, float, float]:
    label, path, published, seeds, algorithm, budget = job
    spec, evaluator = _search(Path(path), published)
    ratios = compare(spec, evaluator, [algorithm], seeds, budget)[0].ratios
    median, p90 = bench_search._median_p90(ratios)
    return label, Path(path).stem.removeprefix("cluster_"), median, p90


def _jobs(directory: Path, algorithm: str, budget: int) -> list[Job]:
    jobs: list[Job] = []
    for label, published, priced in NAMED:
        for path in cluster_tables.write(directory / label, as_published=published, priced=priced):
            jobs.append((label, str(path), published, bench_search.SEEDS, algorithm, budget))
    for label, table_seeds, published, priced in GENERATED:
        for seed in table_seeds:
            for path in cluster_tables.write(
                directory / label / str(seed),
                cluster_tables.generated(24, seed),
                as_published=published,
                priced=priced,
            ):
                seeds = bench_search.GENERATED_SEEDS
                jobs.append((label, str(path), published, seeds, algorithm, budget))
    return jobs


def _setting(text: str) -> tuple[str, str, Any]:
    name, _, value = text.partition("=")
    module, _, constant = name.rpartition(".")
    try:
        return module, constant, ast.literal_eval(value)
    except (ValueError, SyntaxError):
        raise SystemExit(
            f"--set {text}: give MODULE.NAME=VALUE, VALUE a number or a quoted word"
        ) from None


def _apply(settings: list[tuple[str, str, Any]]) -> None:
    for module, constant, value in settings:
        try:
            target = importlib.import_module(f"fleet.search.{module}")
        except ImportError:
            raise SystemExit(f"--set: no module fleet.search.{module}") from None
        if not constant or not hasattr(target, constant):
            raise SystemExit(f"fleet.search.{module} has no {constant}")
        setattr(target, constant, value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algorithm", default="auto")
    parser.add_argument("--set", action="append", default=[], metavar="MODULE.NAME=VALUE")
    parser.add_argument("--budget", type=int, default=9, help="evaluations a search (9)")
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--misses", action="store_true", help="list the tables missing the goal")
    args = parser.parse_args()
    settings = [_setting(s) for s in args.set]
    _apply(settings)  # here, so that a bad name fails before the pool starts
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        jobs = _jobs(Path(tmp), args.algorithm, args.budget)
        with multiprocessing.get_context("fork").Pool(args.processes) as pool:
            results = pool.map(_score, jobs, chunksize=4)
    labels = [label for label, *_ in NAMED] + [label for label, *_ in GENERATED]
    total = met_all = 0
    for label in labels:
        rows = [r for r in results if r[0] == label]
        met = [r for r in rows if r[2] <= 1.05 and r[3] <= 1.15]
        mean_median = sum(r[2] for r in rows) / len(rows)
        mean_p90 = sum(r[3] for r in rows) / len(rows)
        print(f"{label:16} {len(met):3}/{len(rows):3}  mean {mean_median:.4f} / {mean_p90:.4f}")
        if not label.startswith("named"):
            total += len(rows)
            met_all += len(met)
        if args.misses or label.startswith("named"):
            for r in rows:
                if r not in met:
                    print(f"    {r[1]:14} {r[2]:.3f} / {r[3]:.3f}")
    named = sum(1 for r in results if r[0].startswith("named") and r[2] <= 1.05 and r[3] <= 1.15)
    print(f"generated {met_all}/{total}, named {named}/21 ({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
