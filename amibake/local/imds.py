"""A per-instance IMDSv2 endpoint, as on EC2: a token first (PUT), then metadata with it.

Each sandbox gets its own server on its own loopback address; inside the sandbox the name
``instance-data`` (which EC2's DNS also resolves) points there, so templates render the endpoint
as ``http://instance-data`` for the local cloud and ``http://169.254.169.254`` for AWS.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from socketserver import TCPServer
from typing import Any

TOKEN_HEADER = "X-aws-ec2-metadata-token"
# Where the guest's `shutdown` tells the local cloud (not an EC2 path: EC2 sees the power-off).
POWER_PATH = "/amibake-local/shutdown"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"


@dataclass
class InstanceMetadata:
    instance_id: str
    instance_type: str
    image_id: str
    availability_zone: str
    region: str
    address: str
    architecture: str = "x86_64"
    spot_action: dict[str, str] | None = None
    tokens: dict[str, float] = field(default_factory=dict)
    # ECS's task-role endpoint (/v2/credentials/<unguessable id>) for the Batch jobs this
    # instance runs, as the ECS agent serves it on 169.254.170.2: no IMDS token, the path is
    # the secret.
    task_credentials: dict[str, dict[str, str]] = field(default_factory=dict)
    unready_until: float = 0.0  # time.monotonic() before which it answers 503 (booting)
    # When the guest powers off (time.time()), as its `shutdown` set it (amibake.local.power).
    shutdown_at: float | None = None
    shutdown_behavior: str = "stop"  # what EC2 then does: its InstanceInitiatedShutdownBehavior

    def interrupt(self, action: str = "terminate", after_s: int = 120) -> None:
        when = datetime.now(UTC) + timedelta(seconds=after_s)
        self.spot_action = {"action": action, "time": when.strftime("%Y-%m-%dT%H:%M:%SZ")}

    def lookup(self, path: str) -> str | None:
        identity = {
            "instanceId": self.instance_id,
            "instanceType": self.instance_type,
            "imageId": self.image_id,
            "availabilityZone": self.availability_zone,
            "region": self.region,
            "privateIp": self.address,
            "architecture": self.architecture,
        }
        table: dict[str, Any] = {
            "/latest/meta-data/instance-id": self.instance_id,
            "/latest/meta-data/instance-type": self.instance_type,
            "/latest/meta-data/ami-id": self.image_id,
            "/latest/meta-data/local-ipv4": self.address,
            "/latest/meta-data/hostname": "ip-" + self.address.replace(".", "-"),
            "/latest/meta-data/placement/availability-zone": self.availability_zone,
            "/latest/meta-data/placement/region": self.region,
            "/latest/dynamic/instance-identity/document": json.dumps(identity, indent=2),
        }
        if self.spot_action is not None:
            table["/latest/meta-data/spot/instance-action"] = json.dumps(self.spot_action)
        if path in ("/latest/meta-data", "/latest/meta-data/"):
            return "\n".join(
                sorted({p.split("/")[3] for p in table if p.startswith("/latest/meta-data/")})
            )
        value = table.get(path)
        return None if value is None else str(value)


class _Handler(BaseHTTPRequestHandler):
    server: IMDSServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def _send(self, code: int, body: str = "") -> None:
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _unready(self) -> bool:
        if time.monotonic() < self.server.metadata.unready_until:
            self._send(503, "Service Unavailable")
            return True
        return False

    def do_PUT(self) -> None:
        if self.path == POWER_PATH:  # the guest's power-off: no IMDS in it, booting or not
            self._power()
            return
        if self._unready():
            return
        if self.path != "/latest/api/token":
            self._send(404, "Not Found")
            return
        try:
            ttl = int(self.headers.get(TTL_HEADER, ""))
        except ValueError:
            self._send(400, "Missing or invalid " + TTL_HEADER)
            return
        if not 1 <= ttl <= 21600:
            self._send(400, "Invalid " + TTL_HEADER)
            return
        token = secrets.token_urlsafe(32)
        self.server.metadata.tokens[token] = time.monotonic() + ttl
        self._send(200, token)

    def _power(self) -> None:
        """The guest's `shutdown`: at=EPOCH schedules its power-off, cancel forgets it."""
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length).decode(errors="replace")
        try:
            if body != "cancel" and not body.startswith("at="):
                raise ValueError(body)
            at = None if body == "cancel" else float(body.removeprefix("at="))
        except ValueError:
            self._send(400, "at=EPOCH or cancel")
            return
        self.server.metadata.shutdown_at = at
        self._send(200)

    def do_GET(self) -> None:
        if self._unready():
            return
        path = self.path.split("?")[0]
        if path.startswith("/v2/credentials/"):
            found = self.server.metadata.task_credentials.get(path)
            self._send(200, json.dumps(found)) if found else self._send(404, "Not Found")
            return
        token = self.headers.get(TOKEN_HEADER, "")
        expiry = self.server.metadata.tokens.get(token)
        if expiry is None or expiry < time.monotonic():
            self._send(401, "Unauthorized")  # IMDSv2 required: no token, no answer
            return
        value = self.server.metadata.lookup(self.path.split("?")[0])
        if value is None:
            self._send(404, "Not Found")
        else:
            self._send(200, value)


class IMDSServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, metadata: InstanceMetadata, port: int) -> None:
        self.metadata = metadata
        super().__init__((metadata.address, port), _Handler)
        # stop() waits for the serving loop to notice, which it does once a poll interval: at
        # the default 0.5 s, every TerminateInstances took a random 0-0.5 s longer (measured).
        self._thread = threading.Thread(
            target=self.serve_forever,
            kwargs={"poll_interval": 0.05},
            name=f"imds-{metadata.instance_id}",
            daemon=True,
        )
        self._thread.start()

    def server_bind(self) -> None:
        # HTTPServer.server_bind would look up its own name (socket.getfqdn, a resolver round
        # trip per instance launched); nothing here uses server_name.
        TCPServer.server_bind(self)
        self.server_name, self.server_port = str(self.server_address[0]), self.server_address[1]

    def stop(self) -> None:
        self.shutdown()
        self.server_close()
