"""Recipes: loading, their errors (file and line), sources and their hashes, templates."""

from __future__ import annotations

import re
import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest

from amibake import recipes, render, sources
from amibake.errors import UnknownNameError, UserError

FIXTURES = Path(__file__).parent / "recipes"


def copy_recipe(tmp_path: Path, name: str = "trivial") -> Path:
    target = tmp_path / "recipes" / name
    shutil.copytree(FIXTURES / "trivial", target)
    return target


def test_the_shipped_recipes_load() -> None:
    kernels = recipes.load("kernels")
    assert kernels.artifacts == ("bin/kernels",)
    assert "-ffp-contract=off" in kernels.base_cflags


def test_toml_error_names_file_and_line(tmp_path: Path) -> None:
    recipe = copy_recipe(tmp_path)
    (recipe / "recipe.toml").write_text('name = "trivial"\narchitectures = [x86_64]\n')
    with pytest.raises(UserError, match=r"recipe.toml: .*line 2"):
        recipes.load("trivial", recipe.parent)


def test_structural_problems_are_reported_together(tmp_path: Path) -> None:
    recipe = copy_recipe(tmp_path)
    text = (recipe / "recipe.toml").read_text()
    text = text.replace('"x86_64", "arm64"', '"x86_64", "sparc"').replace("build.sh.j2", "nope.j2")
    (recipe / "recipe.toml").write_text(text)
    with pytest.raises(UserError) as caught:
        recipes.load("trivial", recipe.parent)
    assert "'sparc' is not one of" in str(caught.value)
    assert "nope.j2 is not a file beside the recipe" in str(caught.value)


@pytest.mark.parametrize(
    ("change", "said"),
    [
        # a misspelt key of a table was read as absent: -O2 and no smoke test, without a word
        (
            ("base_cflags", "base_cflag"),
            "build: unknown key 'base_cflag'; did you mean base_cflags?",
        ),
        (('command = "bin/hello"', 'comand = "bin/hello"'), "smoke: unknown key 'comand'"),
        (("[smoke]\n", '[bench]\ncommnd = "x"\n[smoke]\n'), "bench: unknown key 'commnd'"),
        # a wrong type was an AttributeError's traceback
        (('path = "src"', 'archives = "x.tar.gz"'), "source.archives must be tables"),
        (('path = "src"', "archives = [1]"), "source.archives must be tables"),
        # the build's template a directory: a jinja2 TemplateNotFound at --dry-run
        (('template = "build.sh.j2"', 'template = "."'), ". is not a file beside the recipe"),
        # a source path that is a file packed an empty tarball and cached it
        (('path = "src"', 'path = "build.sh.j2"'), "build.sh.j2 is not a directory"),
        # an absolute artifact was scanned from the controller's own /usr/bin
        (
            ('["bin/hello"]', '["/usr/bin/true", "../x"]'),
            "build.artifacts: '/usr/bin/true' is not a path under the install prefix",
        ),
        (('["bin/hello"]', '["bin/hello", "../x"]'), "'../x' is not a path under the install"),
        (('["bin/hello"]', "[]"), "build.artifacts lists nothing"),
        (('base_cflags = "-O2"', "base_cflags = 3"), "build.base_cflags must be a string"),
        # written into the script's shell: split the flags, or ran as a command
        (
            ('base_cflags = "-O2"', """base_cflags = '-O2 -DVERSION="1.2 beta"'"""),
            """build.base_cflags: '-DVERSION="1.2' has a character the instance's shell reads""",
        ),
        (
            ('base_cflags = "-O2"', """base_cflags = '-O3"; touch /tmp/x; echo "'"""),
            "build.base_cflags: '-O3\";' has a character",
        ),
        (
            ('base_cflags = "-O2"', "base_cflags = '-Wl,-rpath,$ORIGIN/../lib'"),
            "'-Wl,-rpath,$ORIGIN/../lib' has a character",
        ),
        # an archive's name became a path on the build host: {work}/../../root/.bashrc
        (
            (
                '[source]\npath = "src"',
                '[[source.archives]]\nfilename = "../../root/.bashrc"\nsha256 = "' + "0" * 64 + '"',
            ),
            "source.archives[0].filename '../../root/.bashrc' must be a file's name",
        ),
        (
            (
                '[source]\npath = "src"',
                '[[source.archives]]\nfilename = "x.tar.gz"\nsha = "' + "0" * 64 + '"',
            ),
            "source.archives[0]: unknown key 'sha'",
        ),
    ],
)
def test_a_recipe_s_tables_are_checked_key_by_key(
    tmp_path: Path, change: tuple[str, str], said: str
) -> None:
    recipe = copy_recipe(tmp_path)
    text = (recipe / "recipe.toml").read_text()
    assert change[0] in text, change
    (recipe / "recipe.toml").write_text(text.replace(change[0], change[1], 1))
    with pytest.raises(UserError) as caught:
        recipes.load("trivial", recipe.parent)
    message = str(caught.value)
    assert said in message and "\n" not in message, message


def test_a_smoke_test_given_as_a_string_is_refused_in_one_line(tmp_path: Path) -> None:
    """It was an AttributeError's traceback."""
    recipe = copy_recipe(tmp_path)
    text = (recipe / "recipe.toml").read_text()
    table = '[smoke]\ncommand = "bin/hello"\nexpect = "hello from"\n'
    assert table in text
    (recipe / "recipe.toml").write_text('smoke = "bin/hello"\n' + text.replace(table, ""))
    with pytest.raises(UserError, match="smoke must be a table"):
        recipes.load("trivial", recipe.parent)


def test_an_archive_named_as_debian_names_one_loads(tmp_path: Path) -> None:
    recipe = copy_recipe(tmp_path)
    text = (
        (recipe / "recipe.toml")
        .read_text()
        .replace(
            '[source]\npath = "src"',
            '[[source.archives]]\nfilename = "libzstd_1.5.4+dfsg2.orig.tar.xz"\nsha256 = "'
            + "a" * 64
            + '"',
        )
    )
    (recipe / "recipe.toml").write_text(text)
    loaded = recipes.load("trivial", recipe.parent)
    assert loaded.archives[0].filename == "libzstd_1.5.4+dfsg2.orig.tar.xz"


def test_package_names_a_shell_would_split_are_refused(tmp_path: Path) -> None:
    # They go into an install command run as root on the instance: one word each, nothing more.
    recipe = copy_recipe(tmp_path)
    text = (recipe / "recipe.toml").read_text()
    text = text.replace(
        'packages = ["gcc"]', 'packages = ["gcc; rm -rf /"]\nruntime_packages = "x"'
    )
    (recipe / "recipe.toml").write_text(text)
    with pytest.raises(UserError) as caught:
        recipes.load("trivial", recipe.parent)
    assert "packages: 'gcc; rm -rf /' is not a package name" in str(caught.value)
    assert "runtime_packages must be a list of package names" in str(caught.value)


def test_bench_placeholders_take_their_parameters_values(tmp_path: Path) -> None:
    zstd = recipes.load("zstd")
    assert zstd.placeholders == ["level", "seconds"]
    assert zstd.bench_values() == {"level": "3", "seconds": "2"}  # the defaults
    assert zstd.bench_values({"level": 19}) == {"level": "19", "seconds": "2"}
    assert recipes.load("kernels").placeholders == []  # {args} only
    # A placeholder nothing can fill is refused at load, naming the file: run as is, the
    # workload would fail on every replicate.
    recipe = copy_recipe(tmp_path)
    with (recipe / "recipe.toml").open("a") as toml:
        toml.write('[bench]\ncommand = "bin/hello {greeting} {args}"\n')
    with pytest.raises(UserError) as caught:
        recipes.load("trivial", recipe.parent)
    assert str(caught.value) == (
        f"{recipe / 'recipe.toml'}: bench.command: {{greeting}} needs [bench.parameters] "
        "greeting with a default"
    )
    text = (FIXTURES / "trivial" / "recipe.toml").read_text()
    for toml, expected in (
        ('bench = "bin/hello"\n' + text, "bench must be a table: [bench] command = ..."),
        (text + "[bench]\nparameters = 5\n", "bench.parameters must be tables: NAME = { kind = "),
    ):
        (recipe / "recipe.toml").write_text(toml)
        with pytest.raises(UserError, match=re.escape(expected)):
            recipes.load("trivial", recipe.parent)


def test_unknown_recipe_suggests_close_names() -> None:
    with pytest.raises(UnknownNameError, match="did you mean kernels"):
        recipes.load("kernel")


def test_a_template_with_an_undefined_variable_is_an_error(tmp_path: Path) -> None:
    template = tmp_path / "build.sh.j2"
    template.write_text("#!/bin/bash\nmake -j{{ jobs }} CFLAGS='{{ cflgas }}'\n")
    with pytest.raises(UserError, match=r"build.sh.j2: 'cflgas' is undefined"):
        render.render(template, jobs=2)


def test_a_rendered_script_that_does_not_parse_is_refused() -> None:
    with pytest.raises(UserError, match="does not parse"):
        render.check_shell("#!/bin/bash\nif true; then\n", "broken.sh")


def test_a_rendered_script_shellcheck_rejects_is_refused_and_its_scratch_removed() -> None:
    # bash -n accepts it (the missing space before ] fails only at run time); shellcheck does not.
    refused = pytest.raises(UserError, match=r"^stage.sh: shellcheck: stage.sh:2:\d+: error")
    with refused, render.Checks() as checks:
        checks.shell('#!/bin/bash\n[ "$1" = x]\n', "stage.sh")
        scratch = checks.scratch
    assert not scratch.exists()


def test_a_script_that_passed_is_not_checked_again_and_one_that_failed_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    started: list[list[str]] = []
    real_start = render.Checks.start

    def counted(self: render.Checks, command: list[str], *args: Any, **kw: Any) -> None:
        started.append(command)
        real_start(self, command, *args, **kw)

    monkeypatch.setattr(render.Checks, "start", counted)
    good = f"#!/bin/bash\necho {uuid.uuid4().hex}\n"  # new to this process
    render.check_shell(good, "good.sh")
    assert len(started) == 2  # bash -n and shellcheck
    render.check_shell(good, "good.sh")
    with render.Checks() as checks:
        checks.shell(good, "good.sh")
    assert len(started) == 2  # the same text: the answer is known
    broken = "#!/bin/bash\nif true; then\n"
    for _ in range(2):
        with pytest.raises(UserError, match="does not parse"):
            render.check_shell(broken, "broken.sh")
    assert len(started) == 6  # a refusal is never remembered as a pass


def test_checks_still_running_when_the_caller_fails_are_stopped() -> None:
    with pytest.raises(RuntimeError), render.Checks() as checks:
        checks.start(["sleep", "30"], lambda *_: "never judged")
        process = checks._pending[0][0].result()
        raise RuntimeError("the cloud lookup failed")
    assert process.returncode is not None  # killed and reaped, not left running
    assert not checks.scratch.exists()


def test_source_packing_is_reproducible(tmp_path: Path) -> None:
    recipe = copy_recipe(tmp_path)
    first = recipes.pack_directory(recipe / "src")
    (recipe / "src" / "hello.c").touch()  # a new mtime must not change the bytes
    assert recipes.pack_directory(recipe / "src") == first


def test_source_add_refuses_a_file_no_recipe_accepts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AMIBAKE_SOURCE_CACHE", str(tmp_path / "cache"))
    stray = tmp_path / "zstd-1.5.6.tar.gz"
    stray.write_bytes(b"not the real tarball")
    with pytest.raises(UserError, match="matches no accepted source"):
        sources.add(stray)
    cache = tmp_path / "cache"
    assert not cache.exists() or not any(cache.iterdir())


def test_the_cache_key_covers_the_templates_the_build_template_includes(tmp_path: Path) -> None:
    """Only the recipe file and the template were hashed: an edit to a file the template
    includes reused the artifact built from the old one."""
    recipe = copy_recipe(tmp_path)
    template = recipe / "build.sh.j2"
    template.write_text(template.read_text() + '{% include "common.sh.j2" %}\n')
    (recipe / "common.sh.j2").write_text('{% import "macros.j2" as m %}echo common\n')
    (recipe / "macros.j2").write_text("{% macro x() %}x{% endmacro %}\n")
    (recipe / "unrelated.j2").write_text("echo unrelated\n")
    loaded = recipes.load("trivial", recipe.parent)
    before = loaded.digest()
    (recipe / "unrelated.j2").write_text("echo changed\n")
    assert loaded.digest() == before  # not included: not part of the build
    for included in ("common.sh.j2", "macros.j2"):  # included, and included by an included one
        (recipe / included).write_text((recipe / included).read_text() + "# edited\n")
        assert loaded.digest() != before, included
        before = loaded.digest()
    # a name chosen at render time could be any template beside it: all of them count
    template.write_text(template.read_text() + "{% include pick %}\n")
    before = loaded.digest()
    (recipe / "unrelated.j2").write_text("echo changed again\n")
    assert loaded.digest() != before
