"""Unpacking an archive that came from elsewhere (a build's output fetched from its instance, a
source tarball) so that nothing lands outside the directory it is unpacked into."""

from __future__ import annotations

import copy
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path

from amibake.errors import RemoteError


def unpack(tar: tarfile.TarFile, directory: Path) -> None:
    """Unpack `tar` as Python's "data" extraction filter does, also under a Python without
    filters (Debian 12's python3 is 3.11.2, a plain user's venv's; 3.11.4 added them): nothing
    outside `directory`, no link out of it, no device or FIFO, no setuid bit, files owned by the
    controller's user. The one way to unpack in amibake, its tests and benchmarks; the Batch
    agent's own copy (fleet/agent/s3.py) runs where only the standard library is."""
    label = os.fsdecode(os.path.basename(tar.name)) if tar.name else "the archive"
    if hasattr(tarfile, "data_filter"):
        try:
            tar.extractall(directory, filter="data")
        except tarfile.FilterError as error:  # one error, whichever Python refused it
            raise RemoteError(f"{label}: {error}") from None
    else:
        _extract_checked(tar, directory, label)
    _no_link_out(directory, label)


def _no_link_out(directory: Path, label: str) -> None:
    """Each member's link is checked as it is made, but links made later can carry an earlier
    one out: `a -> p/x/../..`, then `p -> .`, left `a` naming the directory's parent under
    both checks. Every link is read again once all are made; those that lead out are removed."""
    root = os.path.realpath(directory)
    out = []
    for here, dirs, names in os.walk(directory):
        for name in [*dirs, *names]:
            path = os.path.join(here, name)
            if os.path.islink(path):
                real = os.path.realpath(path)
                if real != root and not real.startswith(root + os.sep):
                    out.append(path)
    for path in out:
        os.unlink(path)
    if out:
        where = os.path.relpath(out[0], directory)
        raise RemoteError(f"{label}: {where!r} links outside {directory} through other links")


def _extract_checked(tar: tarfile.TarFile, directory: Path, label: str) -> None:
    root = os.path.realpath(directory)

    def inside(path: str) -> bool:
        real = os.path.realpath(os.path.join(root, path))
        return real == root or real.startswith(root + os.sep)

    def checked() -> Iterator[tarfile.TarInfo]:
        # One member at a time, as extraction reaches it: a path through a link that an
        # earlier member made resolves to where that link really points.
        for member in tar:
            name = member.name
            if os.path.isabs(name) or not inside(name):
                raise RemoteError(f"{label}: {name!r} lies outside {directory}")
            if member.issym() or member.islnk():
                base = os.path.dirname(name) if member.issym() else ""
                if os.path.isabs(member.linkname) or not inside(
                    os.path.join(base, member.linkname)
                ):
                    raise RemoteError(f"{label}: {name!r} links outside {directory}")
            elif not (member.isfile() or member.isdir()):
                raise RemoteError(f"{label}: {name!r} is a device or FIFO")
            member = copy.copy(member)
            member.mode &= 0o755  # no setuid, setgid or sticky bit, no group or other write
            member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
            yield member

    tar.extractall(directory, members=checked())
