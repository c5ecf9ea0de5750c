"""Recipes: ``build_recipes/<app>/recipe.toml`` and the files beside it.

A recipe names its source (a local path, archives each with a sha256, or a git URL at a pinned
commit), the packages its
build needs and those its artifact needs to run (amibake.packages installs them), the build
script template, the artifact paths, a smoke test and how to benchmark it.
Errors name the file (and the line, where TOML gives one).
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amibake import checks, packages, render, source_tree, tomlfile
from amibake.catalog import ARCHITECTURES
from amibake.errors import UnknownNameError, UserError, did_you_mean

RECIPES_DIR = Path(__file__).resolve().parent.parent / "build_recipes"
# {NAME} in a bench command: a parameter of [bench.parameters], filled with its value when the
# workload runs; {args} is the free-form rest (fleet's --args, a tune's other run parameters).
_PLACEHOLDER = re.compile(r"\{(\w+)\}")
# What a [bench.parameters] entry's kind may be: the kinds of value the workload takes, which a
# tune file's parameter of that name must match (fleet.space has the same four).
PARAMETER_KINDS = ("int", "uniform", "loguniform", "categorical")
PARAMETER_KEYS = ("kind", "default", "low", "high", "values")
PARAMETER_BOUNDS = ("default", "low", "high")  # numbers, but a categorical's default
# [bench] metric: fleet reads its values (fleet.spec.metric_from); a misspelt key was read as
# absent (aggregate = "last", the default unit) without a word.
METRIC_KEYS = ("kind", "pattern", "meaning", "aggregate", "unit")
SOURCE_KEYS = ("path", "archives", "git", "commit")
# The keys of each table: a misspelt one (base_cflag, comand) was read as absent, and the build
# ran at -O2 with no smoke test, without a word.
TABLE_KEYS = {
    "build": ("template", "base_cflags", "artifacts", "tmpfs_max_mb", "dispatched"),
    "smoke": ("command", "expect"),
    "bench": ("command", "metric", "parameters"),
}
ARCHIVE_KEYS = ("filename", "sha256", "url")
# A compiler flag as build templates take base_cflags: a plain word (checks.shell_words). They
# write the flags into the script as words (`{{ cc }} {{ base_cflags }} ...`) and inside double
# quotes (`flags="{{ base_cflags }} {{ cflags }}"`): a quote, a $ or a ; there split the flags or
# ran as shell (-DVERSION="1.2 beta" ended in "beta: command not found").
# An archive's file name, as the build host's work directory receives it: a name, never a path.
_FILE_NAME = re.compile(r"[A-Za-z0-9_+~][A-Za-z0-9._+~-]*")


@dataclass(frozen=True)
class Archive:
    filename: str
    sha256: str
    url: str = ""


@dataclass(frozen=True)
class Recipe:
    name: str
    directory: Path
    description: str
    architectures: tuple[str, ...]
    packages: tuple[str, ...]  # the build host's, beside the runtime ones
    template: str
    base_cflags: str
    artifacts: tuple[str, ...]
    tmpfs_max_mb: int | None
    source_path: Path | None
    archives: tuple[Archive, ...]
    smoke_command: str
    smoke_expect: str
    bench: dict[str, Any] = field(default_factory=dict)
    runtime_packages: tuple[str, ...] = ()  # every host that runs the artifact
    # [bench.parameters]: what the workload takes, with each one's default (None: none given).
    bench_defaults: dict[str, Any] = field(default_factory=dict)
    # build.dispatched: CPU features the artifact's code uses only after checking at run time
    # that the CPU has them (zstd's BMI2 paths): found by the ISA scan, but not needed to run.
    dispatched: tuple[str, ...] = ()
    # source.git and source.commit: a repository fetched on the controller at that commit.
    git_url: str = ""
    git_commit: str = ""

    @property
    def placeholders(self) -> list[str]:
        """The parameters written into the bench command as {NAME}, in order."""
        found = _PLACEHOLDER.findall(str(self.bench.get("command", "")))
        return list(dict.fromkeys(n for n in found if n != "args"))

    def bench_values(self, chosen: dict[str, Any] | None = None) -> dict[str, str]:
        """What fills each {NAME} of the bench command: its value in `chosen`, else its
        default."""
        chosen = chosen or {}
        return {n: str(chosen.get(n, self.bench_defaults[n])) for n in self.placeholders}

    @property
    def build_packages(self) -> list[str]:
        """What the build host installs: amibake's tools, the build's and the artifact's
        packages (the smoke test runs the artifact there)."""
        return list(dict.fromkeys([*packages.BUILD_TOOLS, *self.packages, *self.runtime_packages]))

    @property
    def file(self) -> Path:
        return self.directory / "recipe.toml"

    def digest(self) -> str:
        """Hash of what defines the build: the recipe file, its template and every template
        that one includes (an edit to an included file reused the stale artifact)."""
        h = hashlib.sha256()
        for path in (self.file, *render.referenced(self.directory / self.template)):
            name = path.relative_to(self.directory).as_posix()
            h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
        return h.hexdigest()


def artifact_problem(artifact: object) -> str:
    """Why a path cannot be an artifact (a path under the build's install prefix), or ''. An
    absolute one or one with .. was scanned from the controller's own files."""
    if not isinstance(artifact, str) or not artifact:
        return f"{artifact!r} is not a path"
    path = Path(artifact)
    if path.is_absolute() or ".." in path.parts:
        return f"{artifact!r} is not a path under the install prefix, e.g. bin/x"
    return ""


def available(root: Path = RECIPES_DIR) -> list[str]:
    return sorted(p.parent.name for p in root.glob("*/recipe.toml"))


def check_name(name: str, root: Path = RECIPES_DIR) -> None:
    """A recipe is named, never given by path: a folder of the recipes directory. Its name goes
    into paths here and on instances (results/artifacts/NAME_FAMILY.tar.xz, /tmp/NAME-build)."""
    problem = checks.plain_name(name)
    if problem:
        raise UserError(f"recipe {problem}: a recipe is the name of a folder in {root}")


def _with_nul(value: Any, where: str = "") -> list[str]:
    """The keys (dotted) of every text in a recipe's data that holds a NUL."""
    if isinstance(value, str):
        return [where] if "\x00" in value else []
    if isinstance(value, dict):
        return [f for k, v in value.items() for f in _with_nul(v, f"{where}.{k}".lstrip("."))]
    if isinstance(value, list):
        return [f for i, v in enumerate(value) for f in _with_nul(v, f"{where}[{i}]")]
    return []


def load(name: str, root: Path = RECIPES_DIR) -> Recipe:
    check_name(name, root)
    directory = root / name
    path = directory / "recipe.toml"
    if not tomlfile.present(path):
        raise UnknownNameError("recipe", name, available(root), f"recipes live in {root}")
    _, data = tomlfile.read(path, "recipe")
    problems: list[str] = []
    if "name" in data and data["name"] != name:
        problems.append(
            f"name {data['name']!r} must be the recipe's folder name {name!r} (its artifacts "
            "and the paths on instances are named after it)"
        )

    def need(table: dict[str, Any], key: str, kind: type, where: str) -> Any:
        value = table.get(key)
        if not isinstance(value, kind):
            problems.append(f"{where}{key} must be {kind.__name__}")
            return kind()
        return value

    known = {
        "name",
        "description",
        "architectures",
        "packages",
        "runtime_packages",
        "source",
        "build",
        "smoke",
        "bench",
    }
    problems += [f"unknown key {k!r}{did_you_mean(k, known)}" for k in data if k not in known]
    # A path or a command with a NUL in it (TOML's \u0000) failed deep inside with "embedded
    # null byte": no file name, argument or shell word holds one.
    nul = [f"{where} has a NUL character (\\u0000)" for where in _with_nul(data)]
    if nul:
        raise UserError(f"{path}: " + "; ".join(nul))
    source = need(data, "source", dict, "")
    build = need(data, "build", dict, "")
    smoke = data.get("smoke", {})
    if not isinstance(smoke, dict):
        problems.append('smoke must be a table: [smoke] command = "...", expect = "..."')
        smoke = {}
    for table, given in (("build", build), ("smoke", smoke), ("bench", data.get("bench", {}))):
        keys = TABLE_KEYS[table]
        if isinstance(given, dict):  # bench's own type is refused below
            problems += [
                f"{table}: unknown key {k!r}{did_you_mean(k, keys)}" for k in given if k not in keys
            ]
    architectures = tuple(need(data, "architectures", list, ""))
    if isinstance(data.get("architectures"), list) and not architectures:
        problems.append(f"architectures lists none: name {' or '.join(ARCHITECTURES)}, or both")
    for table, given in (("smoke", smoke), ("bench", data.get("bench", {}))):
        for key in ("command", "expect"):
            if isinstance(given, dict) and key in given and not isinstance(given[key], str):
                # A list ran as its Python text ("['bin/x']"), a number as "5".
                problems.append(f'{table}.{key} must be a string, e.g. {key} = "bin/x --n 4"')
    for arch in architectures:
        if arch not in ARCHITECTURES:
            problems.append(f"architectures: {arch!r} is not one of {', '.join(ARCHITECTURES)}")
    template = need(build, "template", str, "build.")
    inside = (directory / template).resolve().is_relative_to(directory.resolve())
    if template and not inside:
        problems.append(f"build.template: {template} is not inside the recipe's folder")
    elif template and not (directory / template).is_file():
        problems.append(f"build.template: {template} is not a file beside the recipe")
    source_path = None
    archives: list[Archive] = []
    if "path" in source:
        source_path = (directory / str(source["path"])).resolve()
        if not source_path.exists():
            problems.append(f"source.path: {source_path} does not exist")
        elif not source_path.is_dir():
            problems.append(f"source.path: {source_path} is not a directory (the source tree)")
    entries = source.get("archives", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        problems.append(
            'source.archives must be tables: [[source.archives]] filename = "...", sha256 = "..."'
        )
        entries = []
    for i, entry in enumerate(entries):
        where = f"source.archives[{i}]"
        problems += [
            f"{where}: unknown key {k!r}{did_you_mean(k, ARCHIVE_KEYS)}"
            for k in entry
            if k not in ARCHIVE_KEYS
        ]
        sha = str(entry.get("sha256", ""))
        if len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
            problems.append(f"{where}.sha256 must be 64 lowercase hex digits")
        filename = entry.get("filename")
        if not isinstance(filename, str) or not _FILE_NAME.fullmatch(filename):
            problems.append(
                f"{where}.filename {filename!r} must be a file's name (letters, digits, . _ + ~ -; "
                "no /): the archive as the build host receives it"
            )
        archives.append(Archive(str(filename), sha, str(entry.get("url", ""))))
    git_url, git_commit = str(source.get("git", "")), str(source.get("commit", ""))
    if git_url and not source_tree.FULL_COMMIT.fullmatch(git_commit):
        problems.append("source.git needs source.commit, the full 40-hex commit to build")
    elif git_commit and not git_url:
        problems.append("source.commit goes with source.git, the repository's URL")
    problems += [f"source: unknown key {k!r}" for k in source if k not in SOURCE_KEYS]
    if sum(map(bool, (source_path, archives, git_url))) > 1:
        problems.append("source takes one of path, archives or git")
    elif source_path is None and not archives and not git_url:
        problems.append("source needs a path, archives, or git and commit")
    package_lists: dict[str, tuple[str, ...]] = {}
    for key in ("packages", "runtime_packages"):
        names = data.get(key, [])
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            problems.append(f"{key} must be a list of package names")
            names = []
        bad = packages.bad_names(names)
        if bad:
            problems.append(f"{key}: {', '.join(map(repr, bad))} is not a package name")
        package_lists[key] = tuple(names)
    bench = data.get("bench", {})
    if not isinstance(bench, dict):
        problems.append("bench must be a table: [bench] command = ...")
        bench = {}
    metric = bench.get("metric", {})
    if not isinstance(metric, dict):
        problems.append('bench.metric must be a table: metric = { kind = "regex", pattern = ... }')
    else:
        problems += [
            f"bench.metric: unknown key {k!r}{did_you_mean(k, METRIC_KEYS)}"
            for k in metric
            if k not in METRIC_KEYS
        ]
    parameters = bench.get("parameters", {})
    tables = isinstance(parameters, dict) and all(isinstance(p, dict) for p in parameters.values())
    if not tables:
        problems.append("bench.parameters must be tables: NAME = { kind = ..., default = ... }")
        parameters = {}
    defaults = {key: spec.get("default") for key, spec in parameters.items()}
    for key, spec in parameters.items():
        problems += [
            f"bench.parameters.{key}: unknown key {k!r}{did_you_mean(k, PARAMETER_KEYS)}"
            for k in spec
            if k not in PARAMETER_KEYS
        ]
        if spec.get("kind", "int") not in PARAMETER_KINDS:
            problems.append(
                f"bench.parameters.{key}.kind {spec.get('kind')!r} is not one of "
                f"{', '.join(PARAMETER_KINDS)}"
            )
        for bound in PARAMETER_BOUNDS:  # a nan default ran the workload with "nan"
            if isinstance(spec.get(bound), float) and checks.number(spec[bound]):
                problems.append(f"bench.parameters.{key}.{bound} {spec[bound]} is not finite")
        integer = spec.get("kind", "int") == "int"
        numeric = ("low", "high") if spec.get("kind") == "categorical" else PARAMETER_BOUNDS
        wrong = [
            f"bench.parameters.{key}.{bound} {spec[bound]!r} is not "
            + ("an integer" if integer else "a number")
            for bound in numeric
            if bound in spec
            and (
                isinstance(spec[bound], bool)
                or not isinstance(spec[bound], int if integer else int | float)
            )
        ]
        problems += wrong
        low, high = spec.get("low"), spec.get("high")
        if not wrong and low is not None and high is not None and low > high:
            problems.append(f"bench.parameters.{key}: low {low} is above high {high}")
    for key in dict.fromkeys(_PLACEHOLDER.findall(str(bench.get("command", "")))):
        if key != "args" and defaults.get(key) is None:
            # Run with the placeholder as is, the workload would fail on every replicate.
            problems.append(
                f"bench.command: {{{key}}} needs [bench.parameters] {key} with a default"
            )
    dispatched = build.get("dispatched", [])
    if not isinstance(dispatched, list) or not all(isinstance(d, str) for d in dispatched):
        problems.append('build.dispatched must be a list of CPU feature names, e.g. ["bmi2"]')
        dispatched = []
    artifacts = need(build, "artifacts", list, "build.")
    if isinstance(build.get("artifacts"), list) and not artifacts:
        problems.append(
            'build.artifacts lists nothing: name what the build installs, e.g. ["bin/x"]'
        )
    for artifact in artifacts:
        problem = artifact_problem(artifact)
        if problem:
            problems.append(f"build.artifacts: {problem}")
    base_cflags = build.get("base_cflags", "-O2")
    if not isinstance(base_cflags, str):
        problems.append('build.base_cflags must be a string of compiler flags, e.g. "-O3"')
    else:
        problem = checks.shell_words(base_cflags)
        if problem:
            problems.append(
                f"build.base_cflags: {problem}: give plain flags, and write a define with spaces "
                "or a $ into the build template itself"
            )
    tmpfs_max = build.get("tmpfs_max_mb")
    if tmpfs_max is not None and (not isinstance(tmpfs_max, int) or tmpfs_max < 64):
        problems.append("build.tmpfs_max_mb must be an integer of at least 64")
    if problems:
        raise UserError(f"{path}: " + "; ".join(problems))
    return Recipe(
        name=name,
        directory=directory,
        description=str(data.get("description", "")),
        architectures=architectures,
        packages=package_lists["packages"],
        template=template,
        base_cflags=str(base_cflags),
        artifacts=tuple(str(a) for a in artifacts),
        tmpfs_max_mb=tmpfs_max,
        source_path=source_path,
        archives=tuple(archives),
        smoke_command=str(smoke.get("command", "")),
        smoke_expect=str(smoke.get("expect", "")),
        bench=dict(bench),
        runtime_packages=package_lists["runtime_packages"],
        bench_defaults=defaults,
        dispatched=tuple(dispatched),
        git_url=git_url,
        git_commit=git_commit,
    )


def pack_directory(path: Path, *, gitignore: bool = True, leave_out: Path | None = None) -> bytes:
    """A reproducible tar.gz of a source directory: same files, same bytes, same sha256. The
    files are those git would commit (.gitignore respected, amibake.source_tree), so a build
    output or an editor's file left in the tree neither ships nor changes the hash."""
    buffer = io.BytesIO()
    names = source_tree.files(path, gitignore=gitignore, leave_out=leave_out)
    if not names:  # an empty tarball was packed, cached and built from, for a build that failed
        raise UserError(
            f"{path}: no file to ship: the tree is empty, or its .gitignore (or an enclosing "
            "repository's) excludes every file"
        )
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as tar:
        for name in names:
            file = path / name
            # Made by hand, as git records a file: a regular file 0644 or 0755 (executable), or
            # a link. From the file's own stat, a checkout under another umask (0664) or a file
            # hard-linked elsewhere (a LNKTYPE member) hashed apart and was built again.
            info = tarfile.TarInfo(name.as_posix())
            if file.is_symlink():
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, os.readlink(file), 0o777
                tar.addfile(info)
                continue
            try:
                with file.open("rb") as handle:
                    stat = os.fstat(handle.fileno())
                    info.size, info.mode = stat.st_size, 0o755 if stat.st_mode & 0o111 else 0o644
                    tar.addfile(info, handle)
            except OSError as exc:  # a file without read permission ended in a traceback
                raise UserError(
                    f"{file}: cannot read it ({exc.strerror}); make it readable, or list it in "
                    f"{path}/.gitignore if the build does not need it"
                ) from None
    raw = buffer.getvalue()
    # gzip stores a timestamp in its header; zero it so the bytes depend on content alone.
    return raw[:4] + b"\0\0\0\0" + raw[8:]
