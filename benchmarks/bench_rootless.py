"""Issue 28's figure: sandbox launch to first SSH command as a plain user, against as root.

As root (CI), the plain user is made as tests/local/test_rootless.py makes it and runs a local
cloud of its own; both sides time the same thing (bench_local_cloud's launch to first command),
one side after the other, medians compared. Run by a plain user there is no root side to time.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from amibake.cloud import Cloud
from benchmarks.bench_local_cloud import _launch_to_first_command
from tests.helpers import base_ami

LAUNCHES = 10
GOAL = 1.5  # plain user's median at most this many times root's


def launches(cloud: Cloud, count: int) -> list[float]:
    """`count` launches to first SSH command on `cloud`, after one not counted (first use)."""
    image_id = base_ami(cloud)
    key = cloud.ec2.create_key_pair(KeyName="bench-rootless", KeyType="ed25519")
    try:
        times = [
            _launch_to_first_command(cloud, image_id, "bench-rootless", key["KeyMaterial"])
            for _ in range(count + 1)
        ]
    finally:
        cloud.ec2.delete_key_pair(KeyName="bench-rootless")
    return times[1:]


def plain_user_launches(count: int) -> list[float]:
    """Run as the plain user: a local cloud of its own, `count` launches timed."""
    from amibake import config
    from amibake.connect import connect
    from amibake.local import control

    cfg = config.load()
    try:
        return launches(connect(cfg), count)
    finally:
        control.down(cfg)


def run(cloud: Cloud) -> dict[str, Any]:
    from tests.local.test_rootless import make_plain_user, release_plain_user

    if os.geteuid() != 0:
        mine = plain_user_launches(LAUNCHES)
        return {
            "plain_user_launch_to_first_ssh_median_s": round(statistics.median(mine), 3),
            "note": "run by a plain user: no root side to compare with",
            "goal": f"plain user / root <= {GOAL}",
            "met": None,
        }
    top = Path(tempfile.mkdtemp(prefix="amibake-bench-rootless-"))
    user, undo = make_plain_user(top)
    try:
        code = (
            "import json, benchmarks.bench_rootless as b; "
            f"print(json.dumps(b.plain_user_launches({LAUNCHES})))"
        )
        done = user.python(code, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"as {user.name}: {done.stderr.strip().splitlines()[-1:]}")
        plain = [float(t) for t in json.loads(done.stdout.strip().splitlines()[-1])]
    finally:
        release_plain_user(user, top, undo)
    root = launches(cloud, LAUNCHES)
    ratio = statistics.median(plain) / statistics.median(root)
    return {
        "launches": LAUNCHES,
        "root_launch_to_first_ssh_median_s": round(statistics.median(root), 3),
        "plain_user_launch_to_first_ssh_median_s": round(statistics.median(plain), 3),
        "plain_user_over_root": round(ratio, 2),
        "goal": f"plain user / root <= {GOAL}",
        "met": ratio <= GOAL,
    }
