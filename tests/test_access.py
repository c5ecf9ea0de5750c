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


def _private(monkeypatch: pytest.MonkeyPatch, cidr: str) -> Any:
    """A context whose SSH dials private addresses, in a VPC whose first subnet is `cidr`;
    checkip is never to be asked."""

    def no_checkip(url: str, timeout: float) -> Any:
        raise AssertionError(f"asked {url}")

    monkeypatch.setattr(urllib.request, "urlopen", no_checkip)
    subnet = {"SubnetId": "subnet-1", "CidrBlock": cidr, "AvailabilityZone": "us-east-1a"}
    return SimpleNamespace(
        cloud=SimpleNamespace(config=Config(cloud="aws", ssh_address="private")),
        network=lambda: SimpleNamespace(subnets=(subnet,)),
    )


def test_private_ssh_is_opened_to_this_machine_s_address_toward_the_vpc(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ssh_address private, SSH comes from this machine's address inside the VPC (or its
    VPN's): the rule opened it to the public address checkip saw, which private SSH never
    comes from, so it never connected. A VPC given here as a loopback range: this machine's
    route to it leaves from 127.0.0.1."""
    assert caller_cidr(_private(monkeypatch, "127.66.0.0/16")) == "127.0.0.1/32"


def test_private_ssh_without_a_route_to_the_vpc_is_one_line(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import errno
    import socket

    def unreachable(self: socket.socket, address: Any) -> None:
        raise OSError(errno.ENETUNREACH, "Network is unreachable")

    monkeypatch.setattr(socket.socket, "connect", unreachable)
    with pytest.raises(CloudError) as refused:
        caller_cidr(_private(monkeypatch, "10.20.0.0/16"))
    said = str(refused.value)
    assert said.startswith("no route from this machine to subnet subnet-1 (10.20.0.0/16)"), said
    assert "Network is unreachable" in said and 'ssh_address = "private" needs' in said
