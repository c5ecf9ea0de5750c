"""Layered configuration: defaults < amibake.toml < AMIBAKE_* environment < command-line flags.

Every layer is validated against the same field table, and all problems are reported in one
error, so a user fixes their file once instead of once per typo.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from amibake import checks, tomlfile
from amibake.errors import ConfigError, UserError

CLOUDS = ("aws", "local")
RETRY_MODES = ("standard", "adaptive")
# AWS region codes: us-east-1, ap-southeast-2 (us-gov-west-1, eusc-de-east-1 too, which are
# refused as other partitions' below). Checked here
# because botocore's own refusal ("region_name '5' doesn't match a supported format") names
# neither the setting nor where it came from, and a well-formed typo only fails at connect time.
REGION = re.compile(r"[a-z]{2,4}(-[a-z]+)+-\d{1,2}")
# The user amibake logs in as on an instance (useradd's rule); it goes into an SSH command line.
USER_NAME = re.compile(r"[a-z_][a-z0-9_-]{0,31}")
# An instance that has not answered SSH in a day never will; more is a typo for fewer.
MAX_SSH_TIMEOUT_S = 86400.0
MAX_DEADLINE_MIN = 1440
# Which address of an instance SSH dials: its public IPv4 (asked for at launch: the controller is
# outside the VPC) or its private one (the controller runs inside the VPC, or reaches it by VPN).
SSH_ADDRESSES = ("public", "private")
SUBNET_ID = re.compile(r"subnet-[0-9a-f]{8}(?:[0-9a-f]{9})?")
SECURITY_GROUP_ID = re.compile(r"sg-[0-9a-f]{8}(?:[0-9a-f]{9})?")


def cache_home() -> Path:
    """Where amibake keeps what it can rebuild (XDG): the local cloud, the source cache."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")


# Settings whose command-line flag is not --SETTING (`amibake local up --faults`).
FLAGS = {"local_faults": "--faults", "local_faults_seed": "--faults-seed", "subnet_ids": "--subnet"}
# The folders runs write under results_dir: logs and keys, reports, artifacts, tune files, and
# the bench monitors' samples.
RESULTS_FOLDERS = ("logs", "reports", "artifacts", "tunes", "runs")


@dataclass(frozen=True)
class Config:
    cloud: str = "aws"
    region: str = "us-east-1"
    profile: str | None = None
    endpoint_url: str | None = None
    retry_mode: str = "standard"
    max_attempts: int = 10
    results_dir: Path = Path("results")
    recipes_dir: Path = Path(__file__).resolve().parent.parent / "build_recipes"
    recipe: str = "kernels"
    size: str = "large"
    spot: bool = True
    ssh_user: str = "ec2-user"
    ssh_timeout_s: float = 300.0
    # An instance powers itself off (and is terminated) this long after its controller last
    # renewed its deadline (amibake.deadline): what a dead controller's instances cost at most.
    instance_deadline_min: int = 30
    ssh_address: str = "public"
    # The account's shape. Empty: the region's default VPC and its default subnets, as most
    # accounts have. Organisations often delete default VPCs: then the subnets to launch in (one
    # or more, any AZs of one VPC), and security groups the instances join beside amibake's own
    # SSH group (which is made in the subnets' VPC).
    subnet_ids: tuple[str, ...] = ()
    security_group_ids: tuple[str, ...] = ()
    # The local cloud: where its daemon listens and keeps state, and which loopback range its
    # sandboxes take addresses from. Tests use their own values so they never touch a user's.
    local_dir: Path = field(default_factory=lambda: cache_home() / "amibake" / "local")
    local_port: int = 5077
    local_subnet: str = "127.77.0.0/16"
    local_ssh_port: int = 22
    local_imds_port: int = 80
    # "KEY_ID:SECRET" to call the local cloud as a given IAM user (default: any, unchecked).
    local_credentials: str | None = None
    # How the local cloud behaves: "none" (moto as it is), "aws" (as AWS documents: eventual
    # consistency, pages, errors; amibake.local.faults), or some of its behaviours by name.
    local_faults: str = "none"
    local_faults_seed: int = 0

    @property
    def is_local(self) -> bool:
        return self.cloud == "local"


_FIELDS = {f.name: f for f in dataclasses.fields(Config)}


def _coerce(name: str, value: Any, problems: list[str], source: str) -> Any:
    """Turn a TOML/env/flag value into the field's type, or record why it cannot be."""
    kind = _FIELDS[name].type
    try:
        if kind in ("int",):
            if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
                raise ValueError  # true is no port, and 2.5 attempts is a typo, not 2
            return int(value)
        if kind == "float":
            if isinstance(value, bool):
                raise ValueError
            return float(value)
        if kind == "bool":
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("1", "true", "yes", "on"):
                return True
            if text in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if kind == "tuple[str, ...]":  # a TOML list, or "a,b" from the environment or a flag
            items = value.split(",") if isinstance(value, str) else value
            if not isinstance(items, list | tuple) or not all(isinstance(i, str) for i in items):
                raise ValueError
            return tuple(i.strip() for i in items if i.strip())
        if kind == "Path":
            if not isinstance(value, str) or not value or "\0" in value:
                raise ValueError
            return Path(value).expanduser()
        if value is None or (kind == "str | None" and value == ""):
            return None
        if not isinstance(value, str):  # TOML's 5 or true for a name: a mistake, not "5"
            raise ValueError
        return value
    except (TypeError, ValueError, OverflowError):  # int(inf) overflows
        problems.append(f"{source}: {name} must be {kind}, got {value!r}")
        return None


@functools.cache
def _partition(region: str) -> str:
    """The AWS partition of a region code (aws, aws-us-gov, aws-cn, ...), as botocore's
    endpoint data has it; a code it does not know takes the pattern it matches."""
    from botocore.exceptions import UnknownRegionError

    from amibake import service_models  # botocore's data, read once a process

    try:
        return str(service_models.session().get_partition_for_region(region))
    except UnknownRegionError:  # a code no partition's pattern takes
        return ""


def _validate(cfg: Config, problems: list[str]) -> None:
    if cfg.cloud not in CLOUDS:
        problems.append(f"cloud must be one of {', '.join(CLOUDS)}, got {cfg.cloud!r}")
    if not REGION.fullmatch(cfg.region):
        problems.append(
            f"region must be an AWS region code such as us-east-1 or eu-west-1, got {cfg.region!r}"
        )
    elif not (partition := _partition(cfg.region)):
        problems.append(
            f"region {cfg.region} is in no AWS partition: give a region code such as us-east-1 "
            "or eu-west-1"
        )
    elif partition != "aws":
        # GovCloud's, China's, the sovereign clouds' ARNs begin arn:aws-us-gov: and so on, and
        # their service names and prices differ: amibake's IAM policy, bucket policy and price
        # catalog are the commercial partition's, and would fail there half-way.
        problems.append(
            f"region {cfg.region} is in AWS's {partition} partition: amibake works in the "
            "commercial partition's regions (us-east-1, eu-west-1, ...) only"
        )
    if cfg.retry_mode not in RETRY_MODES:
        problems.append(
            f"retry_mode must be one of {', '.join(RETRY_MODES)}, got {cfg.retry_mode!r}"
        )
    if not 1 <= cfg.max_attempts <= 50:
        problems.append(f"max_attempts must be between 1 and 50, got {cfg.max_attempts}")
    if not 1 <= cfg.instance_deadline_min <= MAX_DEADLINE_MIN:
        problems.append(
            f"instance_deadline_min must be minutes, 1 to {MAX_DEADLINE_MIN} (a day), got "
            f"{cfg.instance_deadline_min}"
        )
    problem = checks.number(
        cfg.ssh_timeout_s,
        above=0,
        at_most=MAX_SSH_TIMEOUT_S,
        why="an instance that has not answered SSH in a day never will",
    )
    if problem:
        problems.append(f"ssh_timeout_s {problem}")
    if cfg.ssh_address not in SSH_ADDRESSES:
        problems.append(
            f"ssh_address must be one of {', '.join(SSH_ADDRESSES)} (public: the controller is "
            f"outside the VPC), got {cfg.ssh_address!r}"
        )
    for name, pattern, example in (
        ("subnet_ids", SUBNET_ID, "subnet-0123456789abcdef0"),
        ("security_group_ids", SECURITY_GROUP_ID, "sg-0123456789abcdef0"),
    ):
        wrong = [i for i in getattr(cfg, name) if not pattern.fullmatch(i)]
        if wrong:
            problems.append(f"{name}: {', '.join(map(repr, wrong))} is not an id like {example}")
    if cfg.security_group_ids and not cfg.subnet_ids:
        problems.append(
            "security_group_ids needs subnet_ids (the groups belong to the subnets' VPC)"
        )
    if not USER_NAME.fullmatch(cfg.ssh_user):
        problems.append(
            f"ssh_user must be a user name (lowercase letters, digits, _ and -), "
            f"got {cfg.ssh_user!r}"
        )
    problem = checks.integer(cfg.local_faults_seed, 0, 2**32 - 1, "a seed is 32 bits")
    if problem:
        problems.append(f"local_faults_seed {problem}")
    if cfg.endpoint_url is not None:
        from urllib.parse import urlsplit

        parts = urlsplit(cfg.endpoint_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            problems.append(
                f"endpoint_url must be an http:// or https:// URL, got {cfg.endpoint_url!r}"
            )
    if cfg.local_credentials is not None:
        key, _, secret = cfg.local_credentials.partition(":")
        if not key or not secret:
            problems.append("local_credentials must be KEY_ID:SECRET (neither part empty)")
    for name in ("results_dir", "local_dir", "recipes_dir"):
        path = getattr(cfg, name)
        if path.exists() and not path.is_dir():
            problems.append(f"{name} {path} is a file, not a directory")
        elif name != "recipes_dir":  # written to: every command's journal and logs are there
            problem = _unwritable(path)
            if problem:
                shown = f"{path} (from {Path.cwd()})" if not path.is_absolute() else str(path)
                problems.append(
                    f"{name} {shown} {problem}: run from a writable directory or set "
                    f"AMIBAKE_{name.upper()} to one"
                )
            elif name == "results_dir":
                # A file where a run writes a folder failed it half-way, already recorded.
                problems += [
                    f"{path / sub} is a file, not a directory: move it away (runs write in it)"
                    for sub in RESULTS_FOLDERS
                    if (path / sub).exists() and not (path / sub).is_dir()
                ]
    if cfg.local_faults.strip() not in ("", "none"):
        from amibake.local import faults

        try:
            faults.parse(cfg.local_faults, cfg.local_faults_seed)  # a wrong name, said now
        except UserError as exc:
            problems.append(str(exc))
    for name in ("local_port", "local_ssh_port", "local_imds_port"):
        port = getattr(cfg, name)
        if not 1 <= port <= 65535:
            problems.append(f"{name} must be a TCP port (1-65535), got {port}")
    from ipaddress import ip_network

    try:
        net = ip_network(cfg.local_subnet)
        loopback = ip_network("127.0.0.0/8")
        if net.version != 4 or not net.subnet_of(loopback) or net.num_addresses < 4:  # type: ignore[arg-type]
            raise ValueError
    except (ValueError, TypeError):
        problems.append(
            f"local_subnet must be a loopback network inside 127.0.0.0/8 with at least 4 "
            f"addresses, got {cfg.local_subnet!r}"
        )


def _unwritable(path: Path) -> str:
    """Why a directory cannot be written or made, or ''. Run from / (or with a setting under a
    file), opening the journal raised PermissionError or NotADirectoryError with a traceback."""
    existing = path = path.absolute()
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        return f"cannot be made: {existing} is a file"
    if not os.access(existing, os.W_OK | os.X_OK):
        return "is not writable" if existing == path else f"cannot be made in {existing}"
    kernel = _kernel_filesystem(existing)
    if kernel:  # writable to root by os.access, yet no directory can be made there
        return f"is in {kernel}, the kernel's view of itself, where no file can be made"
    return ""


# Filesystems the kernel shows itself through: root passes os.access there, and mkdir fails.
KERNEL_FILESYSTEMS = {"proc", "sysfs", "cgroup", "cgroup2", "debugfs", "tracefs", "securityfs",
                      "configfs", "bpf", "pstore", "devpts", "mqueue", "fusectl"}  # fmt: skip


def _kernel_filesystem(path: Path) -> str:
    """The mount point of the kernel filesystem `path` is on (/proc), or ''."""
    import psutil

    mounts = [
        (Path(m.mountpoint), m.fstype)
        for m in psutil.disk_partitions(all=True)
        if path == Path(m.mountpoint) or Path(m.mountpoint) in path.parents
    ]
    point, kind = max(mounts, key=lambda m: len(m[0].parts), default=(Path(), ""))
    return str(point) if kind in KERNEL_FILESYSTEMS else ""


def load(
    flags: Mapping[str, Any] | None = None,
    *,
    toml_path: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Config:
    """Build the effective Config; raise ConfigError listing every problem found."""
    environ = os.environ if environ is None else environ
    problems: list[str] = []
    values: dict[str, Any] = {}
    origin: dict[str, str] = {}  # setting -> the file, variable or flag that set it last

    named = environ.get("AMIBAKE_CONFIG")
    path = toml_path or Path(named or "amibake.toml")
    if named and toml_path is None and not tomlfile.present(path):
        # amibake.toml may be absent; a file named on purpose is a mistake when it is. The
        # environment and the flags are still checked, so every problem is said at once.
        problems.append(f"AMIBAKE_CONFIG names {path}, which does not exist")
    elif tomlfile.present(path):
        try:
            _, data = tomlfile.read(path, "config file")
        except UserError as exc:  # unreadable or not TOML: said beside the other layers' problems
            problems.append(str(exc))
            data = {}
        for key, value in data.items():
            if key not in _FIELDS:
                close = difflib.get_close_matches(key, _FIELDS, n=1, cutoff=0.75)
                guess = f"; did you mean {close[0]}?" if close else ""
                problems.append(f"{path}: unknown setting {key!r}{guess}")
                continue
            values[key] = _coerce(key, value, problems, str(path))
            origin[key] = str(path)

    if "region" not in values:
        # Below amibake's own settings, the AWS tools' region: a shell set to eu-west-1 ran in
        # us-east-1 without a word, where `aws ec2 describe-instances` then found nothing.
        for env_name in ("AWS_DEFAULT_REGION", "AWS_REGION"):  # the SDKs: AWS_REGION first
            if environ.get(env_name):
                values["region"] = environ[env_name]
                origin["region"] = env_name
    settings = {f"AMIBAKE_{name.upper()}": name for name in _FIELDS}
    for env_name, name in settings.items():
        if env_name in environ:
            values[name] = _coerce(name, environ[env_name], problems, env_name)
            origin[name] = env_name
    for env_name in sorted(environ):
        # A misspelt setting was ignored without a word, and the default used instead.
        if env_name.startswith("AMIBAKE_") and env_name not in settings:
            close = difflib.get_close_matches(env_name, settings, n=1, cutoff=0.85)
            if close:
                problems.append(f"{env_name} is not a setting; did you mean {close[0]}?")

    for key, value in (flags or {}).items():
        if value is None:
            continue
        if key not in _FIELDS:
            raise KeyError(f"flag {key!r} has no config field")  # a programming error
        origin[key] = FLAGS.get(key, f"--{key.replace('_', '-')}")
        values[key] = _coerce(key, value, problems, origin[key])

    if problems:
        raise ConfigError(problems)
    cfg = Config(**values)
    _validate(cfg, problems)
    # Each said of where its value was set (a file, a variable, a flag), as a type error is:
    # "region must be an AWS region code" left the user to find which of three set it.
    if "recipes_dir" in values and not cfg.recipes_dir.exists():  # set, and set wrong
        problems.append(f"recipes_dir {cfg.recipes_dir} does not exist (it holds the recipes)")
    problems = [f"{origin[k]}: {p}" if (k := p.split()[0].rstrip(":")) in origin else p
                for p in problems]  # fmt: skip
    if problems:
        raise ConfigError(problems)
    return cfg
