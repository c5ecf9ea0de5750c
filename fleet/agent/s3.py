"""A Batch job's own access to the job bucket, with its job role's credentials (standard library
only: the job's image need not have more than python3).

ECS gives a job its role's short-lived credentials on an endpoint named in its environment
(AWS_CONTAINER_CREDENTIALS_RELATIVE_URI on 169.254.170.2, or a FULL_URI); requests are signed
with Signature Version 4 and name the account that must own the bucket, so no URL or key ever
travels in the job's definition, environment or logs.

Run as ``python3 -c "<this file>"`` it is the job's bootstrap: it fetches the payload (this
file, job.py and the builds), unpacks it and hands over to job.py, which imports it again.

Environment: FLEET_BUCKET, FLEET_PREFIX (the run's files), FLEET_OWNER (the bucket's account),
FLEET_REGION, and FLEET_S3_ENDPOINT where S3 is not AWS's own (the local cloud).
"""

from __future__ import annotations

import copy
import datetime
import hashlib
import hmac
import http.client
import io
import json
import os
import random
import signal
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator

if __name__ == "__main__":
    # The container's PID 1, from its first instruction on: ECS stops a terminated job with
    # SIGTERM, which PID 1 ignores unless it handles it (and the job ran on 30 s, writing its
    # files). bootstrap() passes it on to job.py once that runs.
    signal.signal(signal.SIGTERM, lambda *_: os._exit(143))

ECS_CREDENTIALS_HOST = "http://169.254.170.2"
UNSIGNED = "UNSIGNED-PAYLOAD"  # S3 takes it; the body is not hashed twice


def credentials() -> dict[str, str]:
    """The job role's credentials, from the endpoint ECS names in the environment."""
    relative = os.environ.get("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI")
    url = (
        ECS_CREDENTIALS_HOST + relative
        if relative
        else os.environ.get("AWS_CONTAINER_CREDENTIALS_FULL_URI", "")
    )
    if not url:
        raise RuntimeError("no job role credentials: the job definition has no jobRoleArn")
    request = urllib.request.Request(url)
    token = os.environ.get("AWS_CONTAINER_AUTHORIZATION_TOKEN")
    if token:
        request.add_header("Authorization", token)
    with urllib.request.urlopen(request, timeout=10) as response:
        found: dict[str, str] = json.loads(response.read())
    return found


def _sign(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


# S3 asks a client to slow down (503 SlowDown) or to try again (500 InternalError) now and then;
# the SDKs retry those, and so must a job with none: one such answer failed the whole job.
ATTEMPTS = 8
RETRIED = (500, 502, 503, 504)
BACKOFF_S = 20.0  # the longest wait between attempts, as the SDKs' standard mode


def request(method: str, key: str, body: bytes | None = None) -> bytes:
    """One S3 request on the job bucket's `key`, sent again with backoff while S3 asks to."""
    for attempt in range(1, ATTEMPTS + 1):
        try:
            return _once(method, key, body)
        except urllib.error.HTTPError as exc:
            if exc.code not in RETRIED or attempt == ATTEMPTS:
                raise
            exc.close()
        # A connection refused or reset on the way (URLError), or while the reply is read
        # (RemoteDisconnected, IncompleteRead, a timeout): the body is bytes, sent again whole.
        except (urllib.error.URLError, http.client.HTTPException, ConnectionError, TimeoutError):
            if attempt == ATTEMPTS:
                raise
        time.sleep(random.random() * min(BACKOFF_S, 2.0**attempt))
    raise AssertionError("unreachable")  # the last attempt returns or raises


def _once(method: str, key: str, body: bytes | None) -> bytes:
    """One S3 request on the job bucket's `key`, signed with the job role's credentials."""
    bucket = os.environ["FLEET_BUCKET"]
    region = os.environ["FLEET_REGION"]
    endpoint = os.environ.get("FLEET_S3_ENDPOINT")
    quoted = urllib.parse.quote(key, safe="/-_.~")
    if endpoint:  # path-style, as the local cloud's one endpoint serves every bucket
        parsed = urllib.parse.urlsplit(endpoint)
        host, path = parsed.netloc, f"/{bucket}/{quoted}"
        url = f"{parsed.scheme}://{host}{path}"
    else:
        host, path = f"{bucket}.s3.{region}.amazonaws.com", f"/{quoted}"
        url = f"https://{host}{path}"
    creds = credentials()
    now = datetime.datetime.now(datetime.timezone.utc)  # noqa: UP017 - python3.9 in the image
    stamp, day = now.strftime("%Y%m%dT%H%M%SZ"), now.strftime("%Y%m%d")
    headers = {
        "host": host,
        "x-amz-content-sha256": UNSIGNED,
        "x-amz-date": stamp,
        "x-amz-expected-bucket-owner": os.environ["FLEET_OWNER"],
    }
    if creds.get("Token"):
        headers["x-amz-security-token"] = creds["Token"]
    names = sorted(headers)
    canonical = "\n".join(
        [method, path, "", *(f"{n}:{headers[n]}" for n in names), "", ";".join(names), UNSIGNED]
    )
    scope = f"{day}/{region}/s3/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", stamp, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    signing = _sign(("AWS4" + creds["SecretAccessKey"]).encode(), day)
    for part in (region, "s3", "aws4_request"):
        signing = _sign(signing, part)
    signature = hmac.new(signing, to_sign.encode(), hashlib.sha256).hexdigest()
    headers["authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={creds['AccessKeyId']}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    del headers["host"]  # urllib sets it from the URL
    sent = urllib.request.Request(url, data=body, method=method, headers=headers)
    with urllib.request.urlopen(sent, timeout=600) as response:
        data: bytes = response.read()
    return data


def get(key: str) -> bytes:
    return request("GET", os.environ["FLEET_PREFIX"] + key)


def put(key: str, body: bytes) -> None:
    request("PUT", os.environ["FLEET_PREFIX"] + key, body)


def extract(tar: tarfile.TarFile, directory: str) -> None:
    """Unpack `tar` into `directory` as Python's "data" extraction filter does, also where the
    instance's python3 predates filters (Debian 12's 3.11.2, 3.11.4 added them): nothing
    outside `directory`, no link pointing out of it, no device or FIFO, no setuid bit, files
    owned by whoever unpacks them."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(directory, filter="data")
    else:
        tar.extractall(directory, members=_checked(tar, directory))
    # Links made later can carry an earlier one out (a -> p/x/../.., then p -> .), past the
    # check of each as it is made: every link is read again once all are (amibake.archive).
    root = os.path.realpath(directory)
    out = []
    for here, dirs, names in os.walk(directory):
        for name in dirs + names:
            path = os.path.join(here, name)
            real = os.path.realpath(path)
            if os.path.islink(path) and real != root and not real.startswith(root + os.sep):
                out.append(path)
    for path in out:
        os.unlink(path)
    if out:
        raise tarfile.TarError(f"{out[0]!r} links outside {directory} through other links")


def _checked(tar: tarfile.TarFile, directory: str) -> Iterator[tarfile.TarInfo]:
    # Checked one member at a time, as extraction reaches it: a path through a link an earlier
    # member made resolves to where that link really points.
    root = os.path.realpath(directory)

    def inside(path: str) -> bool:
        real = os.path.realpath(os.path.join(root, path))
        return real == root or real.startswith(root + os.sep)

    for member in tar:
        name = member.name
        if os.path.isabs(name) or not inside(name):
            raise tarfile.TarError(f"{name!r} would be extracted outside {directory}")
        if member.issym() or member.islnk():
            # A symbolic link resolves from its own directory, a hard link from the top.
            base = os.path.dirname(name) if member.issym() else ""
            if os.path.isabs(member.linkname) or not inside(os.path.join(base, member.linkname)):
                raise tarfile.TarError(f"{name!r} links outside {directory}")
        elif not (member.isfile() or member.isdir()):
            raise tarfile.TarError(f"{name!r} is a device or FIFO")
        member = copy.copy(member)
        member.mode &= 0o755  # no setuid, setgid or sticky bit, no group or other write
        member.uid, member.gid, member.uname, member.gname = os.getuid(), os.getgid(), "", ""
        yield member


def bootstrap() -> int:
    """Fetch and unpack the payload, then run job.py from it. As the container's PID 1 it would
    ignore the SIGTERM by which ECS stops a terminated job (PID 1 gets only the signals it
    handles), and the job ran on for the 30 s to SIGKILL, writing its files after the run had
    removed them: it exits instead, and the kernel ends the rest of the container with it."""
    directory = "/tmp/fleet-" + os.environ["AWS_BATCH_JOB_ID"].replace(":", "-")
    os.makedirs(directory, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(get("payload.tar"))) as tar:
        extract(tar, directory)
    # SIGTERM held back while job.py starts and the handler that passes it on is set: in
    # between, the import-time handler exited without it.
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    child = subprocess.Popen(
        [sys.executable, os.path.join(directory, "job.py")],
        preexec_fn=lambda: signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM}),
    )

    def stop(*_: object) -> None:
        child.terminate()  # where the bootstrap is not PID 1, job.py would be left running
        os._exit(143)

    signal.signal(signal.SIGTERM, stop)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    return child.wait()


if __name__ == "__main__":
    sys.exit(bootstrap())
