"""Boot emulation: which enabled oneshot systemd units an image runs at boot, and in what order.

What it covers, and why that is enough for amibake's images:

- Units enabled in the image's own layers (``/etc/systemd/system/<target>.wants/<unit>``), with
  ``Type=oneshot``. Those are the units a bake installs. Units of the host filesystem under the
  layers are not run: they belong to this machine, not to the image.
- ``Environment=``, ``ExecStartPre=``, ``ExecStart=`` (several allowed, as for oneshot) and
  ``ExecStartPost=``, with systemd's ``-`` prefix (failure ignored); ``@ + ! :`` prefixes are
  dropped. Lines run through ``/bin/sh``, so quoting follows sh, which agrees with systemd for
  the plain commands units use.
- Order: ``After=`` and ``Before=`` between the units found; ties broken by name.

What it does not: services that keep running (``Type=simple`` etc.), sockets, timers, mount
units, ``Requires=`` failure propagation, specifiers (``%i``), ``ConditionXxx=``. A unit using
them is listed in the console log as skipped, never silently ignored.
"""

from __future__ import annotations

import os
import shlex
import stat
from dataclasses import dataclass, field
from pathlib import Path

_EXEC_ORDER = {"ExecStartPre": 0, "ExecStart": 1, "ExecStartPost": 2}
UNIT_DIRS = ("etc/systemd/system", "usr/lib/systemd/system", "lib/systemd/system")


@dataclass
class Unit:
    name: str
    after: set[str] = field(default_factory=set)
    before: set[str] = field(default_factory=set)
    kind: str = "simple"
    environment: list[str] = field(default_factory=list)
    commands: list[tuple[str, bool]] = field(default_factory=list)  # (line, failure ignored)


@dataclass
class BootPlan:
    units: list[Unit] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [unit.name for unit in self.units]

    def script(self) -> str:
        """The sh script that runs the plan inside the sandbox, logging like systemd."""
        lines = ["set +e"]
        for name in self.skipped:
            lines.append(f"echo {shlex.quote(f'systemd: skipped {name} (not a oneshot unit)')}")
        for unit in self.units:
            lines.append(f"echo {shlex.quote(f'systemd: Starting {unit.name}...')}")
            body = ["set -e"]
            body += [f"export {shlex.quote(assignment)}" for assignment in unit.environment]
            for command, ignore_failure in unit.commands:
                body.append(f"{command} || true" if ignore_failure else command)
            lines.append("(\n" + "\n".join(body) + "\n) </dev/null 2>&1")
            ok = f"systemd: Finished {unit.name}."
            failed = f"systemd: Failed to start {unit.name}."
            lines.append(
                f"if [ $? -eq 0 ]; then echo {shlex.quote(ok)}; else echo {shlex.quote(failed)}; fi"
            )
        return "\n".join(lines) + "\n"


def _is_whiteout(path: Path) -> bool:
    # overlayfs marks a file deleted in an upper layer with a 0/0 character device.
    try:
        st = path.lstat()
    except FileNotFoundError:
        return False
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def _resolve(layers: list[Path], relative: str) -> Path | None:
    """The file a path names in the stacked layers (top first), or None if absent or deleted."""
    for layer in layers:
        candidate = layer / relative
        if _is_whiteout(candidate):
            return None
        if candidate.is_symlink():
            target = os.readlink(candidate)
            if target.startswith("/"):
                return _resolve(layers, target.lstrip("/"))
            return _resolve(layers, str(Path(relative).parent / target))
        if candidate.exists():
            return candidate
    return None


def parse_unit(name: str, text: str) -> Unit:
    unit = Unit(name=name)
    staged: list[tuple[int, str, bool]] = []
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
            continue
        key, _, value = line.partition("=")
        key, value = key.strip(), value.strip()
        if section == "Unit" and key in ("After", "Before"):
            target = unit.after if key == "After" else unit.before
            target.update(value.split())
        elif section == "Service" and key == "Type":
            unit.kind = value
        elif section == "Service" and key == "Environment":
            unit.environment += shlex.split(value)
        elif section == "Service" and key in ("ExecStartPre", "ExecStart", "ExecStartPost"):
            ignore = False
            while value and value[0] in "-@+!:":
                ignore = ignore or value[0] == "-"
                value = value[1:]
            if value:
                staged.append((_EXEC_ORDER[key], value, ignore))
    # systemd runs ExecStartPre, then ExecStart, then ExecStartPost whatever the file's order.
    unit.commands = [(line, ignore) for _, line, ignore in sorted(staged, key=lambda s: s[0])]
    return unit


def plan(layers: list[Path]) -> BootPlan:
    """Find the enabled oneshot units of an image's layers and order them."""
    # The top-most layer that mentions a .wants entry decides: a whiteout there disables it.
    decided: dict[str, bool] = {}
    for layer in layers:
        system = layer / "etc/systemd/system"
        if not system.is_dir():
            continue
        for wants in system.glob("*.wants"):
            for entry in wants.iterdir():
                key = f"{wants.name}/{entry.name}"
                if entry.name.endswith(".service") and key not in decided:
                    decided[key] = not _is_whiteout(entry)
    enabled = {key.split("/", 1)[1] for key, on in decided.items() if on}
    units: dict[str, Unit] = {}
    result = BootPlan()
    for name in sorted(enabled):
        found = None
        for directory in UNIT_DIRS:
            found = _resolve(layers, f"{directory}/{name}")
            if found:
                break
        if found is None:
            continue
        unit = parse_unit(name, found.read_text(errors="replace"))
        if unit.kind != "oneshot":
            result.skipped.append(name)
            continue
        units[name] = unit
    # Before= is After= seen from the other side.
    for unit in units.values():
        for other in unit.before:
            if other in units:
                units[other].after.add(unit.name)
    placed: list[Unit] = []
    remaining = dict(units)
    while remaining:
        ready = sorted(
            name for name, unit in remaining.items() if not (unit.after & remaining.keys())
        )
        if not ready:  # an ordering cycle: systemd breaks it too, we break it by name
            ready = sorted(remaining)[:1]
        for name in ready:
            placed.append(remaining.pop(name))
    result.units = placed
    return result
