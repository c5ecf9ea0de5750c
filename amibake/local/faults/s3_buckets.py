"""A bucket just made is not yet found everywhere S3 looks: a setting put on it seconds after
CreateBucket is refused 404 NoSuchBucket, its encryption at times 409 OperationAborted ("A
conflicting conditional operation is currently in progress"), and the same call succeeds a
little later.

Sources: terraform-provider-aws retries NoSuchBucket on PutPublicAccessBlock,
PutBucketLifecycleConfiguration, PutBucketEncryption (with OperationAborted) and the bucket's
other settings for its bucketPropagationTimeout, two minutes, after S3's consistency model (the
S3 user guide: "bucket configurations have an eventual consistency model").

Locally: within a window drawn per bucket from FRESH_S after its CreateBucket, those puts are
refused: NoSuchBucket, or OperationAborted for encryption at a seeded share.
"""

from __future__ import annotations

from amibake.local.faults import Behaviour, Faults, Reply, Request, s3_error

FRESH_S = (0.5, 3.0)  # AWS: seconds, at times more (terraform waits up to two minutes)
ABORTED = 0.5  # share of refused encryption puts answered OperationAborted
SETTINGS = (
    "PutPublicAccessBlock",
    "PutBucketEncryption",
    "PutBucketLifecycleConfiguration",
    "PutBucketTagging",
    "PutBucketPolicy",
)


def _bucket(request: Request) -> str:
    return request.path.strip("/")


def _before(faults: Faults, request: Request) -> Reply | None:
    if request.service != "s3" or request.action not in SETTINGS:
        return None
    bucket = _bucket(request)
    if not faults.fresh("bucket", bucket, FRESH_S):
        return None
    n = faults.ordinal("bucket", bucket)
    if request.action == "PutBucketEncryption" and faults.chance(ABORTED, "bucket", n, "abort"):
        faults.count(BEHAVIOUR.name, "operation aborted")
        return s3_error(
            "OperationAborted",
            "A conflicting conditional operation is currently in progress against this "
            "resource. Please try again.",
            409,
        )
    faults.count(BEHAVIOUR.name, "bucket not found yet")
    return s3_error("NoSuchBucket", "The specified bucket does not exist", 404)


def _after(faults: Faults, request: Request, reply: Reply) -> Reply:
    if request.service == "s3" and request.action == "CreateBucket" and reply.ok:
        faults.remember("made:bucket")[_bucket(request)] = faults.now()
    return reply


BEHAVIOUR = Behaviour(
    name="s3-buckets",
    source="terraform-provider-aws internal/service/s3 (bucketPropagationTimeout); S3 user guide",
    before=_before,
    after=_after,
)
