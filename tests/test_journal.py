"""The SQLite files behind the journal and fleet's results, opened by several at once."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path

import pytest

from amibake.errors import UserError
from amibake.journal import Journal


def test_a_new_database_opens_while_another_connection_holds_it(tmp_path: Path) -> None:
    """The first open turns the file to WAL, which SQLite does not wait for: with another
    connection inside a write (a second trial opening it at the same moment) it failed at
    once with "database is locked". It now waits its turn."""
    path = tmp_path / "journal.sqlite"
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # a writer mid-transaction, before the file is WAL
    release = threading.Timer(0.5, lambda: holder.execute("COMMIT"))
    release.start()
    started = time.monotonic()
    journal = Journal(path)
    journal.start_run("r1", "build", "local", "us-east-1")
    release.join()
    assert time.monotonic() - started >= 0.4  # it waited for the holder
    assert journal.last_run_id() == "r1"


def test_a_damaged_database_is_named_not_replaced(tmp_path: Path) -> None:
    damaged = tmp_path / "journal.sqlite"
    damaged.write_text("not a database, but someone's record all the same\n")
    with pytest.raises(UserError, match=r"journal.sqlite is not a readable SQLite database \("):
        Journal(damaged)
    assert damaged.read_text().startswith("not a database")  # left as it was
