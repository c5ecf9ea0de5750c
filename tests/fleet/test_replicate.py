"""fleet/agent/replicate.sh on its own, against an IMDS of the test's: the spot notice watcher."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from fleet.executor import AGENT


class _Imds(BaseHTTPRequestHandler):
    """IMDSv2 whose tokens die after two uses (as a 6-hour token dies on a long replicate), and
    which raises the spot notice to the second token it issues."""

    server: Any

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: str = "") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_PUT(self) -> None:
        self.server.issued += 1
        token = f"token-{self.server.issued}"
        self.server.uses[token] = 0
        self._send(200, token)

    def do_GET(self) -> None:
        token = self.headers.get("X-aws-ec2-metadata-token", "")
        if token not in self.server.uses or self.server.uses[token] >= 2:
            self._send(401, "Unauthorized")
            return
        self.server.uses[token] += 1
        # The notice only to a second token: the watcher must ask again to see it at all (a
        # notice at a fixed time could reach a slow host's first token still unspent).
        if self.server.issued < 2:
            self._send(404, "Not Found")
        else:
            self._send(200, '{"action": "terminate", "time": "2026-11-24T00:00:00Z"}')


@pytest.fixture
def imds() -> Iterator[Any]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Imds)
    server.issued, server.uses = 0, {}
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def test_the_watcher_asks_a_new_token_when_imds_refuses_its_own(imds: Any, tmp_path: Path) -> None:
    # Its first token dies after two checks: a watcher that kept it would never see the
    # notice, and the 30 s workload would run to its end and be scored.
    endpoint = f"http://127.0.0.1:{imds.server_address[1]}"
    started = time.monotonic()
    ran = subprocess.run(
        ["bash", str(AGENT / "replicate.sh"), str(tmp_path), "r0", endpoint, "0", "60", "sleep 30"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    result = ran.stdout.strip().splitlines()[-1]
    assert result.startswith("FLEET-RESULT ") and "state=interrupted" in result, ran.stdout
    assert time.monotonic() - started < 15
    assert imds.issued >= 2  # it asked again


def _replicate(tmp_path: Path, command: str) -> list[str]:
    """The wrapper's output lines, with an IMDS nobody answers (no spot notice)."""
    ran = subprocess.run(
        ["bash", str(AGENT / "replicate.sh"), str(tmp_path), "r0", "http://127.0.0.1:9", "0",
         "60", command],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    return ran.stdout.splitlines()


def test_the_result_line_stands_alone_after_output_without_a_final_newline(
    tmp_path: Path,
) -> None:
    """`printf value=1` ran into the result line: "value=1FLEET-RESULT ...", and the whole
    type failed as "the replicate wrapper did not finish"."""
    lines = _replicate(tmp_path, "printf value=1")
    assert lines[0] == "value=1" and lines[1].startswith("FLEET-RESULT exit=0 "), lines


def test_what_a_workload_leaves_running_ends_with_its_replicate(tmp_path: Path) -> None:
    """A helper the workload put in the background ran on beside every later replicate."""
    marker = tmp_path / "helper-alive"
    command = f"sh -c 'while :; do touch {marker}; sleep 0.2; done & echo value=1'"
    lines = _replicate(tmp_path, command)
    assert lines[-1].startswith("FLEET-RESULT exit=0 "), lines
    marker.unlink(missing_ok=True)
    time.sleep(1)
    assert not marker.exists(), "the workload's background helper outlived its replicate"


def test_a_workload_whose_leader_refuses_kill_0_is_still_timed_out(tmp_path: Path) -> None:
    """sudo, the leader of every image replicate's group (`sudo -n docker run`), sets its real
    uid to root for moments as it starts, and a plain user's `kill -0` is refused then (EPERM;
    measured: a window about 3 ms into every sudo). The watcher took the refusal for the
    workload's end and never timed it out: the replicate ran on until the controller's SSH
    timeout, and the type failed with nothing recorded (CI, 2026-12-01). Here every `kill -0`
    is refused, and so is the first KILL."""
    refusing = tmp_path / "refusing.sh"
    refusing.write_text(
        "kill() {\n"
        '  if [ "$1" = -0 ] || { [ "$1" = -KILL ] && [ ! -e "$REFUSED" ]; }; then\n'
        '    [ "$1" = -KILL ] && touch "$REFUSED"\n'
        '    echo "kill: Operation not permitted" >&2; return 1\n'
        "  fi\n"
        '  builtin kill "$@"\n'
        "}\n"
    )
    env = {**os.environ, "BASH_ENV": str(refusing), "REFUSED": str(tmp_path / "refused")}
    started = time.monotonic()
    ran = subprocess.run(
        ["bash", str(AGENT / "replicate.sh"), str(tmp_path), "r0", "http://127.0.0.1:9", "0",
         "1", "sleep 30"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    result = ran.stdout.strip().splitlines()[-1]
    assert "state=timeout" in result, ran.stdout
    assert (tmp_path / "refused").exists()  # the first KILL was refused, and sent again
    assert time.monotonic() - started < 15


def test_a_notice_is_marked_before_the_workload_it_stops_ends(imds: Any, tmp_path: Path) -> None:
    """The wrapper kills its watcher as soon as the workload has ended, and a workload ends at
    once on the notice's TERM: a watcher that marked the notice after sending TERM could be
    killed between the two (CI, 2026-12-02), and the replicate was scored as a failure instead
    of rerun elsewhere. Here the watcher is slow after each TERM it sends."""
    slow = tmp_path / "slow.sh"
    slow.write_text('kill() { builtin kill "$@"; r=$?; [ "$1" = -TERM ] && sleep 2; return $r; }\n')
    endpoint = f"http://127.0.0.1:{imds.server_address[1]}"
    ran = subprocess.run(
        ["bash", str(AGENT / "replicate.sh"), str(tmp_path), "r0", endpoint, "0", "60", "sleep 30"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "BASH_ENV": str(slow)},
    )
    result = ran.stdout.strip().splitlines()[-1]
    assert "state=interrupted" in result, ran.stdout
