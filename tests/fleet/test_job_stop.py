"""How a terminated Batch job's container stops: ECS (and the local cloud, amibake/local/jobs.py)
sends SIGTERM to its PID 1, which gets only the signals it handles, so a SIGTERM it does not
handle is dropped and the job ran on to the SIGKILL 30 s later, writing its files. The job agent
(fleet/agent/s3.py) is that PID 1."""

from __future__ import annotations

import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from amibake.local import jobs

# A PID namespace of its own (a plain user's inside a user namespace, as the local cloud's)
PID_NAMESPACE = ["unshare", "--pid", "--fork", "--kill-child"]
if os.geteuid() != 0:
    PID_NAMESPACE[1:1] = ["--user", "--map-root-user"]
AGENT = Path(__file__).resolve().parents[2] / "fleet" / "agent" / "s3.py"


def test_the_agent_exits_at_sigterm_while_it_fetches_its_payload(tmp_path: Path) -> None:
    """SIGTERM before job.py runs, while the agent asks for its credentials: the handler set at
    its first instruction exits (143). Without it, PID 1 dropped the signal and went on
    retrying."""
    silent = socket.socket()  # takes the connection (the backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    silent.settimeout(60)
    port = silent.getsockname()[1]
    env = {
        "PATH": os.environ["PATH"],
        "AWS_BATCH_JOB_ID": "test-job",
        "AWS_CONTAINER_CREDENTIALS_FULL_URI": f"http://127.0.0.1:{port}/creds",
        "FLEET_BUCKET": "bucket",
        "FLEET_REGION": "us-east-1",
        "FLEET_S3_ENDPOINT": f"http://127.0.0.1:{port}",
        "FLEET_OWNER": "123456789012",
        "FLEET_PREFIX": "run/",
    }
    agent = subprocess.Popen(
        [*PID_NAMESPACE, sys.executable, "-I", str(AGENT)],
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        asked, _ = silent.accept()  # the agent is past its imports, waiting for an answer
        init = jobs._container_init(agent.pid)
        assert init is not None, "no PID 1 of a namespace of its own below unshare"
        os.kill(init, signal.SIGTERM)
        try:
            agent.wait(10)  # it retried for minutes
        except subprocess.TimeoutExpired:
            raise AssertionError("the agent as PID 1 ran on after SIGTERM") from None
        assert agent.returncode == 143, agent.returncode
        asked.close()
    finally:
        if agent.poll() is None:
            os.killpg(agent.pid, signal.SIGKILL)
            agent.wait()
        silent.close()


def test_the_local_cloud_stops_a_container_whose_pid_1_has_not_started_yet(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """TerminateJob as the container starts: nsenter and unshare fork before its PID 1 exists.
    The stop waits for it and sends it SIGTERM; before, it found none, sent nothing, and the job
    ran the whole stop timeout. What the signal does is PID 1's affair (one that has not set
    its handler yet drops it, as on ECS): the test watches it sent, then ends the container."""
    starting = subprocess.Popen(
        ["sh", "-c", f"sleep 0.5; exec {shlex.join([*PID_NAMESPACE, 'sleep', '300'])}"],
        start_new_session=True,
    )
    sent: list[tuple[int, int]] = []
    kill = os.kill

    def watched(pid: int, signum: int) -> None:
        sent.append((pid, signum))
        kill(pid, signum)

    try:
        assert jobs._container_init(starting.pid) is None  # not started yet
        with ThreadPoolExecutor(1) as pool:
            with monkeypatch.context() as patch:
                patch.setattr(jobs.os, "kill", watched)
                stopping = pool.submit(jobs._stop_container, starting)
                deadline = time.monotonic() + 20
                while not sent and time.monotonic() < deadline and not stopping.done():
                    time.sleep(0.05)
            assert [signum for _, signum in sent] == [signal.SIGTERM], sent
            status = Path(f"/proc/{sent[0][0]}/status").read_text()
            nspid = next(line for line in status.splitlines() if line.startswith("NSpid:"))
            assert nspid.split()[-1] == "1", nspid  # the container's PID 1, not unshare
            os.killpg(starting.pid, signal.SIGKILL)  # PID 1 (sleep) has no handler: it stays
            stopping.result()
    finally:
        if starting.poll() is None:
            os.killpg(starting.pid, signal.SIGKILL)
        starting.wait()
