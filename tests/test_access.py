"""The caller's address, the one source the security group opens SSH to."""

from __future__ import annotations

import io
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest

from amibake.config import Config
from amibake.errors import CloudError
from amibake.steps.access import caller_cidr


def answered(monkeypatch: pytest.MonkeyPatch, body: bytes) -> Any:
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout: io.BytesIO(body))
    return SimpleNamespace(cloud=SimpleNamespace(config=Config(cloud="aws")))


def test_the_callers_address_is_a_32(monkeypatch: pytest.MonkeyPatch) -> None:
    assert caller_cidr(answered(monkeypatch, b"203.0.113.7\n")) == "203.0.113.7/32"


def test_an_answer_that_is_not_an_address_opens_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    context = answered(monkeypatch, b"<html><title>Sign in to the network</title></html>")
    with pytest.raises(CloudError, match=r"answered '<html><title>Sign in.*not an IPv4 address"):
        caller_cidr(context)
