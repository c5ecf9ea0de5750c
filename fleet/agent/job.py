"""One replicate as an AWS Batch job (the batch executor's side of replicate.sh).

Started by the job's bootstrap in the unpacked payload directory, with standard library only
(a job's image need not have more than python3). The job's array index picks its replicate from
FLEET_PLAN. It prints one ``FLEET-HOST`` line (where it runs: instance, type, zone, CPU, from
IMDSv2 and /proc), unpacks its build, runs ``replicate.sh`` (whose output and ``FLEET-RESULT``
line go to the job's log), and puts the monitor CSV in the job bucket with the job role's
credentials (s3.py).

Environment: FLEET_PLAN (JSON list of [directory, tag]), FLEET_COMMAND, FLEET_TIMEOUT,
FLEET_MONITOR (0|1), FLEET_IMDS, FLEET_ROUND (the monitor CSVs' key prefix), FLEET_SETUP
(shell that installs what the replicates need: setsid, the builds' runtime packages, psutil),
FLEET_EMULATE (JSON: build directory -> shell putting its programs behind QEMU).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import tarfile
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import s3  # type: ignore[import-not-found]  # noqa: E402 - the payload's module, beside it


def imds(base: str) -> dict[str, str]:
    """What the instance says about itself (IMDSv2: token first); empty where IMDS is closed."""
    found: dict[str, str] = {}
    try:
        request = urllib.request.Request(
            f"{base}/latest/api/token",
            method="PUT",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "300"},
        )
        with urllib.request.urlopen(request, timeout=2) as response:
            token = response.read().decode()
    except OSError:
        return found
    for key, path in (
        ("instance_id", "instance-id"),
        ("instance_type", "instance-type"),
        ("zone_id", "placement/availability-zone-id"),
        ("lifecycle", "instance-life-cycle"),
        ("ami", "ami-id"),
    ):
        try:
            request = urllib.request.Request(
                f"{base}/latest/meta-data/{path}", headers={"X-aws-ec2-metadata-token": token}
            )
            with urllib.request.urlopen(request, timeout=2) as response:
                found[key] = response.read().decode().strip()
        except OSError:
            pass
    return found


# The emulators the controller's record_host looks for (amibake/catalog/isa.json's qemu binaries).
EMULATORS = ("qemu-x86_64-static", "qemu-aarch64-static")


def cpu() -> dict[str, object]:
    model, flags, vendor = "", "", ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        key, _, value = line.partition(":")
        if not model and key.strip() in ("model name", "CPU part"):
            model = value.strip()
        if not flags and key.strip() in ("flags", "Features"):
            flags = value.strip()
        if not vendor and key.strip() in ("vendor_id", "CPU implementer"):
            vendor = value.strip()
    try:
        import psutil  # noqa: F401

        monitor = True
    except ImportError:
        monitor = False
    return {
        "kernel": platform.release(),
        "machine": platform.machine(),
        "vcpus": os.cpu_count(),
        "cpu_model": model,
        "cpu_flags": flags,
        "vendor": vendor,
        "emulators": " ".join(e for e in EMULATORS if shutil.which(e)),
        "monitor": monitor,
    }


def main() -> int:
    index = int(os.environ.get("AWS_BATCH_JOB_ARRAY_INDEX", "0"))
    directory, tag = json.loads(os.environ["FLEET_PLAN"])[index]
    # Packages first: whether the monitor can run depends on them (psutil).
    setup = os.environ.get("FLEET_SETUP", ":")
    installed = setup == ":" or subprocess.call(["bash", "-c", setup]) == 0
    host = {**imds(os.environ["FLEET_IMDS"]), **cpu(), "tag": tag}
    print("FLEET-HOST " + json.dumps(host), flush=True)
    if not installed:
        print("fleet: the job could not install what its replicates need", file=sys.stderr)
        return 3
    work = HERE / directory
    archive = HERE / "builds" / f"{directory}.tar.xz"
    if archive.exists() and not work.exists():
        work.mkdir(parents=True)
        with tarfile.open(archive) as tar:
            s3.extract(tar, str(work))
        # Builds this CPU runs only under QEMU: their programs go behind its wrappers.
        wrap = json.loads(os.environ.get("FLEET_EMULATE", "{}")).get(directory)
        if wrap and subprocess.call(["bash", "-c", wrap], cwd=work) != 0:
            print(f"fleet: could not set up emulation of {directory}", file=sys.stderr)
            return 3
    work.mkdir(parents=True, exist_ok=True)
    monitor = "1" if os.environ.get("FLEET_MONITOR") == "1" and host["monitor"] else "0"
    code = subprocess.call(
        [
            "bash",
            str(HERE / "replicate.sh"),
            str(work),
            tag,
            os.environ["FLEET_IMDS"],
            monitor,
            os.environ["FLEET_TIMEOUT"],
            os.environ["FLEET_COMMAND"],
        ]
    )
    csv = work / f"{tag}.csv"
    if monitor == "1" and csv.exists():
        try:
            s3.put(f"{os.environ['FLEET_ROUND']}-{tag}.csv", csv.read_bytes())
        except OSError as exc:
            print(f"fleet: monitor CSV upload failed: {exc}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
