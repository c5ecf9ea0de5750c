"""`fleet tune` with instance types outside the build catalog (issue 23): a tune whose trials
build (a recipe) on such a type is refused in one line naming the catalog file and what an
entry needs, before a run is recorded; the architecture a search space spans is read for any
type EC2 offers without asking a cloud (instance_kinds.architecture), held here to what EC2's
DescribeInstanceTypes says of every type the local cloud describes."""

from __future__ import annotations

from pathlib import Path

import pytest

from amibake import catalog, instance_kinds
from amibake.cloud import Cloud
from fleet.cli import main
from fleet.results import Results

GPU = "g4dn.xlarge"  # a GPU type: no family of the build catalog


@pytest.mark.parametrize(
    "where",
    [
        f'types = ["{GPU}"]\n',
        f'[params.instance_type]\nkind = "categorical"\nvalues = ["c5a.large", "{GPU}"]\n',
    ],
    ids=["types", "params.instance_type"],
)
def test_a_build_on_a_type_outside_the_catalog_is_refused_naming_the_catalog(
    where: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert GPU.split(".")[0] not in catalog.families()
    monkeypatch.setenv("AMIBAKE_RESULTS_DIR", str(tmp_path / "results"))
    tune_file = tmp_path / "t.toml"
    tune_file.write_text(
        'recipe = "kernels"\nobjective = "runtime"\n'
        + where
        + '[params.threads]\nkind = "int"\nlow = 1\nhigh = 2\nstage = "run"\n'
    )
    assert main(["tune", str(tune_file), "--yes"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert f"{tune_file}:" in err and GPU in err
    assert "amibake/catalog/families.json" in err
    assert "architecture" in err and "archspec" in err and "sizes" in err, err
    assert not (tmp_path / "results" / "fleet.sqlite").exists() or (
        Results(tmp_path / "results" / "fleet.sqlite").run_ids() == []
    )


def test_architecture_by_name_is_what_ec2_describes_for_every_type(cloud: Cloud) -> None:
    described = {}
    for page in cloud.ec2.get_paginator("describe_instance_types").paginate():
        for entry in page["InstanceTypes"]:
            described[entry["InstanceType"]] = instance_kinds.from_description(entry).architecture
    assert len(described) > 500 and {"x86_64", "arm64"} <= set(described.values())
    wrong = {t: a for t, a in described.items() if instance_kinds.architecture(t) != a}
    assert wrong == {}
    # The catalog's own word stands for its families.
    for family in catalog.families().values():
        assert instance_kinds.architecture(family.instance_type(family.sizes[0])) == (
            family.architecture
        )
