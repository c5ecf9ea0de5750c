"""Family -> target -> flags, for the compilers that matter, including the fallbacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from amibake import catalog, flags
from amibake.errors import UnknownNameError, UserError

# family, compiler, target, what the flags are for, a flag that must be there
TABLE = [
    ("c5", "gcc@11.4.1", "skylake_avx512", "skylake_avx512", "-march=skylake-avx512"),
    ("c5a", "gcc@12.2.0", "zen2", "zen2", "-march=znver2"),
    ("c6i", "gcc@11.4.1", "icelake", "icelake", "-march=icelake-client"),
    ("c6a", "gcc@11.4.1", "zen3", "zen3", "-march=znver3"),
    ("c6g", "gcc@11.4.1", "neoverse_n1", "neoverse_n1", "-mcpu=neoverse-n1"),
    ("c7i", "gcc@11.4.1", "sapphirerapids", "sapphirerapids", "-march=sapphirerapids"),
    ("c7a", "gcc@13.2.0", "zen4", "zen4", "-march=znver4"),
    # gcc before 12.3 has no -march=znver4: archspec spells zen4 as znver3 plus AVX-512, less
    # VPOPCNTDQ, BF16 and GFNI, which Genoa has (flags.ARCHSPEC_OMITS adds them back).
    ("c7a", "gcc@12.2.0", "zen4", "zen4", "-mavx512f"),
    ("c7a", "gcc@11.4.1", "zen4", "zen4", "-mavx512vpopcntdq"),
    ("c7a", "gcc@12.2.0", "zen4", "zen4", "-mgfni"),
    # gcc 10.2 knows neither zen4 nor zen3 (10.3+): the best it can do is zen2.
    ("c7a", "gcc@10.2.1", "zen4", "zen2", "-march=znver2"),
    ("c7i", "gcc@10.2.1", "sapphirerapids", "icelake", "-march=icelake-client"),
    ("c7g", "gcc@11.4.1", "neoverse_v1", "neoverse_v1", "-mcpu=neoverse-v1"),
    ("c8g", "gcc@13.2.0", "neoverse_v2", "neoverse_v2", "-mcpu=neoverse-v2"),
    ("c8g", "clang@11", "neoverse_v2", "armv8.5a", "-march=armv8.5-a"),
    ("m7i", "gcc@12.2.0", "sapphirerapids", "sapphirerapids", "-march=sapphirerapids"),
    ("m7g", "gcc@12.2.0", "neoverse_v1", "neoverse_v1", "-mcpu=neoverse-v1"),
    ("r7i", "gcc@11.4.1", "sapphirerapids", "sapphirerapids", "-march=sapphirerapids"),
]


@pytest.mark.parametrize(("family", "compiler", "target", "used", "flag"), TABLE)
def test_family_compiler_table(
    family: str, compiler: str, target: str, used: str, flag: str
) -> None:
    result = flags.for_family(catalog.family(family), flags.Compiler.parse(compiler))
    assert (result.target, result.used) == (target, used)
    assert flag in result.cflags.split()
    assert result.fell_back == (target != used)
    if result.fell_back:
        assert result.warning is not None and f"using {used}" in result.warning


def test_a_family_that_lands_on_two_generations_targets_what_both_run() -> None:
    # c5 lands on Skylake or Cascade Lake; Cascade Lake code may not run on Skylake.
    assert flags.family_target(catalog.family("c5")).name == "skylake_avx512"


@pytest.mark.parametrize(
    ("family", "like"),
    [("m5a", None), ("r5a", "m5a"), ("m6a", "c6a"), ("r6a", "c6a"), ("m6g", "c6g"), ("r6g", "c6g")],
)
def test_the_general_and_memory_families_of_a_processor_build_as_its_compute_family(
    family: str, like: str | None
) -> None:
    """m and r families of a processor the catalog knew only as a c family (or not at all)
    were refused by name: each is that processor's, with its target and flags, and priced."""
    from fleet.prices import lookup

    compiler = flags.Compiler.parse("gcc@12.2.0")
    made = flags.for_family(catalog.family(family), compiler)
    if like is None:
        assert made.cflags.split() == ["-march=znver1", "-mtune=znver1"]  # Naples: Zen
    else:
        assert made.cflags == flags.for_family(catalog.family(like), compiler).cflags
    for size in catalog.family(family).sizes:
        assert lookup(f"{family}.{size}").vcpus > 0


def test_the_issue_families_are_all_there_and_valid() -> None:
    known = catalog.families()
    for name in ("c5", "c6i", "c6a", "c6g", "c7i", "c7a", "c7g", "c8g", "m7i", "m7g", "r7i"):
        assert name in known
    for family in known.values():
        catalog.validate(family)


def test_catalog_validation_rejects_bad_data() -> None:
    bad = catalog.Family("x9", "arm64", ("sapphirerapids",), "?", ("large",))
    with pytest.raises(catalog.CatalogError, match="is not arm64"):
        catalog.validate(bad)


def test_unknown_family_lists_close_matches() -> None:
    with pytest.raises(UnknownNameError, match=r"unknown family 'c7x'; did you mean .*c7i"):
        catalog.family("c7x")


@pytest.mark.parametrize("text", ["gcc", "gcc@", "icc@2021", "gcc@twelve"])
def test_compiler_spelling_errors(text: str) -> None:
    with pytest.raises(UserError, match="is not NAME@VERSION"):
        flags.Compiler.parse(text)


def test_the_flags_added_back_are_only_for_the_older_spelling() -> None:
    new = flags.for_family(catalog.family("c7a"), flags.Compiler.parse("gcc@13.2.0"))
    assert new.cflags.split() == ["-march=znver4", "-mtune=znver4"]  # znver4 has them all
    old = flags.for_family(catalog.family("c6a"), flags.Compiler.parse("gcc@11.4.1"))
    assert "-mavx512bf16" not in old.cflags.split()  # zen3: not Genoa's


def test_a_c7i_build_cannot_use_vp2intersect_which_no_sapphire_rapids_has(tmp_path: Path) -> None:
    """gcc before 12.3 enabled AVX512-VP2INTERSECT under -march=sapphirerapids (Debian 12's
    12.2 and AL2023's 11 among them): the c7i flags turn it off, whatever the compiler."""
    import shutil
    import subprocess

    tuned = flags.for_family(catalog.family("c7i"), flags.Compiler.parse("gcc@12.2.0"))
    assert "-mno-avx512vp2intersect" in tuned.cflags.split()
    gcc = shutil.which("gcc")
    assert gcc, "gcc: make install installs it"
    macros = subprocess.run(
        [gcc, *tuned.cflags.split(), "-dM", "-E", "-"],
        input="",
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "__AVX512VP2INTERSECT__" not in macros
    assert "__AVX512FP16__" in macros and "__AMX_TILE__" in macros  # the rest of the target
