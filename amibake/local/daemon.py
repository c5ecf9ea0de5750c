"""The local cloud daemon: ``python -m amibake.local.daemon --settings JSON``.

One process holds the whole cloud: moto's server (the same pieces ThreadedMotoServer assembles:
DomainDispatcherApplication, MotoRequestHandler, werkzeug's threaded server) wrapped by the
gateway, every sandbox, and every IMDS server. Started by ``amibake local up``; stopped by
``amibake local down`` (or SIGTERM), which terminates every sandbox before exiting.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

from amibake.errors import AmibakeError
from amibake.local.engine import LocalCloud, LocalSettings

ERROR_FILE = "startup-error.json"
INFO_FILE = "daemon.json"
REGISTRY_DIR = (
    "registry"  # the ECR's registry: its config, log and storage (amibake.local.registry)
)
# Base images every region offers: the ECS-optimized Amazon Linux 2023 AMIs (x86_64, arm64) that
# amibake bakes from, and Amazon Linux 2 so the end-of-support refusal can be exercised.
BASE_IMAGE_PARAMETERS = (
    "/aws/service/ecs/optimized-ami/amazon-linux-2023/recommended/image_id",
    "/aws/service/ecs/optimized-ami/amazon-linux-2023/arm64/recommended/image_id",
    "/aws/service/ecs/optimized-ami/amazon-linux-2/recommended/image_id",
    # With the accelerators' drivers, for GPU and Inferentia types (amibake.steps.preflight).
    "/aws/service/ecs/optimized-ami/amazon-linux-2023/gpu/recommended/image_id",
    "/aws/service/ecs/optimized-ami/amazon-linux-2023/neuron/recommended/image_id",
)
REGIONS = ("us-east-1", "us-east-2", "us-west-2", "eu-west-1")


def _base_images() -> list[dict[str, Any]]:
    """The AMI records behind moto's own SSM parameters, so every parameter resolves to an AMI."""
    from moto.utilities.utils import load_resource

    images: dict[str, dict[str, Any]] = {}
    for region in REGIONS:
        tree = load_resource(f"ssm/resources/ecs/optimized_amis/{region}.json")
        catalog = {
            a["ami_id"]: a for a in load_resource(f"ec2/resources/ecs/optimized_amis/{region}.json")
        }
        for parameter in BASE_IMAGE_PARAMETERS:
            node: Any = tree
            for part in parameter.strip("/").split("/"):
                node = node.get(part, {}) if isinstance(node, dict) else {}
            ami_id = node.get("Value") if isinstance(node, dict) else None
            if isinstance(ami_id, str) and ami_id in catalog:
                images[ami_id] = catalog[ami_id]
    return list(images.values())


def _configure_moto(directory: Path) -> None:
    # moto reads these at import time, so they are set before anything imports it.
    os.environ["MOTO_ENABLE_AMI_VALIDATION"] = "true"
    os.environ["MOTO_EC2_ENABLE_INSTANCE_TYPE_VALIDATION"] = "true"
    # AWS-managed IAM policies exist on AWS; Batch's instance role attaches one.
    os.environ["MOTO_IAM_LOAD_MANAGED_POLICIES"] = "true"
    # No default AMIs: each would bring a snapshot of its own into every region.
    os.environ["MOTO_EC2_LOAD_DEFAULT_AMIS"] = "false"
    amis = directory / "base-amis.json"
    os.environ.pop("MOTO_AMIS_PATH", None)
    amis.write_text(json.dumps(_base_images(), default=str))
    os.environ["MOTO_AMIS_PATH"] = str(amis)
    from moto.core.config import default_user_config

    default_user_config.setdefault("batch", {})["use_docker"] = False


def _quiet_fast_dispatch() -> None:
    """Per request, moto's dispatcher lists its package directory (one stat per service, under a
    lock) and werkzeug logs a line: measured as 11% of the daemon's CPU while eight builds ran.
    The listing never changes in a running process; request lines stay out of daemon.log
    (errors still go there)."""
    from moto import backends

    modules = tuple(backends.list_of_moto_modules())
    backends.list_of_moto_modules = lambda: modules  # type: ignore[assignment]
    logging.getLogger("werkzeug").setLevel(logging.WARNING)


def serve(settings: LocalSettings) -> None:
    _configure_moto(settings.directory)
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        MotoRequestHandler,
        create_backend_app,
    )
    from werkzeug.serving import make_server

    from amibake.local import faults, jobs, moto_gaps
    from amibake.local.gateway import Gateway
    from amibake.local.registry import EcrFront, Registry

    moto_gaps.apply()
    _quiet_fast_dispatch()

    registry = Registry(settings.directory / REGISTRY_DIR)
    registry.start()
    # Stopped however serving ends: a start that fails later (the port taken) left the
    # registry's process to die with this one, and its storage behind.
    try:
        cloud = LocalCloud(settings)
        cloud.relayed_ports.append(registry.port)  # a plain user's sandboxes pull from it
        cloud.start()
        for image in _base_images():
            cloud.images.seed_ecs_base(image["ami_id"])
        stop = threading.Event()
        behaviour = faults.parse(settings.faults, settings.faults_seed)
        cloud.faults = behaviour
        moto_app = DomainDispatcherApplication(create_backend_app)
        gateway = Gateway(EcrFront(moto_app, registry), cloud, stop, behaviour)
        jobs.install(jobs.JobRunner(cloud, gateway.start_sandbox, registry.endpoint))
        try:
            server = make_server(
                "127.0.0.1",
                settings.port,
                gateway,
                threaded=True,
                request_handler=MotoRequestHandler,
            )
        except OSError as exc:
            from amibake.errors import EnvironmentProblem

            raise EnvironmentProblem(
                f"cannot listen on 127.0.0.1:{settings.port} ({exc.strerror}); stop what uses "
                "it or set AMIBAKE_LOCAL_PORT"
            ) from None
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: stop.set())
        threading.Thread(target=server.serve_forever, name="gateway", daemon=True).start()
        info = {
            "pid": os.getpid(),
            "endpoint": f"http://127.0.0.1:{settings.port}",
            "faults": behaviour.names,
            "faults_seed": settings.faults_seed,
            "registry": registry.endpoint,
            # What a later `up` (every command's connect) compares its own settings with.
            "port": settings.port,
            "subnet": settings.subnet,
            "ssh_port": settings.ssh_port,
            "imds_port": settings.imds_port,
        }
        (settings.directory / INFO_FILE).write_text(json.dumps(info))
        logging.info(
            "local cloud up at %s; faults: %s", info["endpoint"], behaviour.names or "none"
        )
        while not stop.wait(1.0):
            try:
                gateway.reconcile()
            except Exception:  # the reconcile loop must outlive a bad moment in moto
                logging.exception("reconcile failed")
        logging.info("shutting down")
        server.shutdown()
        cloud.shutdown()
    finally:
        registry.stop()
    (settings.directory / INFO_FILE).unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="amibake.local.daemon")
    parser.add_argument("--settings", required=True)
    args = parser.parse_args(argv)
    raw = json.loads(args.settings)
    settings = LocalSettings(**{**raw, "directory": Path(raw["directory"])})
    settings.directory.mkdir(parents=True, exist_ok=True)
    (settings.directory / ERROR_FILE).unlink(missing_ok=True)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        serve(settings)
    except AmibakeError as exc:
        (settings.directory / ERROR_FILE).write_text(
            json.dumps({"exit_code": exc.exit_code, "message": str(exc)})
        )
        logging.error("%s", exc)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
