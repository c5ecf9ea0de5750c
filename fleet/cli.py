"""fleet: run a workload across EC2 instance types and rank them by cost per unit of work."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from amibake import checks, cliutil, cost, logs
from amibake import config as config_module
from amibake.cli import common_options, config_from, guarded, network_options, print_result
from amibake.cliutil import Parser
from amibake.config import Config
from amibake.errors import UserError, did_you_mean

if TYPE_CHECKING:  # pandas: 0.7 s at start-up that --help and status lists do not need
    from fleet.results import Results
    from fleet.tune_spec import TuneSpec

MAX_SEEDS = 1000  # compare: the median and p90 over seeds settle long before
DEFAULT_BUDGET = 20  # compare's trials per seed
DEFAULT_SEEDS = 30  # compare's seeds per algorithm
# compare's own flags, and what a search of a tune file takes instead: given to a search they
# were ignored (--budget 3 ran the file's 5 trials; --replay-runs replayed no noise)
COMPARE_ONLY = {
    "budget": "--trials",
    "seeds": "--seed",
    "algorithms": "--algorithm",
    "space": "the tune file itself",
    "objective_column": "the tune file's objective",
    "replay_runs": "--replay",
}

# A search's flags, and what compare takes instead: given to compare they were ignored
# (--dry-run ran the whole comparison and wrote its report; --trials 3 compared at 20).
SEARCH_ONLY = {
    "trials": "--budget",
    "algorithm": "--algorithms",
    "seed": "--seeds",
    "resume": "nothing: a comparison is not resumed",
    "parallel": "nothing: it replays one trial at a time",
    "gain_replicates": "nothing: it measures no gain",
    "max_cost": "nothing: it spends nothing",
    "dry_run": "nothing: it creates nothing in the cloud (its report goes under results/reports)",
}


def _of_tune_file(file: str | None, problem: str) -> str:
    """A problem the evaluator found with what the tune file names (its recipe, a parameter
    the recipe's workload does not take) said of the file and the key's line, as the file's
    own checks say theirs: it named neither."""
    if not file or not problem.startswith(("params.", "unknown recipe")):
        return problem  # (a replay table's problem names its table)
    from fleet.spec import line_of

    key = problem.split(":", 1)[0] if problem.startswith("params.") else "recipe"
    try:
        line = line_of(Path(file).read_text(), key)
    except (OSError, UnicodeDecodeError):
        line = None
    return f"{file}:{line}: {problem}" if line else f"{file}: {problem}"


def _run_id(results: Results, name: str) -> str:
    """A run id, or `last` for the newest run."""
    if name != "last":
        return name
    runs = results.run_ids()
    if not runs:
        raise UserError(f"no fleet runs yet in {results.path}")
    return str(runs[-1])


def _run_config(args: argparse.Namespace, results: Results, run_id: str) -> Config:
    """The config for acting on a run's resources: the run's own cloud and region. A kill or a
    resume pointed elsewhere would find none of its instances and leave them running."""
    record = results.require(run_id)
    for key in ("cloud", "region"):
        given = getattr(args, key)
        if given is not None and given != record[key]:
            raise UserError(
                f"run {run_id} ran on {key} {record[key]}, not {given}: drop --{key} (a run is "
                "acted on where it ran)"
            )
    return config_from(args, cloud=record["cloud"], region=record["region"])


def _list(text: str | None, flag: str) -> list[str] | None:
    """A comma-separated flag's items; None when the flag was not given. Given and empty
    (`--types ""`), it is refused: it fell back to the default, as if not given."""
    if text is None:
        return None
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise UserError(f"{flag} lists nothing: name at least one (comma-separated)")
    return items


def _refuse_empty(text: str | None, flag: str, fix: str) -> None:
    """A flag given as "": it was read as not given (its default), or as nothing at all."""
    if text is not None and not text.strip():
        raise UserError(f"{flag} is empty: {fix}")


def _names(text: str | None, flag: str) -> list[str] | None:
    """Families, sizes or instance types, in EC2's lowercase (`C7i.Large` is c7i.large)."""
    listed = _list(text, flag)
    return None if listed is None else cliutil.names(",".join(listed))


def _prices(args: argparse.Namespace) -> int:
    from fleet import prices

    cfg = config_from(args)
    families = _names(args.family, "--family") or []  # C7I is c7i; "" is refused
    if args.refresh:
        from amibake.connect import connect

        try:
            snapshot = prices.refresh(connect(cfg), families)
        except prices.PriceError as exc:
            raise UserError(str(exc)) from None
    else:
        try:
            snapshot = prices.in_use(cfg.results_dir, cfg.region)
        except prices.PriceError as exc:
            raise UserError(str(exc)) from None
    if args.type:
        try:
            chosen = [prices.lookup(t.lower(), snapshot) for t in args.type]
        except prices.PriceError as exc:
            raise UserError(str(exc)) from None
    else:
        chosen = [prices.lookup(t, snapshot) for t in snapshot["prices"]]
    if families:
        chosen = [p for p in chosen if p.instance_type.split(".")[0] in families]
        if not chosen and args.type:
            raise UserError(f"none of --type {' '.join(args.type)} is of --family {args.family}")
        if not chosen:
            raise UserError(f"no instance type of family {args.family} in the snapshot")
    rows = prices.rows(chosen)
    if args.json:
        print(
            json.dumps(
                {
                    "date": snapshot["date"],
                    "source": snapshot["source"],
                    "region": snapshot["region"],
                    "prices": rows,
                },
                indent=2,
            )
        )
        return 0
    print(
        f"EC2 Linux prices, {snapshot['region']}, USD/hour, as of {snapshot['date']} "
        f"({snapshot['source']}); spot prices move hourly"
        + (f"\nnote: {snapshot['note']}" if snapshot.get("note") else "")
    )
    print(prices.table_text(rows))
    return 0


def _bench(args: argparse.Namespace) -> int:
    from amibake.connect import connect
    from fleet import bench, container, spec
    from fleet import plan as planning

    cfg = config_from(args)
    _refuse_empty(args.command_line, "--command", "give the workload's command line, or --recipe")
    results = bench.results_db(cfg.results_dir)
    overrides: dict[str, Any] = {
        "types": _names(args.types, "--types"),
        "families": _names(args.families, "--families"),
        "sizes": _names(args.sizes, "--sizes"),
        "recipe": args.recipe,
        "command": args.command_line,
        "builds": _list(args.builds, "--builds"),
        "replicates": args.replicates,
        "warmups": args.warmups,
        "args": args.args,
        "metric": {"kind": "regex", "pattern": args.metric_regex} if args.metric_regex else None,
        "executor": args.executor,
        "spot": False if args.on_demand else None,
        "concurrency": args.concurrency,
        "allow_missing_price": True if args.allow_missing_price else None,
    }
    if args.resume:
        # The run's own plan is what it resumes: a flag that would change it is refused, not
        # silently dropped.
        flags = {"metric": "metric-regex", "spot": "on-demand"}
        given = [
            "--" + flags.get(k, k.replace("_", "-")) for k, v in overrides.items() if v is not None
        ] + ([args.file] if args.file else [])
        if given:
            raise UserError(
                f"--resume RUN takes the run's own plan: drop {', '.join(given)} (or start a new "
                "run with them)"
            )
        run_id = _run_id(results, args.resume)
        record = results.require(run_id)
        if record["kind"] != "bench":
            raise UserError(f"{run_id} is not a fleet bench run (fleet tune --resume?)")
        # A run recorded before the caps (replicates = 99999999999999) ran out of memory
        # planning its replicates: refused, with the way out.
        for key, (low, high, why) in spec.COUNTS.items():
            problem = checks.integer(record["spec"].get(key), low, high, why)
            if problem:
                raise UserError(
                    f"run {run_id} cannot be resumed: its recorded {key} {problem}; "
                    f"`fleet kill {run_id}` removes what it left"
                )
        cfg = _run_config(args, results, run_id)
        # A cap is not the plan: a resumed run may be given a new one.
        problem = "" if args.max_cost is None else spec.cap_problem(args.max_cost)
        if problem:
            raise UserError(f"--max-cost: {problem}")
        bench_spec = spec.BenchSpec.from_json(record["spec"])
        if args.max_cost is not None and bench_spec.executor == "batch":
            raise UserError(
                f"--max-cost: run {run_id} runs on batch, and caps act on the ssh executor only"
            )
        finished = results.finished(run_id)
        todo = [
            r
            for r in bench.plan(bench_spec)
            if (r.instance_type, r.build, r.index, r.warmup) not in finished
        ]
    else:
        overrides["max_cost"] = args.max_cost
        bench_spec = spec.load(Path(args.file) if args.file else None, overrides, cfg.recipes_dir)
        todo = bench.plan(bench_spec)
        # A missing price is refused before anything is recorded.
        bench.price_lookup(
            bench_spec.types,
            bench_spec.allow_missing_price,
            cfg.results_dir,
            cfg.region,
            spot=bench_spec.spot,
        )
    logs.to_terminal()
    cloud = connect(cfg)
    if not args.resume:
        # What this cloud's CPU cannot run is refused before the run is recorded.
        bench.check_runnable(
            cloud, bench_spec.types, bench_spec.builds if bench_spec.recipe else ()
        )
        if bench_spec.image:  # an image ECR lacks, or lacks a type's architecture: refused
            container.preflight(cloud, bench_spec.image, bench_spec.types, bench_spec.gpus)
    estimate = planning.bench_estimate(
        bench_spec, results, cfg.results_dir, cfg.region, todo, cfg.recipes_dir
    )
    cap = bench_spec.max_cost if args.max_cost is None else args.max_cost
    if _estimated(args, estimate, cap):
        return 0
    if not args.resume:
        run_id = bench.create(cloud, bench_spec, results)
    print(
        f"fleet: run {run_id} (report: fleet report {run_id}; log: {results.log_path(run_id)})",
        file=sys.stderr,
    )
    summary = bench.execute(cloud, run_id, results, max_cost=args.max_cost)
    failed = [t for t, s in summary["types"].items() if not s["ok"]]
    summary["answer"] = _answer(results, run_id, cfg.results_dir / "reports")
    print_result(
        args,
        summary,
        lambda s: "\n".join(
            [f"run {s['run_id']}"]
            + [
                f"  {t}: {'done' if v['ok'] else 'FAILED: ' + v['error']}"
                for t, v in s["types"].items()
            ]
            + _spent_lines(s, f"fleet bench --resume {s['run_id']}")
            + [s["answer"], f"report: fleet report {s['run_id']}"]
        ),
    )
    # A run stopped at its cap did not do all it was asked: not a success for a script.
    return 1 if failed or summary.get("stopped") else 0


def _estimated(args: argparse.Namespace, estimate: Any, cap: float | None) -> bool:
    """Say what a run will launch and spend; with --dry-run that is all (True: stop here).
    Otherwise ask to proceed where a terminal is attached, or check --yes or a cap where not."""
    capped = f"; capped at ${cap:g} (--max-cost / max_cost)" if cap is not None else ""
    if args.dry_run:
        print_result(
            args,
            {"dry_run": True, "estimate": estimate.to_json(), "max_cost": cap, "created": []},
            lambda _: f"{estimate.text()}{capped}\n(dry run: nothing was created)",
        )
        return True
    show = f"fleet: {estimate.text()}{capped}"
    cost.approve(estimate, show, yes=args.yes, capped=cap is not None, cap_flag="--max-cost")
    return False


def _spent_lines(summary: dict[str, Any], resume: str) -> list[str]:
    """What the run spent, and, if it stopped at its cap, how to go on."""
    usd = summary.get("spent_usd", 0.0)
    lines = [f"spent: {cost.dollars(usd)} (instance time at its price)"]
    if summary.get("stopped"):
        lines.append(
            f"STOPPED at the cap ({summary['stopped']}); everything it launched is gone. "
            f"Go on with: {resume} --max-cost USD"
        )
    return lines


def _answer(results: Any, run_id: str, reports_dir: Path) -> str:
    """A bench's last line: what it found (the report's answer line), not only where to look."""
    from fleet import report

    try:
        return report.make(results, run_id, reports_dir, html_page=False).answer
    except UserError as exc:  # nothing measured: the types' errors above say why
        return f"answer: none ({exc})"


def _status(args: argparse.Namespace) -> int:
    from fleet import bench, control

    cfg = config_from(args)
    results = bench.results_db(cfg.results_dir)
    if args.run is None:
        rows = [control.status(results, run_id) for run_id in results.run_ids()]
        print_result(
            args,
            rows,
            lambda rs: "\n".join(control.status_line(r) for r in rs) or "no fleet runs yet",
        )
        return 0
    state = control.status(results, _run_id(results, args.run))
    print_result(args, state, control.status_text)
    return 0


def _kill(args: argparse.Namespace) -> int:
    from amibake.connect import connect
    from fleet import bench, control

    results = bench.results_db(config_from(args).results_dir)
    run_id = _run_id(results, args.run)
    cfg = _run_config(args, results, run_id)  # an unknown run is refused before anything else
    logs.to_terminal()
    outcome = control.kill(connect(cfg), results, run_id)
    print_result(
        args,
        outcome,
        lambda o: (
            f"run {o['run_id']} ({o['state']}): controller {o['controller']}; "
            f"cleaned up {len(o['deleted'])} resources"
            + (f"; could not delete: {'; '.join(o['failures'])}" if o["failures"] else "")
        ),
    )
    return 1 if outcome["failures"] else 0


def _report(args: argparse.Namespace) -> int:
    from fleet import bench, report
    from fleet.tune_report import PREFERENCES

    if args.prefer not in PREFERENCES:  # said for a bench run too, which has no use for it
        raise UserError(f"--prefer {args.prefer!r} is not one of {', '.join(PREFERENCES)}")
    _refuse_empty(args.current, "--current", "name the instance type you run today")
    cfg = config_from(args)
    results = bench.results_db(cfg.results_dir)
    run_id = _run_id(results, args.run)
    _say_if_running(results, run_id, "report")
    made = report.make(
        results,
        run_id,
        cfg.results_dir / "reports",
        html_page=not args.no_html,
        prefer=args.prefer,
        current=args.current.strip().lower() if args.current else None,
    )
    if args.json:
        print(json.dumps(made.to_json(), indent=2, default=str))
    else:
        print(made.text)
    return 0


def _say_if_running(results: Any, run_id: str, command: str) -> None:
    """A run still going has measured part of what it will: what reads it now says so."""
    from fleet import control

    if control.status(results, run_id)["state"] == "running":
        print(
            f"fleet {command}: run {run_id} is still running: this reads the replicates it has "
            "measured so far (fleet status shows how far it is)",
            file=sys.stderr,
        )


def _plan(args: argparse.Namespace) -> int:
    from fleet import bench, plan

    deadline_h = plan.hours(args.deadline) if args.deadline is not None else None
    plan.check(args.work, args.instances, deadline_h, args.budget)  # before any run is read
    cfg = config_from(args)
    results = bench.results_db(cfg.results_dir)
    run_id = _run_id(results, args.run)
    _say_if_running(results, run_id, "plan")
    rows = plan.plan(
        results,
        run_id,
        work=args.work,
        instances=args.instances,
        deadline_h=deadline_h,
        budget=args.budget,
    )
    print_result(args, rows, plan.plan_text)
    return 0


def _tune(args: argparse.Namespace) -> int:
    from fleet import control

    try:
        return _tune_command(args)
    finally:
        control.release_claims()  # a resume's, however the command ended


def _tune_command(args: argparse.Namespace) -> int:
    from amibake.connect import connect
    from fleet import bench, control, evaluators, gain, recommended, tune, tune_report
    from fleet import plan as planning
    from fleet.trial import CloudEvaluator

    for name, instead in COMPARE_ONLY.items():  # refused before anything is opened or made
        if args.file != "compare" and getattr(args, name) is not None:
            flag = "--" + name.replace("_", "-")
            raise UserError(
                f"{flag} is for `fleet tune compare`, which compares searches on a table; a "
                f"search of a tune file takes {instead}"
            )
    for name, instead in SEARCH_ONLY.items():
        if args.file == "compare" and getattr(args, name) not in (None, False):
            flag = "--" + name.replace("_", "-")
            raise UserError(f"{flag} is for a search of a tune file; `fleet tune compare` takes "
                            f"{instead}")  # fmt: skip
    if args.file == "compare" and args.replay and args.replay_runs:
        raise UserError("--replay and --replay-runs: compare replays one table; give one of them")
    cfg = config_from(args)
    results = bench.results_db(cfg.results_dir)
    if args.file == "compare":
        return _tune_compare(args)
    overrides = {
        "trials": args.trials,
        "algorithm": args.algorithm,
        "seed": args.seed,
        "parallel": args.parallel,
        "replay": str(Path(args.replay).resolve()) if args.replay else None,
        "startup_trials": args.startup_trials,
        "max_usd": args.max_cost,  # the search's money budget, max_usd (or max_cost) in the file
        "gain_replicates": args.gain_replicates,
    }
    if args.resume:
        args.resume = _run_id(results, args.resume)
        record = results.require(args.resume)
        if record["kind"] != "tune":
            raise UserError(f"{args.resume} is not a fleet tune run (fleet bench --resume?)")
        cfg = _run_config(args, results, args.resume)
        # The record replays only through the same search: what shapes it cannot change. The
        # budget and the trials in flight can (a larger --trials extends the search).
        fixed = [
            f"--{k.replace('_', '-')}"
            for k in ("algorithm", "seed", "replay", "startup_trials")
            if overrides[k] is not None
        ]
        if fixed or args.file:
            raise UserError(
                f"--resume continues run {args.resume} as it was set up: "
                f"{', '.join(fixed) or 'a tune file'} cannot change it (only --trials, --parallel "
                "and --max-cost can); start a new run instead"
            )
        if args.trials is not None:
            trials = results.trials(args.resume)
            asked = int((trials.state == "asked").sum()) if not trials.empty else 0
            if 1 <= args.trials < asked:  # (below 1: the budget's own check says so)
                # Taken, it ran nothing and the run then read "50/2 trials finished".
                raise UserError(
                    f"--trials {args.trials}: run {args.resume} has asked {asked} trials "
                    f"already; give at least {asked} (more extends the search)"
                )
        logs.to_terminal()
        if not args.dry_run:
            # Not while another controller searches; what a dead one's trials left goes first.
            control.take_over(
                None if record["spec"].get("replay") else connect(cfg), results, args.resume
            )
        changes = {
            k: overrides[k]
            for k in ("trials", "parallel", "max_usd", "gain_replicates")
            if overrides[k] is not None
        }
        spec = tune.resumed(results, args.resume, changes)
        run_id = args.resume
    else:
        if not args.file:
            raise UserError("fleet tune needs a tune file (or compare, or --resume RUN)")
        spec = tune.load(Path(args.file), overrides)
        run_id = ""
    logs.to_terminal()  # what reading the space says (a replay table's rows left out) is seen
    try:
        evaluate = evaluators.evaluator(spec, cfg)
    except UserError as exc:
        raise UserError(_of_tune_file(args.file, str(exc))) from None
    if isinstance(evaluate, CloudEvaluator):
        # The cloud (credentials, region, the local cloud's daemon) is checked now: left to the
        # trials, each failed in turn and the search ended "none feasible" with exit 0. So is
        # what its CPU can run, when every instance runs on one (the local cloud).
        bench.check_runnable(evaluate.cloud(), evaluate.types, () if spec.image else ("tuned",))
        trials = results.trials(run_id) if run_id else None
        asked = int((trials.state == "asked").sum()) if trials is not None and len(trials) else 0
        left = max(0, spec.trials - asked)
        estimate = planning.tune_estimate(spec, results, cfg.results_dir, cfg.region, left)
        # Until a trial has cost something, the money budget counts trials at the estimate's.
        spec.trial_usd_guess = estimate.usd / left if left else 0.0
        if _estimated(args, estimate, spec.max_usd):
            return 0
    elif args.dry_run:
        where = spec.replay or "the replay table"
        print_result(
            args,
            {"dry_run": True, "estimate": None, "created": []},
            lambda _: f"{spec.trials} trials looked up in {where}: nothing is launched or spent",
        )
        return 0
    if not run_id:
        run_id = tune.start(results, spec, cfg.cloud, cfg.region)
    print(f"fleet: tune run {run_id} (log: {results.log_path(run_id)})", file=sys.stderr)
    outcome = tune.search(spec, evaluate, results, run_id)
    measured, bake = None, None
    if isinstance(evaluate, CloudEvaluator) and outcome.recommended:
        if spec.gain_replicates and spec.recipe:  # an image's tune builds nothing to compare
            measured = _gain(results, run_id, spec, evaluate, outcome)
            # Read again: a gain an earlier controller measured is the same one, not a new cost.
            outcome.spent_usd = tune.run_spend(results, run_id)
        # The hand-over to `amibake bake --from-tune` (fleet report writes it anew too).
        if recommended.write(
            cfg.results_dir, run_id, spec, outcome.recommended["params"], gain.lines(measured)
        ):
            bake = f"amibake bake --from-tune {run_id}"
    print_result(
        args,
        {
            "run_id": run_id,
            "trials": outcome.trials,
            "best": outcome.best,
            "recommended": outcome.recommended,
            "gain": measured,
            "bake": bake,
            "spent_usd": outcome.spent_usd,
            "stopped": outcome.stopped,
        },
        lambda o: (
            f"run {o['run_id']}: {o['trials']} trials; "
            + (
                "recommended: "
                + tune.recommendation_text(spec.objective, o["recommended"])
                # Ready to paste: the flags and arguments, not a Python dict (issue 27).
                + "\n"
                + tune_report.ready_line(spec.raw, o["run_id"], o["recommended"]["params"])
                if o["recommended"]
                else "none feasible (the report says why each trial failed)"
            )
            + "".join("\n" + line for line in gain.lines(o["gain"]))
            + (f"\nbake it: {o['bake']}" if o["bake"] else "")
            + "".join(
                "\n" + line
                for line in _spent_lines(o, f"fleet tune --resume {o['run_id']}")
                if o["spent_usd"] or o["stopped"]  # a replay spends nothing: no line
            )
            + f"\nnext: fleet report {o['run_id']}"
        ),
    )
    return 0 if outcome.best else 1  # a search that found nothing has not done its job


def _gain(results: Any, run_id: str, spec: Any, evaluate: Any, outcome: Any) -> dict[str, Any]:
    """The recommendation's gain over the generic build and the best standard level, measured
    side by side after the search (fleet/gain.py), within what the money budget leaves."""
    from fleet import gain, tune

    costs = tune.trial_costs(results, run_id)
    runs = max(1, len(costs) * spec.replicates)
    room = None if spec.max_usd is None else spec.max_usd - outcome.spent_usd
    params = outcome.recommended["params"]
    print(
        f"fleet: measuring the gain: the recommendation, the generic build and the standard "
        f"levels, {spec.gain_replicates} runs each, taking turns on one "
        f"{evaluate.instance_type(params)}",
        file=sys.stderr,
    )
    return gain.of_run(
        results,
        run_id,
        evaluate,
        spec.space,
        params,
        spec.gain_replicates,
        room,
        sum(costs.values()) / runs,
    )


def _tune_compare(args: argparse.Namespace) -> int:
    from fleet import replay, tune, tune_report

    logs.to_terminal()  # what the table's columns were read as
    if args.replay_runs:
        return _tune_compare_runs(args)
    if not args.replay:
        raise UserError("fleet tune compare needs --replay TABLE.csv (or --replay-runs RUNS.csv)")
    table = Path(args.replay)
    _refuse_empty(args.objective_column, "--objective-column", "name the column to minimise")
    if args.space:
        changes = {"replay": str(table.resolve()), "replay_column": args.objective_column}
        spec = tune.load(Path(args.space), changes, searched=False)
    else:
        column = args.objective_column or "metric"
        spec = tune.from_dict(replay.space_from_table(table, column), str(table), searched=False)
    algorithms = _list(args.algorithms, "--algorithms") or ["auto", "tpe", "random", "grid"]
    _check_readable(table, spec, algorithms, from_table=not args.space)
    evaluator = replay.ReplayEvaluator(table, spec)
    searched = len(evaluator.configurations())  # what the table holds of the space
    _check_compare(args, algorithms, spec, searched)
    if args.startup_trials is not None:
        spec.startup_trials = args.startup_trials
    rows = replay.compare(spec, evaluator, algorithms, args.seeds, args.budget)
    near = {t: evaluator.near_optimum(t) for t in (0.02, 0.05)}
    text = replay.compare_text(rows, args.budget, searched, near, spec.space.size())
    # One page per table and budget: comparing again with the same ones replaces it.
    out = config_from(args).results_dir / "reports" / f"compare-{table.stem}-{args.budget}"
    files = tune_report.make_compare(rows, text, out)
    summary = {
        "algorithms": [
            {
                "algorithm": r.algorithm,
                "ratios": r.ratios,
                "to_2pct": r.to_2pct,
                "to_5pct": r.to_5pct,
            }
            for r in rows
        ],
        "files": {name: str(path) for name, path in files.items()},
    }
    print_result(args, summary, lambda _: f"{text}\nreport: {files['index.html']}")
    return 0


def _tune_compare_runs(args: argparse.Namespace) -> int:
    """`compare` on a table of runs: every evaluation draws one recorded run (noisy replay), and
    each search is scored by what it recommends."""
    from fleet import noisy_replay, replay, tune

    table = Path(args.replay_runs)
    _refuse_empty(args.objective_column, "--objective-column", "name the column to minimise")
    if args.space:  # its objective, column and constraints, as `compare --replay` reads them
        changes = {"replay": str(table.resolve()), "replay_column": args.objective_column}
        spec = tune.load(Path(args.space), changes, searched=False)
    else:
        column = args.objective_column or "metric"
        raw = replay.space_from_table(table, column, exclude=noisy_replay.RUN_COLUMNS)
        spec = tune.from_dict(raw, str(table), searched=False)
    algorithms = _list(args.algorithms, "--algorithms") or ["auto", "gp", "forest", "tpe", "random"]
    _check_readable(table, spec, algorithms, from_table=not args.space)
    _check_compare(args, algorithms, spec, replicates=True)
    startup = spec.startup if args.startup_trials is None else args.startup_trials
    rows = noisy_replay.compare_noisy(table, spec, algorithms, args.seeds, args.budget, startup)
    text = noisy_replay.compare_noisy_text(rows, args.budget, args.seeds)
    summary = {
        "algorithms": [
            {"algorithm": r.algorithm, "ratios": r.ratios, "covered": r.covered} for r in rows
        ]
    }
    print_result(args, summary, lambda _: text)
    return 0


def _check_readable(table: Path, spec: TuneSpec, algorithms: list[str], from_table: bool) -> None:
    """An instance type the model searches cannot read, refused only if one of them is to run
    (it was refused by the tune file's default algorithm, auto, under --algorithms random),
    naming the table's line of it where the space is the table's own."""
    from fleet import replay
    from fleet.search.features import UNREAD, unread_type
    from fleet.tune_spec import MODEL_ALGORITHMS

    models = [name for name in algorithms if name in MODEL_ALGORITHMS]
    unread = unread_type(spec.space) if models else None
    if unread is None:
        return
    name, value = unread
    where = spec.space.origin(name)
    if from_table:
        rows = replay.read_table(table)[name].astype(str).tolist()
        where = f"{table}:{rows.index(str(value)) + 2}"  # 1: the header
    raise UserError(
        f"{where}: {name} {value!r} {UNREAD} leave {', '.join(models)} out of --algorithms "
        "(tpe, random and grid read a type as a name)"
    )


def _check_compare(
    args: argparse.Namespace,
    algorithms: list[str],
    spec: TuneSpec,
    held: int | None = None,
    *,
    replicates: bool = False,
) -> None:
    """`compare`'s algorithms and counts, before any search: --budget 100000000 on a table of
    four configurations ran without end. `held`: the configurations a table holds of the space,
    where the search runs those alone. `replicates`: an evaluation draws one run, and may draw
    another of a configuration already tried, so the budget is not bounded by their count (it
    was, by the space's without --space and by nothing of the table's with it)."""
    from fleet import tune

    if args.seeds is None:
        args.seeds = DEFAULT_SEEDS
    for name in algorithms:
        if name not in tune.ALGORITHMS:
            guess = did_you_mean(name, tune.ALGORITHMS)
            raise UserError(
                f"--algorithms: {name!r} is not one of {', '.join(tune.ALGORITHMS)}{guess}"
            )
    size = held
    if size is None and not spec.space.continuous and not replicates:
        size = spec.space.size()
    if args.budget is None:
        # A tune file's trials are its budget (`fleet tune` on it runs that many); else ours.
        wanted = spec.trials if "trials" in spec.raw else DEFAULT_BUDGET
        args.budget = wanted if size is None else min(wanted, size)
    limits = {
        "--seeds": (args.seeds, (1, MAX_SEEDS, "each seed is a whole search of the table")),
        "--budget": (args.budget, tune.COUNTS["trials"]),
        "--startup-trials": (args.startup_trials, tune.COUNTS["startup_trials"]),
    }
    for flag, (value, (low, high, why)) in limits.items():
        problem = "" if value is None else checks.integer(value, low, high, why)
        if problem:
            raise UserError(f"{flag} {problem}")
    if size is not None and args.budget > size:
        raise UserError(
            f"--budget {args.budget} is more than the {size} configurations "
            f"{'of the space' if held is None else 'the table holds'}: a "
            f"search that has tried them all has nothing left to ask (use --budget {size} or less)"
        )


# What `fleet tune --help` shows of the tune file; the README has all of it.
TUNE_FILE = """a tune file (see examples/kernels.tune.toml and the README):
  recipe = "kernels"            # or replay = "table.csv": trials looked up, not run
  types = ["c7i.large"]         # or make instance_type a parameter
  objective = "metric"          # runtime | metric | cost
  algorithm = "auto"            # or gp, forest, blend, tpe, random, grid; seed
  trials = 40                   # budget; also max_usd, max_hours; parallel = 2
  [constraints]                 # max_seconds, max_usd_per_unit, max_rss_mb, min_rate
  [params.opt]                  # kind: categorical | int (low, high, step) | uniform | loguniform
  kind = "categorical"
  values = ["-O2", "-O3"]
  stage = "compile"             # compile: into the flags (flag = "-x={}"); run: {args} (arg = ...)
  when = { arch = "x86_64" }    # or { param = "opt", in = ["-O3"] }"""


def spending_options(parser: argparse.ArgumentParser) -> None:
    """For commands that launch instances: the estimate, the question, the cap."""
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="print what would run and its estimate (instance-hours, USD); create nothing",
    )
    parser.add_argument(
        "--yes",
        "-y",
        action="store_true",
        help="proceed without asking (needed above $1 when "
        "no terminal can be asked, unless --max-cost caps the run)",
    )
    parser.add_argument(
        "--max-cost",
        type=float,
        metavar="USD",
        help="start no new work once the spend so far plus what is in flight would pass it "
        "(also max_cost in the file)",
    )


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="fleet", description=__doc__.splitlines()[0])
    cliutil.add_version(parser)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    price = commands.add_parser("prices", help="the price table in use (on-demand, spot per AZ)")
    common_options(price)
    price.add_argument("--type", nargs="+", help="instance types, e.g. c7i.large")
    price.add_argument("--family", help="families, e.g. c7i,c7g")
    price.add_argument(
        "--refresh", action="store_true", help="read the Pricing API and spot price history"
    )

    bench = commands.add_parser("bench", help="run a workload across instance types")
    common_options(bench)
    network_options(bench)
    bench.add_argument("file", nargs="?", help="bench file (TOML); flags override it")
    bench.add_argument("--types", help="instance types, e.g. c5a.large,c6a.large")
    bench.add_argument("--families", help="whole families, with --sizes")
    bench.add_argument("--sizes", help="sizes to try of each family (default large)")
    bench.add_argument("--recipe", help="a build recipe with a [bench] definition")
    bench.add_argument("--command", dest="command_line", help="a plain command; {args} is replaced")
    bench.add_argument("--builds", help="tuned,generic (recipe builds to compare)")
    bench.add_argument("--replicates", type=int, help="measured runs per type and build (3)")
    bench.add_argument("--warmups", type=int, help="unmeasured runs first (1)")
    bench.add_argument("--args", help="runtime arguments for {args}")
    bench.add_argument("--metric-regex", help="a regex with one group around the number")
    bench.add_argument("--executor", help="ssh (default) or batch")
    bench.add_argument("--on-demand", action="store_true", help="on-demand instead of spot")
    bench.add_argument("--concurrency", type=int, help="instance types at once (default 2)")
    bench.add_argument(
        "--allow-missing-price", action="store_true", help="measure types without a price, unpriced"
    )
    bench.add_argument("--resume", metavar="RUN", help="finish an interrupted run")
    spending_options(bench)

    status = commands.add_parser("status", help="what a run has done (or every run)")
    common_options(status)
    status.add_argument("run", nargs="?", help="a run id, or last (default: list every run)")

    kill = commands.add_parser("kill", help="stop a run and clean up all it created")
    common_options(kill)
    kill.add_argument("run", help="a run id, or last")

    report_parser = commands.add_parser("report", help="tables, plots and CSV of a run")
    common_options(report_parser)
    report_parser.add_argument("run", help="a run id, or last")
    report_parser.add_argument("--no-html", action="store_true", help="terminal table only")
    report_parser.add_argument(
        "--prefer", default="balanced", help="tune runs: recommend for time, cost or balanced"
    )
    report_parser.add_argument(
        "--current", metavar="TYPE", help="bench runs: the type you run today, to say the saving"
    )

    plan = commands.add_parser("plan", help="project time and cost of N units of work")
    common_options(plan)
    plan.add_argument("run", help="a run id, or last")
    plan.add_argument("--work", type=float, required=True, help="units of work to do")
    plan.add_argument("--instances", type=int, default=1, help="instances working at once")
    plan.add_argument("--deadline", help="e.g. 4h, 90m")
    plan.add_argument("--budget", type=float, help="USD")

    tune = commands.add_parser(
        "tune",
        help="search build flags and runtime parameters",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=TUNE_FILE,
    )
    common_options(tune)
    network_options(tune)
    tune.add_argument("file", nargs="?", help="tune file (TOML), or `compare`")
    tune.add_argument("--replay", help="evaluate trials from a recorded table (CSV)")
    tune.add_argument(
        "--replay-runs",
        help="compare: draw each evaluation from a table of runs (a run column, several rows "
        "per configuration) and score what each search recommends",
    )
    tune.add_argument(
        "--resume", metavar="RUN", help="continue a search (with --trials N: a new budget)"
    )
    tune.add_argument("--trials", type=int, help="budget in trials")
    tune.add_argument(
        "--algorithm",
        help="auto (default: the blend for instance types, else gp), gp, forest, blend, tpe, "
        "random or grid",
    )
    tune.add_argument("--seed", type=int, help="the search's seed (0): same seed, same trials")
    tune.add_argument("--parallel", type=int, help="trials in flight")
    tune.add_argument(
        "--startup-trials",
        type=int,
        help="trials of the start design (TPE: random) before a model guides the search; "
        "default: the engine's own for the budget",
    )
    tune.add_argument(
        "--gain-replicates",
        type=int,
        help="runs of the recommendation, the generic build and the standard levels side by "
        "side after a cloud search (default 3; 0: measure no gain)",
    )
    tune.add_argument("--space", help="compare: a tune file for the space (default: the table's)")
    tune.add_argument("--objective-column", help="compare: the column to minimise (default metric)")
    tune.add_argument("--algorithms", help="compare: e.g. auto,tpe,random")
    tune.add_argument(
        "--seeds", type=int, help=f"compare: seeds per algorithm (default {DEFAULT_SEEDS})"
    )
    tune.add_argument(
        "--budget",
        type=int,
        help=f"compare: trials per seed (default: the --space file's trials, else "
        f"{DEFAULT_BUDGET}; the space's size if smaller, but for --replay-runs, whose "
        "replicates count)",
    )
    spending_options(tune)

    cliutil.add_completion(commands, "fleet")
    cliutil.document(parser, EXAMPLES, cliutil.exit_codes_text())
    cliutil.mark_completions(parser, "fleet")
    return parser


# What each subcommand's --help shows as its example(s): real commands, which the tests parse.
EXAMPLES = {
    "prices": ["fleet prices --family c7i,c7g", "fleet prices --type c7i.large --json"],
    "bench": [
        "fleet bench --types c7i.large,c7g.large --recipe kernels",
        "fleet bench examples/kernels.bench.toml --replicates 5",
        "fleet bench examples/kernels.bench.toml --dry-run",
        "fleet bench examples/kernels.bench.toml --max-cost 2 --yes",
        "fleet bench --resume last",
    ],
    "status": ["fleet status", "fleet status last --json"],
    "kill": ["fleet kill last"],
    "report": ["fleet report last", "fleet report last --no-html --json"],
    "plan": ["fleet plan last --work 1000000 --deadline 4h --budget 50"],
    "tune": [
        "fleet tune examples/kernels.tune.toml --trials 40",
        "fleet tune --resume last --trials 60",
        "fleet tune examples/kernels.tune.toml --gain-replicates 5",
        "fleet tune compare --replay table.csv --seeds 10",
    ],
    "completion": [
        "fleet completion bash > ~/.local/share/bash-completion/completions/fleet",
        "fleet completion zsh > ~/.zfunc/_fleet",
    ],
}


def _completion(args: argparse.Namespace) -> int:
    cfg = config_module.load()  # the recipes completed are those of the configured folder
    print(cliutil.completion_script(build_parser(), "fleet", args.shell, cfg.recipes_dir))
    return 0


HANDLERS = {
    "completion": _completion,
    "prices": _prices,
    "bench": _bench,
    "status": _status,
    "kill": _kill,
    "report": _report,
    "plan": _plan,
    "tune": _tune,
}


def main(argv: Sequence[str] | None = None) -> int:
    def handle() -> int:
        args = build_parser().parse_args(argv)
        if args.command not in HANDLERS:
            raise UserError(f"`fleet {args.command}` is not built yet (see the open issues)")
        return HANDLERS[args.command](args)

    return guarded("fleet", handle)


def main_entry() -> None:
    sys.exit(main())
