"""Steps on the instance: connect, build in a tmpfs with the family's flags, verify the artifact,
and fetch it with its manifest. Each sends one script per round trip."""

from __future__ import annotations

import json
import logging
import re
import shlex
import sys
import time

import archspec.cpu

from amibake import flags as flags_module
from amibake import packages
from amibake.cloud.reach import reach
from amibake.errors import RemoteError
from amibake.render import Checks, check_shell, render
from amibake.runner import RunContext
from amibake.sources import sha256_of
from amibake.steps.preflight import release_artifact
from amibake.steps.state import BuildState, InstanceState

log = logging.getLogger("amibake")
SHARED = "/shared"


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
        state.phases["connect"] = time.monotonic() - started

    def cleanup(self, state: InstanceState) -> None:
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
        needed = packages.for_build(state.recipe)
        install = packages.install_command(needed)
        # dnf on a new instance takes a while (its metadata, then gcc): say what it waits on.
        log.info("%s: packages %s (installed where missing)", state.label, " ".join(needed))
        facts = remote.script(
            f"""{install}
            arch=$(uname -m); want={want}
            if [ "$arch" = "$want" ]; then cc=gcc; objdump=objdump
            else cc=$want-linux-gnu-gcc; objdump=$want-linux-gnu-objdump; fi
            if ! command -v "$cc" >/dev/null; then echo "missing $arch $cc"; exit 0; fi
            memory_mb=$(awk '/MemTotal/ {{print int($2/1024)}}' /proc/meminfo)
            tmpfs_mb=$((memory_mb / 2))
            if [ {cap} -gt 0 ] && [ "$tmpfs_mb" -gt {cap} ]; then tmpfs_mb={cap}; fi
            mkdir -p {SHARED}
            mountpoint -q {SHARED} || mount -t tmpfs -o size="$tmpfs_mb"m,mode=1777 tmpfs {SHARED}
            rm -rf {work} && mkdir -p {work}/src {work}/out && chown -R {user} {work}
            echo "$cc"; echo "$objdump"; "$cc" -dumpfullversion; nproc
            grep -m1 -E '^(flags|Features)' /proc/cpuinfo | cut -d: -f2 || true""",
            stream=False,
        ).stdout.splitlines()
        if facts and facts[0].startswith("missing "):
            _, arch, cc = facts[0].split()
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
        if len(facts) < 4:
            raise RemoteError(f"{state.instance_id}: could not read the build host's facts")
        state.cc, state.objdump = facts[0], facts[1]
        state.compiler = flags_module.Compiler("gcc", facts[2].strip())
        cpus = int(facts[3])
        cpu_flags = set(facts[4].split()) if len(facts) > 4 else set()
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
        state.cpu_flags = cpu_flags

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


# Registers (and their families) whose use needs an ISA extension.
_ISA_PATTERNS = {
    "avx512f": re.compile(r"%zmm\d+|%k[1-7]\b"),
    "avx": re.compile(r"%ymm\d+"),
    "sve": re.compile(r"\bz\d+\.[bhsdq]\b|\bp\d+\.[bhsdq]\b|\bp\d+/[mz]\b"),
}


def isa_features_used(disassembly: str) -> set[str]:
    return {feature for feature, pattern in _ISA_PATTERNS.items() if pattern.search(disassembly)}


class Verify:
    name = "verify"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: BuildState) -> None:
        remote = state.remote
        assert remote is not None and state.flags is not None
        out = f"{state.work_dir}/out"
        files = " ".join(shlex.quote(a) for a in state.recipe.artifacts)
        # One round trip: the files that are missing (then nothing else), else each file's
        # sha256 (the manifest records the files verified here), the instruction count (it
        # proves objdump understood the binary, else the scan proves nothing) and one line per
        # distinct register name (small for large binaries).
        report = remote.run(
            f'cd {out} && missing=""; for f in {files}; do [ -f "$f" ] || missing="$missing $f"; '
            'done; if [ -n "$missing" ]; then echo "missing:$missing"; exit 0; fi; '
            f"sha256sum {files}; echo ---; "
            f'for f in {files}; do {state.objdump} -d --no-show-raw-insn "$f"; '
            "done > /tmp/amibake-disasm && grep -cE '^ +[0-9a-f]+:' /tmp/amibake-disasm; "
            "grep -oE '%[xyz]mm[0-9]+|%k[0-7]|\\b[zp][0-9]+(\\.[bhsdq]|/[mz])' /tmp/amibake-disasm "
            "| sort -u; rm -f /tmp/amibake-disasm",
            stream=False,
        ).stdout
        if report.startswith("missing:"):
            missing = report.removeprefix("missing:").split()
            raise RemoteError(f"build produced no {', '.join(missing)} in {out}")
        sums, _, scan_text = report.partition("---\n")
        state.file_hashes = {
            name.lstrip("*"): digest
            for digest, name in (line.split(None, 1) for line in sums.splitlines() if line.strip())
        }
        scan = scan_text.split("\n", 1)
        if int(scan[0] or 0) == 0:
            raise RemoteError(f"ISA scan: {state.objdump} disassembled no instruction")
        registers = scan[1] if len(scan) > 1 else ""
        used = isa_features_used(registers)
        target = archspec.cpu.TARGETS[state.flags.used]
        beyond = sorted(f for f in used if f not in target.features)
        if beyond:
            raise RemoteError(
                f"ISA scan: {', '.join(state.recipe.artifacts)} use {', '.join(beyond)}, beyond "
                f"target {target.name}: the flags or the recipe add instructions the family lacks"
            )
        state.isa_features = sorted(used)
        lacking = flags_module.missing_features(target.name, state.cpu_flags)
        if not state.recipe.smoke_command:
            state.smoke = "no smoke test in the recipe"
        elif state.cc != "gcc":
            # Cross-compiled (the local cloud's arm64 families): listing the other
            # architecture's features as "lacking" would say nothing a reader can use.
            state.smoke = (
                f"skipped: cross-compiled with {state.cc}; this host cannot run {target.name}"
            )
            log.warning("smoke test %s", state.smoke)
        elif lacking:
            state.smoke = (
                f"skipped: this host's CPU cannot run {target.name} "
                f"(lacks {', '.join(lacking[:5])})"
            )
            log.warning("smoke test %s", state.smoke)
        else:
            result = remote.run(f"cd {out} && {state.recipe.smoke_command}", stream=False)
            if state.recipe.smoke_expect and state.recipe.smoke_expect not in result.stdout:
                raise RemoteError(
                    f"smoke test: output lacks {state.recipe.smoke_expect!r}: {result.tail}"
                )
            state.smoke = "passed"

    def cleanup(self, state: BuildState) -> None:
        pass


class Fetch:
    name = "fetch"

    def __init__(self, context: RunContext) -> None:
        self.context = context

    def run(self, state: BuildState) -> None:
        remote = state.remote
        assert remote is not None and state.flags is not None and state.compiler is not None
        out = f"{state.work_dir}/out"
        manifest = {
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
            "smoke": state.smoke,
            "smoke_command": state.recipe.smoke_command,
            "smoke_expect": state.recipe.smoke_expect,
            "runtime_packages": list(state.recipe.runtime_packages),
            "base_ami": state.base_ami,
            "instance_type": state.instance_type,
            "run_id": self.context.run_id,
        }
        local_manifest = self.context.log_dir / f"{state.label}.manifest.json"
        local_manifest.write_text(json.dumps(manifest, indent=2))
        archive = f"{state.work_dir}/{state.label}.tar.xz"
        # The manifest goes in on the archiving command's stdin: one round trip, not two.
        remote.run(
            f"cat > {out}/manifest.json && tar -C {out} -cJf {archive} .",
            stream=False,
            stdin=local_manifest.read_bytes(),
        )
        state.artifacts_dir.mkdir(parents=True, exist_ok=True)
        target = state.artifacts_dir / f"{state.label}.tar.xz"
        partial = target.with_suffix(".part")
        remote.get(archive, partial)
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
