"""`fleet bench`: plan the replicates of a run, make sure its builds exist, run every instance
type through the executor, and keep the record in the results database as it goes.

A run is resumable by construction: the work left is the plan minus the replicates the database
holds as finished, so `--resume` after any stop (Ctrl-C, SIGKILL, `fleet kill`) redoes nothing.
"""

from __future__ import annotations

import logging
import statistics
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from amibake import catalog, cpu, flags, instance_kinds, logs, progress
from amibake.cloud import Cloud
from amibake.errors import UserError
from amibake.journal import Journal
from amibake.pipelines import BuildRequest, Outcome, open_run, run_each
from amibake.pipelines import build as build_pipeline
from amibake.runner import Boundary, RunContext
from amibake.steps.preflight import preflight_instance
from amibake.steps.state import Variant
from fleet import container, control, prices
from fleet import plan as planning
from fleet.batch import JobsState, batch_steps, registered
from fleet.executor import IDLE, BenchState, BuildArtifact, Replicate, build_verdict, ssh_steps
from fleet.results import LOCAL_NOTE, Results, new_run_id
from fleet.spec import BenchSpec

log = logging.getLogger("amibake")
# A replicate's line comes when it ends; while one runs longer than this with nothing said, a
# line says what runs, for how long, and what was spent (a silent minute reads as a hang).
HEARTBEAT_S = 30.0

VARIANTS = {"tuned": Variant(), "generic": Variant(name="generic", generic=True)}


def results_db(results_dir: Path) -> Results:
    return Results(results_dir / "fleet.sqlite")


def plan(spec: BenchSpec) -> list[Replicate]:
    """Every replicate of the run, in order: per type, the warm-ups, then the measured runs with
    the builds interleaved (a slow drift of the machine then hits every build alike)."""
    work = []
    for instance_type in spec.types:
        for index in range(spec.warmups):
            work += [Replicate(instance_type, b, index, True) for b in spec.builds]
        for index in range(spec.replicates):
            work += [Replicate(instance_type, b, index, False) for b in spec.builds]
    return work


PriceOf = Callable[[str, bool, str], float | None]


def price_lookup(
    types: Sequence[str],
    allow_missing: bool,
    results_dir: Path,
    region: str,
    instead: str = "pass --allow-missing-price to measure without cost per unit",
    spot: bool = False,
) -> PriceOf:
    """Check every type has a price in the region's table (or that the user accepted none);
    return the lookup. `instead` is the other way out of a missing price."""
    try:
        table = prices.in_use(results_dir, region)
    except prices.PriceError as exc:
        if not allow_missing:
            raise UserError(f"{exc}, or {instead}") from None
        table = {"date": "", "prices": {}}
    missing, unspotted = [], []
    for instance_type in types:
        try:
            if spot and not prices.lookup(instance_type, table).spot:
                unspotted.append(instance_type)
        except prices.PriceError:
            missing.append(instance_type)
    if missing and not allow_missing:
        raise UserError(
            f"no price for {', '.join(missing)} in the {region} price table of {table['date']}; "
            f"refresh it with `fleet prices --refresh --region {region}`, or {instead}"
        )
    # A spot run of a type the table has no spot price for (a refresh that found no spot
    # history for it) was accepted, then left out of the ranking without a word.
    if unspotted and not allow_missing:
        raise UserError(
            f"no spot price for {', '.join(unspotted)} in the {region} price table of "
            f"{table['date']}; refresh it with `fleet prices --refresh --region {region}`, run "
            f"on-demand (--on-demand), or {instead}"
        )

    def price_of(instance_type: str, spot: bool, zone: str) -> float | None:
        try:
            price = prices.lookup(instance_type, table)
        except prices.PriceError:
            return None
        try:
            if spot and zone not in price.spot:
                return price.spot_median  # a zone the table lacks: the median of the others
            return price.hourly(spot, zone)
        except prices.PriceError:  # spot, and no spot price for the type in this region
            return None

    return price_of


@dataclass
class Board:
    """What the run is doing, for the progress lines: per type its status, replicates done,
    and money spent so far (instance time at the price of its market). One line per event: a
    replicate done (with the count, elapsed time and what is left), a type staging, ending or
    changing its jobs' states; a replicate starting only redraws the bar of a terminal."""

    run_id: str
    total: int
    done: int = 0
    status: dict[str, str] = field(default_factory=dict)
    spent: float = 0.0  # from instances already torn down
    live: dict[str, tuple[float, float]] = field(default_factory=dict)  # type -> (start, price)
    unpriced: set[str] = field(default_factory=set)  # types running without a price
    lock: threading.Lock = field(default_factory=threading.Lock)
    cap: float | None = None  # USD: no new work once spent + in flight would pass it
    # type -> USD held for its launch, staging and first replicate from the moment the gate lets
    # it start until its instance is up (or it ends): types the gate lets start at once each
    # count the others' launches, not only their own.
    reserved: dict[str, float] = field(default_factory=dict)
    expected: dict[str, float] = field(default_factory=dict)  # type -> a replicate's seconds
    capped: str = ""  # why work stopped at the cap, once it has
    counter: progress.Counter = field(init=False)
    running: dict[str, tuple[str, float]] = field(default_factory=dict)  # type -> (doing, since)
    said: float = field(default_factory=time.monotonic)  # when this board last logged a line

    def __post_init__(self) -> None:
        self.counter = progress.Counter(self.run_id, self.total, self.done)

    def spent_now(self) -> float:
        now = time.time()
        return self.spent + sum((now - t) * p / 3600 for t, p in self.live.values())

    def may_start(self, state: BenchState) -> str:
        """Why no more work may start for `state` ("" if it may): the money spent so far (every
        instance's time at its price), plus one more replicate on each instance up, plus, for
        an instance not launched yet, its launch and staging too (and those of the types let
        start before it whose instances are not up yet), would pass the cap. A replicate's
        seconds are the type's measured median once it has some, else the estimate's."""
        if self.cap is None:
            return ""
        with self.lock:
            if state.measured:
                self.expected[state.label] = statistics.median(state.measured)

            def next_one(label: str) -> float:
                return self.expected.get(label, self.expected.get("", planning.GUESS_REPLICATE_S))

            flight = sum(next_one(t) * price / 3600 for t, (_, price) in self.live.items())
            flight += sum(
                usd for t, usd in self.reserved.items() if t != state.label and t not in self.live
            )
            launch = 0.0
            if state.label not in self.live:
                price = state.price_of(state.label, state.spot, "") or 0.0
                launch = (planning.SETUP_S + next_one(state.label)) * price / 3600
                flight += launch
            spent = self.spent_now()
            if spent + flight <= self.cap:
                if launch:
                    self.reserved[state.label] = launch
                return ""
            self.capped = (
                f"max cost ${self.cap:g}: ${spent:.4f} spent and ${flight:.4f} more in flight "
                "would pass it"
            )
            return self.capped

    def update(self, state: BenchState, what: str) -> None:
        with self.lock:
            at = time.monotonic()
            if what == "staging" or what in ENDS:
                self.reserved.pop(state.label, None)  # up, or over: its time counts instead
            if what == "staging" and state.label in self.live:
                # A rerun on a new instance (the first was reclaimed): the first one's time,
                # until the new one's launch, was paid for too.
                start, price = self.live.pop(state.label)
                end = min(time.time(), max(start, state.launched_at))
                self.spent += (end - start) * price / 3600
            if what == "staging" and state.price is not None:
                self.live[state.label] = (state.launched_at, state.price)
            elif what == "staging":
                self.unpriced.add(state.label)
            if what in ENDS and state.label in self.live:
                start, price = self.live.pop(state.label)
                self.spent += (time.time() - start) * price / 3600
            # Without a price, "$0.0000 spent" would claim those instances were free.
            unpriced = (
                f" (without {', '.join(sorted(self.unpriced))}: no price)" if self.unpriced else ""
            )
            money = f"${self.spent_now():.4f} spent{unpriced}"
            # What the type is busy with, for the heartbeat: a replicate over SSH; Batch jobs
            # submitted, waiting or running (minutes each, with no line until one changes).
            batch = ("jobs ", "submitted ")
            if what == IDLE:  # its replicates are over (ended, or failed midway): nothing runs
                self.running.pop(state.label, None)
                return
            if what.startswith("running "):
                self.running[state.label] = (f"{what.removeprefix('running ')} running", at)
            elif what.startswith(batch) and not _all_ended(what):
                self.running[state.label] = (what, at)
            elif what != "replicate done" or not self.running.get(state.label, ("",))[0].startswith(
                batch
            ):
                self.running.pop(state.label, None)  # (a Batch type's other jobs run on)
            if what == "replicate done":
                self.done += 1
                self.said = at
                now = self.status.get(state.label, "")
                which = now.removeprefix("running ") + " " if now.startswith("running ") else ""
                self.status[state.label] = "running"
                self.counter.advance(f"{state.label} {which}done; {money}")
                return
            self.status[state.label] = what
            self.counter.show(", ".join(f"{t} {s}" for t, s in self.status.items()))
            if what.startswith("running "):
                return  # the replicate's line is when it ends
            log.info("[%s] %s %s; %s", self.run_id, state.label, what, money)
            self.said = at
            if all(s in ENDS for s in self.status.values()):
                self.counter.close()

    def beat(self, quiet_s: float) -> str:
        """A line on the replicates running now, once the board has said nothing for `quiet_s`
        (a replicate's line comes when it ends, and one may run for minutes): "" when it has
        spoken lately or nothing runs."""
        with self.lock:
            now = time.monotonic()
            if not self.running or now - self.said < quiet_s:
                return ""
            self.said = now
            what = ", ".join(
                f"{label} {doing} for {progress.duration(now - since)}"
                for label, (doing, since) in sorted(self.running.items())
            )
            line = f"{what}; {self.counter.text()}; ${self.spent_now():.4f} spent"
        log.info("[%s] %s", self.run_id, line)
        return line

    @contextmanager
    def ticking(self, quiet_s: float | None = None) -> Iterator[None]:
        """While the block runs, a thread says what runs whenever the board was quiet for
        `quiet_s` (HEARTBEAT_S): the workers block in their SSH command or job wait meanwhile."""
        quiet_s = HEARTBEAT_S if quiet_s is None else quiet_s
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(min(quiet_s, 5.0)):
                self.beat(quiet_s)

        thread = threading.Thread(target=loop, name=f"board {self.run_id}", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()

    def close(self) -> None:
        """The run's bar off the terminal (its lines stay)."""
        self.counter.close()


ENDS = ("done", "failed", "stopped")  # a type's last events


def _all_ended(jobs_line: str) -> bool:
    """Whether a "jobs 2 succeeded, 1 failed (...)" line has every job ended."""
    counts = jobs_line.removeprefix("jobs ").split(" (")[0].split(", ")
    return all(part.split(" ", 1)[-1] in ("succeeded", "failed") for part in counts)


def create(cloud: Cloud, spec: BenchSpec, results: Results) -> str:
    """Record a new run (nothing launched yet) and return its id."""
    run_id = new_run_id("fb")
    note = LOCAL_NOTE if cloud.config.cloud == "local" else ""
    results.create_run(
        run_id, "bench", spec.to_json(), cloud.config.cloud, cloud.config.region, note
    )
    return run_id


def check_runnable(
    cloud: Cloud,
    types: Sequence[str],
    builds: Sequence[str],
    artifacts: dict[tuple[str, str], BuildArtifact] | None = None,
) -> None:
    """Where every instance runs on one known CPU (the local cloud: this machine's), refuse a
    type whose build that CPU cannot run, natively or under QEMU, before anything is launched
    for it: from the builds' own instructions when `artifacts` holds them, else predicted from
    each family's target. A build QEMU runs is allowed, and said to be emulated."""
    machine = cloud.instance_cpu
    if machine is None or not builds:  # a plain command: nothing built, any type runs it
        return
    for instance_type in types:
        family = catalog.family(instance_type.split(".")[0])
        for build in builds:
            artifact = (artifacts or {}).get((family.name, build))
            examples: dict[str, str] = {}
            if artifact is not None:
                verdict = build_verdict(artifact, family, machine)
                basis = "its instructions"
                examples = dict(artifact.manifest.get("isa_examples", {}))
            elif build == "tuned":
                verdict = cpu.verdict(family.architecture, cpu.predicted_needs(family), machine)
                basis = f"predicted from its target, {flags.family_target(family).name}"
            else:  # the architecture's baseline: runs wherever the architecture does
                verdict = cpu.verdict(family.architecture, frozenset(), machine)
                basis = "the architecture's baseline"
            if not verdict.runs:
                runnable = [c.family.name for c in cpu.families_for(machine) if c.verdict.runs]
                raise UserError(
                    f"{instance_type} cannot run here: every instance of the local cloud runs "
                    f"on this machine's CPU ({machine.model or machine.architecture}, "
                    f"{machine.microarchitecture}), which, for the {build} {family.name} build "
                    f"({basis}), {verdict.naming(examples)}; families whose builds run here: "
                    f"{', '.join(runnable[:8]) or 'none'} (amibake families --host)"
                )
            if verdict.how == "emulated" and artifacts is None:
                log.warning(
                    "%s: the %s build will run under QEMU (this machine %s): measured, never "
                    "ranked against native runs",
                    instance_type,
                    build,
                    verdict.reason,
                )


def build_spend(results_dir: Path, runs: Sequence[str], hourly: Callable[[str], float]) -> float:
    """USD the build runs' instances cost: each one's lifetime in the journal at `hourly` of its
    id (its build's type and market). Estimates count the builds; the spend did not, and a cap
    or a search's budget left them out."""
    if not runs:
        return 0.0
    journal = Journal(results_dir / "journal.sqlite")
    try:
        lived = {i: s for run in runs for i, s in journal.instance_lifetimes(run).items()}
    finally:
        journal.close()
    return sum(seconds * hourly(instance) / 3600 for instance, seconds in lived.items())


def ensure_builds(
    cloud: Cloud, spec: BenchSpec, on_open: Callable[[RunContext], None] | None = None
) -> dict[tuple[str, str], BuildArtifact]:
    """The artifact of every (family, build): from amibake's cache, or built now (each build's
    run told to `on_open` as it opens)."""
    if not spec.recipe:
        return {}
    families = sorted({t.split(".")[0] for t in spec.types})
    found: dict[tuple[str, str], BuildArtifact] = {}
    for build in spec.builds:
        request = BuildRequest(
            families=families,
            recipe=spec.recipe,
            size="large",
            recipes_dir=cloud.config.recipes_dir,
            variant=VARIANTS[build],
        )
        for outcome in build_pipeline(cloud, request, on_open=on_open):
            if not outcome.ok:
                raise UserError(f"the {build} build for {outcome.family} failed: {outcome.error}")
            state: Any = outcome.state
            found[(outcome.family, build)] = BuildArtifact(build, state.artifact, state.manifest)
    return found


def execute(
    cloud: Cloud,
    run_id: str,
    results: Results,
    *,
    on_boundary: Boundary | None = None,
    before_replicate: Any = None,
    max_cost: float | None = None,
) -> dict[str, Any]:
    """Run (or finish) a recorded run; returns what happened per type. `max_cost` caps this
    controller's spend (default: the run's own max_cost)."""
    with logs.run_log(results.log_path(run_id)):
        return _execute(
            cloud,
            run_id,
            results,
            on_boundary=on_boundary,
            before_replicate=before_replicate,
            max_cost=max_cost,
        )


def _execute(
    cloud: Cloud,
    run_id: str,
    results: Results,
    *,
    on_boundary: Boundary | None,
    before_replicate: Any,
    max_cost: float | None,
) -> dict[str, Any]:
    record = results.require(run_id)
    spec = BenchSpec.from_json(record["spec"])
    control.take_over(cloud, results, run_id)
    try:
        return _execute_taken(
            cloud,
            run_id,
            results,
            pinned_image(cloud, results, run_id, spec),
            on_boundary=on_boundary,
            before_replicate=before_replicate,
            max_cost=max_cost,
        )
    finally:
        control.release_claims()  # however it ended: a price missing, a build failed, Ctrl-C


def pinned_image(cloud: Cloud, results: Results, run_id: str, spec: BenchSpec) -> BenchSpec:
    """The spec with its image named by the digest its tag named when the run first executed
    (recorded then): a resume pulls that digest whatever the tag names now. A resume read the
    tag again, and a run pooled the replicates of two images into one median."""
    if not spec.image:
        return spec
    ref = container.ImageRef.parse(spec.image)
    pinned = next((d["digest"] for _, kind, d in results.events(run_id) if kind == "image"), "")
    if not pinned:
        pinned = container.lookup(cloud, ref).digest
        results.event(run_id, "image", digest=pinned, reference=spec.image)
    return replace(spec, image=str(replace(ref, tag="", digest=pinned)))


def _execute_taken(
    cloud: Cloud,
    run_id: str,
    results: Results,
    spec: BenchSpec,
    *,
    on_boundary: Boundary | None,
    before_replicate: Any,
    max_cost: float | None,
) -> dict[str, Any]:
    # A type without a price stops the run here.
    price_of = price_lookup(
        spec.types,
        spec.allow_missing_price,
        cloud.config.results_dir,
        cloud.config.region,
        spot=spec.spot,
    )
    # Which table priced it, for its report to say (a refresh between resumes changes it).
    results.event(
        run_id, "prices", **prices.provenance(cloud.config.results_dir, cloud.config.region)
    )
    finished = results.finished(run_id)
    todo = [r for r in plan(spec) if (r.instance_type, r.build, r.index, r.warmup) not in finished]
    if not todo:
        log.info("[%s] every replicate is already finished", run_id)
        results.event(run_id, "finished", resumed=True)
        return {"run_id": run_id, "types": {}}
    builds = spec.builds if spec.recipe else ()
    check_runnable(cloud, spec.types, builds)
    build_runs: list[str] = []
    artifacts = ensure_builds(cloud, spec, control.recording_builds(results, run_id, build_runs))
    check_runnable(cloud, spec.types, builds, artifacts)
    # The builds' instances were paid for too: the cap counts them, each at the dearest of the
    # families' large types, spot, as ensure_builds asks (the journal does not say which
    # instance built which family).
    build_prices = [price_of(f"{t.split('.')[0]}.large", True, "") or 0.0 for t in spec.types]
    built = build_spend(
        cloud.config.results_dir, build_runs, lambda _: max(build_prices, default=0.0)
    )
    board = Board(
        run_id,
        total=spec.planned,
        done=spec.planned - len(todo),
        cap=spec.max_cost if max_cost is None else max_cost,
        expected=planning.replicate_seconds(spec, results)[0],
        spent=built,
    )
    summary: dict[str, Any] = {"run_id": run_id, "types": {}}
    try:
        outcomes = measure(
            cloud,
            run_id,
            results,
            spec,
            todo,
            artifacts,
            board,
            on_boundary=on_boundary,
            before_replicate=before_replicate,
        )
        for outcome in outcomes:
            ended = outcome.state
            assert isinstance(ended, BenchState)
            ending = "failed" if not outcome.ok else "stopped" if ended.stopped else "done"
            board.update(ended, ending)
            summary["types"][ended.label] = {
                "ok": outcome.ok,
                "error": outcome.error,
                "replicates_left": len(ended.pending),
                "instances": ended.attempt + 1 if ended.instance_id or not ended.stopped else 0,
                "stopped": ended.stopped,
            }
    finally:
        board.close()
    _fail_unmeasured(results, run_id, summary["types"])
    summary["spent_usd"] = board.spent_now()
    failed = {t: s["error"] for t, s in summary["types"].items() if not s["ok"]}
    if board.capped:
        # Stopped for the cap, everything it launched torn down: resumable with a new cap.
        summary["stopped"] = board.capped
        log.warning(
            "[%s] stopped at the cap (%s); $%.4f spent", run_id, board.capped, summary["spent_usd"]
        )
        results.event(
            run_id,
            "stopped",
            reason=f"{board.capped}",
            cap=board.cap,
            spent=summary["spent_usd"],
            errors=failed,
        )
    else:
        results.event(
            run_id,
            "finished" if not failed else "failed",
            errors=failed,
            spent=summary["spent_usd"],
        )
    return summary


def _fail_unmeasured(results: Results, run_id: str, types: dict[str, dict[str, Any]]) -> None:
    """A type whose instance ran but whose every replicate failed (the command exited non-zero,
    the metric's pattern never matched) measured nothing: it failed. It was reported "done", and
    a run where nothing was measured exited 0."""
    rows = results.replicates(run_id)
    if rows.empty:
        return
    measured = rows[~rows.warmup.astype(bool)]
    for label, outcome in types.items():
        mine = measured[measured.instance_type == label]
        if not outcome["ok"] or outcome["stopped"] or mine.empty or (mine.state == "ok").any():
            continue
        failed = mine[mine.state == "failed"]
        why = next((e for e in failed.error if e), "") if len(failed) else ""
        outcome["ok"] = False
        outcome["error"] = f"every replicate failed ({len(mine)})" + (f": {why}" if why else "")


def measure(
    cloud: Cloud,
    run_id: str,
    results: Results,
    spec: BenchSpec,
    todo: list[Replicate],
    artifacts: dict[tuple[str, str], BuildArtifact],
    board: Board,
    *,
    on_boundary: Boundary | None = None,
    before_replicate: Any = None,
    trial: int | None = None,
) -> list[Outcome]:
    """The replicates in `todo` on one instance per type, recorded as they end (under `trial`
    when a tune search runs them)."""
    price_of = price_lookup(
        spec.types,
        spec.allow_missing_price,
        cloud.config.results_dir,
        cloud.config.region,
        spot=spec.spot,
    )
    if spec.image:  # refused here, for every type at once, before any instance is launched
        container.preflight(cloud, spec.image, spec.types, spec.gpus)
    states = []
    for instance_type in spec.types:
        family_name, _, size = instance_type.partition(".")
        mine = [r for r in todo if r.instance_type == instance_type]
        if not mine:
            continue
        kind = JobsState if spec.executor == "batch" else BenchState
        state = kind(
            family=instance_kinds.kind_of(cloud, instance_type),
            size=size,
            exact_size=True,
            spot=spec.spot,
            spec=spec,
            artifacts={
                build: artifacts[(family_name, build)] for build in spec.builds if artifacts
            },
            pending=mine,
            record=lambda row: results.record(run_id, replace(row, trial=trial)),
            record_environment=lambda s: results.environment(
                run_id, s.label, s.instance_id, s.facts
            ),
            results_dir=cloud.config.results_dir,
            fleet_run=run_id,
            price_of=price_of,
            on_event=board.update,
            before_replicate=before_replicate or (lambda state, rep: None),
            may_start=board.may_start,
        )
        preflight_instance(cloud, state)
        if isinstance(state, JobsState):
            registered(cloud, state)
        states.append(state)
    with open_run(cloud, f"fleet bench {run_id}") as context:
        results.event(
            run_id,
            "controller",
            **control.this_process(),
            amibake_run=context.run_id,
        )
        try:
            steps: Any = batch_steps if spec.executor == "batch" else ssh_steps
            with board.ticking():
                outcomes = run_each(context, states, steps, on_boundary, spec.concurrency)
        except BaseException as exc:
            # A tune trial's failure ends the trial, not the search: the search says when it
            # stops (a "stopped" here would show a running search as stopped).
            if trial is None:  # what it spent until then, for `fleet status` (not $0)
                results.event(
                    run_id,
                    "stopped",
                    reason=str(exc) or type(exc).__name__,
                    spent=board.spent_now(),
                )
            raise
    return outcomes
