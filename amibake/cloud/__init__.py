"""The one adapter between amibake and the AWS SDK (boto3): sessions, clients, tags, waits."""

from amibake.cloud.session import Cloud, connect

__all__ = ["Cloud", "connect"]
