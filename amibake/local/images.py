"""The local cloud's image store: an AMI is a stack of overlay layers over the host's "/".

CreateImage copies the instance's upper directory (everything the instance wrote) into a new
layer and records the layers beneath it; launching the AMI mounts that stack read-only under the
new instance's own upper directory. Nothing is copied at launch, so launching a baked AMI costs
the same as launching a base one.

The store is a tmpfs in the daemon's private mount namespace, for two reasons: overlayfs refuses a
lower layer that sits inside another lower layer (-ELOOP, "overlapping lowerdir path"), and every
path on the root filesystem sits inside "/", the bottom layer of every stack; and the images live
exactly as long as moto's in-memory record of them. From the host, the store is readable at
``/proc/<daemon pid>/root<store path>``.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

from amibake.errors import LocalCloudError
from amibake.local import dnf
from amibake.local.sandbox import remove_tree

# `amibake local up` names its own mount namespace here, so the daemon can check it has another.
LAUNCHER_NS_ENV = "AMIBAKE_LAUNCHER_MNT_NS"


ECS_UNIT = """[Unit]
Description=Amazon Elastic Container Service - container agent (local cloud stand-in)
After=cloud-final.service

[Service]
Type=simple
ExecStart=/usr/libexec/amazon-ecs-init start

[Install]
WantedBy=multi-user.target
"""


class ImageStore:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.root.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()

    def mount(self) -> None:
        """Put the store on a tmpfs; only ever inside the daemon's own mount namespace."""
        launcher = os.environ.get(LAUNCHER_NS_ENV, "")
        if not launcher or os.readlink("/proc/self/ns/mnt") == launcher:
            raise LocalCloudError(
                "the local cloud daemon must run in a private mount namespace (start it with "
                "`amibake local up`)"
            )
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "mode=700", "amibake-images", str(self.root)],
            check=True,
            capture_output=True,
        )

    def layer(self, image_id: str) -> Path:
        return self.root / image_id / "layer"

    def layers(self, image_id: str) -> list[Path]:
        """The image's layers, top first; empty for images this store did not make (base AMIs)."""
        meta = self.root / image_id / "image.json"
        if not meta.exists():
            return []
        return [Path(p) for p in json.loads(meta.read_text())["layers"]]

    def create(self, image_id: str, instance_upper: Path, parent_layers: list[Path]) -> None:
        target = self.layer(image_id)
        target.mkdir(parents=True)
        # cp -a keeps owners, modes, xattrs (overlay's opaque markers) and whiteout devices,
        # which is what lets this directory serve as a layer of its own.
        done = subprocess.run(
            ["cp", "-a", f"{instance_upper}/.", str(target)], capture_output=True, text=True
        )
        if done.returncode != 0:
            remove_tree(self.root / image_id)
            raise LocalCloudError(f"snapshot of {instance_upper} failed: {done.stderr.strip()}")
        layers = [str(target), *map(str, parent_layers)]
        (self.root / image_id / "image.json").write_text(json.dumps({"layers": layers}))

    def delete(self, image_id: str, in_use: set[Path]) -> bool:
        """Drop an image unless a running sandbox or another image still stacks on its layer."""
        with self._lock:
            layer = self.layer(image_id)
            if layer in in_use:
                return False
            for other in self.root.iterdir():
                if other.name != image_id and layer in self.layers(other.name):
                    return False
            remove_tree(self.root / image_id)
            return True

    def seed_ecs_base(self, image_id: str) -> None:
        """A base AMI's layer: what makes the host's "/" look like the ECS-optimized AMI.

        The ECS agent's unit (enabled, as on the real AMI), its config and some agent state
        under /var/lib/ecs/data, so a bake's hygiene and boot test have the real things to act
        on; no gcc or libgomp, and a dnf that installs them (amibake.local.dnf). The agent itself
        does not run: the unit is not a oneshot (see amibake.local.boot).
        """
        layer = self.layer(image_id)
        units = layer / "usr/lib/systemd/system"
        wants = layer / "etc/systemd/system/multi-user.target.wants"
        for directory in (units, wants, layer / "etc/ecs", layer / "var/lib/ecs/data"):
            directory.mkdir(parents=True, exist_ok=True)
        (units / "ecs.service").write_text(ECS_UNIT)
        (wants / "ecs.service").symlink_to("/usr/lib/systemd/system/ecs.service")
        (layer / "etc/ecs/ecs.config").write_text("ECS_CLUSTER=default\n")
        (layer / "var/lib/ecs/data/agent.db").write_text("agent state of the instance\n")
        dnf.seed(layer)  # no compiler, as on the real AMI, and dnf to install one
        (self.root / image_id / "image.json").write_text(json.dumps({"layers": [str(layer)]}))

    def image_ids(self) -> list[str]:
        return sorted(p.name for p in self.root.iterdir() if (p / "image.json").exists())
