"""From a config to a Cloud: the one place the product reaches the local cloud.

On AWS this is the session alone. With ``cloud = "local"`` it first starts the embedded local
cloud (unless it runs already) and then opens the same session against its endpoint. The AWS
session (amibake/cloud/session.py) knows the local cloud only as an endpoint and an address
lookup, and the local cloud imports nothing of the product's commands: this module, above both,
is what joins them (ARCHITECTURE.md's circle 1). The CLIs, fleet's cloud evaluator and the tests
call it.
"""

from __future__ import annotations

from amibake.cloud.session import Cloud, open_cloud
from amibake.config import Config
from amibake.errors import UserError


def connect(config: Config) -> Cloud:
    """The Cloud for a config; for the local cloud, started when it is not running."""
    if not config.is_local:
        return open_cloud(config)
    from amibake.local.control import hold, up
    from amibake.local.daemon import REGIONS

    # Its base images exist in these regions only: elsewhere the first launch failed with
    # InvalidAMIID.NotFound for the AMI the region's SSM parameter names.
    if config.region not in REGIONS:
        raise UserError(
            f"the local cloud serves {', '.join(REGIONS)}, not {config.region}: pick one "
            "with --region"
        )
    daemon = up(config)  # started unless already running
    hold(config)  # `amibake local down` refuses while this process may still use it
    return open_cloud(config, daemon.endpoint)
