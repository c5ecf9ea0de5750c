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


def test_a_journal_written_before_runs_had_a_pid_gains_the_columns(tmp_path: Path) -> None:
    # An older amibake's journal: its runs table has no pid or host. Opening it adds them, the
    # old rows keep NULL (never closed as killed: nothing says which process ran them).
    path = tmp_path / "journal.sqlite"
    old = sqlite3.connect(path)
    old.execute(
        "CREATE TABLE runs (run_id TEXT PRIMARY KEY, command TEXT NOT NULL, cloud TEXT NOT NULL, "
        "region TEXT NOT NULL, started REAL NOT NULL, finished REAL, "
        "state TEXT NOT NULL DEFAULT 'running', detail TEXT)"
    )
    old.execute(
        "INSERT INTO runs (run_id, command, cloud, region, started) VALUES ('old', 'b', 'local', 'us-east-1', 1)"
    )
    old.commit()
    old.close()
    journal = Journal(path)
    journal.start_run("new", "build", "local", "us-east-1")
    assert journal.close_dead_runs() == []  # 'old' has no pid; 'new' is this live process
    assert journal.run_state("old") == "running" and journal.run_state("new") == "running"


def test_a_run_whose_process_is_gone_is_closed_as_killed(tmp_path: Path) -> None:
    import subprocess
    import sys

    journal = Journal(tmp_path / "journal.sqlite")
    script = (
        "import sys; from amibake.journal import Journal; "
        "Journal(__import__('pathlib').Path(sys.argv[1])).start_run('gone', 'build', 'local', 'us-east-1')"
    )
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "journal.sqlite")], check=True)
    journal.created("gone", "instance", "i-1", "us-east-1", "local")
    assert journal.close_dead_runs() == ["gone"]
    assert journal.run_state("gone") == "killed"
    assert journal.run_detail("gone") == "its process ended without closing it; 1 resources left"
    journal.cleaned_up("gone")  # the instance is still alive: nothing to say yet
    assert (
        journal.run_detail(
            "gone",
        )
        == "its process ended without closing it; 1 resources left"
    )
    journal.deleted("instance", "i-1")
    journal.cleaned_up("gone")
    assert (journal.run_detail("gone") or "").endswith("; cleaned up by gc")
