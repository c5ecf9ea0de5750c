"""Sessions and clients, built in one place.

The same code talks to AWS and to the local cloud: only the endpoint, the credentials (the local
cloud accepts any) and the SSH address lookup differ.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, cast

import boto3
import botocore.config
import botocore.credentials
import botocore.exceptions

from amibake import iam_policy, service_models
from amibake.cloud.tags import LOCAL_SSH_TAG
from amibake.config import Config
from amibake.cpu import Cpu, this_machine
from amibake.errors import CloudError, UserError

log = logging.getLogger("amibake")
# "403": a HEAD request's denial has no body, so botocore has only the status for a code.
DENIED = {"AccessDenied", "AccessDeniedException", "UnauthorizedOperation", "403"}


def name_denied_action(parsed: dict[str, Any], model: Any, **_: Any) -> None:
    """A denial names the IAM action it needs, as EC2 and IAM's do ("not authorized to perform:
    ec2:X"), so the one-line error says what to add to the policy. S3 often says only "Access
    Denied". Runs before botocore raises the error built from `parsed`."""
    error = parsed.get("Error") or {}
    message = str(error.get("Message") or "Access Denied")
    if error.get("Code") not in DENIED or "not authorized to perform" in message:
        return
    action = iam_policy.action_of(model.service_model.signing_name, model.name)
    error["Message"] = f"{message} (not authorized to perform: {action}; see amibake iam-policy)"


# Refused for credentials that have run out (STS's, and the services' own spelling of it).
EXPIRED = {"ExpiredToken", "ExpiredTokenException", "RequestExpired"}
RENEW = (
    "renew them (a new session token, or a profile with sso_session or role_arn, which renew "
    "themselves), then amibake gc removes what a run left"
)


def name_expired_credentials(parsed: dict[str, Any], **_: Any) -> None:
    """A refusal for expired credentials says what to do: a run that outlived its session token
    could not clean up (hashicorp/packer#7045: a token ran out while an AMI was pending)."""
    error = parsed.get("Error") or {}
    if error.get("Code") in EXPIRED:
        error["Message"] = f"{error.get('Message') or 'expired'} (AWS credentials: {RENEW})"


# Refusals botocore's standard and adaptive modes retry as transient (HTTP 500) that its quick
# retries cannot fix: an AZ without on-demand capacity for a type stays so for minutes (the EC2
# user guide: wait, or try another AZ), and the retries spent about 13 s before the caller could
# try the next AZ (scylla-cluster-tests#5119, skyplane#299). Raised at once instead.
NOT_TRANSIENT = {"InsufficientInstanceCapacity"}


def raise_not_transient(client: Any) -> Any:
    """A needs-retry handler, run before botocore's own: the error of a refusal in
    NOT_TRANSIENT is raised as botocore would raise it after its last attempt. (Returning False
    stops the retry only in botocore releases from 2026: older ones slept 0 s and retried for
    ever.)"""

    def handler(response: Any = None, operation: Any = None, **_: Any) -> None:
        if response is None or operation is None:
            return  # an exception before any answer (a timeout): botocore's to judge
        http, parsed = response
        code = (parsed.get("Error") or {}).get("Code")
        if http.status_code >= 300 and code in NOT_TRANSIENT:
            raise client.exceptions.from_code(code)(parsed, operation.name)

    return handler


def check_lifetime(credentials: Any) -> None:
    """Temporary credentials botocore cannot renew (a session token from the environment or a
    credentials file) end mid-run, and the run then cannot clean up: refused when already
    expired, else said once. A profile with SSO, role_arn or credential_process renews them."""
    expiry = getattr(credentials, "_expiry_time", None)  # AWS_CREDENTIAL_EXPIRATION
    renews = isinstance(credentials, botocore.credentials.RefreshableCredentials)
    if renews and credentials.method != "env":
        return
    if expiry is not None:
        left = (expiry - datetime.now(UTC)).total_seconds()
        if left <= 0:
            raise UserError(f"the AWS credentials expired at {expiry:%Y-%m-%d %H:%M} UTC: {RENEW}")
        log.warning(
            "the AWS credentials expire in %d min and cannot be renewed: a run still going then "
            "cannot clean up; %s",
            left // 60,
            RENEW,
        )
    elif credentials.token:
        log.warning(
            "the AWS credentials are a session token that cannot be renewed: a run that outlives "
            "it cannot clean up; %s",
            RENEW,
        )


@dataclass
class Cloud:
    """A configured connection to one cloud (AWS or local) in one region."""

    config: Config
    session: boto3.session.Session
    endpoint_url: str | None
    _clients: dict[str, Any] = field(default_factory=dict)
    _building: threading.Lock = field(default_factory=threading.Lock)
    _account: str = ""

    def client(self, service: str, region: str | None = None) -> Any:
        """The service's client, in the cloud's region or in `region` (a service served from
        a few regions only: the Price List's from us-east-1), with the one retry policy."""
        # Clients are thread-safe and costly to build (~50 ms), so each is built once. Building
        # one is not thread-safe (a boto3 session is not): concurrent runs build under a lock.
        name = service if region is None else f"{service}@{region}"
        with self._building:
            if name in self._clients:
                return self._clients[name]
            made = self.session.client(
                service,  # type: ignore[call-overload]
                region_name=region,
                endpoint_url=self.endpoint_url,
                config=botocore.config.Config(
                    # mode is validated by config (standard or adaptive). max_attempts counts
                    # every attempt, the first included, as the AWS config file's does: botocore's
                    # own max_attempts counts retries (10 made 11, and 1 still retried once).
                    retries=cast(
                        Any,
                        {
                            "mode": self.config.retry_mode,
                            "total_max_attempts": self.config.max_attempts,
                        },
                    ),
                    connect_timeout=10,
                    read_timeout=120,
                    # A bucket is a path on the local cloud's one endpoint (no DNS per bucket);
                    # presigned URLs are SigV4, which every region accepts.
                    s3={"addressing_style": "path" if self.config.is_local else "auto"},
                    signature_version="s3v4" if service == "s3" else None,
                ),
            )
            made.meta.events.register("after-call.*.*", name_denied_action)
            made.meta.events.register("after-call.*.*", name_expired_credentials)
            # on the node botocore's retry handler is on, so that this one is asked first
            retried = f"needs-retry.{made.meta.service_model.service_id.hyphenize()}"
            made.meta.events.register_first(retried, raise_not_transient(made))
            if service == "s3":
                # Every S3 call names the account that must own the bucket: a bucket of the
                # same name held by someone else is refused (403), never written to or read.
                made.meta.events.register("provide-client-params.s3.*", self._expect_own_bucket)
            self._clients[name] = made
            return made

    @property
    def account(self) -> str:
        """The caller's account id (asked once)."""
        if not self._account:
            self._account = str(self.client("sts").get_caller_identity()["Account"])
        return self._account

    def _expect_own_bucket(self, params: dict[str, Any], model: Any, **_: Any) -> None:
        if "ExpectedBucketOwner" in model.input_shape.members:
            params.setdefault("ExpectedBucketOwner", self.account)

    # Clients are typed Any on purpose: the SDK's stubs type instance types and filters as vast
    # Literal unions that only add casts to code that builds requests from data.
    @property
    def ec2(self) -> Any:
        return self.client("ec2")

    @property
    def ssm(self) -> Any:
        return self.client("ssm")

    @property
    def imds_endpoint(self) -> str:
        """The metadata endpoint as seen from an instance (templates take it as a variable)."""
        if not self.config.is_local:
            return "http://169.254.169.254"
        # Each sandbox resolves instance-data (as EC2's DNS does) to its own IMDS server.
        port = self.config.local_imds_port
        return "http://instance-data" + ("" if port == 80 else f":{port}")

    @property
    def instance_cpu(self) -> Cpu | None:
        """The CPU every instance runs on, when it is known before any is launched: on the
        local cloud, this machine's (every sandbox runs on it, whatever its type). On AWS it is
        the type's, learnt on the instance."""
        return this_machine() if self.config.is_local else None

    def ssh_endpoint(self, instance: dict[str, Any]) -> tuple[str, int]:
        """Where to SSH to a described instance: its public or private address (ssh_address),
        an instance without that address being one SSH cannot reach (NoAddress)."""
        kind = "PublicIpAddress" if self.config.ssh_address == "public" else "PrivateIpAddress"
        address = instance.get(kind)
        if not address:
            what = f"{self.config.ssh_address} IPv4 address"
            raise NoAddress(f"{instance['InstanceId']} has no {what}")
        if self.config.is_local:
            for tag in instance.get("Tags", []):
                if tag["Key"] == LOCAL_SSH_TAG:
                    host, _, port = tag["Value"].rpartition(":")
                    return host, int(port)
            raise CloudError(
                f"{instance['InstanceId']} has no {LOCAL_SSH_TAG} tag: it was not started by "
                f"the local cloud's sandbox layer"
            )
        return str(address), 22


class NoAddress(CloudError):
    """A described instance lacks the address SSH dials: not yet (just launched), or never."""


NO_CREDENTIALS = (
    "no AWS credentials found: configure a profile (aws configure), pass --profile, or use "
    "--cloud local"
)


def open_cloud(config: Config, local_endpoint: str | None = None) -> Cloud:
    """The Cloud for a config: AWS, or the local cloud at `local_endpoint` (which
    amibake.connect starts; this module knows only its address, never the emulator)."""
    endpoint = config.endpoint_url
    if config.is_local:
        if local_endpoint is None:
            raise UserError("the local cloud has no endpoint: connect through amibake.connect")
        endpoint = local_endpoint
        # moto accepts any credentials unless IAM enforcement is on; fixed ones keep a user's
        # real keys out of local traffic.
        key, _, secret = (config.local_credentials or "testing:testing").partition(":")
        session = boto3.session.Session(
            aws_access_key_id=key,
            aws_secret_access_key=secret,
            region_name=config.region,
            botocore_session=service_models.session(),
        )
    else:
        try:
            session = boto3.session.Session(
                region_name=config.region, botocore_session=service_models.session(config.profile)
            )
        except botocore.exceptions.ProfileNotFound as exc:
            raise UserError(f"{exc}; pick one from ~/.aws/config or unset --profile") from None
        # Asked now, not at the first call: by then a run may be recorded (a fleet bench run
        # stayed "created" for good) for a command that never could have run.
        credentials = session.get_credentials()
        if credentials is None:
            raise UserError(NO_CREDENTIALS)
        check_lifetime(credentials)
    return Cloud(config=config, session=session, endpoint_url=endpoint)
