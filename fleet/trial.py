"""One `fleet tune` trial on a cloud: build the configuration's compile-time flags (through
amibake's artifact cache, so a configuration seen before is not rebuilt), run its replicates
with the run-time arguments on the chosen executor (ssh or batch), and score it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from amibake import recipes
from amibake.cloud import Cloud
from amibake.config import Config
from amibake.connect import connect
from amibake.errors import AmibakeError, UserError
from amibake.pipelines import BuildRequest
from amibake.pipelines import build as build_pipeline
from amibake.runner import RunContext
from amibake.steps.state import Variant
from fleet import bench, container, control, stats
from fleet.executor import BenchState, BuildArtifact, Replicate
from fleet.search.evaluation import Evaluation
from fleet.space import TYPE
from fleet.spec import PLAIN, BenchSpec, metric_from, recipe_metric
from fleet.tune_spec import TuneSpec, broken_constraint

BUILD_SIZE = "large"  # a trial's build instance: the family's large (what it compiles on)


class Measured(AmibakeError):
    """A measurement that did not finish: why, and what it cost until then."""

    def __init__(self, reason: str, usd: float) -> None:
        super().__init__(reason)
        self.reason, self.usd = reason, usd


class CloudEvaluator:
    def __init__(self, spec: TuneSpec, config: Config) -> None:
        self.spec = spec
        self.config = config
        self._cloud: Cloud | None = None
        self._lock = threading.Lock()
        if spec.image:
            self._image_workload()
        else:
            self._recipe_workload()
        # Money needs a price for every type in the run's region: refused now, before a trial
        # is paid for. Otherwise a type without one is measured, unpriced.
        self.priced = (
            spec.objective == "cost"
            or spec.max_usd is not None
            or "max_usd_per_unit" in spec.constraints
        )
        types = list(spec.space.params[TYPE].values) if TYPE in spec.space.params else spec.types
        self.types = [str(t) for t in types]
        self.price_of = bench.price_lookup(
            types,
            not self.priced,
            config.results_dir,
            config.region,
            instead="leave money out of the search (objective, max_usd, max_usd_per_unit)",
        )
        if spec.image:
            # Every type the search may pick, against the image's architectures and the GPUs
            # asked: refused before the run is recorded, not trial after trial.
            container.preflight(self.cloud(), spec.image, self.types, spec.gpus)
        self.run_id = ""  # set by the search before the first trial
        self.results: Any = None

    def _image_workload(self) -> None:
        """An image's tune: its command and metric from the tune file; nothing is built."""
        self.recipe: recipes.Recipe | None = None
        self.workload = self.spec.command
        self.metric = metric_from(self.spec.metric, {})
        if "min_rate" in self.spec.constraints and not self.metric.higher_is_better:
            raise UserError(
                "constraints.min_rate: the metric is a time, not a rate; bound it with max_seconds"
            )

    def _recipe_workload(self) -> None:
        spec, config = self.spec, self.config
        recipe = recipes.load(spec.recipe, config.recipes_dir)
        bench_definition = recipe.bench
        if "command" not in bench_definition:
            raise UserError(f"{recipe.file} has no [bench] command to run trials with")
        self.workload = str(bench_definition["command"])
        self.metric = recipe_metric(recipe)
        self.recipe = recipe
        # A floor on a rate the workload does not report would never be checked.
        if "min_rate" in spec.constraints and not self.metric.higher_is_better:
            raise UserError(
                f"constraints.min_rate: {recipe.name}'s metric is a time, not a rate; bound it "
                "with max_seconds"
            )
        self._check_run_parameters()

    def _check_run_parameters(self) -> None:
        """Every run parameter must reach the workload: into the bench command's {NAME}, or
        as --NAME VALUE through {args}, which the recipe's [bench.parameters] must then declare
        (a misspelt one failed every trial with the workload's "unknown argument") unless the
        tune file says how to pass it (arg = ...)."""
        recipe = self.recipe
        assert recipe is not None
        placeholders = recipe.placeholders
        for param in self.spec.space.params.values():
            if param.stage != "run" or param.name in placeholders:
                continue
            if "{args}" not in self.workload:
                raise UserError(
                    f"params.{param.name}: {recipe.name}'s bench command ({self.workload}) has "
                    f"no {{args}} to pass it; its parameters: {', '.join(placeholders) or 'none'}"
                )
            declared = recipe.bench_defaults
            if declared and not param.template and param.name not in declared:
                raise UserError(
                    f"params.{param.name}: {recipe.name}'s workload takes no {param.name!r} "
                    f"(its [bench.parameters]: {', '.join(declared)}, in {recipe.file}); "
                    f'give arg = "--{param.name} {{}}" to pass it anyway'
                )

    def cloud(self) -> Cloud:
        with self._lock:
            if self._cloud is None:
                self._cloud = connect(self.config)
            return self._cloud

    def __call__(self, trial: int, params: dict[str, Any]) -> Evaluation:
        cflags = self.spec.space.cflags(params)
        variant = Variant.of_flags(cflags)
        instance_type = self.instance_type(params)
        artifacts: dict[str, BuildArtifact] = {}
        manifest: dict[str, Any] = {"image": self.spec.image} if self.spec.image else {}
        built = 0.0  # USD: the build instance's time, counted against the budget as the trial's
        if not self.spec.image:  # an image's trials build nothing: run-time parameters only
            try:
                artifacts["tuned"], built = self._build(instance_type, "tuned", variant)
            except Measured as failed:
                return Evaluation("failed", reason=f"build failed: {failed}", usd=failed.usd)
            manifest = dict(artifacts["tuned"].manifest)
        build = "tuned" if artifacts else PLAIN  # an image's trials are "plain", as in bench
        todo = [Replicate(instance_type, build, i, False) for i in range(self.spec.replicates)]
        began = time.time()
        try:
            usd = built + self._measure(f"trial {trial}", trial, params, todo, artifacts)
        except Measured as failed:
            usd = built + failed.usd
            return Evaluation("failed", reason=failed.reason, manifest=manifest, usd=usd)
        rows = self.results.replicates(self.run_id)
        # This attempt's runs only: a trial in flight when its controller was killed is run
        # again on resume, and its dead attempt's rows would be scored with the new ones (or
        # alone, when every new replicate failed).
        rows = rows[(rows.trial == trial) & (rows.started >= began)]
        mine = rows[rows.state == "ok"]
        failed_rows = rows[rows.state == "failed"]
        if mine.empty or not failed_rows.empty:
            # A configuration whose runs fail in part (a timeout, out of memory) is not scored on
            # the runs that survived: the fast one of three would lead the search to it, as a
            # bench's pick is never a type whose replicates failed.
            why = str(failed_rows.error.iloc[0]) if not failed_rows.empty else ""
            part = f"{len(failed_rows)} of {len(failed_rows) + len(mine)} replicates failed"
            reason = f"{part}: {why}" if not mine.empty else why or "no replicate finished"
            return Evaluation("failed", reason=reason, manifest=manifest, usd=usd)
        return self._score(mine, manifest, usd)

    def instance_type(self, params: dict[str, Any]) -> str:
        return self.spec.instance_type(params)

    def side_by_side(
        self, label: str, trial: int, params: dict[str, Any], variants: dict[str, Variant], n: int
    ) -> tuple[dict[str, np.ndarray], float]:
        """Each build of `variants` (by build name) run `n` times on one instance of the
        configuration's type with its run-time arguments, the builds taking turns so that a
        drift of the machine's speed falls on all of them alike: each build's metric values,
        and what the instance cost. Raises Measured when a build or the instance failed."""
        instance_type = self.instance_type(params)
        artifacts: dict[str, BuildArtifact] = {}
        built = 0.0
        for build, variant in variants.items():
            try:
                artifacts[build], usd = self._build(instance_type, build, variant)
            except Measured as stopped:
                raise Measured(
                    f"the {build} build failed: {stopped}", built + stopped.usd
                ) from None
            built += usd
        todo = [Replicate(instance_type, b, i, False) for i in range(n) for b in variants]
        began = time.time()
        try:
            usd = built + self._measure(label, trial, params, todo, artifacts)
        except Measured as stopped:
            raise Measured(stopped.reason, built + stopped.usd) from None
        rows = self.results.replicates(self.run_id)
        # This attempt's runs only: an earlier one (a failed gain, or an earlier recommendation
        # before a resume) recorded under the same trial number.
        rows = rows[rows.started >= began]
        mine = rows[(rows.trial == trial) & (rows.state == "ok")]
        values = {b: mine[mine.build == b].metric.to_numpy(dtype=float) for b in variants}
        short = [b for b, v in values.items() if len(v) == 0]
        if short:
            failed = rows[(rows.trial == trial) & (rows.state == "failed")]
            why = str(failed.error.iloc[0]) if not failed.empty else "no replicate finished"
            raise Measured(f"no run of the {', '.join(short)} build finished: {why}", usd)
        return values, usd

    def _build(
        self, instance_type: str, name: str, variant: Variant
    ) -> tuple[BuildArtifact, float]:
        """The variant built for the type's family, through the artifact cache (a
        configuration seen before is not rebuilt), and what its build instance cost. Raises
        Measured when it fails (with what it cost until then)."""
        opened: list[str] = []
        on_open = control.recording_builds(self.results, self.run_id, opened)
        # The build's own type once launched; until then the size it asks for first.
        asked = f"{instance_type.split('.')[0]}.{BUILD_SIZE}"
        try:
            outcome = self._build_run(instance_type, variant, on_open)
        except AmibakeError as exc:  # refused before or while it ran (preflight, interrupted)
            raise Measured(str(exc), self._build_usd(opened, asked, spot=True)) from None
        state: Any = outcome.state
        usd = self._build_usd(opened, state.instance_type or asked, state.market != "on-demand")
        if not outcome.ok:
            raise Measured(str(outcome.error), usd)
        return BuildArtifact(name, state.artifact, dict(state.manifest)), usd

    def _build_usd(self, runs: list[str], instance_type: str, spot: bool) -> float:
        """What the build runs' instances cost, at the build's type and market: the estimate
        counted the builds and the budget did not (a search of compile flags spent outside
        its max_usd)."""
        price = self.price_of(instance_type, spot, "") or 0.0
        return bench.build_spend(self.config.results_dir, runs, lambda _: price)

    def _build_run(
        self, instance_type: str, variant: Variant, on_open: Callable[[RunContext], None]
    ) -> Any:
        outcome = build_pipeline(
            self.cloud(),
            BuildRequest(
                families=[instance_type.split(".")[0]],
                recipe=self.spec.recipe,
                size=BUILD_SIZE,
                recipes_dir=self.config.recipes_dir,
                variant=variant,
            ),
            on_open=on_open,
        )[0]
        return outcome

    def _measure(
        self,
        label: str,
        trial: int,
        params: dict[str, Any],
        todo: list[Replicate],
        artifacts: dict[str, BuildArtifact],
    ) -> float:
        """The replicates in `todo`, recorded under `trial`, on one instance of the type with
        the configuration's run-time arguments: what the instance cost. Raises Measured when
        the instance's run failed."""
        spec, space = self.spec, self.spec.space
        instance_type = self.instance_type(params)
        family = instance_type.split(".")[0]
        # Run parameters named after a {NAME} of the bench command fill it; the rest are args.
        placeholders = self.recipe.placeholders if self.recipe is not None else ()
        filled = {
            n: v
            for n, v in space.active(params).items()
            if n in placeholders and space.params[n].stage == "run"
        }
        bench_spec = BenchSpec(
            types=(instance_type,),
            recipe=spec.recipe,
            command=spec.command,
            image=spec.image,
            gpus=spec.gpus,
            builds=tuple(artifacts) or (PLAIN,),
            replicates=spec.replicates,
            warmups=0,
            args=space.args({n: v for n, v in params.items() if n not in filled}),
            metric=self.metric,
            concurrency=1,
            workload=self.workload,
            parameters=self.recipe.bench_values(filled) if self.recipe is not None else {},
            executor=spec.executor,
            allow_missing_price=not self.priced,
        )
        # Every trial, and every trial of a resume, pulls the digest the first one's tag named.
        bench_spec = bench.pinned_image(self.cloud(), self.results, self.run_id, bench_spec)
        board = bench.Board(f"{self.run_id} {label}", total=len(todo))
        try:
            outcomes = bench.measure(
                self.cloud(),
                self.run_id,
                self.results,
                bench_spec,
                todo,
                {(family, b): a for b, a in artifacts.items()},
                board,
                trial=trial,
            )
        except AmibakeError as exc:
            raise Measured(str(exc), board.spent_now()) from None
        # What it cost: its instances' time at their market's price, as bench's progress counts
        # it (launch to teardown, not only the replicates' run time); a failed trial's instances
        # were paid for too. The build's own instance is amibake build's, unpriced.
        for outcome in outcomes:
            assert isinstance(outcome.state, BenchState)
            board.update(outcome.state, "done" if outcome.ok else "failed")
        usd = board.spent_now()
        if not outcomes[0].ok:
            raise Measured(str(outcomes[0].error), usd)
        return usd

    def _score(self, rows: Any, manifest: dict[str, Any], usd: float) -> Evaluation:
        metric = self.metric
        values = rows.metric.to_numpy(dtype=float)
        median = float(np.median(values))
        price = (
            float(np.median(rows.price_usd_hour.dropna()))
            if rows.price_usd_hour.notna().any()
            else None
        )
        # Time is per unit of work, as cost is (and as a replay table's seconds are): a run's
        # wall time says nothing of speed when the workload runs for a fixed time (the kernels
        # repeat to a minimum time and report a rate); for a workload timed whole they agree.
        per_unit = metric.seconds_per_unit(median)
        cost = stats.cost_per_unit(per_unit, price) if price is not None else None
        objective = self.spec.objective
        # A rate (work per second) is maximised: minimised negated, in its own units, so that a
        # fixed-time workload (the kernels repeat to a minimum time) is judged by its throughput.
        sign = -1.0 if metric.higher_is_better else 1.0
        loss = {"runtime": per_unit, "metric": sign * median, "cost": cost}[objective]
        # The interval of what is minimised, from the replicates (a re-run is judged by it).
        per_replicate = {
            "runtime": np.array([metric.seconds_per_unit(v) for v in values]),
            "metric": sign * values,
            "cost": np.array(
                [stats.cost_per_unit(metric.seconds_per_unit(v), price or 0.0) for v in values]
            ),
        }[objective]
        summary = stats.summarize(per_replicate)
        # Each replicate's loss too: the recommendation pools them with the other trials' (a
        # search whose every trial ran 3 replicates had no interval from one loss per trial).
        losses = [float(v) for v in per_replicate]
        # One replicate has no interval: a point read as one claimed a certainty it lacks.
        interval = [summary.low, summary.high] if summary.n > 1 else None
        manifest = {**manifest, "interval": interval, "n": summary.n, "losses": losses}
        if loss is None:
            return Evaluation(
                "failed",
                reason="no price for the type: cost cannot be the objective",
                manifest=manifest,
            )
        broken = broken_constraint(
            self.spec,
            seconds=per_unit,
            usd_per_unit=cost,
            rss_mb=float(rows.rss_max_mb.max()) if rows.rss_max_mb.notna().any() else None,
            rate=median if metric.higher_is_better else None,
        )
        if broken:
            return Evaluation(
                "infeasible",
                metric=median,
                seconds=per_unit,
                cost_per_unit=cost,
                usd=usd,
                reason=broken,
                manifest=manifest,
            )
        return Evaluation(
            "ok",
            loss=float(loss),
            metric=median,
            seconds=per_unit,
            cost_per_unit=cost,
            usd=usd,
            manifest=manifest,
        )
