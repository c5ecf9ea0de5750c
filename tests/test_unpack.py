"""Unpacking archives that came from an instance (the build's output) or from S3 (a Batch job's
payload), on a Python without tarfile's extraction filters (Debian 12's python3 is 3.11.2, the
instances' and a plain user's venv's): the fallback refuses what the "data" filter refuses, and
strips what it strips. Both copies (amibake's, and the agent's standard-library one) are held to
the same cases; with filters present, the filter itself is held to them too."""

from __future__ import annotations

import io
import os
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from amibake.archive import unpack
from amibake.errors import RemoteError
from fleet.agent.s3 import extract

Unpack = Callable[[tarfile.TarFile, Path], None]
UNPACKERS: dict[str, Unpack] = {
    "amibake": unpack,
    "agent": lambda tar, directory: extract(tar, str(directory)),
}


def _archive(*members: tuple[tarfile.TarInfo, bytes]) -> tarfile.TarFile:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    buffer.seek(0)
    return tarfile.open(fileobj=buffer)


def _file(name: str, mode: int = 0o644, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size, info.mode = len(data), mode
    return info, data


def _link(name: str, target: str, kind: bytes = tarfile.SYMTYPE) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname = kind, target
    return info, b""


def _dir(name: str) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.mode = tarfile.DIRTYPE, 0o755
    return info, b""


def _device(name: str) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type, info.devmajor, info.devminor = tarfile.CHRTYPE, 1, 3
    return info, b""


REFUSED = {
    "parent": [_file("../escaped")],
    "absolute": [_file("/tmp/absolute-from-tar")],
    "symlink-out": [_link("link", "/etc")],
    "relative-symlink-out": [_file("a/keep"), _link("a/link", "../../outside")],
    "hardlink-out": [_link("hard", "/etc/passwd", tarfile.LNKTYPE)],
    "through-a-link": [_link("up", ".."), _file("up/escaped")],
    # each link inside as it is made; `a` leads out once `p` exists
    "out-through-a-later-link": [_link("a", "p/x/../.."), _dir("x"), _link("p", ".")],
    "device": [_device("null")],
}


@pytest.fixture(params=["fallback", "filter"])
def python(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """A Python without extraction filters (3.11.2), and this one's filter where it has one."""
    if request.param == "fallback":
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python has no extraction filters: the fallback case covers it")
    return str(request.param)


@pytest.mark.parametrize("case", sorted(REFUSED))
@pytest.mark.parametrize("unpacker", sorted(UNPACKERS))
def test_what_would_land_outside_or_is_a_device_is_refused(
    case: str, unpacker: str, python: str, tmp_path: Path
) -> None:
    target = tmp_path / "into"
    target.mkdir()
    if case == "absolute" and python == "filter":
        # The data filter strips the leading slash: the file lands inside, which is as safe.
        UNPACKERS[unpacker](_archive(*REFUSED[case]), target)
        assert (target / "tmp" / "absolute-from-tar").is_file()
    else:
        with pytest.raises((tarfile.TarError, RemoteError)):
            UNPACKERS[unpacker](_archive(*REFUSED[case]), target)
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "outside").exists()
    # and no link that leads out is left behind
    for link in (p for p in target.rglob("*") if p.is_symlink()):
        assert link.resolve().is_relative_to(target.resolve()), link
    assert not Path("/tmp/absolute-from-tar").exists()


@pytest.mark.parametrize("unpacker", sorted(UNPACKERS))
def test_setuid_and_shared_write_bits_are_stripped_and_files_are_the_unpackers(
    unpacker: str, python: str, tmp_path: Path
) -> None:
    tar = _archive(
        _file("bin/tool", 0o4777, b"#!/bin/sh\n"),
        _file("data.txt", 0o666),
        _link("bin/alias", "tool"),
    )
    UNPACKERS[unpacker](tar, tmp_path)
    tool = tmp_path / "bin" / "tool"
    assert tool.stat().st_mode & 0o7777 == 0o755
    assert (tmp_path / "data.txt").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "bin" / "alias").resolve() == tool.resolve()  # a link inside stays
    assert tool.stat().st_uid == os.getuid()


def test_nothing_else_unpacks_an_archive_by_itself() -> None:
    """One way to unpack: five end-to-end tests once called extractall(filter="data") of their
    own and failed with a TypeError under Debian 12's python3, a plain user's venv's. The local
    cloud's image layers are the one other (a root filesystem: owners, modes and links kept)."""
    root = Path(__file__).resolve().parents[1]
    allowed = {"amibake/archive.py", "fleet/agent/s3.py", "amibake/local/container_runtime.py"}
    allowed.add("tests/test_unpack.py")  # this test names what it looks for
    found = [
        f"{path.relative_to(root)}:{number}"
        for top in ("amibake", "fleet", "tests", "benchmarks")
        for path in sorted((root / top).rglob("*.py"))
        if str(path.relative_to(root)) not in allowed
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if ".extractall(" in line or 'filter="data"' in line
    ]
    assert not found, f"unpack with amibake.archive.unpack instead: {found}"
