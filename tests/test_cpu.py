"""What a CPU runs, decided by the instructions a build uses: the ISA scan, the verdicts
(native, under QEMU, not at all), and the family each kind of machine picks. CPUs are data here
(`Cpu.of_target`), so every rule is checked on machines this one is not."""

from __future__ import annotations

import json
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import archspec.cpu
import pytest

from amibake import catalog, cpu, flags, isa, recipes
from amibake.cli import main
from tests.helpers import pick_family

KERNELS = recipes.RECIPES_DIR / "kernels" / "src" / "kernels.c"
PROBES = Path(__file__).parent / "cpu"
BOTH = frozenset({"x86_64", "arm64"})
# The compiler for each architecture's code, on any Debian machine: the native gcc under its
# triplet name, or the cross gcc `make install` adds for the other architecture.
GCC = {"x86_64": "x86_64-linux-gnu-gcc", "arm64": "aarch64-linux-gnu-gcc"}

# A machine of each kind people run this on (as archspec names them), and the family the suite
# would take as its own there: its own generation where EC2 has one, natively; an old x86 one
# (no AVX2) takes the newest family whose build QEMU runs.
HOSTS = {
    "zen2": ("c5a", "native"),
    "zen3": ("c6a", "native"),
    "zen4": ("c7a", "native"),
    "skylake_avx512": ("c5", "native"),
    "cascadelake": ("c5", "native"),
    "icelake": ("c6i", "native"),
    "sapphirerapids": ("c7i", "native"),
    "x86_64_v2": ("c6a", "emulated"),
    "neoverse_n1": ("c6g", "native"),
    "neoverse_v1": ("c7g", "native"),
}


def compile_c(tmp_path: Path, architecture: str, source: str | Path, *cflags: str) -> Path:
    """Build a program for the architecture with this machine's compiler for it."""
    compiler = shutil.which(GCC[architecture])
    assert compiler, f"no {GCC[architecture]}: make install adds the cross compiler"
    if isinstance(source, str):
        path = tmp_path / "program.c"
        path.write_text(source)
        source = path
    out = tmp_path / f"program-{architecture}"
    subprocess.run(
        [compiler, *cflags, "-o", str(out), str(source), "-lm"],
        check=True,
        capture_output=True,
    )
    return out


def gcc_version(architecture: str) -> flags.Compiler:
    version = subprocess.run(
        [GCC[architecture], "-dumpfullversion"], check=True, capture_output=True, text=True
    ).stdout
    return flags.Compiler("gcc", version.strip())


VECTOR_LOOP = (
    "float a[4096], b[4096];\n"
    "int main(void) { for (int i = 0; i < 4096; i++) a[i] = a[i] * 2.0f + b[i];\n"
    "  return (int)a[7]; }\n"
)


def test_the_scan_names_each_feature_the_instructions_need(tmp_path: Path) -> None:
    baseline = compile_c(tmp_path, "x86_64", VECTOR_LOOP, "-O3", "-march=x86-64")
    scan = isa.scan(baseline.parent, [baseline.name])
    assert scan.architecture == "x86_64" and scan.instructions > 0
    assert scan.features == {}  # SSE2 and older: every x86-64 CPU
    assert scan.programs == [baseline.name]
    wide = compile_c(
        tmp_path, "x86_64", VECTOR_LOOP, "-O3", "-mavx512f", "-mprefer-vector-width=512"
    )
    scan = isa.scan(wide.parent, [wide.name])
    assert "avx512f" in scan.features and "zmm" in scan.features["avx512f"]
    assert "avx512f (v" in scan.example(["avx512f"])  # a message names an instruction
    counted = compile_c(
        tmp_path,
        "x86_64",
        "int main(int c, char **v) { return __builtin_popcount(c); }",
        "-O2",
        "-mpopcnt",
    )
    assert set(isa.scan(counted.parent, [counted.name]).features) == {"popcnt"}
    # A static program carries glibc's longjmp and libgcc's unwinder, whose shadow-stack code
    # (RDSSP, a no-op without CET) runs on every x86-64 CPU: it was reported as cet_ss, which no
    # /proc/cpuinfo names, and the program judged to run nowhere.
    static = compile_c(
        tmp_path,
        "x86_64",
        "#include <setjmp.h>\nstatic jmp_buf b;\n"
        "int main(void) { if (!setjmp(b)) longjmp(b, 1); return 0; }",
        "-O2",
        "-static",
    )
    assert "cet_ss" not in isa.scan(static.parent, [static.name]).features


COPIES = (
    "#include <stdio.h>\n#include <string.h>\n"
    "int main(int c, char **v) { char a[256], b[256]; memset(a, c, sizeof a);\n"
    '  memcpy(b, a, sizeof a); printf("%zu\\n", strlen(b)); return 0; }\n'
)
CLONES = (
    "int a[4096], b[4096];\n"
    '__attribute__((target_clones("avx512f", "default"))) void twice(void)\n'
    "{ for (int i = 0; i < 4096; i++) a[i] = 2 * a[i] + b[i]; }\n"
    '__attribute__((target("avx2"))) void thrice(void)\n'
    "{ for (int i = 0; i < 4096; i++) b[i] = 3 * b[i] + a[i]; }\n"
    "int main(int c, char **v) { twice(); if (c > 5) thrice(); return a[7]; }\n"
)


@pytest.mark.parametrize("architecture", ["x86_64", "arm64"])
def test_code_a_cpu_check_picks_at_run_time_does_not_count(
    architecture: str, tmp_path: Path
) -> None:
    """A static program carries glibc's memcpy, strlen... in a variant per CPU generation, one
    picked at start-up by an IFUNC resolver, and the C runtime's guarded code (lock elision,
    memory tagging, outline atomics, the unwinder's SVE frames). Baseline code read as needing
    AVX-512, RTM and XSAVEC (x86-64), or SVE and MTE (arm64): no EC2 CPU has all of either, and
    the program was judged to run nowhere."""
    program = compile_c(tmp_path, architecture, COPIES, "-O2", "-static")
    needs = set(isa.scan(program.parent, [program.name]).features)
    # TZCNT is in glibc's generic code: gcc's `rep bsf`, which a CPU without BMI1 runs as BSF.
    assert needs <= {"bmi1"}, needs
    # Stripped, nothing says which code is whose: read whole, as before.
    subprocess.run([GCC[architecture].replace("gcc", "strip"), str(program)], check=True)
    stripped = set(isa.scan(program.parent, [program.name]).features)
    assert stripped > needs, stripped


def test_a_target_clone_does_not_count_and_a_function_built_for_a_target_does(
    tmp_path: Path,
) -> None:
    """gcc's target_clones: an AVX-512 clone its resolver picks only where the CPU has it. A
    function built for AVX2 and called directly runs wherever it is called: it counts."""
    program = compile_c(tmp_path, "x86_64", CLONES, "-O3")
    scan = isa.scan(program.parent, [program.name])
    assert "avx512f" not in scan.features, scan.features
    assert "avx2" in scan.features and "ymm" in scan.features["avx2"], scan.features
    # Nor does the XGETBV of libgcc's CPU check the resolver asks (after CPUID's OSXSAVE).
    assert set(scan.features) == {"avx", "avx2"}, scan.features


def test_a_build_for_a_target_may_use_what_its_march_enables(tmp_path: Path) -> None:
    """gcc turns an int8 dot product into AVX-VNNI's vpdpbusd under -march=sapphirerapids,
    which every Sapphire Rapids has though archspec's list leaves it out: the build check
    held it beyond the c7i's target and refused a correct build."""
    spr = archspec.cpu.TARGETS["sapphirerapids"]
    dot = (
        "unsigned char a[4096]; signed char b[4096];\n"
        "int main(void) { int s = 0; for (int i = 0; i < 4096; i++) s += a[i] * b[i];\n"
        "  return s; }\n"
    )
    program = compile_c(tmp_path, "x86_64", dot, "-O3", "-march=sapphirerapids")
    needs = set(isa.scan(program.parent, [program.name]).features)
    assert "avx_vnni" in needs, needs  # with Debian's gcc 12, which make install adds
    assert needs & isa.known_features("x86_64") <= cpu.target_features(spr), needs
    assert {"avx_vnni", "avx512_fp16"} <= cpu.target_features(spr)
    # Its descendants have them too; an older target is not given them.
    assert "avx_vnni" not in cpu.target_features(archspec.cpu.TARGETS["icelake"])


def test_a_zen_build_may_use_sha_and_adx_its_march_enables(tmp_path: Path) -> None:
    """Every Zen has SHA-NI and ADX (gcc's -march=znver1 enables both), which archspec's zen
    lists leave out: a c5a build hashing with SHA intrinsics was refused as beyond zen2."""
    family = catalog.family("c5a")
    tuned = flags.for_family(family, gcc_version(family.architecture))
    hashing = (
        "#include <immintrin.h>\n"
        "int main(int argc, char **argv) { (void)argv; __m128i s = _mm_set1_epi32(argc);\n"
        "  s = _mm_sha256rnds2_epu32(s, s, s); unsigned long long c = (unsigned long long)argc;\n"
        '  __asm__ volatile("adcx %1, %0" : "+r"(c) : "r"(c));\n'  # gcc's own is adc
        "  return _mm_cvtsi128_si32(s) + (int)c; }\n"
    )
    program = compile_c(tmp_path, "x86_64", hashing, "-O2", *tuned.cflags.split())
    needs = set(isa.scan(program.parent, [program.name]).features)
    assert {"sha_ni", "adx"} <= needs, needs
    zen2 = archspec.cpu.TARGETS[tuned.used]
    assert needs & isa.known_features("x86_64") <= cpu.target_features(zen2), needs
    for name in ("zen3", "zen4"):  # the later generations inherit them, and RDPID from zen2
        assert {"sha_ni", "adx", "rdpid"} <= cpu.target_features(archspec.cpu.TARGETS[name])
    assert "rdpid" not in cpu.target_features(archspec.cpu.TARGETS["zen"])


def test_the_scan_reads_arm64_and_skips_what_runs_as_a_no_op(tmp_path: Path) -> None:
    sve = compile_c(tmp_path, "arm64", VECTOR_LOOP, "-O3", "-march=armv8.2-a+sve")
    scan = isa.scan(sve.parent, [sve.name])
    assert scan.architecture == "arm64" and "sve" in scan.features
    # Branch protection's PACIASP and BTI sit in the hint space: no-ops on a CPU without them.
    hinted = compile_c(tmp_path, "arm64", VECTOR_LOOP, "-O2", "-mbranch-protection=standard")
    assert isa.scan(hinted.parent, [hinted.name]).features == {}


def test_the_scan_skips_scripts_and_refuses_two_architectures(tmp_path: Path) -> None:
    x86 = compile_c(tmp_path, "x86_64", VECTOR_LOOP, "-O2")
    (tmp_path / "run.sh").write_text("#!/bin/sh\nexec ./program-x86_64\n")
    assert isa.scan(tmp_path, ["run.sh", x86.name]).programs == [x86.name]
    assert isa.scan(tmp_path, ["run.sh"]).instructions == 0
    arm = compile_c(tmp_path, "arm64", VECTOR_LOOP, "-O2")
    with pytest.raises(isa.UserError, match="is arm64 code beside x86_64 code"):
        isa.scan(tmp_path, [x86.name, arm.name])


def test_a_cpu_runs_what_it_has_emulates_what_qemu_has_and_names_the_rest() -> None:
    icelake = cpu.Cpu.of_target("icelake", emulators=BOTH)
    assert cpu.verdict("x86_64", {"avx2", "avx512f"}, icelake) == cpu.Verdict("native")
    # A zen2 build that uses nothing an Icelake lacks runs there: no family name decides.
    assert cpu.verdict("x86_64", {"avx", "avx2"}, icelake).how == "native"
    spr_only = cpu.verdict("x86_64", {"amx_tile"}, icelake)
    assert spr_only.how == "no"
    assert spr_only.reason == "lacks amx_tile, and qemu-x86_64-static does not emulate amx_tile"
    assert spr_only.missing == ("amx_tile",)
    assert spr_only.naming({"amx_tile": "tilerelease", "avx2": "vpaddd"}).endswith(
        "(it uses amx_tile: tilerelease)"
    )
    graviton = cpu.verdict("arm64", {"sve"}, icelake)
    assert graviton.how == "emulated" and graviton.reason == "is x86_64, not arm64"
    assert graviton.emulator == "qemu-aarch64-static -cpu max -L /usr/aarch64-linux-gnu"
    old = cpu.Cpu.of_target("x86_64_v2", emulators=BOTH)
    avx2 = cpu.verdict("x86_64", {"avx2", "fma"}, old)
    assert avx2.how == "emulated" and avx2.emulator == "qemu-x86_64-static -cpu max"
    bare = cpu.Cpu.of_target("icelake")  # no QEMU installed
    assert cpu.verdict("arm64", set(), bare).reason == (
        "is x86_64, not arm64, and has no qemu-aarch64-static (install qemu-user-static)"
    )


@pytest.mark.parametrize("name", sorted(HOSTS))
def test_each_kind_of_machine_picks_a_family_whose_kernels_build_runs_there(
    name: str, tmp_path: Path
) -> None:
    machine = cpu.Cpu.of_target(name, emulators=BOTH)
    family_name, how = HOSTS[name]
    choices = cpu.families_for(machine)
    assert (choices[0].family.name, choices[0].verdict.how) == (family_name, how)
    assert pick_family(machine) == family_name  # what the suite's fixtures take there
    # The kernels built for that family, with this machine's compiler, run there: decided by
    # the instructions the build really uses.
    family = catalog.family(family_name)
    tuned = flags.for_family(family, gcc_version(family.architecture))
    program = compile_c(
        tmp_path, family.architecture, KERNELS, "-O3", "-fopenmp", *tuned.cflags.split()
    )
    needs = set(isa.scan(program.parent, [program.name]).features)
    assert needs <= cpu.predicted_needs(family)  # the prediction did not leave any out
    assert cpu.verdict(family.architecture, needs, machine).how == how


@pytest.mark.parametrize(
    ("name", "family"),
    [("zen2", "c5a"), ("zen3", "c6a"), ("zen4", "c7a"), ("sapphirerapids", "c7i")],
)
def test_a_virtual_machine_hiding_kernel_flags_still_takes_its_own_generation(
    name: str, family: str
) -> None:
    """A Genoa guest shows no pku or flush_l1d (archspec then names it x86_64_v4 or zen2): it
    was given c5a (zen2), as if older. A Rome guest without RDSEED was given c6a, a Sapphire
    Rapids guest without WAITPKG, CLDEMOTE or AMX c6i. Its own generation's family runs and
    comes first."""
    real = cpu.Cpu.of_target(name, emulators=BOTH)
    guest = replace(real, features=real.features - cpu.HIDDEN_BY_HYPERVISORS)
    assert guest.features != real.features  # the target has them: the case is real
    assert cpu.best_family(guest) == family
    assert cpu.families_for(guest)[0].verdict.how == "native"
    assert guest.microarchitecture == name  # as its runs are recorded, not x86_64_v4


def test_the_examples_family_runs_natively_on_any_x86_64_machine_with_avx2(tmp_path: Path) -> None:
    # examples/ benchmark c5a: its tuned kernels build (zen2) needs AVX2 and nothing newer, so
    # every x86-64 machine of the last eight years runs it natively on the local cloud.
    examples = recipes.RECIPES_DIR.parent / "examples"
    assert all('"c5a.large"' in p.read_text() for p in examples.glob("*.toml"))
    family = catalog.family("c5a")
    tuned = flags.for_family(family, gcc_version("x86_64"))
    program = compile_c(tmp_path, "x86_64", KERNELS, "-O3", "-fopenmp", *tuned.cflags.split())
    needs = set(isa.scan(program.parent, [program.name]).features)
    for name in ("haswell", "zen", "skylake", "icelake", "zen4", "sapphirerapids"):
        assert cpu.verdict("x86_64", needs, cpu.Cpu.of_target(name)).how == "native", name


@pytest.mark.parametrize("architecture", ["x86_64", "arm64"])
def test_qemu_emulates_the_features_the_catalog_says(architecture: str, tmp_path: Path) -> None:
    table = isa.data(architecture)
    qemu = shutil.which(table.qemu_binary)
    assert qemu, f"no {table.qemu_binary}: make install adds qemu-user-static"
    probe = compile_c(tmp_path, architecture, PROBES / f"{architecture}_features.c", "-O1")
    here = cpu.this_machine().architecture
    emulator = cpu.emulator_command(architecture, here).split()
    ran = subprocess.run([*emulator, str(probe)], check=True, capture_output=True, text=True)
    assert set(ran.stdout.split()) == table.qemu_features


def test_cpuinfo_is_read_with_linux_names_and_arm_vendors() -> None:
    graviton2 = cpu.Cpu.from_cpuinfo(
        "aarch64",
        "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc "
        "dcpop asimddp ssbs",
        vendor="0x41",
    )
    assert graviton2.architecture == "arm64" and graviton2.vendor == "ARM"
    assert graviton2.microarchitecture == "neoverse_n1"
    x86 = cpu.Cpu.from_cpuinfo("x86_64", "pni ssse3 sse4_1", vendor="GenuineIntel")
    assert "sse3" in x86.features and "pni" not in x86.features  # archspec's name


def test_families_host_lists_what_this_machine_runs_best_first(
    capsys: pytest.CaptureFixture[str], host: cpu.Cpu, host_family: str
) -> None:
    assert main(["families", "--host", "--first"]) == 0
    assert capsys.readouterr().out.strip() == host_family
    assert main(["families", "--host", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["family"] == host_family
    assert {r["runs"] for r in rows} <= {"native", "emulated"}
    assert main(["families", "--host"]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"this machine: {host.model or '?'} ({host.microarchitecture}")
    assert "the local cloud smoke-tests" in text and "it benchmarks natively:" in text
    assert main(["families", "--first"]) == 2
    assert "--first goes with --host" in capsys.readouterr().err
    # The other architecture's best, for cross builds: one QEMU runs (c7i's AVX-512 it does not).
    other = "arm64" if host.architecture == "x86_64" else "x86_64"
    assert main(["families", "--host", "--first", "--architecture", other]) == 0
    cross = capsys.readouterr().out.strip()
    assert cross == cpu.best_family(host, architecture=other)
    assert catalog.family(cross).architecture == other
    how = {c.family.name: c.verdict.how for c in cpu.families_for(host)}
    assert how[cross] == "emulated"
    assert main(["families", "--architecture", other]) == 2
    assert "--architecture goes with --host" in capsys.readouterr().err
