"""Installing a recipe's packages on an instance, with the image's own package manager.

The ECS-optimized Amazon Linux 2023 AMI is made to run containers: it has no compiler, and an
OpenMP build's runtime (libgomp) is not a given either. A recipe names what its build needs
(``packages``) and what its artifact needs to run (``runtime_packages``); the build host gets
both, and every host that runs the artifact (a bench instance, a baked image, a Batch job's
container) gets the runtime ones. dnf is Amazon Linux 2023's; yum is Amazon Linux 2's.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from typing import Any

# What amibake itself runs on a host: artifacts are tar.xz (unpacked on every host that runs
# one; the build host tars its output and unpacks xz sources). The ISA scan runs on the
# controller, so no host needs a disassembler.
ARTIFACT_TOOLS = ("tar", "xz")
BUILD_TOOLS = ARTIFACT_TOOLS

# What dnf and yum take as a package name (letters, digits, and . _ + -), and nothing a shell
# would read as more than one word.
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")


def bad_names(names: Iterable[str]) -> list[str]:
    return [name for name in names if not NAME.match(name)]


def install_command(names: Iterable[str], *, optional: bool = False) -> str:
    """Shell, run as root, that installs the packages (dnf, else yum) or exits 3 saying which it
    could not (optional: says so and goes on); a no-op for none. Installing what is already
    there changes nothing."""
    unique = list(dict.fromkeys(names))
    if not unique:
        return ":"
    if optional:
        return f"( {install_command(unique)} ) || true"
    listed = " ".join(shlex.quote(name) for name in unique)
    said = " ".join(unique)
    # rpm first: where all are installed (a baked image), dnf would still fetch the
    # repositories' metadata, seconds to a minute on a new instance, for nothing.
    return (
        f"if ! rpm -q {listed} >/dev/null 2>&1; then\n"
        "if command -v dnf >/dev/null; then pm=dnf; elif command -v yum >/dev/null; then pm=yum; "
        f'else echo "no dnf or yum here to install {said}" >&2; exit 3; fi\n'
        f'"$pm" install -y -q {listed} >&2 '
        f'|| {{ echo "$pm could not install {said}" >&2; exit 3; }}\n'
        "fi"
    )


def runtime(manifests: Iterable[dict[str, Any]]) -> list[str]:
    """The runtime packages of these artifacts' recipes, as their manifests record them."""
    needed = [str(name) for manifest in manifests for name in manifest.get("runtime_packages", [])]
    return list(dict.fromkeys(needed))
