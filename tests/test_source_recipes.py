"""`amibake recipe new`: a user's own source tree (a directory or a git commit) as a recipe,
built on the local cloud with the family's flags passed the way its build system takes them.

The projects are made here, a few lines of C each, with a file their .gitignore excludes that
must never reach the build host. The family is this machine's (host_family), so the artifact
runs here."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from amibake import catalog, flags, new_recipe, pipelines, recipes, source_tree, sources
from amibake.archive import unpack
from amibake.cli import main as amibake
from amibake.cloud import Cloud
from amibake.errors import UserError
from amibake.steps.preflight import cache_key

HELLO_C = '#include <stdio.h>\nint main(void) { puts("hello from %s"); return 0; }\n'
CMAKE = (
    "cmake_minimum_required(VERSION 3.13)\nproject(hello C)\n"
    "add_executable(hello hello.c)\ninstall(TARGETS hello DESTINATION bin)\n"
)
# A Makefile as people write them: CFLAGS set here, overridden by the build's own.
MAKEFILE = (
    "CC ?= cc\nCFLAGS ?= -O0\nPREFIX ?= /usr/local\n"
    "hello: hello.c\n\t$(CC) $(CFLAGS) -o hello hello.c\n"
    "install: hello\n\tmkdir -p $(PREFIX)/bin\n\tcp hello $(PREFIX)/bin/hello\n"
)
JUNK = "build-output.log"
# A real project built the way a user's would be: Debian's orig tarball of lz4 1.9.4, which
# `make lz4-source` puts in the source cache under this sha256.
LZ4_SHA256 = "0b0e3aa07c8c063ddf40b082bdf7e37a1562bda40a0ff5272957f3e987e0e54b"


def project(where: Path, build: str, greeting: str = "") -> Path:
    where.mkdir(parents=True)
    (where / "hello.c").write_text(HELLO_C % (greeting or build))
    (where / ("CMakeLists.txt" if build == "cmake" else "Makefile")).write_text(
        CMAKE if build == "cmake" else MAKEFILE
    )
    (where / ".gitignore").write_text(f"{JUNK}\n/build/\n")
    (where / JUNK).write_text("left over from a local build: must not ship\n")
    return where


def git(cwd: Path, *args: str) -> str:
    author = ["-c", "user.name=t", "-c", "user.email=t@example.org"]
    return subprocess.run(
        ["git", *author, *args], cwd=cwd, check=True, capture_output=True, text=True
    ).stdout.strip()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("AMIBAKE_SOURCE_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def shipped(recipe: recipes.Recipe) -> list[str]:
    with tarfile.open(sources.resolve(recipe).path) as tar:
        return sorted(tar.getnames())


# What a tree ships


def test_the_build_system_is_told_by_the_files_at_the_top() -> None:
    def told(*names: str) -> str:
        return new_recipe.detect([Path(n) for n in names])

    assert told("CMakeLists.txt", "Makefile", "src/x.c") == "cmake"
    assert told("configure.ac", "Makefile.am") == "autotools"
    assert told("configure", "Makefile.in") == "autotools"
    assert told("Makefile", "x.c") == "make"
    assert told("src/CMakeLists.txt", "x.c") == ""  # not at the top


def test_a_cmake_project_naming_no_language_needs_a_cxx_compiler(tmp_path: Path) -> None:
    # project(x) enables C and C++: without g++ CMake stops at "No CMAKE_CXX_COMPILER".
    (tmp_path / "CMakeLists.txt").write_text("project(x)\n")
    names = [Path("CMakeLists.txt"), Path("x.c")]
    assert new_recipe.languages(tmp_path, names, "cmake") == ["C", "CXX"]
    (tmp_path / "CMakeLists.txt").write_text("project(x VERSION 1.0 LANGUAGES C Fortran)\n")
    assert new_recipe.languages(tmp_path, names, "cmake") == ["C", "Fortran"]
    assert new_recipe.languages(tmp_path, [Path("a.c"), Path("b.cpp")], "make") == ["C", "CXX"]


def test_gitignore_is_read_as_git_reads_it(tmp_path: Path) -> None:
    """The matcher used outside a git work tree keeps exactly what git itself would (nested
    files, negation, directory patterns, anchored ones)."""
    tree = tmp_path / "tree"
    files = {
        ".gitignore": "*.o\n!keep.o\n/out/\nlogs/\n",
        "a.c": "",
        "a.o": "",
        "keep.o": "",
        "out/x": "",
        "sub/out/y": "",  # /out/ is anchored at the top: this one ships
        "sub/logs/z": "",
        "sub/.gitignore": "*.tmp\n!important.o\n",
        "sub/t.tmp": "",
        "sub/important.o": "",
        "sub/deeper/u.tmp": "",
        "sub/deeper/v.c": "",
    }
    for name, text in files.items():
        (tree / name).parent.mkdir(parents=True, exist_ok=True)
        (tree / name).write_text(text)
    ours = source_tree.files(tree)
    assert Path("a.o") not in ours and Path("sub/t.tmp") not in ours
    git(tree, "init", "-q")
    assert source_tree._git_listed(tree) is not None
    assert sorted(source_tree._git_listed(tree) or []) == ours


def test_a_directory_recipe_ships_the_tree_less_what_gitignore_excludes(
    tmp_path: Path, cache: Path
) -> None:
    src = project(tmp_path / "hello", "cmake")
    (src / "build").mkdir()
    (src / "build" / "CMakeCache.txt").write_text("a local build directory\n")
    written = new_recipe.write("hello", str(src), root=tmp_path / "recipes")
    assert written.build == "cmake" and written.files == 3
    recipe = recipes.load("hello", tmp_path / "recipes")
    assert recipe.source_path == src
    assert recipe.packages == ("gcc", "make", "cmake")
    assert shipped(recipe) == [".gitignore", "CMakeLists.txt", "hello.c"]


@pytest.mark.parametrize("kind", ["plain", "git", "exported"])
def test_a_link_to_a_directory_ships_as_the_link(tmp_path: Path, kind: str) -> None:
    """include -> src was left out (is_file() of a link to a directory is False), and the build
    failed on the instance for a header it did not have."""
    src = project(tmp_path / "hello", "make")
    (src / "src").mkdir()
    (src / "src" / "hello.h").write_text("#define GREETING 1\n")
    (src / "include").symlink_to("src")
    if kind == "git":
        git(src, "init", "-q")
    names = source_tree.files(src, gitignore=kind != "exported")
    assert Path("include") in names and Path("src/hello.h") in names, names
    with tarfile.open(fileobj=io.BytesIO(recipes.pack_directory(src))) as tar:
        link = tar.getmember("include")
        assert link.issym() and link.linkname == "src"


def test_amibake_s_results_folder_in_the_tree_never_ships(tmp_path: Path, cache: Path) -> None:
    """`recipe new --from .` where amibake runs: its results folder (the database, logs, a kept
    run's private keys) shipped to every build host, and changed the source hash at every run,
    so nothing was built from cache."""
    src = project(tmp_path / "hello", "make")
    results = src / "results"
    (results / "logs").mkdir(parents=True)
    (results / "journal.sqlite").write_text("a run's journal")
    (results / "logs" / "ab-0123.pem").write_text("-----BEGIN OPENSSH PRIVATE KEY-----")
    for kind in ("plain", "git"):
        if kind == "git":
            git(src, "init", "-q")
        names = source_tree.files(src, leave_out=results)
        assert not [n for n in names if n.parts[0] == "results"], (kind, names)
    packed = recipes.pack_directory(src, leave_out=results)
    (results / "journal.sqlite").write_text("the journal, a run later")
    assert recipes.pack_directory(src, leave_out=results) == packed  # the same cache key
    written = new_recipe.write("hello", str(src), root=tmp_path / "recipes", results_dir=results)
    assert written.files == 3  # hello.c, Makefile, .gitignore


def test_a_link_out_of_the_tree_is_refused_in_one_line(tmp_path: Path) -> None:
    """It shipped as a link and arrived dangling on the build host (a commit's is refused)."""
    src = project(tmp_path / "hello", "make")
    (src / "pw").symlink_to("/etc/passwd")
    with pytest.raises(UserError) as refused:
        new_recipe.write("hello", str(src), root=tmp_path / "recipes")
    said = str(refused.value)
    assert "pw links outside the tree (to /etc/passwd)" in said and "\n" not in said
    assert not (tmp_path / "recipes" / "hello").exists()


def test_autotools_whose_configure_does_not_ship_installs_what_makes_it(tmp_path: Path) -> None:
    """configure is generated and git-ignored (as most autotools projects have it): the build
    host runs autoreconf, which the recipe did not install."""
    src = tmp_path / "tool"
    src.mkdir()
    (src / "configure.ac").write_text("AC_INIT([tool], [1])\nAC_OUTPUT\n")
    (src / "configure").write_text("#!/bin/sh\n")
    (src / "main.c").write_text("int main(void) { return 0; }\n")
    (src / ".gitignore").write_text("/configure\n")
    written = new_recipe.write("tool", str(src), root=tmp_path / "recipes")
    assert written.build == "autotools"
    assert {"autoconf", "automake", "libtool"} <= set(written.packages), written.packages


def test_a_submodule_ships_its_files_and_one_not_checked_out_is_named(tmp_path: Path) -> None:
    """A submodule is one gitlink entry to git and a directory here: its files were left out
    without a word."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "lib.c").write_text("int lib(void) { return 1; }\n")
    git(lib, "init", "-q")
    git(lib, "add", ".")
    git(lib, "commit", "-qm", "lib")
    src = project(tmp_path / "hello", "make")
    git(src, "init", "-q")
    git(src, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "vendor/lib")
    names = source_tree.files(src)
    assert Path("vendor/lib/lib.c") in names and Path(JUNK) not in names, names
    git(src, "submodule", "deinit", "-q", "-f", "vendor/lib")  # no longer checked out
    with pytest.raises(UserError) as refused:
        source_tree.files(src)
    said = str(refused.value)
    assert "vendor/lib: a git submodule that is not checked out" in said and "\n" not in said
    assert "submodule update --init vendor/lib" in said


def test_the_source_hash_follows_content_not_mode_bits_or_links(tmp_path: Path) -> None:
    """A checkout under another umask (0664) or a file hard-linked elsewhere hashed apart."""
    one, two = (project(tmp_path / n, "make") for n in ("one", "two"))
    (one / "hello.c").chmod(0o664)
    os.link(one / "Makefile", tmp_path / "elsewhere")
    assert recipes.pack_directory(one) == recipes.pack_directory(two)
    (two / "hello.c").chmod(0o755)  # executable is content, as git records it
    assert recipes.pack_directory(one) != recipes.pack_directory(two)


def test_a_tree_with_nothing_to_ship_is_refused(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / ".gitignore").write_text("*\n")
    (empty / "ignored.c").write_text("int x;\n")
    with pytest.raises(UserError, match="no file to ship"):
        recipes.pack_directory(empty)


def test_the_same_tree_is_the_same_cache_key_and_an_edit_a_new_one(
    tmp_path: Path, cache: Path
) -> None:
    src = project(tmp_path / "hello", "make")
    new_recipe.write("hello", str(src), root=tmp_path / "recipes")

    def key() -> str:
        request = pipelines.BuildRequest(
            ["c5a"], "hello", "large", recipes_dir=tmp_path / "recipes"
        )
        return cache_key(pipelines.prepare(request, tmp_path / "results")[0])

    first = key()
    (src / "hello.c").touch()  # a new mtime: the same content
    (src / JUNK).write_text("another local build's output\n")  # ignored: not shipped
    assert key() == first
    (src / "hello.c").write_text(HELLO_C % "an edited hello")
    edited = key()
    assert edited != first
    # amibake's own flags for the target are an input too: a change to them (AVX512-VP2INTERSECT
    # taken out of c7i's) left artifacts built with the old flags as cache hits.
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(flags.ARCHSPEC_OMITS, ("zen2", "-march=znver2"), "-mno-sse4a")
        assert key() != edited
    assert key() == edited


def test_a_git_url_is_built_at_its_pinned_commit_only(tmp_path: Path, cache: Path) -> None:
    work = project(tmp_path / "work", "make", "commit one")
    git(work, "init", "-q")
    git(work, "add", ".")
    git(work, "commit", "-qm", "one")
    first = git(work, "rev-parse", "HEAD")
    (work / "hello.c").write_text(HELLO_C % "commit two")
    git(work, "commit", "-qam", "two")
    bare = tmp_path / "hello.git"
    git(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    url = f"file://{bare}"
    root = tmp_path / "recipes"

    with pytest.raises(UserError, match=r"a git URL is built at a pinned commit: add --commit"):
        new_recipe.write("hello", url, root=root)
    with pytest.raises(UserError, match=r"--commit abc1234: give the full 40-hex commit"):
        new_recipe.write("hello", url, root=root, commit="abc1234")
    with pytest.raises(UserError, match=rf"commit {'0' * 40} is not in {url}"):
        new_recipe.write("hello", url, root=root, commit="0" * 40)
    assert not root.exists() or not any(root.iterdir())

    written = new_recipe.write("hello", url, root=root, commit=first)
    assert written.build == "make"
    recipe = recipes.load("hello", root)
    assert (recipe.git_url, recipe.git_commit, recipe.source_path) == (url, first, None)
    # Fetched once, on the controller: a build finds the commit's tree in the cache.
    assert (cache / f"git-{first}").exists()
    names = shipped(recipe)
    assert JUNK not in names and "./Makefile" not in names and "Makefile" in names
    with tarfile.open(sources.resolve(recipe).path) as tar:
        member = tar.extractfile("hello.c")
        assert member is not None and b"commit one" in member.read()


@pytest.mark.parametrize("filters", [True, False], ids=["python-filters", "python-3.11.2"])
def test_a_git_commit_linking_out_of_its_tree_is_refused_in_one_line(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, filters: bool
) -> None:
    if not filters:  # Debian 12's python3 (a plain user's venv) has no extraction filters
        monkeypatch.delattr(tarfile, "data_filter", raising=False)
    elif not hasattr(tarfile, "data_filter"):
        pytest.skip("this Python has no extraction filters: the python-3.11.2 case covers it")
    work = project(tmp_path / "work", "make")
    (work / "secrets").symlink_to("/etc/passwd")
    git(work, "init", "-q")
    git(work, "add", ".")
    git(work, "commit", "-qm", "a link out")
    root = tmp_path / "recipes"
    commit = git(work, "rev-parse", "HEAD")
    with pytest.raises(UserError, match=r"'secrets'.*a build source's links must stay in its tree"):
        new_recipe.write("hello", f"file://{work}", root=root, commit=commit)
    assert not root.exists() or not any(root.iterdir())


def test_refusals_name_the_fix_and_write_nothing(tmp_path: Path) -> None:
    root = tmp_path / "recipes"
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "main.c").write_text("int main(void) { return 0; }\n")
    with pytest.raises(UserError, match=r"give --build cmake\|make\|autotools, or --build custom"):
        new_recipe.write("x", str(bare), root=root)
    with pytest.raises(UserError, match="is not a plain name"):
        new_recipe.write("../x", str(bare), root=root, build="make")
    assert not root.exists() or not any(root.iterdir())
    written = new_recipe.write("x", str(bare), root=root, build="custom")
    # The stub says what to write; rendered, it parses, and it fails until written.
    assert "write the build" in (written.directory / "build.sh.j2").read_text()
    assert written.packages == ["gcc"]


def test_every_build_template_renders_to_a_script_that_parses() -> None:
    # Every template parses before a build launches; tests/test_real_trees.py builds the
    # autotools and CMake ones for real (gzip, cmark).
    from amibake.render import check_shell, render

    for build in new_recipe.BUILD_SYSTEMS:
        script = render(
            new_recipe.TEMPLATES / f"{build}.sh.j2",
            family="c7g",
            target="neoverse_v1",
            cc="aarch64-linux-gnu-gcc",
            base_cflags="-O3",
            cflags="-mcpu=neoverse-v1",
            src_dir="/shared/amibake-build/src",
            out_dir="/shared/amibake-build/out",
            jobs=4,
        )
        check_shell(script, f"{build}.sh.j2")
        if build != "custom":
            assert '"-O3 -mcpu=neoverse-v1"' in script


# Built on the local cloud


def build_and_check(
    cloud: Cloud, tmp_path: Path, recipe_name: str, family_name: str, greeting: str
) -> dict[str, object]:
    outcome = pipelines.build(
        cloud,
        pipelines.BuildRequest(
            [family_name], recipe_name, "large", recipes_dir=tmp_path / "recipes"
        ),
    )[0]
    assert outcome.ok, outcome.error
    state = outcome.state
    assert state is not None and state.artifact is not None
    manifest = json.loads(state.artifact.with_name(f"{state.label}.manifest.json").read_text())
    # The family's tuned flags, the compiler's own words for them, reached the compile line.
    compiler = flags.Compiler.parse(manifest["compiler"])
    tuned = flags.for_family(catalog.family(family_name), compiler).cflags
    assert tuned and tuned in manifest["cflags"]
    logs = cloud.config.results_dir / "logs" / str(manifest["run_id"])
    log = "\n".join(p.read_text() for p in logs.glob("*.log"))
    compiled = [line for line in log.splitlines() if "hello.c" in line and " -o " in line]
    assert compiled and all(tuned in line for line in compiled), compiled
    # The artifact runs (this machine is of the family's kind) and is the program built.
    out = tmp_path / f"{recipe_name}-artifact"
    with tarfile.open(state.artifact) as tar:
        unpack(tar, out)
    ran = subprocess.run([out / "bin" / "hello"], capture_output=True, text=True, check=True)
    assert ran.stdout.strip() == f"hello from {greeting}"
    return manifest


@pytest.mark.e2e
def test_a_cmake_and_a_make_tree_build_with_the_family_flags(
    cloud: Cloud, tmp_path: Path, host_family: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "recipes").mkdir()
    for build in ("cmake", "make"):
        src = project(tmp_path / f"src-{build}", build)
        # Through the command, as a user would.
        argv = ["recipe", "new", f"hello-{build}", "--from", str(src), "--artifact", "bin/hello"]
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("AMIBAKE_RECIPES_DIR", str(tmp_path / "recipes"))
            assert amibake(argv) == 0, capsys.readouterr().err
        assert f"built with {build}" in capsys.readouterr().out
        manifest = build_and_check(cloud, tmp_path, f"hello-{build}", host_family, build)
        assert manifest["files"].keys() == {"bin/hello"}  # type: ignore[attr-defined]


@pytest.mark.e2e
def test_a_git_commit_builds_on_a_host_without_git(
    cloud: Cloud, tmp_path: Path, host_family: str
) -> None:
    work = project(tmp_path / "work", "cmake", "a pinned commit")
    git(work, "init", "-q")
    git(work, "add", ".")
    git(work, "commit", "-qm", "pinned")
    pinned = git(work, "rev-parse", "HEAD")
    (work / "hello.c").write_text(HELLO_C % "a later commit")
    git(work, "commit", "-qam", "later")
    bare = tmp_path / "hello.git"
    git(tmp_path, "clone", "-q", "--bare", str(work), str(bare))
    new_recipe.write(
        "hello-git",
        f"file://{bare}",
        root=tmp_path / "recipes",
        commit=pinned,
        artifacts=["bin/hello"],
    )
    build_and_check(cloud, tmp_path, "hello-git", host_family, "a pinned commit")


@pytest.mark.e2e
def test_a_real_project_lz4_builds_from_its_tree_with_the_family_flags(
    cloud: Cloud, tmp_path: Path, host_family: str
) -> None:
    orig = sources.cache_dir() / LZ4_SHA256
    if not orig.exists():
        pytest.skip("lz4's Debian orig tarball is not in the source cache: make lz4-source")
    assert sources.sha256_of(orig) == LZ4_SHA256
    with tarfile.open(orig) as tar:
        unpack(tar, tmp_path / "unpacked")
    tree = tmp_path / "unpacked" / "lz4-1.9.4"  # as a user's checkout of it would be
    written = new_recipe.write("lz4", str(tree), root=tmp_path / "recipes", artifacts=["bin/lz4"])
    # Make detected; gcc-c++ too, for the C++ of its fuzzers and contrib (a guess on the safe side).
    assert written.build == "make" and {"gcc", "make"} <= set(written.packages)
    outcome = pipelines.build(
        cloud,
        pipelines.BuildRequest([host_family], "lz4", "large", recipes_dir=tmp_path / "recipes"),
    )[0]
    assert outcome.ok, outcome.error
    state = outcome.state
    assert state is not None and state.artifact is not None
    manifest = state.manifest
    compiler = flags.Compiler.parse(manifest["compiler"])
    tuned = flags.for_family(catalog.family(host_family), compiler).cflags
    # Every C file of the library and the program was compiled with the family's flags, which
    # replaced lz4's own CFLAGS (make's command line overrides the Makefile's).
    logs = cloud.config.results_dir / "logs" / str(manifest["run_id"])
    lines = [line for p in logs.glob("*.log") for line in p.read_text().splitlines()]
    compiled = [line for line in lines if " -c " in line and "lz4.c" in line]
    assert compiled and all(tuned in line for line in compiled), compiled
    out = tmp_path / "artifact"
    with tarfile.open(state.artifact) as tar:
        unpack(tar, out)
    data = b"family-tuned lz4 " * 4096
    packed = subprocess.run([out / "bin/lz4", "-c"], input=data, capture_output=True, check=True)
    assert len(packed.stdout) < len(data) / 10
    back = subprocess.run([out / "bin/lz4", "-dc"], input=packed.stdout, capture_output=True)
    assert back.stdout == data


def test_a_source_file_that_cannot_be_read_is_named_on_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file without read permission (as a plain user) ended `source add` and a directory
    # recipe's build in PermissionError. Root reads anything: the refusal is simulated.
    src = project(tmp_path / "hello", "cmake")
    archive = tmp_path / "src.tar.gz"
    archive.write_bytes(b"an archive")
    unreadable = {src / "hello.c", archive}
    opened = Path.open

    def open_unless_denied(self: Path, *args: object, **kwargs: object) -> object:
        if self in unreadable:
            raise PermissionError(13, "Permission denied", str(self))
        return opened(self, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(Path, "open", open_unless_denied)
    with pytest.raises(
        UserError,
        match=f"^{src}/hello.c: cannot read it \\(Permission denied\\); "
        f"make it readable, or list it in {src}/.gitignore",
    ):
        recipes.pack_directory(src)
    with pytest.raises(UserError, match=f"^{archive}: cannot read it \\(Permission denied\\)"):
        sources.add(archive)


@pytest.mark.parametrize("denied", ["the tree", "a folder in it"])
def test_a_tree_that_cannot_be_listed_is_named_not_taken_for_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
    denied: str,
) -> None:  # fmt: skip
    """A folder without read permission (as a plain user): os.walk skipped it, so `recipe new
    --from` said "no files to build (the tree is empty...)", and a folder inside went missing
    from the tree unsaid. Root reads anything: the refusal is simulated."""
    src = project(tmp_path / "hello", "cmake")
    (src / "lib").mkdir()
    (src / "lib" / "util.c").write_text("int util(void) { return 1; }\n")
    blocked = src if denied == "the tree" else src / "lib"
    listed = os.scandir

    def scandir_unless_denied(path: object = ".") -> object:
        if Path(str(path)) == blocked:
            raise PermissionError(13, "Permission denied", str(path))
        return listed(path)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "scandir", scandir_unless_denied)
    (tmp_path / "recipes").mkdir()
    monkeypatch.setenv("AMIBAKE_RECIPES_DIR", str(tmp_path / "recipes"))
    assert amibake(["recipe", "new", "hello", "--from", str(src)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    said = f"{blocked}: cannot read it (Permission denied); make it readable"
    assert said in err, err
    assert ("/.gitignore" in err) == (blocked != src), err
    assert not (tmp_path / "recipes" / "hello").exists()  # nothing written
