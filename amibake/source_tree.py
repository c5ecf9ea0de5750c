"""A user's source tree as a build source: the files it ships, and a git commit as such a tree.

What ships is what git would commit: in a git work tree, git itself says so (tracked files, and
untracked ones no .gitignore excludes); elsewhere the tree's .gitignore files are read with
pathspec's gitignore matcher, each applying below its own directory, deeper ones last, as git
reads them. Build outputs, editor files and a checkout's junk never reach the instance, and
never change the content hash a build is cached under.

A git URL is fetched here, on the controller, at one pinned commit, and exported as a plain
tree (`git archive`), so the build host needs no git and no access to the repository.
"""

from __future__ import annotations

import os
import re
import subprocess
import tarfile
import tempfile
from pathlib import Path
from typing import NoReturn

import pathspec

from amibake.archive import unpack
from amibake.errors import RemoteError, UserError

FULL_COMMIT = re.compile(r"[0-9a-f]{40}")
# What git takes as a remote: a URL of its transports, or scp-like user@host:path.
_GIT_URL = re.compile(r"^(?:(?:https?|git|ssh|git\+ssh|file)://|[\w.-]+@[\w.-]+:)")
# A fetch that failed because the commit is not in the repository, as upload-pack words it.
_NOT_THERE = ("not our ref", "couldn't find remote ref", "no such remote ref")
# A server that serves advertised refs only: fetch them all, then look for the commit.
_REFS_ONLY = ("unadvertised object", "not allow")
GIT_TIMEOUT_S = 900
# What git would commit: tracked files, and untracked ones that no ignore rule excludes.
_LIST_FLAGS = ("--cached", "--others", "--exclude-standard")
# Never ask for a password or a host key on a terminal: a fetch either works or says why.
_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_SSH_COMMAND": "ssh -o BatchMode=yes"}


def is_git_url(text: str) -> bool:
    return bool(_GIT_URL.match(text))


def files(directory: Path, *, gitignore: bool = True, leave_out: Path | None = None) -> list[Path]:
    """The files of the tree that ship, relative to it, sorted; .gitignore respected unless
    told otherwise (a tree git exported is already exactly what was committed). A symbolic
    link ships as a link, whatever it points to: a link to a directory (include -> src) was
    left out, and the build failed on the instance for a header it did not have.

    `leave_out` (amibake's results folder) never ships, ignored or not: a tree built from
    where amibake runs (`--from .`) shipped its database, logs, artifacts and a kept run's
    private keys to every build host, and hashed anew at every run, so never built from cache."""
    if not gitignore:
        listed = [p.relative_to(directory) for p in directory.rglob("*")]
    else:
        found = _git_listed(directory)
        listed = found if found is not None else _matched(directory)
    outside = _relative(leave_out, directory) if leave_out is not None else None
    shipped = sorted(
        p
        for p in listed
        if _ships(directory / p) and (outside is None or not p.is_relative_to(outside))
    )
    for name in shipped:
        # A link ships as a link: one leading out of the tree arrives dangling on the build
        # host (its headers missing there), as a git commit's such link is refused.
        if (directory / name).is_symlink() and _relative(directory / name, directory) is None:
            raise UserError(
                f"{directory}: {name} links outside the tree (to {os.readlink(directory / name)})"
                ": a build source's links must stay in its tree: copy what it names into the "
                "tree, or link within it"
            )
    return shipped


def _relative(path: Path, directory: Path) -> Path | None:
    """`path` relative to `directory` when it is inside it (both resolved), else None."""
    try:
        return path.resolve().relative_to(directory.resolve())
    except ValueError:
        return None


def _ships(path: Path) -> bool:
    return path.is_symlink() or path.is_file()


def _git_listed(directory: Path) -> list[Path] | None:
    """What git would commit under `directory`, when it is in a git work tree (else None)."""
    try:
        inside = subprocess.run(
            ["git", "-C", str(directory), "rev-parse", "--is-inside-work-tree"],
            capture_output=True,
            text=True,
        )
        if inside.returncode != 0 or inside.stdout.strip() != "true":
            return None
        listed = subprocess.run(
            ["git", "-C", str(directory), "ls-files", "-z", *_LIST_FLAGS],
            capture_output=True,
            check=True,
        )
    except (FileNotFoundError, subprocess.CalledProcessError):
        return None  # no git here, or one that will not read this tree: match by hand
    found: list[Path] = []
    for name in filter(None, listed.stdout.split(b"\0")):
        entry = Path(os.fsdecode(name))
        here = directory / entry
        if not here.is_dir() or here.is_symlink():
            found.append(entry)
            continue
        # git lists a directory only as a submodule (a gitlink): its files are what it has
        # checked out, as its own work tree says. They were left out without a word.
        inner = _git_listed(here) if (here / ".git").exists() else None
        if not inner:
            raise UserError(
                f"{here}: a git submodule that is not checked out, so its files cannot ship: "
                f"run `git -C {directory} submodule update --init {entry}`"
            )
        found += [entry / p for p in inner]
    return found


def _matched(directory: Path) -> list[Path]:
    """The tree's files less those its .gitignore files exclude (git's rules: a pattern is
    relative to the file's directory, a deeper file overrides, an excluded directory's files
    stay excluded whatever a later pattern says)."""
    specs: dict[str, pathspec.GitIgnoreSpec] = {}
    kept: list[Path] = []

    def unreadable(error: OSError) -> NoReturn:
        # os.walk skips a directory it cannot list: its files went missing unsaid, and a tree
        # that could not be read at all was "empty, or .gitignore excludes everything".
        where = Path(str(error.filename))
        hint = "" if where == directory else f", or list it in {directory}/.gitignore"
        raise UserError(f"{where}: cannot read it ({error.strerror}); make it readable{hint}")

    for here, dirs, names in os.walk(directory, onerror=unreadable):
        rel = Path(here).relative_to(directory).as_posix()
        rel = "" if rel == "." else rel
        ignore_file = Path(here) / ".gitignore"
        if ignore_file.is_file():
            try:
                lines = ignore_file.read_text(errors="replace").splitlines()
            except OSError as exc:
                unreadable(exc)
            specs[rel] = pathspec.GitIgnoreSpec.from_lines(lines)
        # The .gitignore files above and at this directory, shallowest first.
        applying = sorted(
            (base for base in specs if base == "" or rel == base or rel.startswith(base + "/")),
            key=lambda base: base.count("/") + (base != ""),
        )

        def ignored(path: str, is_dir: bool, applying: list[str] = applying) -> bool:
            verdict = False
            for base in applying:
                inner = path[len(base) + 1 :] if base else path
                result = specs[base].check_file(inner + ("/" if is_dir else ""))
                if result.include is not None:
                    verdict = result.include
            return verdict

        def joined(name: str, rel: str = rel) -> str:
            return f"{rel}/{name}" if rel else name

        # os.walk lists a link to a directory among the directories and does not enter it:
        # it ships as the link it is
        links = [d for d in dirs if (Path(here) / d).is_symlink()]
        dirs[:] = sorted(
            d for d in dirs if d != ".git" and d not in links and not ignored(joined(d), True)
        )
        kept += [Path(joined(n)) for n in [*names, *links] if not ignored(joined(n), False)]
    return kept


def _git(args: list[str], cwd: Path) -> subprocess.CompletedProcess[bytes]:
    try:
        return subprocess.run(
            ["git", *args],
            cwd=cwd,
            capture_output=True,
            env={**os.environ, **_GIT_ENV},
            timeout=GIT_TIMEOUT_S,
        )
    except FileNotFoundError:
        raise UserError("git is not installed here: a git source is fetched by git") from None
    except subprocess.TimeoutExpired:
        raise UserError(
            f"git {args[0]} took over {GIT_TIMEOUT_S} s: is the repository reachable?"
        ) from None


def _said(result: subprocess.CompletedProcess[bytes]) -> str:
    lines = [line.strip() for line in result.stderr.decode(errors="replace").splitlines()]
    return next((line for line in reversed(lines) if line), f"exit {result.returncode}")


def export_commit(url: str, commit: str, into: Path) -> None:
    """The tree of `commit` of the repository at `url`, written into the directory `into`."""
    if not FULL_COMMIT.fullmatch(commit):
        raise UserError(f"--commit {commit}: give the full 40-hex commit to build")
    with tempfile.TemporaryDirectory(prefix="amibake-git-") as scratch:
        repo = Path(scratch)
        _git(["init", "-q", "--bare", "."], repo)
        fetched = _git(["fetch", "-q", "--depth", "1", "--", url, commit], repo)
        said = _said(fetched).lower()
        if fetched.returncode != 0 and any(words in said for words in _REFS_ONLY):
            # The server serves named refs only: take them all, then look for the commit.
            everything = ["+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"]
            fetched = _git(["fetch", "-q", "--", url, *everything], repo)
            if fetched.returncode == 0:
                found = _git(["cat-file", "-e", f"{commit}^{{commit}}"], repo)
                said = "not our ref" if found.returncode else ""
                fetched = found
        if fetched.returncode != 0:
            if any(words in said for words in _NOT_THERE):
                raise UserError(f"commit {commit} is not in {url}: check --commit")
            raise UserError(f"git fetch {url} failed: {_said(fetched)}")
        archive = repo / "tree.tar"
        exported = _git(["archive", "--format=tar", f"--output={archive}", commit], repo)
        if exported.returncode != 0:
            raise UserError(f"git archive {commit} of {url} failed: {_said(exported)}")
        into.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive) as tar:
            try:
                unpack(tar, into)
            except RemoteError as error:  # a symlink out of the tree
                raise UserError(
                    f"{url} at {commit}: {error}; a build source's links must stay in its tree"
                ) from None
