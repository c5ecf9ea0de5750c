"""The local cloud's Amazon Linux package manager: what a base image lacks, and dnf to add it.

A local instance's root is this machine's "/", which has gcc, libgomp and python3-psutil; the
ECS-optimized AMI has no compiler, an image without gcc need not have OpenMP's runtime, and
psutil (fleet's monitor) is no part of Amazon Linux's python3. So a base image's layer hides
them (overlay whiteouts) and keeps a copy aside, and its ``/usr/bin/dnf`` puts a hidden
package's files back when asked to install it. A build or bench that forgets to install
what it needs then fails here as it would on AWS. Any other package name counts as installed:
the rest of this machine stands in for the image.
"""

from __future__ import annotations

import functools
import glob
import logging
import os
import shutil
import stat
from pathlib import Path

log = logging.getLogger("amibake.local")

STASH = "usr/lib/amibake-local/packages"  # in the layer: <name>.files, and root/<path> copies


def _libgomp() -> list[str]:
    return sorted(
        path
        for pattern in ("/usr/lib/*/libgomp.so.1*", "/usr/lib64/libgomp.so.1*")
        for path in glob.glob(pattern)
    )


@functools.cache  # this machine's files: looked up once for every base image the daemon seeds
def hidden_packages() -> dict[str, list[str]]:
    """Package name -> this machine's files or directories that the base image hides
    (absolute paths). gcc brings libgomp with it, as Amazon Linux's gcc package requires it."""
    libgomp = _libgomp()
    gcc = ["/usr/bin/gcc"] if os.path.lexists("/usr/bin/gcc") else []
    psutil = glob.glob("/usr/lib/python3/dist-packages/psutil")  # the system python3's
    found = {"gcc": gcc + libgomp if gcc else [], "libgomp": libgomp, "python3-psutil": psutil}
    return {name: paths for name, paths in found.items() if paths}


DNF = f"""#!/bin/sh
# The local cloud's stand-in for Amazon Linux's dnf (amibake/local/dnf.py): the base image hides
# the packages listed under /{STASH}, as the real AMI lacks them, and installing one puts its
# files back. Any other package is part of the image already.
# Like dnf, it leaves what it fetched in /var/cache/dnf until `dnf clean all`.
stash=/{STASH}
cache=/var/cache/dnf
case "$1" in
  install) shift ;;
  clean) rm -rf "$cache"; exit 0 ;;
  *) echo "dnf (local cloud): only install and clean are served" >&2; exit 1 ;;
esac
for name in "$@"; do
  case "$name" in -*) continue ;; esac
  mkdir -p "$cache" && echo "$name" > "$cache/$name.rpm"
  if [ -f "$stash/$name.files" ]; then
    while IFS= read -r path; do
      mkdir -p "$(dirname "$path")"
      cp -a "$stash/root$path" "$(dirname "$path")/"
    done < "$stash/$name.files"
    echo "Installed: $name"
  else
    echo "Package $name is already installed."
  fi
done
"""


def seed(layer: Path) -> None:
    """Hide the packages in a base image's layer, keep their files aside, and add dnf."""
    stash = layer / STASH
    (stash / "root").mkdir(parents=True, exist_ok=True)
    dnf = layer / "usr/bin/dnf"
    dnf.parent.mkdir(parents=True, exist_ok=True)
    dnf.write_text(DNF)
    dnf.chmod(0o755)
    for name, paths in hidden_packages().items():
        (stash / f"{name}.files").write_text("".join(f"{p}\n" for p in paths))
        for path in paths:
            kept = stash / "root" / path.lstrip("/")
            kept.parent.mkdir(parents=True, exist_ok=True)
            if not os.path.lexists(kept):  # a directory (psutil) whole, a symlink as one
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.copytree(path, kept, symlinks=True)
                else:
                    shutil.copy2(path, kept, follow_symlinks=False)
            whiteout = layer / path.lstrip("/")
            whiteout.parent.mkdir(parents=True, exist_ok=True)
            if os.path.lexists(whiteout):
                continue
            try:  # overlayfs reads a 0/0 character device as "no such file here"
                os.mknod(whiteout, stat.S_IFCHR | 0o600, os.makedev(0, 0))
            except PermissionError:  # a rootless daemon may not make devices: nothing hidden
                log.warning("cannot hide %s in base images (no permission to mknod)", path)
                return
