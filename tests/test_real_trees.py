"""`amibake recipe new` on real projects of the two build systems lz4 (make, in
test_source_recipes.py) does not cover: gzip 1.12 (autotools, GNU's release tarball with its
configure) and cmark 0.30.2 (CMake), each from Debian's orig tarball (`make gzip-source
cmark-source` puts them in the source cache), unpacked as a user's checkout would be, and built
on the local cloud for this machine's best family (read at run time) so that the artifact runs
here. The family's flags must reach every compile line the way the build system takes them
(configure's CFLAGS; CMake's CMAKE_C_FLAGS), and what was built must do its job."""

from __future__ import annotations

import re
import subprocess
import tarfile
from pathlib import Path

import pytest

from amibake import catalog, flags, pipelines, recipes, sources
from amibake.archive import unpack
from amibake.cli import main as amibake
from amibake.cloud import Cloud

# Debian bookworm's orig tarballs, by the sha256 the Makefile's targets check.
GZIP = ("ce5e03e519f637e1f814011ace35c4f87b33c0bbabeec35baf5fbd3479e91956", "gzip-1.12")
CMARK = ("6c7d2bcaea1433d977d8fed0b55b71c9d045a7cdf616e3cd2dce9007da753db3", "cmark-0.30.2")


def unpacked(tmp_path: Path, orig: tuple[str, str], target: str) -> Path:
    sha256, top = orig
    cached = sources.cache_dir() / sha256
    if not cached.exists():
        pytest.skip(f"{top}'s Debian orig tarball is not in the source cache: make {target}")
    assert sources.sha256_of(cached) == sha256
    with tarfile.open(cached) as tar:
        unpack(tar, tmp_path / "unpacked")
    return tmp_path / "unpacked" / top


def recipe_new(tmp_path: Path, capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """`amibake recipe new ...` as a user runs it, into the test's recipes folder."""
    (tmp_path / "recipes").mkdir(exist_ok=True)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AMIBAKE_RECIPES_DIR", str(tmp_path / "recipes"))
        assert amibake(["recipe", "new", *argv]) == 0, capsys.readouterr().err
    return capsys.readouterr().out


def build(cloud: Cloud, tmp_path: Path, name: str, family: str) -> tuple[str, list[str], Path]:
    """Build the recipe for the family: its tuned flags, the build log's lines, the artifact
    unpacked."""
    outcome = pipelines.build(
        cloud, pipelines.BuildRequest([family], name, "large", recipes_dir=tmp_path / "recipes")
    )[0]
    assert outcome.ok, outcome.error
    state = outcome.state
    assert state is not None and state.artifact is not None
    manifest = state.manifest
    compiler = flags.Compiler.parse(manifest["compiler"])
    tuned = flags.for_family(catalog.family(family), compiler).cflags
    assert tuned and tuned in manifest["cflags"]
    logs = cloud.config.results_dir / "logs" / str(manifest["run_id"])
    lines = [line for p in sorted(logs.glob("*.log")) for line in p.read_text().splitlines()]
    out = tmp_path / f"{name}-artifact"
    with tarfile.open(state.artifact) as tar:
        unpack(tar, out)
    return tuned, lines, out


# A compiler invocation (gcc, or a cross gcc) that compiles, as a verbose build log shows it;
# configure's "checking whether gcc understands -c and -o together" is not one.
COMPILE = re.compile(r"^(\S*/)?\S*gcc\s.*\s-c\s")


def compiles_of(lines: list[str], source: str) -> list[str]:
    """The compiler invocations that compiled `source` (a .c file), from a verbose build log."""
    pattern = re.compile(rf"(^|[ /]){re.escape(source)}(\s|$)")
    return [line for line in lines if " -c " in line and pattern.search(line)]


@pytest.mark.e2e
def test_gzip_an_autotools_project_builds_with_the_family_flags_in_configure(
    cloud: Cloud, tmp_path: Path, host_family: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = unpacked(tmp_path, GZIP, "gzip-source")
    said = recipe_new(
        tmp_path, capsys, "gzip", "--from", str(tree), "--build", "autotools",
        "--artifact", "bin/gzip",
    )  # fmt: skip
    assert "built with autotools" in said, said
    recipe = recipes.load("gzip", tmp_path / "recipes")
    # A release tarball has its configure: no autoconf/automake on the build host.
    assert not {"autoconf", "automake", "libtool"} & set(recipe.packages), recipe.packages
    tuned, lines, out = build(cloud, tmp_path, "gzip", host_family)
    # configure took them as CFLAGS (its precious variable), and every Makefile it wrote used
    # them: each compile of gzip's own C files and of gnulib's (lib/libgzip.a) had them.
    configured = [line for line in lines if line.startswith("building with autotools for")]
    assert configured and tuned in configured[0], configured
    compiled = [line for line in lines if COMPILE.match(line)]
    assert all(tuned in line for line in compiled), [c for c in compiled if tuned not in c][:3]
    for source in ("gzip.c", "deflate.c", "inflate.c"):
        assert compiles_of(compiled, source), source
    assert sum("libgzip_a-" in line for line in compiled) >= 10, "gnulib's compiles not seen"
    data = b"family-tuned gzip, built by autotools\n" * 4096
    gzip = out / "bin" / "gzip"
    packed = subprocess.run([gzip, "-9c"], input=data, capture_output=True, check=True).stdout
    assert packed[:2] == b"\x1f\x8b" and len(packed) < len(data) / 20
    back = subprocess.run([gzip, "-dc"], input=packed, capture_output=True, check=True).stdout
    assert back == data
    version = subprocess.run([gzip, "--version"], capture_output=True, text=True, check=True)
    assert version.stdout.startswith("gzip 1.12")


@pytest.mark.e2e
def test_cmark_a_cmake_project_builds_with_the_family_flags_in_cmake_c_flags(
    cloud: Cloud, tmp_path: Path, host_family: str, capsys: pytest.CaptureFixture[str]
) -> None:
    tree = unpacked(tmp_path, CMARK, "cmark-source")
    # Detected from its CMakeLists.txt (it has a Makefile beside it, a wrapper of cmake).
    said = recipe_new(tmp_path, capsys, "cmark", "--from", str(tree), "--artifact", "bin/cmark")
    assert "built with cmake" in said, said
    recipe = recipes.load("cmark", tmp_path / "recipes")
    assert {"gcc", "cmake"} <= set(recipe.packages)
    tuned, lines, out = build(cloud, tmp_path, "cmark", host_family)
    # CMAKE_C_FLAGS, and nothing after them that overrides them: the Release configuration's
    # own -O3 is cut, so the recipe's base flags (-O3 here) and the family's are the last word.
    for source in ("blocks.c", "inlines.c", "main.c"):
        compiled = compiles_of(lines, source)
        assert compiled and all(tuned in line for line in compiled), (source, compiled)
        assert all(line.count("-O") == 1 for line in compiled), compiled
    html = subprocess.run(
        [out / "bin" / "cmark"],
        input="# Tuned\n\nbuilt *for* the family\n",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert html == "<h1>Tuned</h1>\n<p>built <em>for</em> the family</p>\n"
