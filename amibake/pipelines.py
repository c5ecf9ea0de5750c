"""The pipelines as readable lists of steps, and what it takes to run one."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import botocore.exceptions

from amibake import bake as bake_module
from amibake import catalog, recipes, render, runner, sources
from amibake.cloud import Cloud, tags
from amibake.errors import AmibakeError, CloudError, UserError
from amibake.flags import Compiler, for_build
from amibake.journal import Journal
from amibake.logs import run_log
from amibake.runner import Boundary, Interrupted, Rerun, RunContext, Runner, Step, new_run_id
from amibake.steps.access import KeyPair, SecurityGroup
from amibake.steps.image import BakeState, BootTest, CreateImage, Hygiene, Install, Record
from amibake.steps.launch import LaunchFleet, LaunchTemplate
from amibake.steps.preflight import (
    ArtifactCache,
    candidate_sizes,
    look_up,
    preflight,
    spot_role_for,
)
from amibake.steps.remote_build import Build, Connect, Fetch, Verify, render_build_script
from amibake.steps.state import BuildState, InstanceState, Variant

log = logging.getLogger("amibake")
# Amazon Linux 2023's gcc: what --dry-run renders flags for (a real build asks the instance).
AL2023_COMPILER = Compiler("gcc", "11.4.1")
MAX_ATTEMPTS = 4  # instances one runner may go through when spot keeps interrupting it


# After the preflight phase (which creates nothing and so is not a step with a cleanup).
BUILD_STEPS = (
    ArtifactCache,
    KeyPair,
    SecurityGroup,
    LaunchTemplate,
    LaunchFleet,
    Connect,
    Build,
    Verify,
    Fetch,
)
PLAN = ["preflight", *(step.name for step in BUILD_STEPS)]


def build_steps(context: RunContext) -> list[Step[BuildState]]:
    return [step(context) for step in BUILD_STEPS]


@dataclass
class BuildRequest:
    families: list[str]
    recipe: str
    size: str
    spot: bool = True
    on_demand_fallback: bool = False
    keep_on_error: bool = False
    dry_run: bool = False
    compiler: Compiler = AL2023_COMPILER
    recipes_dir: Path = recipes.RECIPES_DIR
    variant: Variant = field(default_factory=Variant)


@dataclass
class Outcome:
    """How one runner of a run ended: a family's build, or an architecture's bake."""

    family: str
    ok: bool
    state: InstanceState | None = None
    error: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {"family": self.family, "ok": self.ok}
        if self.error:
            out["error"] = self.error
        state = self.state
        if isinstance(state, BakeState):
            out.update(
                architecture=state.architecture,
                image_id=state.image_id if state.keep_image else None,
                base_ami=state.base_ami,
                artifacts=[a.path.name for a in state.artifacts],
                boot_test=state.boot_report,
                phases={k: round(v, 3) for k, v in state.phases.items()},
            )
        elif isinstance(state, BuildState):
            out.update(
                cache_hit=state.cache_hit,
                artifact=str(state.artifact) if state.artifact else None,
                instance_type=state.instance_type or None,
                market=state.market or None,
                target=state.flags.target if state.flags else None,
                cflags=state.manifest.get("cflags"),
                label=state.label,
                smoke=state.smoke or None,
                warnings=state.warnings,
                remote_seconds=round(state.remote_seconds, 3),
            )
        return {**out, **self.extra}


@contextmanager
def open_run(cloud: Cloud, command: str) -> Iterator[RunContext]:
    """A run: its id, journal entry, tags, and log file; closed with its final state."""
    config = cloud.config
    run_id = new_run_id()
    journal = Journal(config.results_dir / "journal.sqlite")
    journal.start_run(run_id, command, config.cloud, config.region)
    owner = cloud.client("sts").get_caller_identity()["Arn"]
    log_dir = config.results_dir / "logs" / run_id
    context = RunContext(
        run_id=run_id,
        cloud=cloud,
        journal=journal,
        tags=tags.run_tags(run_id, owner),
        log_dir=log_dir,
    )
    state = "failed"
    with run_log(log_dir / "run.log"):
        runner.opened(context)
        try:
            yield context
            # A run that returns is not a success: each of its builds or types may have failed.
            state = "failed" if context.failed else "succeeded"
        except (KeyboardInterrupt, Interrupted):
            state = "interrupted"
            raise
        finally:
            runner.closed(context)
            left = journal.alive(run_id)
            parts = [f"{', '.join(context.failed)} failed"] if context.failed else []
            parts.append(f"{len(left)} resources left" if left else "nothing left")
            if left and state == "succeeded":
                state = "left-resources"  # what it made is not all gone: not a clean success
            detail = "; ".join(parts)
            journal.finish_run(run_id, state, detail)
            log.info("[%s] %s; %s", run_id, state, detail)
            journal.close()


def prepare(request: BuildRequest, results_dir: Path) -> list[BuildState]:
    """Validate everything that needs no cloud: families, recipe, sizes, source. Creates nothing."""
    if not request.families:
        raise UserError("--family needs at least one family, e.g. --family c7i")
    variant = request.variant
    if (variant.generic or variant.cflags) and not variant.name.replace("_", "").isalnum():
        raise UserError(f"build variant name {variant.name!r} must be letters, digits and _")
    recipe = recipes.load(request.recipe, request.recipes_dir)
    source = sources.resolve(recipe, results_dir)
    states = []
    # The trial renders' checkers run side by side (eight families' one after another took
    # 300 ms before anything launched).
    with render.Checks() as checks:
        for name in request.families:
            family = catalog.family(name)
            state = BuildState(
                family=family,
                recipe=recipe,
                source=source,
                size=request.size,
                spot=request.spot,
                on_demand_fallback=request.on_demand_fallback,
                # Variants are fleet's experiments: kept apart from what bake puts in images.
                artifacts_dir=results_dir / "artifacts" / ("variants" if variant.name else ""),
                expected_compiler=request.compiler,
                dry_run=request.dry_run,
                variant=variant,
            )
            candidate_sizes(state)
            if family.architecture not in recipe.architectures:
                raise UserError(
                    f"recipe {recipe.name} builds for {', '.join(recipe.architectures)} only; "
                    f"family {name} is {family.architecture}"
                )
            # A trial render: an undefined variable or a script that does not parse fails here,
            # not after an instance was launched. The real render uses the instance's compiler.
            render_build_script(
                state,
                for_build(family, request.compiler, variant.generic),
                jobs=2,
                checks=checks,
            )
            states.append(state)
    return states


def preflight_all(cloud: Cloud, states: list[BuildState]) -> None:
    """Check every build against the cloud; creates nothing, so it is not journaled. What all
    families look up alike is asked once (three calls, not three per family); then each
    family's DryRun launch runs side by side: one after another, eight families' lookups took
    0.3 s on the local cloud, and would take seconds on AWS at tens of milliseconds a call."""
    lookups = look_up(cloud, states)
    with ThreadPoolExecutor(len(states), thread_name_prefix="preflight") as pool:
        checked = [pool.submit(preflight, cloud, state, lookups) for state in states]
    for done in checked:  # the first problem in the order the families were given
        done.result()


def dry_run(states: list[BuildState]) -> list[Outcome]:
    """The plan and the rendered script of each (preflighted) build."""
    outcomes = []
    for state in states:
        state.compiler = state.expected_compiler
        state.flags = for_build(state.family, state.compiler, state.variant.generic)
        script = render_build_script(state, state.flags, jobs=2)
        outcomes.append(
            Outcome(
                state.family.name,
                True,
                state,
                extra={
                    "plan": PLAN,
                    "base_ami": state.base_ami,
                    "instance_types": [
                        state.family.instance_type(s) for s in candidate_sizes(state)
                    ],
                    "compiler": str(state.compiler),
                    "flags": state.cflags,
                    "packages": state.recipe.build_packages,
                    "build_script": script,
                    "created": [],
                },
            )
        )
    return outcomes


def _how_to_debug(context: RunContext, state: InstanceState) -> None:
    """--keep-on-error: say how to reach the kept instance, and how to clean up after."""
    if not state.instance_id or not state.private_key:
        return
    # Named by slot, unique in the run: by family, two kept sizes of one wrote the same file.
    key_file = context.log_dir / f"{state.slot}.pem"
    key_file.parent.mkdir(parents=True, exist_ok=True)
    key_file.touch(mode=0o600)
    key_file.write_text(state.private_key)
    # The host key the run verified (from the console output), for ssh to check as the run
    # did: the hint without it had the user accept whatever key answered.
    known = context.log_dir / f"{state.slot}.known_hosts"
    checked = state.remote is not None and state.remote.save_host_keys(known)
    try:
        from amibake.cloud.reach import describe

        host, port = context.cloud.ssh_endpoint(describe(context.cloud, state.instance_id))
        verify = f" -o UserKnownHostsFile={known} -o StrictHostKeyChecking=yes" if checked else ""
        where = f"ssh -i {key_file}{verify} -p {port} {context.cloud.config.ssh_user}@{host}"
    except AmibakeError as exc:
        where = f"(no address yet: {exc})"
    log.warning("kept %s for debugging: %s", state.instance_id, where)
    if state.renewal is not None:  # amibake.deadline: kept, it still ends itself
        state.renewal.stop()
        until = time.strftime("%H:%M", time.gmtime(state.renewal.until))
        log.warning(
            "it powers itself off (and is terminated) at about %s UTC, its deadline: "
            "`sudo shutdown -c` on it keeps it",
            until,
        )
    log.warning("when done: amibake gc --run-id %s", context.run_id)


def build(
    cloud: Cloud,
    request: BuildRequest,
    on_boundary: Boundary | None = None,
    states: list[BuildState] | None = None,
    on_open: Callable[[RunContext], None] | None = None,
) -> list[Outcome]:
    """Build every requested family. `states`, if given, are already prepared and preflighted.
    `on_open` learns the build's run as soon as it is opened, before anything is made: a caller
    that records it (fleet's bench and tune) can clean up after a SIGKILL of its own."""
    if states is None:
        states = prepare(request, cloud.config.results_dir)
        preflight_all(cloud, states)
    # Spot's service-linked role, once every check has passed and the user has said to go on
    # (the cost question comes between preflight and here): bad input or a "no" makes nothing.
    spot_role_for(cloud, states)
    if request.dry_run:
        return dry_run(states)
    with open_run(cloud, f"build {','.join(request.families)} {request.recipe}") as context:
        context.keep_on_error = request.keep_on_error
        if on_open is not None:
            on_open(context)
        return run_each(context, states, build_steps, on_boundary)


SPOT_TERMINATION = "Server.SpotInstanceTermination"


def _spot_reclaimed(context: RunContext, instance_id: str) -> bool:
    """Whether spot took the instance back (its state reason says so)."""
    try:
        reservations = context.cloud.ec2.describe_instances(InstanceIds=[instance_id])
    except botocore.exceptions.ClientError:
        return False
    for reservation in reservations.get("Reservations", []):
        for instance in reservation.get("Instances", []):
            if instance.get("StateReason", {}).get("Code") == SPOT_TERMINATION:
                return True
    return False


def run_each(
    context: RunContext,
    states: Sequence[InstanceState],
    make_steps: Callable[[RunContext], list[Step[Any]]],
    on_boundary: Boundary | None = None,
    concurrency: int | None = None,
) -> list[Outcome]:
    """One runner per state (family, architecture, instance type), at most ``concurrency`` at
    once; Ctrl-C unwinds them all. A step that raises Rerun gets a fresh instance, a few times."""

    def attempts(state: InstanceState) -> None:
        def reclaimed(exc: BaseException) -> Rerun | None:
            # Spot may reclaim the instance at any stage (connecting, staging, installing),
            # not only mid-replicate: that is a rerun, not a failure.
            if not isinstance(exc, (AmibakeError, botocore.exceptions.ClientError)):
                return None
            if isinstance(exc, Rerun) or not state.instance_id:
                return None
            if not _spot_reclaimed(context, state.instance_id):
                return None
            return Rerun(f"spot reclaimed {state.instance_id} ({exc})")

        while True:
            try:
                steps = make_steps(context)
                Runner(context, steps, on_boundary, state.label, rerun_if=reclaimed).run(state)
                return
            except Rerun as exc:
                if state.attempt + 1 >= MAX_ATTEMPTS:
                    raise CloudError(f"{exc}; gave up after {MAX_ATTEMPTS} instances") from exc
                log.warning("[%s %s] %s: starting over", context.run_id, state.label, exc)
                state.start_over()

    def one(state: InstanceState) -> Outcome:
        try:
            try:
                attempts(state)
            except BaseException:
                if context.keep_on_error:
                    _how_to_debug(context, state)
                raise
            return Outcome(state.family.name, True, state)
        except (AmibakeError, botocore.exceptions.ClientError) as exc:
            context.failed.append(state.label)
            if isinstance(exc, UserError) and len(states) == 1:
                raise
            return Outcome(state.family.name, False, state, error=str(exc))

    try:
        if len(states) == 1:
            # In the main thread, so Ctrl-C lands inside the step that is running.
            outcomes = [one(states[0])]
        else:
            workers = min(len(states), concurrency or len(states))
            with ThreadPoolExecutor(workers, thread_name_prefix="run") as pool:
                futures = [pool.submit(one, s) for s in states]
                try:
                    outcomes = [f.result() for f in futures]
                except KeyboardInterrupt:
                    # Threads never see the signal: tell each run to stop and unwind.
                    context.cancel.set()
                    log.warning("interrupted: cleaning up every run")
                    for future in futures:
                        future.exception()
                    raise
    except KeyboardInterrupt:
        raise Interrupted("interrupted; everything the run created was cleaned up") from None
    if context.cancel.is_set():
        raise Interrupted("interrupted; everything the run created was cleaned up")
    return outcomes


BAKE_STEPS = (
    KeyPair,
    SecurityGroup,
    LaunchTemplate,
    LaunchFleet,
    Connect,
    Install,
    Hygiene,
    CreateImage,
    BootTest,
    Record,
)


def bake_steps(context: RunContext) -> list[Step[BakeState]]:
    return [step(context) for step in BAKE_STEPS]


@dataclass
class BakeRequest:
    families: list[str] | None = None  # None: every artifact in results/artifacts
    name: str = "amibake"
    reserve_mb_per_vcpu: int = 700
    base_ami: str | None = None
    allow_eol: bool = False
    keep_on_error: bool = False
    dry_run: bool = False
    build_recipe: str | None = None  # --build: build the families that have no artifact yet
    # --from-tune: the recipe built with a tune's recommended flags, instead of its own build
    variant: Variant = field(default_factory=Variant)
    tuned_by: str = ""  # the tune run that recommended `variant`

    def manifest(self, artifacts_dir: Path, family: str) -> Path:
        """Where the build of `family` this bake takes has its manifest."""
        suffix = f"-{self.variant.name}" if self.variant.name else ""
        where = artifacts_dir / "variants" if self.variant.name else artifacts_dir
        return where / f"{self.build_recipe}_{family}{suffix}.manifest.json"


def build_missing(cloud: Cloud, request: BakeRequest) -> list[Outcome]:
    """--build: one build run for the requested families that have no artifact of the recipe."""
    if request.build_recipe is None:
        return []
    check_bake(request)  # --build without --family, among the rest
    artifacts = cloud.config.results_dir / "artifacts"
    missing = [
        family
        for family in request.families or []
        if not request.manifest(artifacts, family).exists()
    ]
    if not missing:
        return []
    build_request = BuildRequest(
        families=missing,
        recipe=request.build_recipe,
        size="large",
        recipes_dir=cloud.config.recipes_dir,
        dry_run=request.dry_run,  # a dry bake plans its builds, and launches none of them
        variant=request.variant,
    )
    outcomes = build(cloud, build_request)
    failed = [o for o in outcomes if not o.ok]
    if failed:
        raise UserError(f"--build: {failed[0].family}: {failed[0].error}")
    return outcomes


# EC2's rule for an image name (3-128 of these characters); the bake appends -ARCH-DATE-TIME.
AMI_NAME = re.compile(r"[A-Za-z0-9()\[\] ./'@_-]+")
NAME_ROOM = 128 - len("-x86_64-20260101-000000")


def check_bake(request: BakeRequest) -> None:
    """What a bake's flags can get wrong, refused before any cloud is asked (a bad image name
    would otherwise fail at CreateImage, after the bake instance was set up)."""
    if request.reserve_mb_per_vcpu < 0:
        raise UserError("--tmpfs-reserve-mb-per-vcpu must be zero or more")
    if request.build_recipe is not None and not request.families:
        raise UserError("--build needs --family: which families to build")
    for name in request.families or []:
        catalog.family(name)
    if len(request.name) > NAME_ROOM or not AMI_NAME.fullmatch(request.name):
        raise UserError(
            f"--name {request.name!r}: an image name prefix is up to {NAME_ROOM} letters, digits, "
            "spaces and ()[]./-'@_ (the bake appends -ARCH-DATE-TIME)"
        )


def prepare_bake(cloud: Cloud, request: BakeRequest) -> list[BakeState]:
    """One bake per architecture, checked and rendered; creates nothing."""
    check_bake(request)
    # Read now, as Record will append to it: damaged, it would fail the bake after CreateImage.
    bake_module.baked(cloud.config.results_dir / "amis.json")
    artifacts_dir = cloud.config.results_dir / "artifacts"
    if request.tuned_by:  # --from-tune: exactly the recommended build, not every app's
        chosen = [request.manifest(artifacts_dir, f) for f in request.families or []]
        artifacts = bake_module.load_artifacts(artifacts_dir, None, chosen)
    else:
        artifacts = bake_module.load_artifacts(artifacts_dir, request.families)
    if request.base_ami is not None and len({a.architecture for a in artifacts}) > 1:
        raise UserError("--base-ami names one image, but the artifacts span architectures")
    states = []
    # The rendered files' checkers run while the cloud answers the lookups below.
    with render.Checks() as checks:
        boot_user_data = bake_module.user_data(bake_module.BOOT_TEST_CLUSTER, checks)
        for architecture in sorted({a.architecture for a in artifacts}):
            mine = [a for a in artifacts if a.architecture == architecture]
            files = bake_module.render_files(
                mine, architecture, request.reserve_mb_per_vcpu, cloud.imds_endpoint, checks
            )
            base, root = bake_module.base_image(
                cloud, architecture, request.base_ami, request.allow_eol
            )
            families = sorted({a.family for a in mine})
            bake_module.check_shapes(cloud, families, request.reserve_mb_per_vcpu)
            # Bake (and boot-test) on the most generic family: every artifact's fallback runs
            # there.
            generic = next(iter(bake_module.fallbacks(mine).values()))
            states.append(
                BakeState(
                    family=catalog.family(generic),
                    size="large",
                    base_ami=base,
                    root_device=root,
                    architecture=architecture,
                    name=request.name,
                    artifacts=mine,
                    files=files,
                    boot_user_data=boot_user_data,
                    reserve_mb_per_vcpu=request.reserve_mb_per_vcpu,
                    amis_file=cloud.config.results_dir / "amis.json",
                )
            )
    return states


def bake(
    cloud: Cloud,
    request: BakeRequest,
    on_boundary: Boundary | None = None,
    states: list[BakeState] | None = None,
) -> list[Outcome]:
    states = prepare_bake(cloud, request) if states is None else states
    if request.dry_run:
        return [
            Outcome(
                s.architecture,
                True,
                s,
                extra={
                    "plan": [step.name for step in BAKE_STEPS],
                    "files": {path: content for path, (content, _) in s.files.items()},
                    "created": [],
                },
            )
            for s in states
        ]
    with open_run(cloud, f"bake {request.name}") as context:
        context.keep_on_error = request.keep_on_error
        return run_each(context, states, bake_steps, on_boundary)
