"""The install command a host runs for a recipe's packages: what it does with dnf, yum and rpm
present or missing, run here against stand-ins for them."""

from __future__ import annotations

import subprocess
from pathlib import Path

from amibake import packages


def _run(
    tmp_path: Path, tools: dict[str, str], names: list[str]
) -> subprocess.CompletedProcess[str]:
    """The command under bash with only `tools` (name -> script body) and the basics on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in tools.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (tmp_path / "calls").touch()
    return subprocess.run(
        ["/bin/bash", "-euo", "pipefail", "-c", packages.install_command(names)],
        env={"PATH": str(bin_dir), "CALLS": str(tmp_path / "calls")},
        capture_output=True,
        text=True,
    )


def _calls(tmp_path: Path) -> list[str]:
    return (tmp_path / "calls").read_text().splitlines()


RECORD = 'echo "${0##*/} $*" >> "$CALLS"'


def test_nothing_to_install_is_a_no_op() -> None:
    assert packages.install_command([]) == ":"


def test_missing_packages_are_installed_with_dnf_once_each(tmp_path: Path) -> None:
    done = _run(tmp_path, {"rpm": f"{RECORD}; exit 1", "dnf": RECORD}, ["gcc", "xz", "gcc"])
    assert done.returncode == 0, done.stderr
    assert _calls(tmp_path) == ["rpm -q gcc xz", "dnf install -y -q gcc xz"]


def test_installed_packages_skip_dnf_and_its_metadata(tmp_path: Path) -> None:
    done = _run(tmp_path, {"rpm": RECORD, "dnf": RECORD}, ["gcc"])
    assert done.returncode == 0, done.stderr
    assert _calls(tmp_path) == ["rpm -q gcc"]


def test_yum_where_there_is_no_dnf(tmp_path: Path) -> None:
    done = _run(tmp_path, {"yum": RECORD}, ["gcc"])
    assert done.returncode == 0, done.stderr
    assert _calls(tmp_path) == ["yum install -y -q gcc"]


def test_no_package_manager_or_a_failed_install_says_which_packages(tmp_path: Path) -> None:
    none = _run(tmp_path, {}, ["gcc", "libgomp"])
    assert none.returncode == 3
    assert none.stderr.strip() == "no dnf or yum here to install gcc libgomp"
    failing = tmp_path / "failing"
    failing.mkdir()
    refused = _run(failing, {"dnf": "echo 'No match for argument: gcc' >&2; exit 1"}, ["gcc"])
    assert refused.returncode == 3
    assert refused.stderr.strip().splitlines() == [
        "No match for argument: gcc",
        "dnf could not install gcc",
    ]


def test_an_optional_package_that_cannot_be_installed_is_said_and_passed(tmp_path: Path) -> None:
    # psutil for fleet's monitor: without it the replicates still run, unmonitored.
    script = packages.install_command(["python3-psutil"], optional=True) + "\necho went on"
    done = subprocess.run(
        ["/bin/bash", "-euo", "pipefail", "-c", script],
        env={"PATH": str(tmp_path)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "went on\n"
    assert done.stderr.strip() == "no dnf or yum here to install python3-psutil"
