"""The one Jinja2 environment for every template: StrictUndefined, so a missing variable is an
error at render time, not an empty string in a script that runs as root."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any

import jinja2

from amibake.errors import UserError

USER_DATA_LIMIT = 16 * 1024


def render(template: Path, **variables: Any) -> str:
    environment = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template.parent)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # shell and unit files, not HTML
    )
    try:
        return environment.get_template(template.name).render(**variables)
    except jinja2.UndefinedError as exc:
        raise UserError(
            f"{template}: {exc.message}; define it or remove it from the template"
        ) from None
    except jinja2.TemplateSyntaxError as exc:
        raise UserError(f"{template}:{exc.lineno}: {exc.message}") from None


def check_shell(script: str, name: str) -> None:
    """Refuse a rendered script that bash cannot parse, or that shellcheck finds errors in."""
    with tempfile.NamedTemporaryFile("w", suffix=".sh", delete=False) as handle:
        handle.write(script)
        path = Path(handle.name)
    try:
        parsed = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        if parsed.returncode != 0:
            raise UserError(f"{name}: rendered script does not parse: {parsed.stderr.strip()}")
        try:
            checked = subprocess.run(
                ["shellcheck", "--severity=error", "--format=gcc", str(path)],
                capture_output=True,
                text=True,
            )
        except FileNotFoundError:
            return
        if checked.returncode != 0:
            first = checked.stdout.strip().splitlines()[0].replace(str(path), name)
            raise UserError(f"{name}: shellcheck: {first}")
    finally:
        path.unlink(missing_ok=True)
