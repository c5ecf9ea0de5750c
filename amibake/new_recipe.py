"""`amibake recipe new NAME --from DIR|GIT_URL`: a recipe for a user's own source tree.

The recipe it writes is an ordinary one (recipe.toml and build.sh.j2 in the recipes folder):
its source is the directory (`source.path`, packed at each build, .gitignore respected, so the
tree's content hash is its cache key's source part) or a repository at a pinned commit
(`source.git` and `source.commit`, fetched here and cached). Its build script is the template
of the project's build system (amibake/build_templates/), copied beside the recipe so that the
user can adjust it and the recipe's hash covers it; each passes the family's flags the way its
build system takes them. Everything is checked before anything is written: a refusal leaves no
folder behind.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

from amibake import recipes, source_tree, sources
from amibake.errors import UserError

TEMPLATES = Path(__file__).resolve().parent / "build_templates"
BUILD_SYSTEMS = ("cmake", "make", "autotools", "custom")
# What tells a tree's build system, in the order looked for at its top.
MARKERS = (
    ("cmake", ("CMakeLists.txt",)),
    ("autotools", ("configure", "configure.ac", "configure.in")),
    ("make", ("GNUmakefile", "makefile", "Makefile")),
)
# Amazon Linux 2023's package for each language's compiler, and for each build system's tools.
COMPILERS = {"C": "gcc", "CXX": "gcc-c++", "Fortran": "gcc-gfortran"}
TOOLS = {"cmake": ["make", "cmake"], "make": ["make"], "autotools": ["make"], "custom": []}
BOOTSTRAP = ["autoconf", "automake", "libtool"]  # configure.ac without configure
SUFFIXES = {
    "C": {".c"},
    "CXX": {".cc", ".cpp", ".cxx", ".c++", ".C"},
    "Fortran": {".f", ".for", ".f90", ".f95", ".f03", ".f08", ".F", ".F90"},
}
_PROJECT = re.compile(r"\bproject\s*\(([^)]*)\)", re.IGNORECASE)


@dataclass(frozen=True)
class Written:
    name: str
    directory: Path
    build: str
    source: str  # the directory, or URL@commit
    packages: list[str]
    files: int  # how many files the source ships


def detect(names: list[Path]) -> str:
    """The build system of a tree, from the files at its top."""
    top = {str(n) for n in names if len(n.parts) == 1}
    for system, markers in MARKERS:
        if top & set(markers):
            return system
    return ""


def languages(tree: Path, names: list[Path], build: str) -> list[str]:
    """The languages whose compilers the build needs: C always (the family's flags are probed
    with gcc), C++ and Fortran by the sources' suffixes and, for CMake, by project(): a
    project() naming no language enables C and C++."""
    found = {"C"}
    for language, suffixes in SUFFIXES.items():
        if any(n.suffix in suffixes for n in names):
            found.add(language)
    if build == "cmake" and (tree / "CMakeLists.txt").is_file():
        for call in _PROJECT.findall((tree / "CMakeLists.txt").read_text(errors="replace")):
            words = set(call.replace("\n", " ").split())
            named = words & {"C", "CXX", "Fortran"}
            found |= named or {"C", "CXX"}
    return [language for language in COMPILERS if language in found]


def write(
    name: str,
    origin: str,
    *,
    root: Path,
    commit: str | None = None,
    build: str | None = None,
    artifacts: list[str] | None = None,
    results_dir: Path | None = None,
) -> Written:
    """Check everything, then write the recipe NAME in `root` for the tree at `origin`
    (amibake's `results_dir` is not part of it, where the tree holds it)."""
    recipes.check_name(name, root)
    target = root / name
    if target.exists():
        raise UserError(f"recipe {name} already exists in {root}: choose another name")
    if build is not None and build not in BUILD_SYSTEMS:
        raise UserError(f"--build {build}: choose one of {', '.join(BUILD_SYSTEMS)}")
    for artifact in artifacts or []:
        problem = recipes.artifact_problem(artifact)
        if problem:
            raise UserError(f"--artifact: {problem}")
    if source_tree.is_git_url(origin):
        if not commit:
            raise UserError(
                f"--from {origin}: a git URL is built at a pinned commit: add --commit SHA "
                "(the full 40-hex commit)"
            )
        if not source_tree.FULL_COMMIT.fullmatch(commit):
            raise UserError(f"--commit {commit}: give the full 40-hex commit (git rev-parse)")
        with tempfile.TemporaryDirectory(prefix="amibake-tree-") as scratch:
            tree = Path(scratch) / "tree"
            source_tree.export_commit(origin, commit, tree)
            names = source_tree.files(tree, gitignore=False)
            chosen, needs = _plan(tree, names, build, origin)
            sources.store_commit(commit, tree)  # the build finds it in the cache
        source = {"git": origin, "commit": commit}
        said = f"{origin}@{commit[:12]}"
    else:
        if commit:
            raise UserError(f"--commit goes with a git URL; --from {origin} is a directory")
        tree = Path(origin).expanduser().resolve()
        if not tree.exists():
            raise UserError(f"--from {origin}: no such directory")
        if not tree.is_dir():
            raise UserError(f"--from {origin}: not a directory (give the source tree's folder)")
        names = source_tree.files(tree, leave_out=results_dir)
        chosen, needs = _plan(tree, names, build, origin)
        source = {"path": str(tree)}
        said = str(tree)
    _write_files(target, name, said, source, chosen, needs, artifacts or [f"bin/{name}"])
    try:
        recipes.load(name, root)  # what was written loads, or nothing is left
    except UserError:
        shutil.rmtree(target, ignore_errors=True)
        raise
    return Written(name, target, chosen, said, needs, len(names))


def _plan(tree: Path, names: list[Path], build: str | None, origin: str) -> tuple[str, list[str]]:
    """The build system and the packages the base image must install for it."""
    if not names:
        raise UserError(
            f"--from {origin}: no files to build (the tree is empty, or .gitignore excludes "
            "everything)"
        )
    chosen = build or detect(names)
    if not chosen:
        raise UserError(
            f"--from {origin}: no CMakeLists.txt, configure(.ac) or Makefile at its top to tell "
            "the build system: give --build cmake|make|autotools, or --build custom and write "
            "the build script"
        )
    needs = [COMPILERS[language] for language in languages(tree, names, chosen)]
    needs += TOOLS[chosen]
    if chosen == "autotools" and Path("configure") not in names:  # what ships, not what is here
        needs += BOOTSTRAP
    return chosen, list(dict.fromkeys(needs))


def _toml(value: object) -> str:
    """A TOML value: strings as JSON writes them (a subset of TOML's basic strings)."""
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    return json.dumps(value)


def _write_files(
    target: Path,
    name: str,
    said: str,
    source: dict[str, str],
    build: str,
    needs: list[str],
    artifacts: list[str],
) -> None:
    if "git" in source:
        where = (
            "# A repository at a pinned commit: fetched on the controller (git), cached, and\n"
            "# uploaded as a tarball, so the build host needs no git.\n"
        )
    else:
        where = (
            "# The tree as it is when built: packed with .gitignore respected, and its content\n"
            "# hash is the build's cache key's source part (an edit builds anew).\n"
        )
    lines = [
        f"# Written by `amibake recipe new {name}`: {said}, built with {build} and the family's",
        "# flags. An ordinary recipe: edit it (artifacts, smoke test, bench command) as any other.",
        f"name = {_toml(name)}",
        f"description = {_toml(f'{name}: {said} ({build})')}",
        'architectures = ["x86_64", "arm64"]',
        f"packages = {_toml(needs)}  # what the base image installs to build it",
        "",
        "[source]",
        where.rstrip("\n"),
        *(f"{key} = {_toml(value)}" for key, value in source.items()),
        "",
        "[build]",
        f"# The {build} template of amibake/build_templates/, copied here to adjust if need be.",
        'template = "build.sh.j2"',
        "# Fixed flags every build gets; the family's target flags (-march/-mcpu) follow them.",
        'base_cflags = "-O3"',
        "# What the build installs under its prefix, scanned and packed into the artifact.",
        f"artifacts = {_toml(artifacts)}",
        "",
        "# [smoke]",
        f'# command = "{artifacts[0]} --version"  # run on the build host after the build',
        '# expect = "..."',
        "",
        "[bench]",
        "# What fleet bench runs; {args} is --args. Scored by its run time unless a metric says",
        '# otherwise: metric = { kind = "regex", pattern = "..." }',
        f"command = {_toml(artifacts[0] + ' {args}')}",
    ]
    target.parent.mkdir(parents=True, exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        scratch.chmod(0o755)  # mkdtemp's is the owner's alone: a recipe folder is not secret
        (scratch / "recipe.toml").write_text("\n".join(lines) + "\n")
        shutil.copyfile(TEMPLATES / f"{build}.sh.j2", scratch / "build.sh.j2")
        scratch.rename(target)  # whole or not at all
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
