"""SSH to an instance: one Fabric connection per instance, host key verified, output streamed.

Host keys are never trusted on first use. The instance's console output carries the block that
cloud-init prints (``-----BEGIN SSH HOST KEY FINGERPRINTS-----``); a server key whose SHA256
fingerprint is not in that block is rejected, exactly as ``RejectPolicy`` would reject a key
missing from known_hosts. The same code runs on AWS and on the local cloud.

Commands run on the connection's transport directly rather than through Fabric's ``run``: invoke's
runner polls for completion with a 10 ms sleep, which would dominate short commands. Steps should
send one script per step (``script``) anyway: most of a command's cost is the remote shell
starting.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import re
import select
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import paramiko
from fabric import Config as FabricConfig
from fabric import Connection

from amibake.errors import HostKeyMismatch, RemoteError

Sink = Callable[[str], None]
# After a command's exit status, how long its output may still come before EOF: enough for a
# loaded machine's sshd to drain the pipe, short enough not to wait on a background process
# that holds the output open (such a command's output is whatever came by then).
EOF_AFTER_EXIT_S = 5.0
# A connection that went silent (a network that drops packets, a host gone without a reset, an
# sshd stopped) is found by keepalives: one every KEEPALIVE_S, and the connection closed when
# none is answered within SILENCE_S, as ssh's ServerAliveInterval/ServerAliveCountMax do
# (OpenSSH refuses keepalive@openssh.com, and the refusal is the answer). TCP alone never
# tells: a command's reads wait on a silent peer for ever, and the run with them, its instance
# billed and its cleanup never reached. Closed, the waiting command fails as "connection lost".
KEEPALIVE_S = 15.0
SILENCE_S = 60.0
_BLOCK = re.compile(
    r"-----BEGIN SSH HOST KEY FINGERPRINTS-----(.*?)-----END SSH HOST KEY FINGERPRINTS-----", re.S
)
_FINGERPRINT = re.compile(r"\b(SHA256:[A-Za-z0-9+/]{43})\b")


def parse_fingerprints(console_output: str) -> set[str]:
    """SHA256 fingerprints from every fingerprint block in a console log."""
    found: set[str] = set()
    for block in _BLOCK.findall(console_output):
        found.update(_FINGERPRINT.findall(block))
    return found


def fingerprint(key: paramiko.PKey) -> str:
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


class FingerprintPolicy(paramiko.MissingHostKeyPolicy):
    """Accept a server key only if its fingerprint was published in the console output."""

    def __init__(self, allowed: set[str]) -> None:
        self.allowed = allowed

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        seen = fingerprint(key)
        if seen not in self.allowed:
            raise HostKeyMismatch(
                f"{hostname}: host key {key.get_name()} {seen} is not among the fingerprints in "
                f"the instance's console output ({', '.join(sorted(self.allowed)) or 'none'}); "
                "refusing to connect"
            )
        client.get_host_keys().add(hostname, key.get_name(), key)


def load_private_key(pem: str) -> paramiko.PKey:
    for kind in (paramiko.Ed25519Key, paramiko.ECDSAKey, paramiko.RSAKey):
        try:
            return kind.from_private_key(io.StringIO(pem))
        except (paramiko.SSHException, ValueError):
            continue
    raise RemoteError("the key pair's private key is not an ed25519, ECDSA or RSA key")


def _ask_keepalive(transport: paramiko.Transport, answered: threading.Event) -> None:
    """One keepalive, waited for (until the connection closes, if nobody answers)."""
    with contextlib.suppress(paramiko.SSHException, OSError, EOFError):
        transport.global_request("keepalive@openssh.com", wait=True)
    answered.set()


@dataclass
class Result:
    command: str
    exit_code: int
    stdout: str
    stderr: str

    @property
    def tail(self) -> str:
        lines = (self.stdout + self.stderr).strip().splitlines()
        return " | ".join(lines[-5:])


class Remote:
    """A verified SSH connection to one host, reused for all its commands and transfers."""

    def __init__(
        self,
        host: str,
        port: int,
        user: str,
        private_key: paramiko.PKey,
        fingerprints: set[str],
        sink: Sink | None = None,
        log: IO[str] | None = None,
        cancel: threading.Event | None = None,
    ) -> None:
        self.name = f"{user}@{host}:{port}"
        self.cancel = cancel
        self.sink = sink
        self.log = log
        self.connection = Connection(
            host,
            user=user,
            port=port,
            config=FabricConfig(overrides={"load_ssh_configs": False}),
            connect_timeout=10,
            connect_kwargs={"pkey": private_key, "look_for_keys": False, "allow_agent": False},
        )
        # Fabric installs AutoAddPolicy; replace it before the first connect.
        self.connection.client.set_missing_host_key_policy(FingerprintPolicy(fingerprints))
        self._user = user
        self.silent = ""  # why the keepalive closed the connection, once it has
        self._closing = threading.Event()

    def open(self) -> None:
        try:
            self.connection.open()
        except HostKeyMismatch:
            raise
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise RemoteError(f"{self.name}: cannot connect: {exc}") from exc
        # paramiko leaves Nagle's algorithm on: each small request then waits for a delayed
        # ACK, about 40 ms a command (measured: 49.7 ms -> 6.0 ms for /bin/true).
        transport = self.connection.transport
        if transport is not None:
            transport.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.silent = ""
            self._closing = threading.Event()  # this connection's: a reopened one has its own
            threading.Thread(
                target=self._keepalive,
                args=(transport, self._closing),
                name=f"keepalive-{self.name}",
                daemon=True,
            ).start()

    def close(self) -> None:
        self._closing.set()
        self.connection.close()

    def save_host_keys(self, path: Path) -> bool:
        """The host keys accepted (FingerprintPolicy) in OpenSSH's known_hosts form, for a
        person's ssh to verify the host as this connection did; False when none was."""
        keys = self.connection.client.get_host_keys()
        if not len(keys):
            return False
        keys.save(str(path))
        return True

    def _keepalive(self, transport: paramiko.Transport, closing: threading.Event) -> None:
        """Until this connection closes: a keepalive every KEEPALIVE_S; none answered within
        SILENCE_S closes it (see KEEPALIVE_S)."""
        while not closing.wait(KEEPALIVE_S) and transport.is_active():
            answered = threading.Event()
            threading.Thread(
                target=_ask_keepalive,
                args=(transport, answered),
                name=f"keepalive-ask-{self.name}",
                daemon=True,
            ).start()
            if not answered.wait(SILENCE_S) and not closing.is_set():
                self.silent = f"no answer to SSH keepalives for {SILENCE_S:.0f}s"
                self._emit(f"{self.name}: {self.silent}; closing the connection\n")
                transport.close()  # what waits on it fails now, as "connection lost"
                return

    def quiet(self, command: str, timeout_s: float) -> int | None:
        """Run `command` on a channel of its own, beside whatever else runs (safe from another
        thread), nothing shown or logged: its exit code, or None when it did not end within
        `timeout_s` or the connection is gone."""
        transport = self.connection.transport
        if transport is None or not transport.is_active():
            return None
        try:
            channel = transport.open_session(timeout=timeout_s)
            try:
                channel.settimeout(timeout_s)
                channel.exec_command(command)
                deadline = time.monotonic() + timeout_s
                while not channel.exit_status_ready():
                    if time.monotonic() > deadline:
                        return None
                    time.sleep(0.05)
                return int(channel.recv_exit_status())
            finally:
                channel.close()
        except (paramiko.SSHException, OSError, EOFError):
            return None

    def __enter__(self) -> Remote:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _emit(self, text: str) -> None:
        if self.log is not None:
            self.log.write(text)
            self.log.flush()
        if self.sink is not None:
            self.sink(text)

    def run(
        self,
        command: str,
        *,
        stdin: bytes | None = None,
        check: bool = True,
        stream: bool = True,
        timeout_s: float | None = None,
    ) -> Result:
        """Run one command; stream its output to the log and sink; fail on non-zero if check."""
        transport = self.connection.transport
        if transport is None or not transport.is_active():
            self.open()
            transport = self.connection.transport
        assert transport is not None
        try:
            channel = transport.open_session()
            channel.exec_command(command)
            if stdin is not None:
                channel.sendall(stdin)
            channel.shutdown_write()
            out, err = self._collect(channel, stream, timeout_s)
            code = channel.recv_exit_status()
        except (paramiko.SSHException, OSError, EOFError) as exc:
            raise RemoteError(
                f"{self.name}: connection lost while running {command!r}: {self.silent or exc}"
            ) from exc
        if code == -1:
            why = f": {self.silent}" if self.silent else ""
            raise RemoteError(f"{self.name}: connection lost while running {command!r}{why}")
        result = Result(command, code, out, err)
        if check and code != 0:
            raise RemoteError(f"{self.name}: {command!r} exited {code}: {result.tail}")
        return result

    def _collect(self, channel: Any, stream: bool, timeout_s: float | None) -> tuple[str, str]:
        out: list[bytes] = []
        err: list[bytes] = []
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        exited = 0.0  # when the exit status was first seen with nothing left to read
        while True:
            got = False
            while channel.recv_ready():
                chunk = channel.recv(65536)
                out.append(chunk)
                got = True
                if stream:
                    self._emit(chunk.decode(errors="replace"))
            while channel.recv_stderr_ready():
                chunk = channel.recv_stderr(65536)
                err.append(chunk)
                got = True
                if stream:
                    self._emit(chunk.decode(errors="replace"))
            # Read before the buffers are: data that comes with the EOF is then in them.
            eof = channel.eof_received
            if (
                channel.exit_status_ready()
                and not channel.recv_ready()
                and not (channel.recv_stderr_ready())
            ):
                # The exit status is not the end of the output: sshd sends it when the command
                # exits, and what is still in the command's pipe follows (RFC 4254 allows it;
                # under load a replicate's last line, its FLEET-RESULT, came after it and was
                # lost). The end is EOF; waited for a while only, as a process the command left
                # in the background may hold the output open.
                if eof:
                    break
                exited = exited or time.monotonic()
                if time.monotonic() - exited > EOF_AFTER_EXIT_S:
                    break
            if channel.closed and not got:
                break
            if self.cancel is not None and self.cancel.is_set():
                channel.close()
                raise RemoteError(f"{self.name}: cancelled while running a command")
            if deadline is not None and time.monotonic() > deadline:
                channel.close()
                raise RemoteError(f"{self.name}: command timed out after {timeout_s:.0f}s")
            if not got:
                select.select([channel], [], [], 0.05 if exited else 1.0)
        return b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace")

    def script(self, text: str, *, sudo: bool = True, check: bool = True, **kw: Any) -> Result:
        """Run a whole bash script in one round trip (as root via sudo unless told otherwise)."""
        shell = "bash -euo pipefail -s"
        if sudo and self._user != "root":
            shell = "sudo -n " + shell
        return self.run(shell, stdin=text.encode(), check=check, **kw)

    def put(self, local: Path, remote: str) -> None:
        try:
            self.connection.put(str(local), remote)
        except (OSError, paramiko.SSHException) as exc:
            raise RemoteError(f"{self.name}: upload of {local} to {remote} failed: {exc}") from exc

    def get(self, remote: str, local: Path) -> None:
        try:
            self.connection.get(remote, str(local))
        except (OSError, paramiko.SSHException) as exc:
            raise RemoteError(f"{self.name}: download of {remote} failed: {exc}") from exc
