"""botocore's data files are read once a process (amibake/service_models.py): sessions share what
they read, and a data path of the user's own (AWS_DATA_PATH) is still read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from amibake import service_models


def test_sessions_share_the_models_they_read() -> None:
    first, second = service_models.session(), service_models.session()
    assert first.get_component("data_loader") is not second.get_component("data_loader")
    # the same decoded model, not a second decoding of the same file
    ec2 = first.get_component("data_loader").load_service_model("ec2", "service-2")
    assert second.get_component("data_loader").load_service_model("ec2", "service-2") is ec2
    assert first.get_component("data_loader").load_data("endpoints") is second.get_component(
        "data_loader"
    ).load_data("endpoints")
    assert "RunInstances" in service_models.service_model("ec2").operation_names
    assert "DescribeInstances" in service_models.paginators("ec2")


def test_a_data_path_of_the_users_own_is_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = {
        "version": "2.0",
        "metadata": {
            "apiVersion": "2020-01-01",
            "endpointPrefix": "mine",
            "protocol": "json",
            "serviceId": "Mine",
            "signatureVersion": "v4",
            "targetPrefix": "Mine",
            "jsonVersion": "1.1",
        },
        "operations": {},
        "shapes": {},
    }
    where = tmp_path / "mine" / "2020-01-01"
    where.mkdir(parents=True)
    (where / "service-2.json").write_text(json.dumps(model))
    monkeypatch.setenv("AWS_DATA_PATH", str(tmp_path))
    assert service_models.session().get_service_model("mine").service_name == "mine"
    monkeypatch.delenv("AWS_DATA_PATH")
    # sessions without it do not see it: the shared reads are kept by search path
    assert "mine" not in service_models.session().get_available_services()
