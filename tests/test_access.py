"""The caller's address, the one source the security group opens SSH to."""

from __future__ import annotations

import http.server
import threading
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest

from amibake.config import Config
from amibake.errors import CloudError
from amibake.steps import access
from amibake.steps.access import caller_cidr


@pytest.fixture
def checkip(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[bytes], Any]]:
    """A checkip on loopback answering what the test sets; a context of AWS that asks it."""
    answer = [b""]

    class Answering(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", str(len(answer[0])))
            self.end_headers()
            self.wfile.write(answer[0])

        def log_message(self, *_: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Answering)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(access, "CHECKIP", f"http://127.0.0.1:{server.server_address[1]}/")

    def answered(body: bytes) -> Any:
        answer[0] = body
        return SimpleNamespace(cloud=SimpleNamespace(config=Config(cloud="aws")))

    yield answered
    server.shutdown()
    server.server_close()


def test_the_callers_address_is_a_32(checkip: Callable[[bytes], Any]) -> None:
    assert caller_cidr(checkip(b"203.0.113.7\n")) == "203.0.113.7/32"


def test_the_address_is_asked_directly_not_through_a_proxy(
    checkip: Callable[[bytes], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SSH dials instances directly: through HTTPS_PROXY, checkip saw the proxy's address, and
    the rule opened SSH to everyone behind that proxy. A proxy that refuses every connection
    (the discard port) is not asked."""
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert caller_cidr(checkip(b"203.0.113.7\n")) == "203.0.113.7/32"


def test_an_answer_that_is_not_an_address_opens_nothing(checkip: Callable[[bytes], Any]) -> None:
    context = checkip(b"<html><title>Sign in to the network</title></html>")
    with pytest.raises(CloudError, match=r"answered '<html><title>Sign in.*not an IPv4 address"):
        caller_cidr(context)


def _private(monkeypatch: pytest.MonkeyPatch, cidr: str) -> Any:
    """A context whose SSH dials private addresses, in a VPC whose first subnet is `cidr`;
    checkip is never to be asked."""

    monkeypatch.setattr(access, "CHECKIP", "http://127.0.0.1:9/")  # refused, if it were asked
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
