"""The one Jinja2 environment for every template: StrictUndefined, so a missing variable is an
error at render time, not an empty string in a script that runs as root."""

from __future__ import annotations

import functools
import hashlib
import itertools
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import jinja2

from amibake.errors import UserError

USER_DATA_LIMIT = 16 * 1024

Verdict = Callable[[int, str, str], "str | None"]  # (exit code, stdout, stderr) -> the problem
# Scripts this process saw pass bash -n and shellcheck: a build checks its script before launch
# and again once the instance's compiler is known, and the two renders are often the same text
# (then the second check was 11 ms of CPU and a 9 ms wait per family, for the same answer).
_passed: set[str] = set()
_passed_lock = threading.Lock()


@functools.cache
def _environment(directory: Path) -> jinja2.Environment:
    # One per template directory, kept: it caches each compiled template (re-read if the file
    # changes), where a fresh one compiled every template again (20 ms of a bake's own time).
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(directory)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        autoescape=False,  # shell and unit files, not HTML
    )


def render(template: Path, **variables: Any) -> str:
    try:
        return _environment(template.parent).get_template(template.name).render(**variables)
    except jinja2.UndefinedError as exc:
        raise UserError(
            f"{template}: {exc.message}; define it or remove it from the template"
        ) from None
    except jinja2.TemplateSyntaxError as exc:
        raise UserError(f"{template}:{exc.lineno}: {exc.message}") from None


def referenced(template: Path) -> list[Path]:
    """The template and every template it includes, imports or extends, transitively: what its
    render depends on. A name computed at render time (`{% include name %}`) could be any
    template beside it: then all of them (*.j2) are."""
    from jinja2 import meta

    environment = _environment(template.parent)
    found: dict[Path, None] = {}
    pending = [template.name]
    while pending:
        name = pending.pop()
        path = template.parent / name
        if path in found or not path.is_file():
            continue
        found[path] = None
        try:
            names = list(meta.find_referenced_templates(environment.parse(path.read_text())))
        except jinja2.TemplateSyntaxError as exc:
            raise UserError(f"{path}:{exc.lineno}: {exc.message}") from None
        if None in names:
            found.update(dict.fromkeys(sorted(template.parent.rglob("*.j2"))))
            break
        pending += [n for n in names if n is not None]
    return sorted(found)


class Checks:
    """External checkers of rendered files (bash -n, shellcheck, systemd-analyze verify), all
    started at once and left to run: each is a process of 10-50 ms, which a bake paid one after
    another (measured: 150 ms of its 190 ms own time), and they can run while the caller waits
    on the cloud. They are started from a thread of their own, so that even their process starts
    (3 ms each, the binary loaded before vfork returns) overlap the caller's work. Leaving the
    ``with`` block waits for them and raises the first problem; an error inside the block stops
    them instead.

        with Checks() as checks:
            checks.shell(script, "stage.sh.j2")
            ...  # other work, the checkers running meanwhile
    """

    def __init__(self) -> None:
        self.scratch = Path(tempfile.mkdtemp(prefix="amibake-check-"))
        self._starter = ThreadPoolExecutor(1, thread_name_prefix="checks")
        self._pending: list[tuple[Future[subprocess.Popen[str] | None], Verdict]] = []
        self._scripts = itertools.count()
        self._shells: list[str] = []  # digests of the scripts checked here

    def start(self, command: list[str], verdict: Verdict, *, optional: bool = False) -> None:
        """Run `command`; `verdict(exit code, stdout, stderr)` says what is wrong, or None.
        An optional checker that is not installed is skipped."""

        def spawn() -> subprocess.Popen[str] | None:
            try:
                return subprocess.Popen(
                    command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
            except FileNotFoundError:
                if optional:
                    return None
                raise

        self._pending.append((self._starter.submit(spawn), verdict))

    def shell(self, script: str, name: str) -> None:
        """Refuse a rendered script that bash cannot parse, or that shellcheck finds errors in."""
        digest = _digest(script)
        if _known_good(digest):
            return
        self._shells.append(digest)
        path = self.scratch / f"{next(self._scripts)}.sh"
        path.write_text(script)

        def parses(code: int, _: str, err: str) -> str | None:
            return f"{name}: rendered script does not parse: {err.strip()}" if code else None

        def lints(code: int, out: str, _: str) -> str | None:
            if not code:
                return None
            first = (out.strip().splitlines() or ["failed"])[0].replace(str(path), name)
            return f"{name}: shellcheck: {first}"

        self.start(["bash", "-n", str(path)], parses)
        self.start(
            ["shellcheck", "--severity=error", "--format=gcc", str(path)], lints, optional=True
        )

    def __enter__(self) -> Checks:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        failed = kind is not None
        # On an error, checkers not yet started never start; the started ones are killed.
        self._starter.shutdown(wait=True, cancel_futures=failed)
        try:
            problems = []
            for started, verdict in self._pending:
                if started.cancelled() or (failed and started.exception() is not None):
                    continue
                process = started.result()
                if process is None:  # an optional checker that is not installed
                    continue
                if failed:
                    process.kill()
                out, err = process.communicate()
                if not failed and (problem := verdict(process.returncode, out, err)):
                    problems.append(problem)
            if problems:  # in the order started: a parse error before shellcheck's take on it
                raise UserError(problems[0])
            if not failed:
                with _passed_lock:
                    _passed.update(self._shells)
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)


def _digest(script: str) -> str:
    return hashlib.sha256(script.encode()).hexdigest()


def _known_good(digest: str) -> bool:
    with _passed_lock:
        return digest in _passed


def check_shell(script: str, name: str, checks: Checks | None = None) -> None:
    """Refuse a rendered script that bash cannot parse, or that shellcheck finds errors in: on
    `checks` when given (its caller waits for them), else before returning."""
    if checks is not None:
        checks.shell(script, name)
        return
    if _known_good(_digest(script)):  # no Checks (scratch directory, thread) made for nothing
        return
    with Checks() as own:
        own.shell(script, name)
