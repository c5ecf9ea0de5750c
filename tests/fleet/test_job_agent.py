"""The Batch job agent (fleet/agent/s3.py) as a container's PID 1, in a PID namespace of its own
as ECS runs it: PID 1 gets only the signals it handles, so a SIGTERM it does not handle is
dropped, and a terminated job ran on to the SIGKILL 30 s later, writing its files."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from amibake.local.jobs import _container_init

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
    namespace = ["unshare", "--pid", "--fork", "--kill-child"]
    if os.geteuid() != 0:
        namespace[1:1] = ["--user", "--map-root-user"]
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
        [*namespace, sys.executable, "-I", str(AGENT)],
        env=env,
        cwd=tmp_path,
        start_new_session=True,
    )
    try:
        asked, _ = silent.accept()  # the agent is past its imports, waiting for an answer
        init = _container_init(agent.pid)
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
