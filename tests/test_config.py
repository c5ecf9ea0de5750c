"""Config layers: defaults < amibake.toml < AMIBAKE_* environment < flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from amibake import config
from amibake.errors import ConfigError


def test_layers_override_in_order(tmp_path: Path) -> None:
    toml = tmp_path / "amibake.toml"
    toml.write_text('region = "eu-west-1"\nsize = "xlarge"\nrecipe = "zstd"\n')
    env = {"AMIBAKE_SIZE": "2xlarge", "AMIBAKE_RECIPE": "kernels"}
    cfg = config.load({"recipe": "custom"}, toml_path=toml, environ=env)
    assert (cfg.region, cfg.size, cfg.recipe) == ("eu-west-1", "2xlarge", "custom")
    assert cfg.cloud == "aws"  # default survives


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    toml = tmp_path / "amibake.toml"
    toml.write_text('colud = "local"\nmax_attempts = "many"\n')
    with pytest.raises(ConfigError) as caught:
        config.load({"spot": "perhaps"}, toml_path=toml, environ={"AMIBAKE_LOCAL_PORT": "x"})
    problems = caught.value.problems
    assert len(problems) == 4, problems
    assert any("unknown setting 'colud'" in p for p in problems)
    assert any("AMIBAKE_LOCAL_PORT" in p for p in problems)
    assert any("--spot" in p for p in problems)


def test_semantic_validation(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        config.load(
            {"cloud": "gcp", "local_subnet": "10.0.0.0/8", "local_port": 70000},
            toml_path=tmp_path / "none.toml",
            environ={},
        )
    text = str(caught.value)
    assert "cloud must be one of aws, local" in text
    assert "local_subnet must be a loopback network" in text
    assert "local_port must be a TCP port" in text
    for region in ("us-east1", "5", "US-EAST-1", "us-east-1 "):
        with pytest.raises(ConfigError, match=f"region must be an AWS region code.*{region!r}"):
            config.load({"region": region}, toml_path=tmp_path / "none.toml", environ={})
    for region in ("us-east-1", "ap-southeast-2", "mx-central-1"):
        loaded = config.load({"region": region}, toml_path=tmp_path / "none.toml", environ={})
        assert loaded.region == region
    # Well formed, but another partition's: its ARNs (arn:aws-us-gov:...), service names and
    # prices are not the ones amibake's policies and catalog name, and a run failed half-way.
    for region, partition in (("us-gov-west-1", "aws-us-gov"), ("cn-north-1", "aws-cn")):
        with pytest.raises(ConfigError, match=f"region {region} is in AWS's {partition} partition"):
            config.load({"region": region}, toml_path=tmp_path / "none.toml", environ={})


def test_a_name_given_as_a_number_in_the_file_is_refused(tmp_path: Path) -> None:
    toml = tmp_path / "amibake.toml"
    toml.write_text("region = 5\nrecipe = true\n")
    with pytest.raises(ConfigError) as caught:
        config.load(toml_path=toml, environ={})
    assert caught.value.problems == [
        f"{toml}: region must be str, got 5",
        f"{toml}: recipe must be str, got True",
    ]


def test_toml_syntax_error_names_the_file_and_line(tmp_path: Path) -> None:
    toml = tmp_path / "amibake.toml"
    toml.write_text('region = "us-east-1"\nsize = \n')
    with pytest.raises(ConfigError, match=r"amibake.toml: .*line 2"):
        config.load(toml_path=toml, environ={})


def test_the_accounts_network_shape_from_file_environment_or_flag(tmp_path: Path) -> None:
    """Accounts without a default VPC name their subnets (and groups) once, in any layer."""
    toml = tmp_path / "amibake.toml"
    toml.write_text(
        'subnet_ids = ["subnet-0123456789abcdef0", "subnet-89abcdef"]\n'
        'security_group_ids = ["sg-0123456789abcdef0"]\nssh_address = "private"\n'
    )
    cfg = config.load(toml_path=toml, environ={})
    assert cfg.subnet_ids == ("subnet-0123456789abcdef0", "subnet-89abcdef")
    assert (cfg.security_group_ids, cfg.ssh_address) == (("sg-0123456789abcdef0",), "private")
    env = {"AMIBAKE_SUBNET_IDS": "subnet-01234567, subnet-89abcdef"}
    assert config.load(toml_path=toml, environ=env).subnet_ids == (
        "subnet-01234567",
        "subnet-89abcdef",
    )
    assert config.load(
        {"subnet_ids": "subnet-76543210"}, toml_path=toml, environ={}
    ).subnet_ids == ("subnet-76543210",)
    assert config.load(toml_path=tmp_path / "none.toml", environ={}).subnet_ids == ()


def test_a_wrong_network_setting_is_named_with_its_shape(tmp_path: Path) -> None:
    toml = tmp_path / "amibake.toml"
    toml.write_text('subnet_ids = "subnet-1"\nsecurity_group_ids = [3]\n')
    with pytest.raises(ConfigError) as caught:
        config.load(toml_path=toml, environ={"AMIBAKE_SSH_ADDRESS": "elastic"})
    assert len(caught.value.problems) == 1  # [3] is no list of ids
    with pytest.raises(ConfigError) as caught:
        config.load(toml_path=tmp_path / "none.toml", environ={
            "AMIBAKE_SUBNET_IDS": "subnet-1", "AMIBAKE_SECURITY_GROUP_IDS": "sg-01234567",
            "AMIBAKE_SSH_ADDRESS": "elastic",
        })  # fmt: skip
    problems = caught.value.problems
    assert any("ssh_address must be one of public, private" in p for p in problems), problems
    assert any("subnet_ids: 'subnet-1' is not an id like subnet-" in p for p in problems)
    with pytest.raises(ConfigError) as caught:
        config.load(toml_path=tmp_path / "none.toml", environ={
            "AMIBAKE_SECURITY_GROUP_IDS": "sg-01234567",
        })  # fmt: skip
    assert "security_group_ids needs subnet_ids" in caught.value.problems[0]


def test_a_results_directory_that_cannot_be_written_is_one_problem_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Run from / as a plain user, opening the journal raised PermissionError; a setting under
    # a file raised NotADirectoryError.
    (tmp_path / "file").write_text("")
    under_a_file = {"AMIBAKE_RESULTS_DIR": str(tmp_path / "file" / "results")}
    with pytest.raises(
        ConfigError,
        match=r"results_dir .*/file/results cannot be made: .*/file "
        r"is a file: run from a writable directory or set AMIBAKE_RESULTS_DIR",
    ):
        config.load(toml_path=tmp_path / "none.toml", environ=under_a_file)
    # os.access is what a plain user's permissions answer (root's always says yes)
    denied = {str(tmp_path / "ro")}
    monkeypatch.setattr(config.os, "access", lambda path, mode: str(path) not in denied)
    (tmp_path / "ro").mkdir()
    for setting, says in (
        (tmp_path / "ro", "is not writable"),
        (tmp_path / "ro" / "new" / "results", f"cannot be made in {tmp_path}/ro"),
    ):
        with pytest.raises(ConfigError, match=f"results_dir {setting} {says}: run from"):
            config.load(
                toml_path=tmp_path / "none.toml", environ={"AMIBAKE_RESULTS_DIR": str(setting)}
            )
    monkeypatch.chdir(tmp_path / "ro")  # the default, relative: named with where it is from
    with pytest.raises(ConfigError, match=f"results_dir results \\(from {tmp_path}/ro\\) cannot"):
        config.load(toml_path=tmp_path / "none.toml", environ={})
    assert config.load(
        toml_path=tmp_path / "none.toml", environ={}, flags={"results_dir": str(tmp_path)}
    )
