"""The one adapter between amibake and the AWS SDK (boto3): sessions, clients, tags, waits.
It knows the local cloud only as an endpoint and an address lookup: amibake.connect starts it."""

from amibake.cloud.session import Cloud

__all__ = ["Cloud"]
