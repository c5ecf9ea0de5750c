"""What goes into a baked image, checked before any instance starts: the artifacts, the base
image, the tmpfs arithmetic, and the rendered units and scripts (verified by systemd-analyze,
bash -n and shellcheck)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import archspec.cpu

from amibake import catalog, checks, cpu, isa, saved
from amibake.cloud import Cloud
from amibake.cloud.calls import describe_image
from amibake.cloud.ec2 import delete_image, describe_instance_types, snapshots_of
from amibake.errors import UserError
from amibake.render import USER_DATA_LIMIT, Checks, check_shell, render
from amibake.saved import read_json
from amibake.sources import sha256_of
from amibake.steps.preflight import BASE_AMI_PARAMETER

log = logging.getLogger("amibake")

ROOT = Path(__file__).resolve().parent.parent
UNITS_DIR = ROOT / "systemd_units"
USERDATA_DIR = ROOT / "userdata_templates"
DATA_DIR = "/usr/local/data"
LIBEXEC = "/usr/local/libexec/amibake"
UNITS = ("amibake-shared-tmpfs.service", "amibake-stage.service")
# Drop-ins for the base image's own units: path on the instance -> template.
DROP_INS = {"/etc/systemd/system/ecs.service.d/amibake.conf": "ecs-after-stage.conf.j2"}
SCRIPTS = ("shared-tmpfs", "stage")
MIN_TMPFS_MB = 256
# What a fresh instance's /proc/meminfo says is available at boot, of its nominal memory: the
# kernel and firmware keep some (ECS's docs: an 8 GiB m4.large shows 7985 MiB in all) and the
# boot's own processes more. The size check at bake time judges a shape by this, as its tmpfs
# unit will at boot (by MemAvailable).
AVAILABLE_AT_BOOT = 0.85
BOOT_TEST_CLUSTER = "amibake-boot-test"  # set through user data, read back by the boot test


@dataclass(frozen=True)
class Artifact:
    app: str
    family: str
    architecture: str
    target: str
    path: Path
    manifest: dict[str, Any]

    @property
    def installed(self) -> str:
        """Its name in the image, where the stage unit looks for the family's build: a variant
        (a tune's recommended flags) takes the place of the family's own build."""
        return f"{self.app}_{self.family}.tar.xz"


def tmpfs_mb(available_mb: int, vcpus: int, reserve_mb_per_vcpu: int) -> int:
    """The size of /shared: memory available at boot minus a reserve per vCPU."""
    size = available_mb - reserve_mb_per_vcpu * vcpus
    if size < MIN_TMPFS_MB:
        raise UserError(
            f"--tmpfs-reserve-mb-per-vcpu {reserve_mb_per_vcpu} leaves {size} MiB for /shared on "
            f"{vcpus} vCPUs with {available_mb} MiB (at least {MIN_TMPFS_MB} needed): lower the "
            "reserve or use larger instances"
        )
    return size


def baked(amis_file: Path) -> list[dict[str, Any]]:
    """results/amis.json: one record per image baked, oldest first (none before the first)."""
    if not amis_file.exists():
        return []

    def records(data: Any) -> list[dict[str, Any]]:
        for record in data:  # the fields batch and the next bake read
            for key in ("image_id", "architecture"):
                str(record[key])
            dict(record["artifacts"])
        return list(data)

    return read_json(
        amis_file, "restore it, or move it away to start a new record of the images baked", records
    )


def recipe_of(record: dict[str, Any]) -> tuple[str, ...]:
    """The apps a baked image holds: images of the same apps and architecture replace each
    other."""
    return tuple(sorted({str(m["app"]) for m in record["artifacts"].values()}))


def here(record: dict[str, Any], cloud: Cloud) -> bool:
    """Baked in this cloud and region, and not retired: an image EC2 here should have."""
    return (
        not record.get("retired")
        and record.get("cloud", cloud.config.cloud) == cloud.config.cloud
        and record.get("region", cloud.config.region) == cloud.config.region
    )


def retire_older(
    cloud: Cloud, amis_file: Path, image_id: str, keep: int, launched: dict[str, str]
) -> list[dict[str, Any]]:
    """`bake --keep N`: the images of `image_id`'s recipe and architecture older than the newest
    `keep` (amis.json is in the order baked), deregistered with their snapshots
    (DeregisterImage's DeleteAssociatedSnapshots, which cannot race) and marked retired in
    amis.json; what was retired. One Batch launches hosts from (`launched`: image -> its
    environment) stays, said why: retired, its environment could start no host, and its jobs
    waited RUNNABLE."""
    records = baked(amis_file)  # written whole, read whole: what it held when asked
    new = next(r for r in records if r["image_id"] == image_id)
    same = [
        r
        for r in records
        if here(r, cloud)
        and r["architecture"] == new["architecture"]
        and recipe_of(r) == recipe_of(new)
    ]
    retired = []
    for record in same[: max(0, len(same) - keep)]:
        if record["image_id"] in launched:
            log.warning(
                "kept %s: Batch's compute environment %s launches from it (amibake batch up "
                "--from-bake moves it to the newest; the next bake --keep retires it then)",
                record["image_id"],
                launched[record["image_id"]],
            )
            continue
        image = describe_image(cloud.ec2, record["image_id"])
        snapshots = snapshots_of(image) if image is not None else []
        if image is not None:
            delete_image(cloud.ec2, record["image_id"], snapshots)
        record["retired"] = datetime.now(UTC).isoformat(timespec="seconds")
        retired.append(
            {
                "image_id": record["image_id"],
                "architecture": record["architecture"],
                "apps": list(recipe_of(record)),
                "baked": record.get("created", ""),
                "snapshots": snapshots,
                "was_there": image is not None,
            }
        )
    if retired:
        mark_retired(amis_file, {r["image_id"]: r["retired"] for r in same if r.get("retired")})
    return retired


def mark_retired(amis_file: Path, stamps: dict[str, str]) -> None:
    """Mark the images of `stamps` (image -> when) retired in amis.json, as it is now (another
    bake may have added to it): `bake --keep`'s, and a recorded image its bake's cleanup or gc
    deleted (its record was written before it was marked kept)."""
    if not stamps or not amis_file.exists():
        return
    with amis_changed(amis_file) as now:
        for record in now:
            if record["image_id"] in stamps and not record.get("retired"):
                record["retired"] = stamps[record["image_id"]]


def retired_now(image_ids: list[str]) -> dict[str, str]:
    """`mark_retired`'s stamps for images deleted now."""
    when = datetime.now(UTC).isoformat(timespec="seconds")
    return dict.fromkeys(image_ids, when)


@contextmanager
def amis_changed(amis_file: Path) -> Iterator[list[dict[str, Any]]]:
    """amis.json's records, read, changed in place by the caller and written back whole, under
    the file's lock: two bakes at once, or one bake's two architectures, each wrote back what it
    had read, and the other's image was lost from the record (kept, so never gc'd, retired or
    registered)."""
    with saved.locked(amis_file):
        records = baked(amis_file)
        yield records
        saved.write_whole(amis_file, json.dumps(records, indent=2))


def _texts(record: Any, keys: tuple[str, ...]) -> None:
    """A saved record's fields that must be text (str() of a 5 passed, and failed the bake
    later): ValueError naming the first that is not, KeyError for one missing."""
    for key in keys:
        if not isinstance(record[key], str):
            raise ValueError(f"{key}: {record[key]!r} is not text")


def _manifest(manifest: Any) -> dict[str, Any]:
    """An artifact's manifest, with the fields a bake reads."""
    _texts(manifest, ("app", "family", "architecture", "target", "artifact_sha256"))
    # The app names paths in the bake's commands and in the staging script every instance of
    # the image runs as root at boot: a recipe's name (checks.plain_name), never shell words.
    problem = checks.plain_name(manifest["app"])
    if problem:
        raise ValueError(f"app {problem}")
    return manifest  # type: ignore[no-any-return]


def load_artifacts(
    artifacts_dir: Path, families: list[str] | None, chosen: list[Path] | None = None
) -> list[Artifact]:
    """The built artifacts to bake (those of `chosen` manifests, else every one of the
    families), checked against their manifests."""
    found = []
    for manifest_path in (
        chosen if chosen is not None else sorted(artifacts_dir.glob("*.manifest.json"))
    ):
        if not manifest_path.exists():
            raise UserError(
                f"{manifest_path} is missing: build it again (amibake bake --from-tune)"
            )
        manifest = read_json(
            manifest_path,
            "build the family again (amibake build), which writes it anew",
            _manifest,
        )
        if families is not None and manifest.get("family") not in families:
            continue
        path = manifest_path.with_name(manifest_path.name.replace(".manifest.json", ".tar.xz"))
        if not path.exists() or sha256_of(path) != manifest.get("artifact_sha256"):
            raise UserError(f"{path} is missing or does not match {manifest_path.name}: rebuild it")
        found.append(
            Artifact(
                app=manifest["app"],
                family=manifest["family"],
                architecture=manifest["architecture"],
                target=manifest["target"],
                path=path,
                manifest=manifest,
            )
        )
    wanted = set(families or [])
    missing = sorted(wanted - {a.family for a in found})
    if missing or not found:
        names = ",".join(missing) or "FAMILY"
        raise UserError(
            f"no built artifact for {', '.join(missing) or 'any family'} in {artifacts_dir}: run "
            f"`amibake build --family {names}` first, or bake with --build"
        )
    return found


TUNE_RUN = re.compile(r"ft-[0-9a-f]{10}")


def from_tune(results_dir: Path, run: str) -> dict[str, Any]:
    """The recommended build of a `fleet tune` run (`last`: the newest), as fleet wrote it in
    results/tunes/RUN.json when the search ended: its recipe, instance type and flags."""
    tunes = results_dir / "tunes"
    if run == "last":
        written = sorted(tunes.glob("ft-*.json"), key=lambda p: p.stat().st_mtime)
        if not written:
            raise UserError(
                f"no tune run has a recommendation in {tunes}: run `fleet tune FILE` on a cloud "
                "first (a replayed search has no build to bake)"
            )
        run = written[-1].stem
    if not TUNE_RUN.fullmatch(run):
        raise UserError(f"--from-tune {run!r}: a tune run is ft- and 10 hex digits, or last")
    path = tunes / f"{run}.json"
    if not path.exists():
        raise UserError(
            f"tune run {run} has no recommendation in {tunes}: it is another machine's, replayed, "
            "or found no feasible trial (see `fleet report " + run + "`)"
        )

    def shape(data: Any) -> dict[str, Any]:
        _texts(data, ("run_id", "recipe", "instance_type", "family", "cflags", "args"))
        # Its flags go into the bake's build script as written: words a shell reads there ran
        # as root on the bake instance, from a results file anyone who could write it wrote.
        problem = checks.shell_words(str(data["cflags"]))
        if problem:
            raise ValueError(f"cflags: {problem}")
        return data  # type: ignore[no-any-return]

    return read_json(path, f"run `fleet report {run}`, which writes it anew", shape)


def needs(artifact: Artifact) -> frozenset[str]:
    """The features a CPU needs to run the build: its scan's (archspec's names), or, for a
    manifest from before the scan, the ones its target lets gcc emit from plain C."""
    if "isa_features" in artifact.manifest:
        return frozenset(artifact.manifest["isa_features"])
    target = archspec.cpu.TARGETS[artifact.target]
    return cpu.normalized(frozenset(target.features)) & isa.data(artifact.architecture).codegen


def candidates(artifacts: list[Artifact]) -> dict[str, list[tuple[str, str]]]:
    """Per app, the builds a CPU of a family the image has no build for may take, the newest
    target first (the build for the newest CPU it can run), each with what it needs as
    /proc/cpuinfo names it: the stage unit takes the first whose needs the CPU has. The build
    needing the least taken blind ran AVX-512 code on an AMD Milan (a c6i build on a c6a)."""
    cpuinfo = {archspec_name: linux for linux, archspec_name in cpu.CPUINFO_ALIASES.items()}
    found: dict[str, list[tuple[str, str]]] = {}

    def newest_first(artifact: Artifact) -> tuple[int, int, str]:
        target = archspec.cpu.TARGETS[artifact.target]
        return (-len(target.features), -len(needs(artifact)), artifact.family)

    for artifact in sorted(artifacts, key=newest_first):
        line = " ".join(sorted(cpuinfo.get(f, f) for f in needs(artifact)))
        found.setdefault(artifact.app, []).append((artifact.family, line))
    return dict(sorted(found.items()))


def fallbacks(artifacts: list[Artifact]) -> dict[str, str]:
    """Per app, the family whose build needs the fewest ISA features (needs(); then its
    target's): the bake runs and boot-tests on it, where each app's least demanding build runs.
    A CPU of a family the image has no build for takes one by its features (candidates())."""

    def demand(artifact: Artifact) -> tuple[int, int, int, str]:
        target = archspec.cpu.TARGETS[artifact.target]
        return (len(needs(artifact)), len(target.features), len(target.ancestors), artifact.family)

    best: dict[str, Artifact] = {}
    for artifact in artifacts:
        current = best.get(artifact.app)
        if current is None or demand(artifact) < demand(current):
            best[artifact.app] = artifact
    return {app: artifact.family for app, artifact in sorted(best.items())}


def base_image(
    cloud: Cloud, architecture: str, base_ami: str | None, allow_eol: bool
) -> tuple[str, str]:
    """The ECS-optimized Amazon Linux 2023 image for the architecture, or the one asked for,
    and its root device: the launch template encrypts the volume mapped there (another base
    image's root may be /dev/sda1, and a mapping of Amazon Linux's /dev/xvda then added an empty
    encrypted volume and booted the root as the image had it, unencrypted into the bake)."""
    ec2 = cloud.ec2
    if base_ami is None:
        parameter = BASE_AMI_PARAMETER[architecture]
        base_ami = str(cloud.ssm.get_parameter(Name=parameter)["Parameter"]["Value"])
    image = describe_image(ec2, base_ami)
    if image is None:
        raise UserError(f"base image {base_ami} does not exist in {cloud.config.region}")
    if image.get("Architecture") != architecture:
        raise UserError(
            f"base image {base_ami} is {image.get('Architecture')}, but the artifacts are "
            f"{architecture}: give an {architecture} image"
        )
    name = str(image.get("Name", "")) + " " + str(image.get("Description", ""))
    if ("amzn2-" in name or "Amazon Linux AMI 2.0" in name) and not allow_eol:
        raise UserError(
            f"base image {base_ami} is Amazon Linux 2, which reached end of support on 2026-06-30; "
            "use the Amazon Linux 2023 ECS image (the default), or --allow-eol"
        )
    return base_ami, str(image.get("RootDeviceName") or "/dev/xvda")


def check_shapes(cloud: Cloud, families: list[str], reserve: int) -> None:
    """Every size of every family must leave room for /shared (a render-time error otherwise)."""
    types = [catalog.family(f).instance_type(s) for f in families for s in catalog.family(f).sizes]
    described = describe_instance_types(cloud.ec2, types)
    for shape in sorted(described, key=lambda t: t["MemoryInfo"]["SizeInMiB"])[:1]:
        # By nominal memory, a reserve passed here that every such host's tmpfs unit refused.
        available = int(shape["MemoryInfo"]["SizeInMiB"] * AVAILABLE_AT_BOOT)
        try:
            tmpfs_mb(available, shape["VCpuInfo"]["DefaultVCpus"], reserve)
        except UserError as exc:
            raise UserError(f"{shape['InstanceType']}: {exc}") from None


def render_files(
    artifacts: list[Artifact],
    architecture: str,
    reserve: int,
    imds_endpoint: str,
    checks: Checks | None = None,
) -> dict[str, tuple[str, int]]:
    """Path on the instance -> (content, mode) for every unit and script the image gets. Their
    checks run on `checks` when given (the caller waits for them), else before returning."""
    if checks is None:
        with Checks() as own:
            return render_files(artifacts, architecture, reserve, imds_endpoint, own)
    variables = {
        "reserve_mb_per_vcpu": reserve,
        "min_tmpfs_mb": MIN_TMPFS_MB,
        "libexec": LIBEXEC,
        "data_dir": DATA_DIR,
        "imds_endpoint": imds_endpoint,
        "architecture": architecture,
        "candidates": candidates(artifacts),
    }
    files: dict[str, tuple[str, int]] = {}
    for unit in UNITS:
        files[f"/etc/systemd/system/{unit}"] = (
            render(UNITS_DIR / f"{unit}.j2", **variables),
            0o644,
        )
    for path, template in DROP_INS.items():
        files[path] = (render(UNITS_DIR / template, **variables), 0o644)
    for script in SCRIPTS:
        text = render(UNITS_DIR / f"{script}.sh.j2", **variables)
        checks.shell(text, f"{script}.sh.j2")
        files[f"{LIBEXEC}/{script}"] = (text, 0o755)
    verify_units(files, checks)
    return files


def verify_units(files: dict[str, tuple[str, int]], checks: Checks) -> None:
    """systemd-analyze verify in a scratch root holding the units, their scripts and the targets."""
    if shutil.which("systemd-analyze") is None:
        return
    root = Path(tempfile.mkdtemp(prefix="units-", dir=checks.scratch))  # one per architecture
    system = Path("/usr/lib/systemd/system")
    (root / "usr/lib/systemd/system").mkdir(parents=True)
    for target in system.glob("*.target"):
        # Linked, not copied (74 copies took 40 ms a bake); copied where /tmp is another device.
        try:
            os.link(target, root / "usr/lib/systemd/system" / target.name)
        except OSError:
            shutil.copyfile(target, root / "usr/lib/systemd/system" / target.name)
    for path, (content, mode) in files.items():
        local = root / path.lstrip("/")
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_text(content)
        local.chmod(mode)

    def verdict(code: int, out: str, err: str) -> str | None:
        # It reports some mistakes (a bad Type=) as warnings with exit 0: any output is a fault.
        problems = (err + out).strip()
        if code == 0 and not problems:
            return None
        first = problems.splitlines()[0].replace(str(root), "") if problems else "failed"
        return f"systemd-analyze verify: {first}"

    units = [p for p in files if p.endswith(".service")]
    checks.start(["systemd-analyze", f"--root={root}", "verify", *units], verdict)


def user_data(ecs_cluster: str = "", checks: Checks | None = None) -> str:
    text = render(USERDATA_DIR / "bake-userdata.sh.j2", ecs_cluster=ecs_cluster)
    check_user_data(text, checks)
    return text


def check_user_data(text: str, checks: Checks | None = None) -> None:
    size = len(text.encode())
    if size > USER_DATA_LIMIT:
        raise UserError(f"user data is {size} bytes; EC2 accepts at most {USER_DATA_LIMIT}")
    check_shell(text, "user data", checks)
