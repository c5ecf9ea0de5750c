"""The journal: an SQLite record (WAL) of every run and every cloud resource it created.

A step writes a resource's id here right after the create call returns, before waiting on it,
so ``amibake gc`` can find it even if the process is SIGKILLed a moment later. Deletions are
recorded once a describe call confirms the resource is gone.
"""

from __future__ import annotations

import os
import socket
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from amibake import procs
from amibake.errors import UserError

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, command TEXT NOT NULL, cloud TEXT NOT NULL, region TEXT NOT NULL,
    started REAL NOT NULL, finished REAL, state TEXT NOT NULL DEFAULT 'running', detail TEXT,
    pid INTEGER, host TEXT, pid_started TEXT
);
CREATE TABLE IF NOT EXISTS resources (
    run_id TEXT NOT NULL, kind TEXT NOT NULL, resource_id TEXT NOT NULL, region TEXT NOT NULL,
    cloud TEXT NOT NULL, created REAL NOT NULL, deleted REAL,
    PRIMARY KEY (kind, resource_id)
);
"""


@dataclass(frozen=True)
class Resource:
    run_id: str
    kind: str
    resource_id: str
    region: str
    cloud: str
    created: float


BUSY_S = 30.0  # how long a statement waits for another connection's lock


def open_database(path: Path, schema: str) -> sqlite3.Connection:
    """An SQLite file in WAL mode, shared by threads (callers hold a lock), autocommitting: a
    reader never waits on a writer, and a row is on disk once its statement returns."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # /proc/x as root: os.access said writable (config._unwritable)
        raise UserError(
            f"{path.parent} cannot be made ({exc.strerror}): it holds the record of what runs "
            "made; set AMIBAKE_RESULTS_DIR (or results_dir) to a directory of your own"
        ) from None
    try:
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=BUSY_S)
    except sqlite3.OperationalError as exc:  # a directory there, or a file this user cannot open
        kind = "a directory" if path.is_dir() else "not a file this user can open"
        raise UserError(
            f"{path} is {kind} ({exc}): it holds the record of what runs made; fix its "
            "permissions, or set AMIBAKE_RESULTS_DIR to a directory of your own"
        ) from None
    # Turning a new file to WAL takes a lock SQLite does not wait for (the busy timeout does not
    # apply): two first opens at once, as two trials in flight on a fresh results directory,
    # failed one of them with "database is locked". Retried for as long as a busy wait would be.
    deadline = time.monotonic() + BUSY_S
    try:
        while True:
            try:
                db.execute("PRAGMA journal_mode=WAL")
                break
            except sqlite3.OperationalError as exc:
                if "locked" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.02)
        db.execute("PRAGMA synchronous=NORMAL")
        db.executescript(schema)
        _add_missing_columns(db, schema)
    except sqlite3.DatabaseError as exc:
        db.close()
        if "locked" in str(exc):
            raise
        # Not ours to repair, and not to be replaced silently: it is the record of what runs made.
        raise UserError(
            f"{path} is not a readable SQLite database ({exc}); restore it, or move it away to "
            "start a new record"
        ) from None
    return db


def _add_missing_columns(db: sqlite3.Connection, schema: str) -> None:
    """A file written by an older amibake lacks columns added since: add them (NULL for the
    rows it already holds), as CREATE TABLE IF NOT EXISTS leaves an existing table alone."""
    for table, columns in _declared_columns(schema).items():
        have = {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
        for name, declaration in columns.items():
            if name not in have:
                db.execute(f"ALTER TABLE {table} ADD COLUMN {name} {declaration}")


def _declared_columns(schema: str) -> dict[str, dict[str, str]]:
    """Each table's plain columns (name -> type) from CREATE TABLE statements; constraints and
    columns with NOT NULL or a key are left out (ALTER TABLE cannot add those)."""
    tables: dict[str, dict[str, str]] = {}
    for statement in schema.split(";"):
        head, _, body = statement.partition("(")
        words = head.split()
        if len(words) < 3 or words[:2] != ["CREATE", "TABLE"]:
            continue
        columns = {}
        for part in body.rsplit(")", 1)[0].split(","):
            name, _, declaration = part.strip().partition(" ")
            if name.isidentifier() and name.upper() != "PRIMARY":
                plain = "NOT NULL" not in declaration and "KEY" not in declaration
                if plain:
                    columns[name] = declaration.strip()
        tables[words[-1]] = columns
    return tables


class Journal:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._db = open_database(path, SCHEMA)

    def _exec(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def start_run(self, run_id: str, command: str, cloud: str, region: str) -> None:
        self._exec(
            "INSERT INTO runs (run_id, command, cloud, region, started, pid, host, pid_started) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                command,
                cloud,
                region,
                time.time(),
                os.getpid(),
                socket.gethostname(),
                procs.started(os.getpid()),
            ),
        )

    def finish_run(self, run_id: str, state: str, detail: str = "") -> None:
        self._exec(
            "UPDATE runs SET finished = ?, state = ?, detail = ? WHERE run_id = ?",
            (time.time(), state, detail, run_id),
        )

    def run_state(self, run_id: str) -> str | None:
        rows = self._exec("SELECT state FROM runs WHERE run_id = ?", (run_id,))
        return str(rows[0][0]) if rows else None

    def run_detail(self, run_id: str) -> str | None:
        rows = self._exec("SELECT detail FROM runs WHERE run_id = ?", (run_id,))
        return str(rows[0][0] or "") if rows else None

    def close_dead_runs(self) -> list[str]:
        """Runs still 'running' whose process is gone (SIGKILL, a lost machine): closed as
        killed, with what they left (gc removes it). A run of another machine, or whose
        process lives, is left alone. Returns the runs closed."""
        closed = []
        here = socket.gethostname()
        live = self.live_runs()
        for run_id, pid, host in self._exec(
            "SELECT run_id, pid, host FROM runs WHERE state = 'running'"
        ):
            if host != here or not isinstance(pid, int) or run_id in live:
                continue
            left = self.alive(str(run_id))
            detail = f"its process ended without closing it; {len(left)} resources left"
            self.finish_run(str(run_id), "killed", detail)
            closed.append(str(run_id))
        return closed

    def live_runs(self) -> dict[str, int]:
        """Runs still running on this machine: run id -> pid. Its process is alive and is the
        one that started the run (a pid taken since by another process is not)."""
        here = socket.gethostname()
        return {
            str(run_id): pid
            for run_id, pid, host, when in self._exec(
                "SELECT run_id, pid, host, pid_started FROM runs WHERE state = 'running'"
            )
            if host == here
            and isinstance(pid, int)
            and procs.same_process(pid, str(when) if when else None)
        }

    def running_elsewhere(self, within_s: float) -> dict[str, str]:
        """Runs this journal has as running on another machine (a results dir shared between
        machines), started within `within_s`: run id -> host. Whether they live cannot be told
        from here; one older is taken for dead (a container's or a CI machine's name is gone
        with it, and its run was kept for ever)."""
        here = socket.gethostname()
        return {
            str(run_id): str(host)
            for run_id, host in self._exec(
                "SELECT run_id, host FROM runs WHERE state = 'running' AND host IS NOT NULL "
                "AND started >= ?",
                (time.time() - within_s,),
            )
            if host != here
        }

    def known_runs(self) -> frozenset[str]:
        """Every run this journal has a record of, whatever its state: started here, or with a
        resource recorded here."""
        rows = self._exec("SELECT run_id FROM runs UNION SELECT run_id FROM resources")
        return frozenset(str(r) for (r,) in rows)

    def cleaned_up(self, run_id: str) -> None:
        """gc removed the last of what the run left: its record says so."""
        if self.alive(run_id):
            return
        self._exec(
            "UPDATE runs SET detail = COALESCE(detail, '') || '; cleaned up by gc' "
            "WHERE run_id = ? AND state != 'running' AND COALESCE(detail, '') "
            "NOT LIKE '%cleaned up by gc'",
            (run_id,),
        )

    def last_run_id(self) -> str | None:
        rows = self._exec("SELECT run_id FROM runs ORDER BY started DESC LIMIT 1")
        return str(rows[0][0]) if rows else None

    def created(self, run_id: str, kind: str, resource_id: str, region: str, cloud: str) -> None:
        self._exec(
            "INSERT OR REPLACE INTO resources (run_id, kind, resource_id, region, cloud, created)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            (run_id, kind, resource_id, region, cloud, time.time()),
        )

    def deleted(self, kind: str, resource_id: str) -> None:
        self._exec(
            "UPDATE resources SET deleted = ? WHERE kind = ? AND resource_id = ?",
            (time.time(), kind, resource_id),
        )

    def resources(self, run_id: str) -> list[Resource]:
        """Everything the run created, deleted or not."""
        rows = self._exec(
            "SELECT run_id, kind, resource_id, region, cloud, created FROM resources "
            "WHERE run_id = ? ORDER BY created",
            (run_id,),
        )
        return [Resource(*row) for row in rows]  # type: ignore[arg-type]

    def instance_lifetimes(self, run_id: str) -> dict[str, float]:
        """Seconds each of the run's instances lived: from its creation to its deletion (or to
        now, while it lives)."""
        rows = self._exec(
            "SELECT resource_id, created, deleted FROM resources "
            "WHERE run_id = ? AND kind = 'instance'",
            (run_id,),
        )
        now = time.time()
        return {
            str(instance): float(str(deleted or now)) - float(str(created))
            for instance, created, deleted in rows
        }

    def alive(self, run_id: str | None = None, cloud: str | None = None) -> list[Resource]:
        sql = "SELECT run_id, kind, resource_id, region, cloud, created FROM resources"
        sql += " WHERE deleted IS NULL"
        args: list[object] = []
        if run_id is not None:
            sql += " AND run_id = ?"
            args.append(run_id)
        if cloud is not None:
            sql += " AND cloud = ?"
            args.append(cloud)
        return [Resource(*row) for row in self._exec(sql + " ORDER BY created", tuple(args))]  # type: ignore[arg-type]

    def close(self) -> None:
        with self._lock:
            self._db.close()
