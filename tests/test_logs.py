"""The terminal log handler, installed once per process, follows sys.stderr."""

from __future__ import annotations

import io
import logging

import pytest

from amibake import logs


def test_the_terminal_log_writes_to_stderr_as_it_is_now(monkeypatch: pytest.MonkeyPatch) -> None:
    first, second = io.StringIO(), io.StringIO()
    monkeypatch.setattr("sys.stderr", first)
    logs.to_terminal()
    logging.getLogger("amibake").info("one")
    first.close()  # a test's capture, closed when the test ends
    monkeypatch.setattr("sys.stderr", second)
    logs.to_terminal()  # installed already: not a second handler
    logging.getLogger("amibake").info("two")
    assert second.getvalue() == "amibake: two\n"
