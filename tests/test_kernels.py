"""The kernels suite itself: a build is verified by its checksums, so every flag set must compute
bit-identical results at every size, and the throughput must come from enough repetitions."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from amibake import recipes

LINE = re.compile(r"kernel=(\w+) checksum=(\S+) seconds=(\S+) throughput=\S+")


def build(tmp_path: Path, name: str, flags: str) -> Path:
    source = recipes.load("kernels").source_path
    assert source is not None
    binary = tmp_path / name
    subprocess.run(
        ["gcc", "-ffp-contract=off", "-fopenmp", *flags.split(), "-o", str(binary),
         str(source / "kernels.c"), "-lm"],
        check=True,
    )  # fmt: skip
    return binary


def run(binary: Path, *args: str) -> dict[str, tuple[str, float]]:
    done = subprocess.run([str(binary), *args], capture_output=True, text=True)
    assert done.returncode == 0, f"{binary.name} {' '.join(args)}: {done.stderr.strip()}"
    out = done.stdout
    return {name: (checksum, float(seconds)) for name, checksum, seconds in LINE.findall(out)}


def test_checksums_are_identical_across_flags_at_the_default_and_a_large_size(
    tmp_path: Path,
) -> None:
    """-O2 and -O3 once disagreed on the stencil at the default size: its input used a signed
    int overflow (undefined behaviour, so each optimisation level computed its own input). The
    sanitizer build turns any such overflow into a failure."""
    builds = {
        flags: build(tmp_path, f"k{i}", flags)
        for i, flags in enumerate(
            ["-O2", "-O3 -march=native -funroll-loops", "-O1 -fsanitize=undefined "
             "-fno-sanitize-recover=all"]
        )
    }  # fmt: skip
    for size in ("1", "4"):
        outputs = {
            flags: {k: c for k, (c, _) in run(b, "--size", size, "--min-time", "0").items()}
            for flags, b in builds.items()
        }
        first = next(iter(outputs.values()))
        assert sorted(first) == ["matmul", "nbody", "sieve", "stencil"]
        assert all(o == first for o in outputs.values()), (size, outputs)


def test_each_kernel_repeats_until_the_minimum_time(tmp_path: Path) -> None:
    binary = build(tmp_path, "k", "-O2")
    timed = run(binary, "--quick", "--min-time", "0.2")
    assert all(seconds >= 0.2 for _, seconds in timed.values()), timed
    once = run(binary, "--quick")  # --quick alone: one pass each, for smoke runs
    assert all(seconds < 0.2 for _, seconds in once.values()), once
    assert {k: c for k, (c, _) in once.items()} == {k: c for k, (c, _) in timed.items()}


@pytest.mark.parametrize("bad", [["--min-time", "-1"], ["--block", "0"], ["--nope"]])
def test_bad_arguments_exit_2_with_a_message(tmp_path: Path, bad: list[str]) -> None:
    binary = build(tmp_path, "k", "-O2")
    done = subprocess.run([str(binary), *bad], capture_output=True, text=True)
    assert done.returncode == 2 and done.stderr.startswith("kernels: "), done
