"""The local cloud's data plane: sandboxes, their addresses, IMDS servers and images.

It knows nothing of moto: the gateway translates EC2 calls into these plain operations.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from amibake.errors import EnvironmentProblem, LocalCloudError, UserError
from amibake.local import boot, faults, rootless
from amibake.local.faults import imds as imds_fault
from amibake.local.images import ImageStore
from amibake.local.imds import IMDSServer, InstanceMetadata
from amibake.local.sandbox import (
    Isolation,
    Sandbox,
    SandboxSpec,
    SpawnFn,
    port_free,
    remove_tree,
)

log = logging.getLogger("amibake.local")


@dataclass(frozen=True)
class LocalSettings:
    directory: Path
    port: int
    subnet: str
    ssh_port: int
    imds_port: int
    faults: str = "none"
    faults_seed: int = 0

    @property
    def sandboxes_dir(self) -> Path:
        return self.directory / "sandboxes"

    @property
    def images_dir(self) -> Path:
        return self.directory / "images"


@dataclass(frozen=True)
class Launch:
    """What the gateway read from the control plane about one new instance."""

    instance_id: str
    image_id: str
    instance_type: str
    availability_zone: str
    region: str
    architecture: str
    public_key: str
    user_data: bytes | None
    shutdown_behavior: str = "stop"  # InstanceInitiatedShutdownBehavior (EC2's default: stop)


class LocalCloud:
    def __init__(self, settings: LocalSettings) -> None:
        self.settings = settings
        self.faults = faults.Faults()  # the daemon sets the behaviours it runs with
        settings.sandboxes_dir.mkdir(parents=True, exist_ok=True)
        self.images = ImageStore(settings.images_dir)
        self.sandboxes: dict[str, Sandbox] = {}
        self.metadata: dict[str, InstanceMetadata] = {}
        self._imds: dict[str, IMDSServer] = {}
        # EC2 keeps a terminated instance's console output for a while; so do we, to debug it.
        self._last_console: dict[str, str] = {}
        self._lock = threading.RLock()
        self._spawn = SpawnFn()
        self._addresses = self._address_pool()
        # A plain user's daemon is root in a user namespace of its own (amibake.local.rootless):
        # its sandboxes stack on a skeleton layer, each in a network namespace of its own, sshd
        # on a port the user may bind.
        self.rootless = rootless.active()
        self.ssh_port = rootless.ssh_port(settings.ssh_port) if self.rootless else settings.ssh_port
        self._skeleton: rootless.Skeleton | None = None
        self._connector: rootless.Connector | None = None
        self._netns: dict[str, tuple[rootless.Netns, list[rootless.Relay]]] = {}
        # Host ports a sandbox reaches at 127.0.0.1 besides the endpoint: the ECR registry's
        # (the daemon adds it), where a plain user's sandboxes pull images from.
        self.relayed_ports: list[int] = []

    def _address_pool(self) -> Iterator[str]:
        network = ipaddress.ip_network(self.settings.subnet)
        while True:  # addresses are reused once the pool wraps; in-use ones are skipped
            for host in network.hosts():
                yield str(host)

    def start(self) -> None:
        self.images.mount()
        self.check_ports()
        if self.rootless:
            # In the image store's tmpfs: a lower layer may not sit inside another ("/home"),
            # and the skeleton lives as long as the daemon, as the images do.
            started = time.monotonic()
            self._skeleton = rootless.Skeleton.build(
                self.images.root / ".skeleton", self.settings.directory
            )
            log.info("skeleton layer built in %.2fs", time.monotonic() - started)
            self._connector = rootless.Connector()  # started here: on the host's network

    def check_ports(self) -> None:
        """Fail at start-up, in one line, if the sandboxes' ports are taken for every address."""
        first = next(ipaddress.ip_network(self.settings.subnet).hosts())
        for name, port in self._host_ports():
            if not port_free(str(first), port):
                setting = "AMIBAKE_LOCAL_SSH_PORT" if name == "ssh" else "AMIBAKE_LOCAL_IMDS_PORT"
                raise EnvironmentProblem(
                    f"{name} port {port} on {first} is already in use (a host service listening "
                    f"on 0.0.0.0:{port}?); set {setting} to a free port"
                )

    def _host_ports(self) -> list[tuple[str, int]]:
        """The ports a sandbox takes on the host's network: a plain user's IMDS answers inside
        the sandbox's own network namespace."""
        ports = [("ssh", self.ssh_port)]
        return ports if self.rootless else [*ports, ("IMDS", self.settings.imds_port)]

    def _allocate_address(self) -> str:
        taken = {s.spec.address for s in self.sandboxes.values()}
        size = ipaddress.ip_network(self.settings.subnet).num_addresses
        for _ in range(size):
            address = next(self._addresses)
            if address in taken:
                continue
            if all(port_free(address, port) for _, port in self._host_ports()):
                return address
        raise LocalCloudError(f"no free address left in {self.settings.subnet}")

    def launch(self, request: Launch) -> str:
        """Start the sandbox for a new instance; return its SSH endpoint as "address:port"."""
        layers = self.images.layers(request.image_id)
        with self._lock:
            address = self._allocate_address()
            spec = SandboxSpec(
                instance_id=request.instance_id,
                address=address,
                ssh_port=self.ssh_port,
                imds_port=self.settings.imds_port,
                layers=[str(p) for p in layers],
                authorized_key=request.public_key,
                user_data=request.user_data,
                units=boot.plan(layers),
            )
            sandbox = Sandbox(
                self.settings.sandboxes_dir / request.instance_id, spec, self.settings.directory
            )
            self.sandboxes[request.instance_id] = sandbox
            metadata = InstanceMetadata(
                instance_id=request.instance_id,
                instance_type=request.instance_type,
                image_id=request.image_id,
                availability_zone=request.availability_zone,
                region=request.region,
                address=address,
                architecture=request.architecture,
                shutdown_behavior=request.shutdown_behavior,
            )
            self.metadata[request.instance_id] = metadata
            metadata.unready_until = time.monotonic() + imds_fault.unready_for(
                self.faults, request.instance_id
            )
            try:
                self._imds[request.instance_id] = self._serve_metadata(sandbox, metadata)
            except OSError as exc:
                self.terminate(request.instance_id)
                raise LocalCloudError(
                    f"IMDS for {request.instance_id} on {address}: {exc}"
                ) from exc
        try:
            sandbox.start(self._spawn)
        except Exception:
            self.terminate(request.instance_id)
            raise
        log.info("launched %s at %s:%s", request.instance_id, address, self.ssh_port)
        return f"{address}:{self.ssh_port}"

    def _serve_metadata(self, sandbox: Sandbox, metadata: InstanceMetadata) -> IMDSServer:
        """The instance's IMDS; for a plain user's, inside a network namespace made for it,
        with the host socket its sshd will accept on and the relay to this cloud's endpoint."""
        port = self.settings.imds_port
        if self._skeleton is None or self._connector is None:
            return IMDSServer(metadata, port)
        netns = rootless.Netns()
        relays: list[rootless.Relay] = []
        try:
            server = netns.run(lambda: IMDSServer(metadata, port))
            for relayed in (self.settings.port, *self.relayed_ports):
                relays.append(rootless.Relay(netns, relayed, self._connector))
        except BaseException:
            for made in relays:
                made.close()
            netns.close()
            raise
        self._netns[metadata.instance_id] = (netns, relays)
        try:
            listener = rootless.listen(metadata.address, self.ssh_port)
        except LocalCloudError:
            server.stop()
            raise
        sandbox.isolation = Isolation(self._skeleton, netns, listener)
        return server

    def terminate(self, instance_id: str) -> bool:
        with self._lock:
            sandbox = self.sandboxes.pop(instance_id, None)
            server = self._imds.pop(instance_id, None)
            self.metadata.pop(instance_id, None)
        if server is not None:
            server.stop()
        if sandbox is None:
            self._close_netns(instance_id)
            return False
        self._last_console[instance_id] = sandbox.console_output()[-65536:]
        try:
            sandbox.stop()
        finally:
            self._close_netns(instance_id)
        log.info("terminated %s", instance_id)
        return True

    def _close_netns(self, instance_id: str) -> None:
        with self._lock:
            held = self._netns.pop(instance_id, None)
        if held is not None:
            netns, relays = held
            for relay in relays:
                relay.close()
            netns.close()

    def create_image(self, instance_id: str, image_id: str, reboot: bool = True) -> None:
        """The image of an instance's disk. As EC2 does unless told NoReboot, the instance is
        shut down for it and boots again: every process ends (SSH sessions with them), /run
        and /tmp start empty, and a shutdown it had scheduled is forgotten. Its disk is copied
        while nothing writes to it."""
        sandbox = self.sandboxes.get(instance_id)
        if sandbox is None:
            raise LocalCloudError(f"CreateImage: {instance_id} has no running sandbox")
        if reboot:
            sandbox.halt()
            metadata = self.metadata.get(instance_id)
            if metadata is not None:
                metadata.shutdown_at = None  # it lived in the guest's /run
        parents = [Path(p) for p in sandbox.spec.layers]
        try:
            self.images.create(image_id, sandbox.upper, parents)
            log.info("created image %s from %s", image_id, instance_id)
        finally:
            with self._lock:  # terminated meanwhile (a cleanup's TerminateInstances): not booted
                still = self.sandboxes.get(instance_id) is sandbox
            if reboot and still:
                self._boot_again(sandbox)

    def _boot_again(self, sandbox: Sandbox) -> None:
        """Boot a halted sandbox on its disk; a plain user's gets a new socket for its sshd
        (the last one went with the processes that held it)."""
        if sandbox.isolation is not None:
            listener = rootless.listen(sandbox.spec.address, self.ssh_port)
            sandbox.isolation = replace(sandbox.isolation, listener=listener)
        sandbox.start(self._spawn)
        log.info("rebooted %s", sandbox.spec.instance_id)

    def deregister_image(self, image_id: str) -> None:
        in_use = {Path(p) for s in self.sandboxes.values() for p in s.spec.layers}
        self.images.delete(image_id, in_use)

    def console_output(self, instance_id: str) -> str | None:
        sandbox = self.sandboxes.get(instance_id)
        if sandbox is None:
            return self._last_console.get(instance_id)
        return sandbox.console_output()

    def powered_off(self) -> list[tuple[str, str]]:
        """The instances whose guest's shutdown time has come: (instance id, what EC2 does with
        it: its InstanceInitiatedShutdownBehavior, stop or terminate)."""
        now = time.time()
        with self._lock:
            return [
                (instance_id, metadata.shutdown_behavior)
                for instance_id, metadata in self.metadata.items()
                if metadata.shutdown_at is not None and metadata.shutdown_at <= now
            ]

    def interrupt(self, instance_id: str, after_s: int = 120) -> dict[str, str]:
        """Raise the spot interruption notice on the instance's IMDS, for `after_s` ahead."""
        metadata = self.metadata.get(instance_id)
        if metadata is None:
            raise UserError(
                f"{instance_id} is not a running local-cloud instance; `amibake local status` "
                "lists them"
            )
        metadata.interrupt(after_s=after_s)
        assert metadata.spot_action is not None
        return metadata.spot_action

    def status(self) -> dict[str, Any]:
        return {
            "instances": {
                iid: {
                    "address": f"{s.spec.address}:{s.spec.ssh_port}",
                    "imds": f"http://{s.spec.address}:{self.settings.imds_port}",
                    "pid": s.process.pid if s.process else None,
                    "layers": len(s.spec.layers),
                    "interrupted": self.metadata[iid].spot_action is not None
                    if iid in self.metadata
                    else False,
                    # When its guest powers off (its `shutdown`), epoch seconds, or None.
                    "shutdown_at": self.metadata[iid].shutdown_at if iid in self.metadata else None,
                }
                for iid, s in sorted(self.sandboxes.items())
            },
            "images": self.images.image_ids(),
            "image_store": str(self.images.root),
        }

    def shutdown(self) -> None:
        for instance_id in list(self.sandboxes):
            try:
                self.terminate(instance_id)
            except LocalCloudError as exc:
                log.error("%s", exc)
        self._spawn.shutdown()
        if self._connector is not None:
            self._connector.shutdown()
        remove_tree(self.settings.sandboxes_dir)
        remove_tree(self.settings.images_dir)
