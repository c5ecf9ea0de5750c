"""An instance's metadata service is not there the moment it boots: early boot units that ask
it once fail.

Sources: the EC2 user guide, "Access instance metadata" (IMDS is reached over the instance's
network, which comes up during boot; cloud-init and the AWS SDKs retry it); the systemd
documentation of network-online.target (a unit that needs the network orders itself after it).
Locally, each instance's IMDS answers 503 for its first seconds (amibake.local.imds), at a
seeded delay.
"""

from __future__ import annotations

from amibake.local.faults import Behaviour, Faults

UNREADY_S = (1.0, 3.0)


def unready_for(faults: Faults, instance_id: str) -> float:
    """How long the instance's IMDS refuses after launch (0 when the behaviour is off)."""
    if not faults.on(BEHAVIOUR.name):
        return 0.0
    n = faults.ordinal("imds-instance", instance_id)
    faults.count(BEHAVIOUR.name, "imds unready at boot")
    return faults.between(*UNREADY_S, "imds", n, "unready")


BEHAVIOUR = Behaviour(
    name="imds-late",
    source="EC2 user guide: Access instance metadata; systemd network-online.target",
    elsewhere="each instance's IMDS (amibake.local.engine asks unready_for at launch)",
)
