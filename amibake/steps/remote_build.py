"""Steps on the instance: connect, build in a tmpfs with the family's flags, verify the artifact,
and fetch it with its manifest. Each sends one script per round trip."""

from __future__ import annotations

import json
import logging
import shlex
import shutil
import sys
import tarfile
import time

import archspec.cpu

from amibake import cpu as cpu_module
from amibake import flags as flags_module
from amibake import isa, packages
from amibake.archive import unpack
from amibake.cloud.reach import reach
from amibake.deadline import Renewal
from amibake.errors import RemoteError, UserError
from amibake.remote import Remote
from amibake.render import Checks, check_shell, render
from amibake.runner import RunContext
from amibake.sources import sha256_of
from amibake.steps.preflight import MANIFEST_FORMAT, release_artifact
from amibake.steps.state import BuildState, InstanceState

log = logging.getLogger("amibake")
SHARED = "/shared"
# The tail of the smoke test's output the manifest keeps (a build's checksums, to compare one
# architecture's build with another's).
SMOKE_OUTPUT_CHARS = 4000


class Connect:
    name = "connect"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: InstanceState) -> None:
        log_path = self.context.log_dir / f"{state.slot}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        prefix = f"[{state.slot}] "

        def to_terminal(text: str) -> None:
            for line in text.splitlines():
                print(prefix + line, file=sys.stderr, flush=True)

        handle = log_path.open("a")
        started = time.monotonic()
        state.remote = reach(
            self.context.cloud,
            state.instance_id,
            state.private_key,
            sink=to_terminal,
            log=handle,
            cancel=self.context.cancel,
        )
        state.renewal = Renewal(
            state.remote, self.context.cloud.config.instance_deadline_min, state.label
        ).start()
        state.phases["connect"] = time.monotonic() - started

    def cleanup(self, state: InstanceState) -> None:
        if state.renewal is not None:
            state.renewal.stop()  # the instance's deadline stands: it ends then, kept or not
            state.renewal = None
        if state.remote is not None:
            state.remote.close()
            if state.remote.log is not None:
                state.remote.log.close()
            state.remote = None


class Build:
    name = "build"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: BuildState) -> None:
        remote = state.remote
        assert remote is not None
        # The family's machine type, as uname says it. On AWS the instance is of the family, so
        # the native gcc is used; on the local cloud every instance runs on this machine's CPU,
        # so an arm64 family is cross-compiled when a cross compiler is there.
        want = {"x86_64": "x86_64", "arm64": "aarch64"}[state.family.architecture]
        work = state.work_dir
        user = self.context.cloud.config.ssh_user
        cap = state.recipe.tmpfs_max_mb or 0
        # One round trip (as root) learns the build host's facts and prepares the tmpfs, sized
        # from its memory: half of it, or the recipe's cap.
        # The recipe's packages first: the base image has no compiler (amibake.packages).
        needed = state.recipe.build_packages
        install = packages.install_command(needed)
        # dnf on a new instance takes a while (its metadata, then gcc): say what it waits on.
        log.info("%s: packages %s (installed where missing)", state.label, " ".join(needed))
        facts = remote.script(
            f"""{install}
            arch=$(uname -m); want={want}
            if [ "$arch" = "$want" ]; then cc=gcc; else cc=$want-linux-gnu-gcc; fi
            if ! command -v "$cc" >/dev/null; then echo "missing $arch $cc"; exit 0; fi
            memory_mb=$(awk '/MemTotal/ {{print int($2/1024)}}' /proc/meminfo)
            tmpfs_mb=$((memory_mb / 2))
            if [ {cap} -gt 0 ] && [ "$tmpfs_mb" -gt {cap} ]; then tmpfs_mb={cap}; fi
            mkdir -p {SHARED}
            mountpoint -q {SHARED} || mount -t tmpfs -o size="$tmpfs_mb"m,mode=1777 tmpfs {SHARED}
            rm -rf {work} && mkdir -p {work}/src {work}/out && chown -R {user} {work}
            echo "cc=$cc"; echo "version=$("$cc" -dumpfullversion)"; echo "cpus=$(nproc)"
            {cpu_module.FACTS_SCRIPT}""",
            stream=False,
        ).stdout
        if facts.startswith("missing "):
            _, arch, cc = facts.split()[:3]
            if cc == "gcc":
                raise RemoteError(
                    f"{state.instance_id} has no gcc to build {state.family.name}: add gcc to "
                    f"the packages of {state.recipe.file}"
                )
            raise RemoteError(
                f"{state.instance_id} is {arch} and has no {cc} to build {state.family.name} "
                f"({state.family.architecture}); on the local cloud install the cross compiler "
                f"(make install does: gcc-{want.replace('_', '-')}-linux-gnu)"
            )
        found = cpu_module.facts(facts)
        if not {"cc", "version", "cpus", "flags"} <= found.keys():
            raise RemoteError(f"{state.instance_id}: could not read the build host's facts")
        state.cc = found["cc"]
        state.compiler = flags_module.Compiler("gcc", found["version"])
        cpus = int(found["cpus"])
        state.flags = flags_module.for_build(state.family, state.compiler, state.variant.generic)
        if state.flags.warning:
            log.warning("%s", state.flags.warning)
            state.warnings.append(state.flags.warning)
        state.build_script = render_build_script(state, state.flags, cpus, state.cc)
        local_script = self.context.log_dir / f"{state.family.name}.build.sh"
        local_script.write_text(state.build_script)
        remote.put(state.source.path, f"{work}/{state.source.filename}")
        remote.put(local_script, f"{work}/build.sh")
        started = time.monotonic()
        remote.script(
            f"""
            cd {work}/src
            tar -xf ../{shlex.quote(state.source.filename)}
            bash {work}/build.sh
            """
        )
        state.remote_seconds += time.monotonic() - started
        state.host_cpu = cpu_module.from_facts(found)

    def cleanup(self, state: BuildState) -> None:
        pass  # the tmpfs dies with the instance


def render_build_script(
    state: BuildState,
    flags: flags_module.Flags,
    jobs: int,
    cc: str = "gcc",
    checks: Checks | None = None,
) -> str:
    """The recipe's build script for these flags; checked on `checks` when given (the caller
    waits for it), else before returning."""
    work = state.work_dir
    script = render(
        state.recipe.directory / state.recipe.template,
        family=state.family.name,
        target=flags.used,
        cc=cc,
        base_cflags=state.recipe.base_cflags,
        cflags=f"{flags.cflags} {state.variant.cflags}".strip(),
        src_dir=f"{work}/src",
        out_dir=f"{work}/out",
        jobs=jobs,
    )
    check_shell(script, f"{state.recipe.name}/{state.recipe.template}", checks)
    return script


class Verify:
    """The artifact exists, uses no instruction beyond the family's target, and (where the
    build host runs it, natively or under QEMU) passes its smoke test."""

    name = "verify"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: BuildState) -> None:
        remote = state.remote
        assert remote is not None and state.flags is not None and state.host_cpu is not None
        out = f"{state.work_dir}/out"
        files = " ".join(shlex.quote(a) for a in state.recipe.artifacts)
        # One round trip: the files that are missing (then nothing else), else each file's
        # sha256 (the manifest records the files verified here) and the output directory as
        # one tar, fetched to be scanned here and packed by Fetch.
        report = remote.run(
            f'cd {out} && missing=""; for f in {files}; do [ -f "$f" ] || missing="$missing $f"; '
            'done; if [ -n "$missing" ]; then echo "missing:$missing"; exit 0; fi; '
            f"sha256sum {files}; tar -cf {state.work_dir}/out.tar .",
            stream=False,
        ).stdout
        if report.startswith("missing:"):
            missing = report.removeprefix("missing:").split()
            raise RemoteError(f"build produced no {', '.join(missing)} in {out}")
        state.file_hashes = {
            name.lstrip("*"): digest
            for digest, name in (line.split(None, 1) for line in report.splitlines() if line)
        }
        state.local_out = self.context.log_dir / f"{state.label}.out"
        shutil.rmtree(state.local_out, ignore_errors=True)
        state.local_out.mkdir(parents=True)
        fetched = state.local_out.with_suffix(".tar")
        remote.get(f"{state.work_dir}/out.tar", fetched)
        with tarfile.open(fetched) as tar:
            unpack(tar, state.local_out)
        fetched.unlink()
        self._scan(state)
        self._smoke(state, remote, out)

    def _scan(self, state: BuildState) -> None:
        assert state.flags is not None and state.local_out is not None
        artifacts = ", ".join(state.recipe.artifacts)
        try:
            scan = isa.scan(state.local_out, state.recipe.artifacts)
        except UserError as exc:
            raise RemoteError(f"ISA scan: {exc}") from None
        if not scan.instructions:
            raise RemoteError(f"ISA scan: no machine code in {artifacts}")
        if scan.architecture != state.family.architecture:
            raise RemoteError(
                f"ISA scan: {artifacts} is {scan.architecture} code, not "
                f"{state.family.architecture} ({state.family.name})"
            )
        needs = scan.needs(state.recipe.dispatched)
        target = archspec.cpu.TARGETS[state.flags.used]
        # Only features archspec knows can be held against a target (it does not list
        # PREFETCHW or RDTSCP for any): the others are still checked against each CPU.
        beyond = sorted(
            (needs & isa.known_features(state.family.architecture))
            - cpu_module.target_features(target)
        )
        if beyond:
            raise RemoteError(
                f"ISA scan: {artifacts} use {scan.example(beyond)}, beyond target "
                f"{target.name}: the flags or the recipe add instructions the family lacks"
            )
        state.isa_features = sorted(needs)
        state.isa_examples = {f: scan.features[f] for f in state.isa_features}
        state.programs = scan.programs
        log.info(
            "%s: %d instructions; needs %s",
            state.label,
            scan.instructions,
            ", ".join(state.isa_features) or "the baseline only",
        )

    def _smoke(self, state: BuildState, remote: Remote, out: str) -> None:
        assert state.host_cpu is not None
        host = state.host_cpu
        verdict = cpu_module.verdict(state.family.architecture, set(state.isa_features), host)
        if not state.recipe.smoke_command:
            state.smoke = "no smoke test in the recipe"
            return
        if not verdict.runs:
            where = host.model or host.architecture
            state.smoke = f"skipped: the build host ({where}) {verdict.naming(state.isa_examples)}"
            log.warning("smoke test %s", state.smoke)
            return
        if verdict.how == "emulated":
            log.info(
                "%s: smoke test under %s: the build host %s",
                state.label,
                verdict.emulator,
                verdict.reason,
            )
        command = cpu_module.command_in(out, state.recipe.smoke_command, state.programs, verdict)
        result = remote.run(command, stream=False)
        if state.recipe.smoke_expect and state.recipe.smoke_expect not in result.stdout:
            raise RemoteError(
                f"smoke test: output lacks {state.recipe.smoke_expect!r}: {result.tail}"
            )
        state.smoke = "passed"
        state.smoke_on = verdict.how
        state.smoke_output = result.stdout[-SMOKE_OUTPUT_CHARS:]

    def cleanup(self, state: BuildState) -> None:
        if state.local_out is not None:
            shutil.rmtree(state.local_out, ignore_errors=True)


class Fetch:
    name = "fetch"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: BuildState) -> None:
        # Packed here from the files Verify fetched and scanned: what is cached is exactly
        # what was verified, and the build host sends the output once.
        assert state.flags is not None and state.compiler is not None
        assert state.local_out is not None
        manifest = {
            "format": MANIFEST_FORMAT,
            "app": state.recipe.name,
            "family": state.family.name,
            "architecture": state.family.architecture,
            "recipe_sha256": state.recipe.digest(),
            "source_sha256": state.source.sha256,
            "target": state.flags.target,
            "target_used": state.flags.used,
            "compiler": str(state.compiler),
            "cflags": f"{state.recipe.base_cflags} {state.cflags}".strip(),
            "variant": state.variant.name,
            "files": state.file_hashes,
            "isa_features": state.isa_features,
            "isa_examples": state.isa_examples,
            "isa_dispatched": list(state.recipe.dispatched),
            "programs": state.programs,
            "smoke": state.smoke,
            "smoke_on": state.smoke_on,
            "smoke_output": state.smoke_output,
            "smoke_command": state.recipe.smoke_command,
            "smoke_expect": state.recipe.smoke_expect,
            "runtime_packages": list(state.recipe.runtime_packages),
            "base_ami": state.base_ami,
            "instance_type": state.instance_type,
            "run_id": self.context.run_id,
        }
        (state.local_out / "manifest.json").write_text(json.dumps(manifest, indent=2))
        state.artifacts_dir.mkdir(parents=True, exist_ok=True)
        target = state.artifacts_dir / f"{state.label}.tar.xz"
        partial = target.with_suffix(".part")
        with tarfile.open(partial, "w:xz") as tar:
            tar.add(state.local_out, arcname=".", filter=_as_root)
        partial.replace(target)
        # The sidecar adds what only the controller knows: the archive's own hash and cache key.
        manifest["artifact_sha256"] = sha256_of(target)
        manifest["cache_key"] = state.cache_key
        sidecar = state.artifacts_dir / f"{state.label}.manifest.json"
        sidecar.write_text(json.dumps(manifest, indent=2))
        state.manifest = manifest
        state.artifact = target
        release_artifact(state)  # written: a run waiting for it finds it in the cache

    def cleanup(self, state: BuildState) -> None:
        pass


def _as_root(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """Files owned by root in the archive, as the build host's tar made them: whoever runs
    the controller, an instance unpacking it as root gets root's files."""
    member.uid = member.gid = 0
    member.uname = member.gname = "root"
    return member
