"""The controller's source cache, keyed by sha256: a source is checked once, uploaded as is.

A directory is packed (amibake.recipes.pack_directory) each time it is resolved, so an edit to
the tree is a new sha256, hence a new build. A git commit is fetched and packed once: the
commit names its content, and `git-<commit>` in the cache says which tarball it became.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from amibake import source_tree
from amibake.config import cache_home
from amibake.errors import UserError
from amibake.recipes import Recipe, available, load, pack_directory


def cache_dir() -> Path:
    path = Path(os.environ.get("AMIBAKE_SOURCE_CACHE", cache_home() / "amibake" / "sources"))
    path.mkdir(parents=True, exist_ok=True)
    return path


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as handle:
        for chunk in iter(lambda: handle.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


@dataclass(frozen=True)
class Source:
    path: Path  # in the cache, named by its sha256
    sha256: str
    filename: str  # the name the build script sees


def resolve(recipe: Recipe, results_dir: Path | None = None) -> Source:
    """The recipe's source, in the cache: packed from its directory (amibake's `results_dir`
    left out where the tree holds it), or one of its archives."""
    if recipe.source_path is not None:
        target, digest = store(pack_directory(recipe.source_path, leave_out=results_dir))
        return Source(target, digest, f"{recipe.name}-src.tar.gz")
    if recipe.git_url:
        target, digest = from_git(recipe.git_url, recipe.git_commit)
        return Source(target, digest, f"{recipe.name}-src.tar.gz")
    for archive in recipe.archives:
        cached = cache_dir() / archive.sha256
        if cached.exists():
            return Source(cached, archive.sha256, archive.filename)
    names = ", ".join(a.filename for a in recipe.archives)
    raise UserError(
        f"recipe {recipe.name}: no accepted source archive in the cache ({names}); get one and "
        f"run `amibake source add FILE`"
    )


def store(data: bytes) -> tuple[Path, str]:
    """Put packed bytes in the cache under their sha256; the path and the sha256."""
    digest = hashlib.sha256(data).hexdigest()
    target = cache_dir() / digest
    if not target.exists():
        tmp = target.with_suffix(f".{os.getpid()}.part")
        tmp.write_bytes(data)
        tmp.replace(target)
    return target, digest


def store_commit(commit: str, tree: Path) -> tuple[Path, str]:
    """Pack a commit's exported tree (as committed: no .gitignore applied) into the cache, and
    remember which tarball the commit became."""
    target, digest = store(pack_directory(tree, gitignore=False))
    marker = cache_dir() / f"git-{commit}"
    part = marker.with_name(f"{marker.name}.{os.getpid()}.part")
    part.write_text(digest + "\n")
    part.replace(marker)
    return target, digest


def from_git(url: str, commit: str) -> tuple[Path, str]:
    """The packed tree of a commit: from the cache, else fetched from `url` on this machine."""
    marker = cache_dir() / f"git-{commit}"
    if marker.exists():
        digest = marker.read_text().strip()
        if (cache_dir() / digest).exists():
            return cache_dir() / digest, digest
    with tempfile.TemporaryDirectory(prefix="amibake-tree-") as scratch:
        tree = Path(scratch) / "tree"
        source_tree.export_commit(url, commit, tree)
        return store_commit(commit, tree)


def add(file: Path) -> tuple[Source, list[str]]:
    """Check a file against every recipe's accepted archives and store it; say which recipes."""
    if file.is_dir():
        raise UserError(f"{file} is a directory; give the source archive itself (FILE.tar.gz)")
    if not file.is_file():
        raise UserError(f"{file}: no such file")
    try:
        digest = sha256_of(file)
    except OSError as exc:  # a file without read permission ended in a traceback
        raise UserError(f"{file}: cannot read it ({exc.strerror}); make it readable") from None
    matches = []
    for name in available():
        recipe = load(name)
        for archive in recipe.archives:
            if archive.sha256 == digest:
                matches.append((recipe.name, archive))
    if not matches:
        raise UserError(
            f"{file}: sha256 {digest} matches no accepted source of any recipe; refusing to cache "
            "it (check the download, or add its sha256 to the recipe)"
        )
    target = cache_dir() / digest
    if not target.exists():
        # A part of this process's own: two processes adding one archive at once (parallel
        # test workers, two shells) must not write into one file, one renaming it half done.
        part = target.with_suffix(f".{os.getpid()}.part")
        shutil.copyfile(file, part)
        part.replace(target)
    return Source(target, digest, matches[0][1].filename), [name for name, _ in matches]
