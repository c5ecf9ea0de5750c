"""The boot plan: which enabled oneshot units an image runs, in After=/Before= order."""

from __future__ import annotations

import os
from pathlib import Path

from amibake.local import boot


def _unit(layer: Path, name: str, body: str, enabled: bool = True) -> None:
    system = layer / "etc/systemd/system"
    system.mkdir(parents=True, exist_ok=True)
    (system / name).write_text(body)
    if enabled:
        wants = system / "multi-user.target.wants"
        wants.mkdir(exist_ok=True)
        os.symlink(f"/etc/systemd/system/{name}", wants / name)


def test_order_follows_after_and_before_across_layers(tmp_path: Path) -> None:
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    _unit(
        lower, "c.service", "[Unit]\nAfter=b.service\n[Service]\nType=oneshot\nExecStart=/bin/c\n"
    )
    _unit(
        upper, "a.service", "[Unit]\nBefore=b.service\n[Service]\nType=oneshot\nExecStart=/bin/a\n"
    )
    _unit(upper, "b.service", "[Service]\nType=oneshot\nExecStart=-/bin/b\nExecStartPre=/bin/pre\n")
    _unit(upper, "d.service", "[Service]\nType=simple\nExecStart=/bin/d\n")
    _unit(upper, "e.service", "[Service]\nType=oneshot\nExecStart=/bin/e\n", enabled=False)
    plan = boot.plan([upper, lower])
    assert plan.names == ["a.service", "b.service", "c.service"]
    assert plan.skipped == ["d.service"]
    b = plan.units[1]
    assert b.commands == [("/bin/pre", False), ("/bin/b", True)]
    script = plan.script()
    assert "/bin/b || true" in script
    assert "skipped d.service" in script


def test_a_whiteout_in_an_upper_layer_deletes_a_unit(tmp_path: Path) -> None:
    lower, upper = tmp_path / "lower", tmp_path / "upper"
    _unit(lower, "gone.service", "[Service]\nType=oneshot\nExecStart=/bin/x\n")
    wants = upper / "etc/systemd/system/multi-user.target.wants"
    wants.mkdir(parents=True)
    os.mknod(wants / "gone.service", 0o600 | 0o020000, os.makedev(0, 0))  # overlay whiteout
    assert boot.plan([upper, lower]).names == []
