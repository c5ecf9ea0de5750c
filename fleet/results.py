"""fleet's results: one SQLite database (WAL) under results/, append-only.

Nothing is ever updated: a replicate that is interrupted and run again is two rows (attempts),
a run's progress is a series of events. What happened stays on the record, and a controller
killed at any moment leaves a database that says exactly what finished.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from amibake.errors import UserError
from amibake.journal import open_database

# The first line of a local-cloud run's report: what such a run measures and what it cannot.
LOCAL_NOTE = (
    "Local cloud: every instance type ran on this machine's CPU, so differences between types "
    "are not measured here; builds and the method are."
)

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY, kind TEXT NOT NULL, created REAL NOT NULL, spec TEXT NOT NULL,
    cloud TEXT NOT NULL, region TEXT NOT NULL, note TEXT NOT NULL DEFAULT ''
);
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, at REAL NOT NULL, kind TEXT NOT NULL,
    detail TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS replicates (
    id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, instance_type TEXT NOT NULL,
    build TEXT NOT NULL, replicate INTEGER NOT NULL, warmup INTEGER NOT NULL,
    state TEXT NOT NULL, metric REAL, seconds REAL, exit_code INTEGER, error TEXT,
    instance_id TEXT, market TEXT, zone TEXT, price_usd_hour REAL,
    started REAL, finished REAL, monitor_csv TEXT, cpu_mean REAL, cpu_max REAL,
    rss_max_mb REAL, monitor_samples INTEGER, trial INTEGER
);
CREATE INDEX IF NOT EXISTS replicates_run ON replicates (run_id, instance_type, build);
CREATE TABLE IF NOT EXISTS environments (
    id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, instance_type TEXT NOT NULL,
    instance_id TEXT NOT NULL, at REAL NOT NULL, facts TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS trials (
    id INTEGER PRIMARY KEY, run_id TEXT NOT NULL, trial INTEGER NOT NULL, state TEXT NOT NULL,
    params TEXT NOT NULL, loss REAL, metric REAL, seconds REAL, cost_per_unit REAL,
    reason TEXT, manifest TEXT, at REAL NOT NULL
);
"""
DONE = ("ok", "failed")  # a replicate in one of these states is finished; "interrupted" is not


@dataclass(frozen=True)
class ReplicateRow:
    instance_type: str
    build: str
    replicate: int
    warmup: bool
    state: str  # ok | failed | interrupted
    metric: float | None = None
    seconds: float | None = None
    exit_code: int | None = None
    error: str = ""
    instance_id: str = ""
    market: str = ""
    zone: str = ""
    price_usd_hour: float | None = None
    started: float = 0.0
    finished: float = 0.0
    monitor_csv: str = ""
    cpu_mean: float | None = None
    cpu_max: float | None = None
    rss_max_mb: float | None = None
    monitor_samples: int | None = None
    trial: int | None = None


def new_run_id(prefix: str = "fb") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


class Results:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._file: sqlite3.Connection | None = None
        self._empty: sqlite3.Connection | None = None
        if path.exists():
            self._file = open_database(path, SCHEMA)  # refused now if it cannot be opened

    def close(self) -> None:
        for db in (self._file, self._empty):
            if db is not None:
                db.close()

    def _connection(self, writes: bool) -> sqlite3.Connection:
        """The database (callers hold the lock). Made by the first write only: a command
        refused for bad input, or a status of a run that does not exist, read an empty record
        and left a results/fleet.sqlite behind. Until then reads see an empty one in memory."""
        if self._file is None and (writes or self.path.exists()):
            self._file = open_database(self.path, SCHEMA)
        if self._file is not None:
            return self._file
        if self._empty is None:
            self._empty = sqlite3.connect(":memory:", check_same_thread=False)
            self._empty.executescript(SCHEMA)
        return self._empty

    def log_path(self, run_id: str) -> Path:
        """A fleet run's log, beside its amibake runs' under results/logs/."""
        return self.path.parent / "logs" / run_id / "run.log"

    def _exec(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[Any, ...]]:
        with self._lock:
            writes = not sql.lstrip().upper().startswith("SELECT")
            return self._connection(writes).execute(sql, args).fetchall()

    def _frame(self, sql: str, args: tuple[object, ...] = ()) -> pd.DataFrame:
        # Under the lock like every statement: the connection is shared by the trials' threads,
        # and a read between another thread's BEGIN and COMMIT would see half a batch.
        with self._lock:
            return pd.read_sql_query(sql, self._connection(writes=False), params=args)

    # runs and events
    def create_run(
        self, run_id: str, kind: str, spec: dict[str, Any], cloud: str, region: str, note: str = ""
    ) -> None:
        self._exec(
            "INSERT INTO runs VALUES (?, ?, ?, ?, ?, ?, ?)",
            (run_id, kind, time.time(), json.dumps(spec), cloud, region, note),
        )

    def run(self, run_id: str) -> dict[str, Any] | None:
        rows = self._exec(
            "SELECT run_id, kind, created, spec, cloud, region, note FROM runs WHERE run_id = ?",
            (run_id,),
        )
        if not rows:
            return None
        rid, kind, created, spec, cloud, region, note = rows[0]
        return {
            "run_id": rid,
            "kind": kind,
            "created": created,
            "spec": json.loads(spec),
            "cloud": cloud,
            "region": region,
            "note": note,
        }

    def require(self, run_id: str) -> dict[str, Any]:
        """The run, or a one-line error naming the recent ones."""
        record = self.run(run_id)
        if record is None:
            known = self.run_ids()[-5:]
            raise UserError(
                f"no fleet run {run_id!r} in {self.path}"
                + (f"; recent runs: {', '.join(known)}" if known else "")
            )
        return record

    def run_ids(self) -> list[str]:
        return [r[0] for r in self._exec("SELECT run_id FROM runs ORDER BY created")]

    def event(self, run_id: str, kind: str, **detail: Any) -> None:
        self._exec(
            "INSERT INTO events (run_id, at, kind, detail) VALUES (?, ?, ?, ?)",
            (run_id, time.time(), kind, json.dumps(detail)),
        )

    def events(self, run_id: str) -> list[tuple[float, str, dict[str, Any]]]:
        rows = self._exec(
            "SELECT at, kind, detail FROM events WHERE run_id = ? ORDER BY id", (run_id,)
        )
        return [(at, kind, json.loads(detail)) for at, kind, detail in rows]

    # replicates
    def record(self, run_id: str, row: ReplicateRow) -> None:
        self.record_many(run_id, [row])

    def record_many(self, run_id: str, rows: list[ReplicateRow]) -> None:
        """Insert rows in one transaction: all of them, or none."""
        columns = ", ".join(ReplicateRow.__dataclass_fields__)
        marks = ", ".join("?" for _ in ReplicateRow.__dataclass_fields__)
        values = [
            (run_id, *(int(v) if isinstance(v, bool) else v for v in row.__dict__.values()))
            for row in rows
        ]
        with self._lock:
            db = self._connection(writes=True)
            db.execute("BEGIN")  # autocommit connection: the transaction is explicit
            try:
                db.executemany(
                    f"INSERT INTO replicates (run_id, {columns}) VALUES (?, {marks})", values
                )
            except BaseException:
                db.execute("ROLLBACK")
                raise
            db.execute("COMMIT")

    def finished(self, run_id: str) -> set[tuple[str, str, int, bool]]:
        """(type, build, replicate, warmup) of every replicate that needs no further attempt."""
        rows = self._exec(
            "SELECT instance_type, build, replicate, warmup FROM replicates "
            "WHERE run_id = ? AND state IN ('ok', 'failed')",
            (run_id,),
        )
        return {(t, b, int(r), bool(w)) for t, b, r, w in rows}

    def replicates(self, run_id: str) -> pd.DataFrame:
        return self._frame("SELECT * FROM replicates WHERE run_id = ? ORDER BY id", (run_id,))

    def environment(
        self, run_id: str, instance_type: str, instance_id: str, facts: dict[str, Any]
    ) -> None:
        self._exec(
            "INSERT INTO environments (run_id, instance_type, instance_id, at, facts) "
            "VALUES (?, ?, ?, ?, ?)",
            (run_id, instance_type, instance_id, time.time(), json.dumps(facts)),
        )

    def environments(self, run_id: str) -> list[dict[str, Any]]:
        rows = self._exec(
            "SELECT instance_type, instance_id, facts FROM environments WHERE run_id = ? "
            "ORDER BY id",
            (run_id,),
        )
        return [{"instance_type": t, "instance_id": i, **json.loads(facts)} for t, i, facts in rows]

    # trials (fleet tune)
    def trial(
        self,
        run_id: str,
        trial: int,
        state: str,
        params: dict[str, Any],
        *,
        loss: float | None = None,
        metric: float | None = None,
        seconds: float | None = None,
        cost_per_unit: float | None = None,
        reason: str = "",
        manifest: dict[str, Any] | None = None,
    ) -> None:
        self._exec(
            "INSERT INTO trials (run_id, trial, state, params, loss, metric, seconds, "
            "cost_per_unit, reason, manifest, at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                trial,
                state,
                json.dumps(params, sort_keys=True),
                loss,
                metric,
                seconds,
                cost_per_unit,
                reason,
                json.dumps(manifest or {}),
                time.time(),
            ),
        )

    def trials(self, run_id: str) -> pd.DataFrame:
        frame = self._frame("SELECT * FROM trials WHERE run_id = ? ORDER BY id", (run_id,))
        return frame
