"""A command's output is read to its end: sshd may send the exit status before the last of the
output (RFC 4254 allows it), which under load lost a replicate's FLEET-RESULT line."""

from __future__ import annotations

import os
import threading
import time
from types import SimpleNamespace
from typing import Any

from amibake import remote


class LateChannel:
    """A channel whose exit status arrives first and whose last chunk and EOF come after it."""

    def __init__(self, first: bytes, last: bytes, late_s: float, eof: bool = True) -> None:
        self.chunks = [first]
        self.status_ready = True
        self.eof_received = False
        self.closed = False
        self._read, self._write = os.pipe()  # what select waits on

        def arrive() -> None:
            time.sleep(late_s)
            self.chunks.append(last)
            self.eof_received = eof
            os.write(self._write, b"x")

        threading.Thread(target=arrive, daemon=True).start()

    def fileno(self) -> int:
        return self._read

    def recv_ready(self) -> bool:
        return bool(self.chunks)

    def recv(self, _: int) -> bytes:
        return self.chunks.pop(0)

    def recv_stderr_ready(self) -> bool:
        return False

    def exit_status_ready(self) -> bool:
        return self.status_ready


def collect(channel: Any) -> tuple[str, str]:
    reader = SimpleNamespace(cancel=None, _emit=lambda _: None)
    return remote.Remote._collect(reader, channel, False, None)  # type: ignore[arg-type]


def test_output_after_the_exit_status_is_read_to_eof() -> None:
    out, _ = collect(LateChannel(b"kernel=sieve\n", b"FLEET-RESULT exit=0\n", late_s=0.3))
    assert out == "kernel=sieve\nFLEET-RESULT exit=0\n"


def test_a_background_process_holding_the_output_is_not_waited_on_for_ever() -> None:
    started = time.monotonic()
    out, _ = collect(LateChannel(b"started\n", b"", late_s=0.1, eof=False))
    waited = time.monotonic() - started
    assert out == "started\n"
    assert remote.EOF_AFTER_EXIT_S <= waited < remote.EOF_AFTER_EXIT_S + 2
