"""The layer in front of moto: passes every call through, and acts on the EC2 calls that need a
real machine behind them.

=====================  =========================================================================
RunInstances           start a sandbox per instance; tag it with its SSH address
CreateFleet            the same for the instances an ``instant`` fleet launched
TerminateInstances     destroy the sandboxes (a reconcile loop catches every other way to die)
CreateImage            copy the instance's filesystem layer into the image store
DeregisterImage        drop the image's layer when nothing stacks on it
GetConsoleOutput       the sandbox's real boot log, with its SSH host key fingerprints
=====================  =========================================================================

It also serves the local cloud's own admin calls under ``/_amibake/``.
"""

from __future__ import annotations

import base64
import io
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable
from typing import Any

from amibake.cloud.tags import LOCAL_SSH_TAG
from amibake.errors import AmibakeError, UserError
from amibake.local import faults, pricing
from amibake.local.engine import Launch, LocalCloud
from amibake.local.moto_gaps import BACKENDS

log = logging.getLogger("amibake.local")

WATCHED = {
    "RunInstances",
    "CreateFleet",
    "TerminateInstances",
    "CreateImage",
    "DeregisterImage",
    "GetConsoleOutput",
}
_CREDENTIAL = re.compile(r"Credential=([^/]+)/[^/]+/([^/]+)/([^/]+)/")
_INSTANCE_ID = re.compile(r"<instanceId>(i-[0-9a-f]+)</instanceId>")
_FLEET_INSTANCE = re.compile(r"<item>(i-[0-9a-f]+)</item>")
_IMAGE_ID = re.compile(r"<imageId>(ami-[0-9a-f]+)</imageId>")
_OUTPUT = re.compile(r"<output>.*?</output>", re.S)
GONE_STATES = {"shutting-down", "terminated", "stopping", "stopped"}
# Spot terminates an instance two minutes after its notice; locally five seconds, in the same
# order of events.
RECLAIM_AFTER_S = 5.0
SPOT_TERMINATION = "Server.SpotInstanceTermination"
INITIATED_SHUTDOWN = "Client.InstanceInitiatedShutdown"  # EC2's state reason for it
# Services moto does not serve. It answered them with a 500 and an HTML page, which boto retried
# and then quoted whole ("the Pricing API said: <!doctype html> ..."): a service the local
# cloud lacks is refused at once, in the service's JSON protocol, saying so. (The Pricing API
# was one: the local cloud serves it now, amibake/local/pricing.py.)
UNSERVED: dict[str, str] = {}

StartResponse = Callable[..., Any]


def _decode_user_data(value: Any) -> bytes | None:
    if value is None:
        return None
    encoded = value.as_bytes() if hasattr(value, "as_bytes") else str(value).encode()
    try:
        return base64.b64decode(encoded)
    except ValueError:
        return encoded


class Gateway:
    def __init__(
        self,
        app: Callable[..., Iterable[bytes]],
        cloud: LocalCloud,
        stop: threading.Event,
        behaviour: faults.Faults | None = None,
    ) -> None:
        self.app = app
        self.cloud = cloud
        self.stop = stop
        self.faults = behaviour or faults.Faults()
        self.faults.hooks["reclaim"] = self.reclaim
        self._where: dict[str, tuple[str, str]] = {}  # instance id -> (account, region)

    # --- WSGI -------------------------------------------------------------------------------

    def __call__(self, environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        if path.startswith("/_amibake/"):
            return self._admin(path, environ, start_response)
        scope = _CREDENTIAL.search(environ.get("HTTP_AUTHORIZATION", ""))
        if scope is not None and scope.group(3) == "pricing":
            return pricing.serve(environ, start_response)
        if scope is not None and scope.group(3) in UNSERVED:
            return self._unserved(UNSERVED[scope.group(3)], start_response)
        if scope is not None and scope.group(3) == "s3" and not self._owner_expected(environ):
            return _s3_error(start_response, "403 Forbidden", "AccessDenied", "Access Denied")
        faulty = bool(self.faults.enabled) and scope is not None
        if scope is None or (scope.group(3) != "ec2" and not faulty):
            return self._moto(environ, start_response)  # the fast path: moto as it is
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        service, account, region = scope.group(3), self._account(scope.group(1)), scope.group(2)
        request = faults.request_of(service, environ, body, account, region)
        if faulty:
            answer = self.faults.before(request)
            if answer is not None:
                return _send(answer, start_response)
        elif request.action not in WATCHED:
            return self._moto(environ, start_response)

        captured: dict[str, Any] = {}

        def capture(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            captured["status"], captured["headers"] = status, headers
            return lambda data: None

        data = b"".join(self._moto(environ, capture))
        reply = faults.Reply(int(captured["status"].split()[0]), captured["headers"], data)
        if service == "ec2" and reply.ok and request.action in WATCHED:
            try:
                reply.body = self._after(
                    request.action, request.params, reply.body, account, region
                )
            except AmibakeError as exc:
                log.error("%s: %s", request.action, exc)
        if faulty:
            reply = self.faults.after(request, reply)
        return _send(reply, start_response)

    @staticmethod
    def _unserved(service: str, start_response: StartResponse) -> list[bytes]:
        body = json.dumps(
            {
                "__type": "NotImplemented",
                "message": f"the local cloud has no {service} (moto does not serve it)",
            }
        ).encode()
        start_response(
            "400 Bad Request",
            [("Content-Type", "application/x-amz-json-1.1"), ("Content-Length", str(len(body)))],
        )
        return [body]

    @staticmethod
    def _owner_expected(environ: dict[str, Any]) -> bool:
        """S3's ExpectedBucketOwner, which moto ignores: a request naming an owner for a bucket
        another account holds is refused with 403 AccessDenied, as S3 does."""
        expected = environ.get("HTTP_X_AMZ_EXPECTED_BUCKET_OWNER")
        bucket = environ.get("PATH_INFO", "").lstrip("/").split("/", 1)[0]
        if not expected or not bucket:
            return True
        from moto.s3.models import s3_backends

        with BACKENDS:
            held = s3_backends.bucket_accounts.get(bucket)  # (partition, account)
        return held is None or held[1] == expected

    def _moto(self, environ: dict[str, Any], start_response: StartResponse) -> list[bytes]:
        """moto answers the request, one request at a time (BACKENDS), its body read whole
        inside the lock (a WSGI body may be produced lazily)."""
        with BACKENDS:
            return list(self.app(environ, start_response))

    @staticmethod
    def _account(access_key: str) -> str:
        from moto.iam.models import get_account_id_from

        return str(get_account_id_from(access_key))

    @staticmethod
    def _backend(account: str, region: str) -> Any:
        from moto.ec2.models import ec2_backends

        return ec2_backends[account][region]

    # --- EC2 actions ------------------------------------------------------------------------

    def _after(
        self, action: str, params: dict[str, str], response: bytes, account: str, region: str
    ) -> bytes:
        text = response.decode()
        backend = self._backend(account, region)
        if action == "RunInstances":
            for instance_id in _INSTANCE_ID.findall(text):
                self.start_sandbox(backend, instance_id, account, region)
        elif action == "CreateFleet":
            for instance_id in set(_FLEET_INSTANCE.findall(text)):
                self.start_sandbox(backend, instance_id, account, region)
        elif action == "TerminateInstances":
            for key, instance_id in params.items():
                if key.startswith("InstanceId."):
                    self.cloud.terminate(instance_id)
        elif action == "CreateImage":
            image = _IMAGE_ID.search(text)
            if image:
                reboot = params.get("NoReboot", "false").lower() != "true"
                self.cloud.create_image(params["InstanceId"], image.group(1), reboot)
        elif action == "DeregisterImage":
            self.cloud.deregister_image(params["ImageId"])
        elif action == "GetConsoleOutput":
            output = self.cloud.console_output(params["InstanceId"])
            if output is not None:
                encoded = base64.b64encode(output.encode()).decode()
                text = _OUTPUT.sub(lambda _: f"<output>{encoded}</output>", text, count=1)
                return text.encode()
        return response

    def start_sandbox(self, backend: Any, instance_id: str, account: str, region: str) -> None:
        with BACKENDS:
            request = self._launch_request(backend, instance_id, region)
        self._where[instance_id] = (account, region)
        try:
            endpoint = self.cloud.launch(request)
        except AmibakeError as exc:
            # As on EC2: the call succeeded, the instance then dies with a reason.
            log.error("sandbox for %s failed: %s", instance_id, exc)
            with BACKENDS:
                backend.create_tags([instance_id], {"amibake-local:error": str(exc)[:255]})
                backend.terminate_instances([instance_id])
            return
        with BACKENDS:
            backend.create_tags([instance_id], {LOCAL_SSH_TAG: endpoint})

    @staticmethod
    def _launch_request(backend: Any, instance_id: str, region: str) -> Launch:
        """What the sandbox of a new instance needs, read from moto's records of it."""
        instance = backend.get_instance(instance_id)
        key_name = instance.key_name
        user_data = instance.user_data
        behaviour = instance.instance_initiated_shutdown_behavior
        tags = {
            t["key"]: t["value"]
            for t in backend.describe_tags(filters={"resource-id": [instance_id]})
        }
        template_id = tags.get("aws:ec2launchtemplate:id")
        if template_id:
            # moto's CreateFleet drops most launch template fields from the instance; the
            # template itself still has them.
            version = backend.get_launch_template(template_id).get_version(
                tags.get("aws:ec2launchtemplate:version", "$Default")
            )
            key_name = key_name or version.data.get("KeyName")
            user_data = user_data or version.data.get("UserData")
        public_key = ""
        if key_name and key_name in backend.key_pairs:
            public_key = backend.key_pairs[key_name].material_public.decode().strip()
        image = backend.amis.get(instance.image_id)
        return Launch(
            instance_id=instance_id,
            image_id=instance.image_id,
            instance_type=instance.instance_type,
            availability_zone=instance.placement.zone or f"{region}a",
            region=region,
            architecture=getattr(image, "architecture", None) or "x86_64",
            public_key=public_key,
            user_data=_decode_user_data(user_data),
            shutdown_behavior=behaviour,
        )

    def reclaim(self, instance_id: str, after_s: float = RECLAIM_AFTER_S) -> dict[str, str]:
        """Spot's reclaim, in its order: the interruption notice on IMDS, then, `after_s` later
        (two minutes on AWS, shortened here), the instance terminated by the service with
        Server.SpotInstanceTermination, however far the product had got with it."""
        notice = self.cloud.interrupt(instance_id, after_s=max(1, round(after_s)))

        def terminate() -> None:
            account, region = self._where.get(instance_id, ("", ""))
            try:
                with BACKENDS:
                    backend = self._backend(account, region)
                    backend.terminate_instances([instance_id])
                    instance = backend.get_instance(instance_id)
                    instance.state_reason.code = SPOT_TERMINATION
                    instance.state_reason.message = f"{SPOT_TERMINATION}: Spot instance termination"
            except Exception as exc:  # already gone: nothing to reclaim
                log.info("reclaim of %s: %s", instance_id, exc)
            self.cloud.terminate(instance_id)
            log.info("reclaimed spot instance %s", instance_id)

        timer = threading.Timer(after_s, terminate)
        timer.daemon = True
        timer.start()
        return notice

    def reconcile(self) -> None:
        """Power off the instances whose guest shut down; destroy sandboxes whose instance died
        by any path (DeleteFleets, StopInstances...)."""
        for instance_id, behaviour in self.cloud.powered_off():
            self._power_off(instance_id, behaviour)
        for instance_id in list(self.cloud.sandboxes):
            account, region = self._where.get(instance_id, ("", ""))
            try:
                with BACKENDS:
                    state = self._backend(account, region).get_instance(instance_id).state
            except Exception:  # unknown to moto: the instance is gone
                state = "terminated"
            if state in GONE_STATES:
                self.cloud.terminate(instance_id)

    def _power_off(self, instance_id: str, behaviour: str) -> None:
        """The guest powered off (its `shutdown`): EC2 stops the instance, or terminates it when
        launched with InstanceInitiatedShutdownBehavior terminate, saying why."""
        account, region = self._where.get(instance_id, ("", ""))
        try:
            with BACKENDS:
                backend = self._backend(account, region)
                if behaviour == "terminate":
                    backend.terminate_instances([instance_id])
                else:
                    backend.stop_instances([instance_id])
                instance = backend.get_instance(instance_id)
                instance.state_reason.code = INITIATED_SHUTDOWN
                instance.state_reason.message = f"{INITIATED_SHUTDOWN}: Instance initiated shutdown"
        except Exception as exc:  # gone already
            log.info("power-off of %s: %s", instance_id, exc)
        self.cloud.terminate(instance_id)
        log.info("%s shut itself down: %s", instance_id, behaviour)

    # --- admin ------------------------------------------------------------------------------

    def _admin(
        self, path: str, environ: dict[str, Any], start_response: StartResponse
    ) -> Iterable[bytes]:
        length = int(environ.get("CONTENT_LENGTH") or 0)
        payload = json.loads(environ["wsgi.input"].read(length) or b"{}") if length else {}
        code, body = "200 OK", {}
        try:
            if path == "/_amibake/status":
                body = {"ok": True, **self.cloud.status(), "faults": self.faults.counts()}
            elif path == "/_amibake/interrupt":
                body = {"instance-action": self.reclaim(payload["instance_id"])}
            elif path == "/_amibake/shutdown":
                self.stop.set()
                body = {"ok": True}
            else:
                code, body = "404 Not Found", {"error": f"no admin call {path}"}
        except UserError as exc:  # the caller asked for something wrong: theirs to fix
            code, body = "400 Bad Request", {"error": str(exc)}
        except AmibakeError as exc:
            code, body = "500 Internal Server Error", {"error": str(exc)}
        data = json.dumps(body).encode()
        start_response(
            code, [("Content-Type", "application/json"), ("Content-Length", str(len(data)))]
        )
        return [data]


def _s3_error(start_response: StartResponse, status: str, code: str, message: str) -> list[bytes]:
    body = (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f"<Error><Code>{code}</Code><Message>{message}</Message></Error>"
    ).encode()
    start_response(
        status, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))]
    )
    return [body]


def _send(reply: faults.Reply, start_response: StartResponse) -> list[bytes]:
    from http import HTTPStatus

    headers = [(k, v) for k, v in reply.headers if k.lower() != "content-length"]
    headers.append(("Content-Length", str(len(reply.body))))
    start_response(f"{reply.status} {HTTPStatus(reply.status).phrase}", headers)
    return [reply.body]
