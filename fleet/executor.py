"""The ssh executor: one instance per type, launched by the same steps as `amibake build`, reused
for every replicate of that type, torn down at the end.

Two steps follow the launch: Stage (upload the builds, the monitor and the replicate wrapper;
record the environment) and Measure (run the pending replicates one by one and record each as it
ends). A spot interruption notice during a replicate records it as interrupted and raises Rerun:
the runner unwinds this instance and starts over on a new one with what is still pending.
"""

from __future__ import annotations

import csv
import logging
import math
import shlex
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from amibake import cpu as cpu_module
from amibake import packages
from amibake.catalog import Family
from amibake.cloud import Cloud
from amibake.cloud.reach import describe
from amibake.cpu import Verdict
from amibake.errors import RemoteError, UserError
from amibake.instance_kinds import InstanceKind, Kind
from amibake.runner import Rerun, RunContext, Step
from amibake.steps.access import KeyPair, SecurityGroup
from amibake.steps.launch import LaunchFleet, LaunchTemplate
from amibake.steps.remote_build import SHARED, Connect
from amibake.steps.state import InstanceState
from fleet import container
from fleet.results import ReplicateRow
from fleet.spec import BenchSpec

log = logging.getLogger("amibake")
# A type's last replicate is over (ended, or failed midway): said to the progress board only.
IDLE = "idle"
AGENT = Path(__file__).resolve().parent / "agent"
WORK = f"{SHARED}/fleet"
TAIL_LINES = 8


@dataclass(frozen=True)
class Replicate:
    instance_type: str
    build: str
    index: int
    warmup: bool
    again: bool = False  # a warm-up repeated on a new instance: outside the plan

    @property
    def tag(self) -> str:
        return f"{self.build}-{'w' if self.warmup else 'r'}{self.index}"


def launched_at(instance: dict[str, Any]) -> float:
    """When an instance's billing began, as EC2 describes it: its LaunchTime, not when SSH
    first answered or a Batch job on it first reported (min: a skewed clock must not put it
    in the future)."""
    launched = instance.get("LaunchTime")
    return min(launched.timestamp(), time.time()) if launched else time.time()


@dataclass(frozen=True)
class BuildArtifact:
    name: str  # tuned | generic | a tune trial's variant
    path: Path  # the .tar.xz
    manifest: dict[str, Any]


@dataclass(kw_only=True)
class BenchState(InstanceState):
    """One instance type's share of a bench run."""

    spec: BenchSpec
    artifacts: dict[str, BuildArtifact]  # by build name; empty for a plain command
    pending: list[Replicate]
    record: Callable[[ReplicateRow], None]
    record_environment: Callable[[BenchState], None]
    results_dir: Path
    fleet_run: str
    price_of: Callable[[str, bool, str], float | None]  # (type, spot, zone id) -> USD/hour
    on_event: Callable[[BenchState, str], None] = lambda state, what: None
    before_replicate: Callable[[BenchState, Replicate], None] = lambda state, rep: None
    # Why no more work may start on this type ("" if it may): a spending cap would be passed.
    may_start: Callable[[BenchState], str] = lambda state: ""
    stopped: str = ""  # why the type stopped with replicates pending (the cap), if it did
    measured: list[float] = field(default_factory=list)  # seconds of its replicates so far
    zone: str = ""
    price: float | None = None
    facts: dict[str, Any] = field(default_factory=dict)
    monitor: bool = True
    launched_at: float = 0.0
    done: int = 0

    @property
    def label(self) -> str:
        return self.family.instance_type(self.size)

    @property
    def slot(self) -> str:
        return f"{self.label.replace('.', '-')}-{self.attempt}"


def ssh_steps(context: RunContext) -> list[Step[BenchState]]:
    return [
        Gate(context),
        KeyPair(context),
        SecurityGroup(context),
        LaunchTemplate(context),
        LaunchFleet(context),
        Connect(context),
        Stage(context),
        Measure(context),
    ]


def host_setup(state: BenchState, tools: Iterable[str]) -> str:
    """Shell installing what a host needs to run the replicates: `tools` and the builds'
    runtime packages, or the run stops there; and psutil for the monitor (Amazon Linux's
    python3 has none), which may fail: the replicates then run without the monitor, as
    record_host warns."""
    needed = [*tools, *packages.runtime(b.manifest for b in state.artifacts.values())]
    monitor = ["python3-psutil"] if state.spec.monitor else []
    return "\n".join(
        [packages.install_command(needed), packages.install_command(monitor, optional=True)]
    )


class Gate:
    """Before anything is made for a type: whether its instance may still start (a cap on the
    run's spend). If not, the type ends here, having launched nothing."""

    name = "gate"
    local_only = True  # nothing to clean up

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: BenchState) -> None:
        why = state.may_start(state)
        if why:
            log.warning("%s: not launched: %s", state.label, why)
            state.stopped = why
            state.finished_early = True

    def cleanup(self, state: BenchState) -> None:
        pass


class Stage:
    name = "stage"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: BenchState) -> None:
        remote = state.remote
        assert remote is not None
        instance: Any = describe(self.context.cloud, state.instance_id)
        state.launched_at = launched_at(instance)
        zone_name = instance.get("Placement", {}).get("AvailabilityZone", "")
        zones = self.context.cloud.ec2.describe_availability_zones(ZoneNames=[zone_name])
        state.zone = zones["AvailabilityZones"][0].get("ZoneId", zone_name)
        state.price = state.price_of(state.label, state.market == "spot", state.zone)
        # After the price: the progress board starts counting this instance's cost on it.
        state.on_event(state, "staging")
        user = self.context.cloud.config.ssh_user
        remote.script(
            f"""
            {host_setup(state, packages.ARTIFACT_TOOLS)}
            mkdir -p {SHARED}
            mountpoint -q {SHARED} || mount -t tmpfs -o mode=1777 tmpfs {SHARED}
            rm -rf {WORK} && mkdir -p {WORK}/run && chown -R {user} {WORK}
            """,
            stream=False,
        )
        remote.put(AGENT / "replicate.sh", f"{WORK}/replicate.sh")
        remote.put(AGENT / "monitor.py", f"{WORK}/monitor.py")
        for build in state.artifacts.values():
            remote.put(build.path, f"{WORK}/{build.name}.tar.xz")
            remote.run(
                f"mkdir -p {WORK}/{build.name} && tar -C {WORK}/{build.name} -xJf "
                f"{WORK}/{build.name}.tar.xz",
                stream=False,
            )
        facts = cpu_module.facts(
            remote.run(
                f"""echo "kernel=$(uname -r)"; echo "vcpus=$(nproc)"
                {cpu_module.FACTS_SCRIPT}
                python3 -c 'import psutil' 2>/dev/null && echo monitor=yes || echo monitor=no""",
                stream=False,
            ).stdout
        )
        host = {
            **facts,
            "vcpus": int(facts["vcpus"]) if facts.get("vcpus", "").isdigit() else None,
            "cpu_model": facts.get("model", ""),
            "cpu_flags": facts.get("flags", ""),
            "monitor": facts.get("monitor") == "yes",
        }
        image = stage_image(self.context.cloud, state, host) if state.spec.image else None
        record_host(self.context.cloud, state, host, state.base_ami, image)
        for build in state.artifacts.values():
            emulator = state.facts["emulated"].get(build.name)
            if emulator:
                remote.run(
                    f"cd {WORK}/{build.name} && "
                    + cpu_module.wrap_programs(list(build.manifest.get("programs", [])), emulator),
                    stream=False,
                )

    def cleanup(self, state: BenchState) -> None:
        pass  # the tmpfs dies with the instance


class Measure:
    name = "measure"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: BenchState) -> None:
        try:
            self._replicates(state)
        finally:  # ended or failed midway: nothing runs on it now (the heartbeat stops)
            state.on_event(state, IDLE)

    def _replicates(self, state: BenchState) -> None:
        remote = state.remote
        assert remote is not None
        imds = self.context.cloud.imds_endpoint
        command = workload_line(state)
        # An image's container outlives its client: removed once the replicate ends.
        cleanup = container.REMOVE_LINE if state.facts.get("image") else ""
        timeout = state.spec.timeout_s
        state.pending[0:0] = warmups_again(state)
        while state.pending:
            self.context.check_cancel()
            why = state.may_start(state)
            if why:
                # Nothing more starts on it; the runner then tears the instance down.
                log.warning("%s: stopping with %d left: %s", state.label, len(state.pending), why)
                state.stopped = why
                break
            replicate = state.pending[0]
            state.before_replicate(state, replicate)
            state.on_event(state, f"running {replicate.tag}")
            directory = f"{WORK}/{replicate.build}" if state.artifacts else f"{WORK}/run"
            started = time.time()
            result = remote.run(
                f"FLEET_CLEANUP={shlex.quote(cleanup)} "
                f"bash {WORK}/replicate.sh {directory} {replicate.tag} {imds} "
                f"{int(state.monitor)} {math.ceil(timeout)} {shlex.quote(command)}",
                check=False,
                stream=False,
                timeout_s=timeout + 60,
            )
            row = result_row(state, replicate, result.stdout + result.stderr, started)
            if row.state == "ok" and state.monitor:
                local = monitor_csv(state, replicate)
                try:
                    remote.get(f"{directory}/{replicate.tag}.csv", local)
                    row = with_monitor(row, local)
                except RemoteError as exc:
                    log.warning("%s: no monitor CSV for %s: %s", state.label, replicate.tag, exc)
            state.record(row)
            if row.state == "ok" and row.seconds is not None:
                state.measured.append(row.seconds)
            if row.state == "interrupted":
                raise Rerun(f"spot interruption notice on {state.instance_id}")
            state.pending.pop(0)
            if not replicate.again:
                state.done += 1
                state.on_event(state, "replicate done")

    def cleanup(self, state: BenchState) -> None:
        pass  # each replicate is recorded as it ends; nothing is left to undo


def warmups_again(state: BenchState) -> list[Replicate]:
    """A new instance (a rerun after a spot notice, a resumed run) is as cold as the first
    was: the run's warm-ups run again on it before its first measured replicate, recorded as
    warm-ups (never scored) and outside the plan's count."""
    if not state.spec.warmups or not state.pending or state.pending[0].warmup:
        return []
    builds = list(dict.fromkeys(r.build for r in state.pending))
    return [
        Replicate(state.label, build, index, True, again=True)
        for index in range(state.spec.warmups)
        for build in builds
    ]


def stage_image(cloud: Cloud, state: BenchState, host: dict[str, Any]) -> dict[str, Any]:
    """Log the instance in to ECR, pull the image's variant for the type's architecture (by the
    digest the preflight read) and find out how it runs there: whether it has a POSIX shell for
    the command line, whether the instance's CPU runs it natively, and what the monitor can see.
    Returns the facts the environment records under "image"."""
    remote = state.remote
    assert remote is not None
    ref = container.ImageRef.parse(state.spec.image)
    image = container.lookup(cloud, ref)
    where = container.login(cloud, ref)
    architecture = state.family.architecture
    platform = f"linux/{container.OCI_ARCHITECTURE[architecture]}"
    scheme = "http" if where.insecure else "https"
    remote.run(
        f"sudo -n docker login --username {shlex.quote(where.username)} --password-stdin "
        f"{scheme}://{where.host}",
        stdin=where.password.encode(),  # never on a command line (ps, logs)
        stream=False,
    )
    pull = where.pull_name(ref, image.digest)
    remote.run(f"sudo -n docker pull --platform {platform} {pull}", stream=False)
    # A shell that can start another program: what `sh -c "a && b"` needs (under QEMU without
    # binfmt_misc, the shell itself starts and its children do not).
    probe = remote.run(
        f"sudo -n docker run --rm --platform {platform} --entrypoint /bin/sh {pull} "
        "-c 'exec /bin/sh -c :'",
        check=False,
        stream=False,
    )
    machine = str(host.get("machine", ""))
    native = {"aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)
    # A Docker daemon starts the container: the workload is dockerd's, not the client's child.
    daemon = remote.run("sudo -n docker info >/dev/null 2>&1", check=False, stream=False)
    not_measured = []
    if probe.exit_code != 0:
        not_measured.append(
            "the image has no POSIX shell: the command ran as plain words (no pipes, "
            "redirections or variables), and a metric file is the program's own to write "
            "($FLEET_METRIC_FILE is in its environment)"
        )
    if daemon.exit_code == 0 and state.spec.monitor:
        not_measured.append(
            "the workload runs under the Docker daemon: the monitor's process-tree columns "
            "(tree_rss_mb, tree_cpu_percent) are the docker client's, not the workload's; the "
            "machine-wide ones are measured"
        )
    for what in not_measured:
        log.warning("%s: %s", state.label, what)
    return {
        "reference": str(ref),
        "digest": image.digest,
        "pull": pull,
        "platform": platform,
        "shell": probe.exit_code == 0,
        "emulated": native != architecture,
        "not_measured": not_measured,
    }


def workload_line(state: BenchState) -> str:
    """What the replicate wrapper runs: the command, or the command in the run's image."""
    command = state.spec.command_line()
    image = state.facts.get("image")
    if not image:
        return command
    return container.run_line(
        image["pull"], state.family.architecture, command, image["shell"], state.spec.gpus
    )


def record_host(
    cloud: Cloud,
    state: BenchState,
    host: dict[str, Any],
    ami: str,
    image: dict[str, Any] | None = None,
) -> None:
    """Record where the replicates run (the environment row) and how each build runs on that
    CPU: natively, emulated (under QEMU, recorded so, never ranked against native runs), or not
    at all, refused in one line naming what it lacks. ``host`` is what the instance reported:
    kernel, machine, vcpus, cpu_model, cpu_flags, vendor, emulators, monitor (psutil)."""
    machine = cpu_module.from_facts(
        {
            "machine": str(host.get("machine", "")),
            "flags": str(host.get("cpu_flags", "")),
            "vendor": str(host.get("vendor", "")),
            "model": str(host.get("cpu_model", "")),
            "emulators": str(host.get("emulators", "")),
        }
    )
    state.monitor = state.spec.monitor and bool(host.get("monitor"))
    if state.spec.monitor and not state.monitor and image is None:
        log.warning("%s has no python3-psutil: running without the monitor", state.label)
    verdicts = {b.name: build_verdict(b, state.family, machine) for b in state.artifacts.values()}
    state.facts = {
        "kernel": host.get("kernel", ""),
        "machine": host.get("machine", ""),
        "vcpus": host.get("vcpus"),
        "cpu_model": machine.model,
        "microarchitecture": machine.microarchitecture,
        "ami": ami,
        "instance_id": state.instance_id,
        "zone": state.zone,
        "market": state.market,
        "price_usd_hour": state.price,
        "cloud": cloud.config.cloud,
        "builds": {
            b.name: {
                "compiler": b.manifest.get("compiler"),
                "cflags": b.manifest.get("cflags"),
                "target": b.manifest.get("target_used"),
                "runs": verdicts[b.name].how,
            }
            for b in state.artifacts.values()
        },
        "emulated": {n: v.emulator for n, v in verdicts.items() if v.how == "emulated"},
    }
    if image is not None:
        state.facts["image"] = image
        if image["emulated"]:
            # The image's variant for the type's architecture, on a CPU of the other one: the
            # runtime runs it under QEMU (the local cloud), measured, never ranked as native.
            emulator = f"qemu-{'aarch64' if state.family.architecture == 'arm64' else 'x86_64'}"
            state.facts["emulated"] = {b: emulator for b in state.spec.builds}
            # A Batch job's host is seen from outside (EC2), which names no machine.
            where = host.get("machine")
            on = f"this {where} CPU" if where else "a CPU of the other architecture"
            log.warning(
                "%s: the image's %s variant runs under %s on %s: measured, never ranked "
                "against native runs",
                state.label,
                state.family.architecture,
                emulator,
                on,
            )
    if isinstance(state.family, InstanceKind):  # a type outside the build catalog: as EC2 has it
        state.facts.update(state.family.facts())
    state.record_environment(state)
    where = (
        " (on the local cloud every type runs on this machine's CPU)"
        if cloud.config.cloud == "local"
        else ""
    )
    for name, verdict in verdicts.items():
        if not verdict.runs:
            examples = dict(state.artifacts[name].manifest.get("isa_examples", {}))
            raise UserError(
                f"the {name} build of {state.family.name} cannot run on {state.label}'s CPU "
                f"({machine.model or machine.architecture}): it {verdict.naming(examples)}{where}"
            )
        if verdict.how == "emulated":
            log.warning(
                "%s: the %s build runs under %s (%s): measured, but never ranked against "
                "native runs",
                state.label,
                name,
                verdict.emulator.split()[0],
                verdict.reason,
            )
    if cloud.instance_cpu is None and state.artifacts and isinstance(state.family, Family):
        # On AWS the CPU is the family's: one lacking what the family's build is made for
        # landed on a generation the catalog does not list for it.
        lacking = sorted(cpu_module.predicted_needs(state.family) - machine.features)
        if lacking:
            raise UserError(
                f"{state.label}'s CPU ({machine.model}) lacks {', '.join(lacking)}, which "
                f"the {state.family.name} target has: a generation the catalog does not list"
            )


def build_verdict(build: BuildArtifact, family: Kind, machine: cpu_module.Cpu) -> Verdict:
    """How `machine` runs a build, from the instructions its scan found."""
    architecture = str(build.manifest.get("architecture", family.architecture))
    return cpu_module.verdict(architecture, set(build.manifest.get("isa_features", [])), machine)


def failed_row(state: BenchState, replicate: Replicate, started: float) -> ReplicateRow:
    """A replicate's record with where and when it ran, failed until its output says otherwise."""
    return ReplicateRow(
        state="failed",
        instance_type=state.label,
        build=replicate.build,
        replicate=replicate.index,
        warmup=replicate.warmup,
        instance_id=state.instance_id,
        market=state.market,
        zone=state.zone,
        price_usd_hour=state.price,
        started=started,
        finished=time.time(),
    )


def result_row(
    state: BenchState, replicate: Replicate, output: str, started: float
) -> ReplicateRow:
    """A replicate's record from its output (the wrapper's FLEET-RESULT line ends it)."""
    lines = output.rstrip("\n").splitlines()
    summary = next((line for line in reversed(lines) if line.startswith("FLEET-RESULT ")), "")
    body = [line for line in lines if not line.startswith(("FLEET-RESULT ", "FLEET-HOST "))]
    tail = " | ".join(body[-TAIL_LINES:])
    base = failed_row(state, replicate, started)
    if not summary:
        raise RemoteError(f"{state.label}: the replicate wrapper did not finish: {tail}")
    fields = dict(part.split("=", 1) for part in summary.split(" ", 5)[1:5] if "=" in part)
    metric_file = summary.split("metric_file=", 1)[1] if "metric_file=" in summary else ""
    code = int(fields.get("exit", "-1"))
    seconds = float(fields.get("end", "0")) - float(fields.get("start", "0"))
    if fields.get("state") == "interrupted":
        return replace(base, state="interrupted", seconds=seconds, error="spot interruption notice")
    if fields.get("state") == "timeout":
        return replace(
            base,
            seconds=seconds,
            error=f"timed out after {state.spec.timeout_s:.0f}s; last lines: {tail}",
        )
    if code != 0:
        return replace(
            base,
            seconds=seconds,
            exit_code=code,
            error=f"the workload exited {code}; last lines: {tail}",
        )
    try:
        value = state.spec.metric.parse("\n".join(body), seconds, metric_file)
    except ValueError as exc:
        return replace(base, seconds=seconds, exit_code=code, error=f"{exc}; last lines: {tail}")
    return replace(base, state="ok", metric=value, seconds=seconds, exit_code=code)


def monitor_csv(state: BenchState, replicate: Replicate) -> Path:
    """Where a replicate's monitor CSV is kept on the controller."""
    local = (
        state.results_dir
        / "runs"
        / state.fleet_run
        / "monitor"
        / f"{state.label}_{replicate.tag}_{state.attempt}.csv"
    )
    local.parent.mkdir(parents=True, exist_ok=True)
    return local


def with_monitor(row: ReplicateRow, local: Path) -> ReplicateRow:
    """The row with the summary of its monitor CSV (fetched to ``local``)."""
    cpu, rss = [], []
    with local.open() as handle:
        for sample in csv.DictReader(handle):
            cpu.append(float(sample["cpu_percent"]))
            rss.append(float(sample["tree_rss_mb"]))
    return replace(
        row,
        monitor_csv=str(local),
        cpu_mean=sum(cpu) / len(cpu) if cpu else None,
        cpu_max=max(cpu) if cpu else None,
        rss_max_mb=max(rss) if rss else None,
        monitor_samples=len(cpu),
    )
