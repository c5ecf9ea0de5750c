"""The results database, shared by a run's threads: a batch of replicates is seen whole."""

from __future__ import annotations

import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

from fleet.results import ReplicateRow, Results


class SlowBatches(sqlite3.Connection):
    """Inserts a batch's first row, pauses, then the rest: a window to read half a batch in."""

    def executemany(self, sql: str, rows: Any, /) -> sqlite3.Cursor:
        rows = list(rows)
        super().executemany(sql, rows[:1])
        time.sleep(0.5)
        return super().executemany(sql, rows[1:])


def test_a_reader_on_another_thread_sees_a_batch_whole_or_not_at_all(tmp_path: Path) -> None:
    results = Results(tmp_path / "fleet.sqlite")
    results._connection(writes=True).close()  # the file and its tables, made
    results._file = sqlite3.connect(
        tmp_path / "fleet.sqlite",
        factory=SlowBatches,
        check_same_thread=False,
        isolation_level=None,
    )
    batch = [ReplicateRow("c7i.large", "tuned", i, False, "ok", metric=1.0) for i in range(4)]
    writer = threading.Thread(target=results.record_many, args=("run", batch))
    writer.start()
    time.sleep(0.2)  # inside the batch
    seen = [len(results.replicates("run")), len(results.trials("run"))]
    writer.join()
    assert seen[0] in (0, 4), f"saw {seen[0]} of a batch of 4"
    assert seen[1] == 0  # trials are read under the same lock (none recorded)
    assert len(results.replicates("run")) == 4


def test_the_database_is_made_by_the_first_write_not_by_a_read(tmp_path: Path) -> None:
    """A command refused for bad input, or a status of a run that does not exist, left an empty
    results/fleet.sqlite: reads of a record not yet made see an empty one in memory."""
    path = tmp_path / "results" / "fleet.sqlite"
    results = Results(path)
    assert results.run_ids() == [] and results.run("fb-0") is None
    assert list(results.replicates("fb-0").columns)[:3] == ["id", "run_id", "instance_type"]
    assert not path.parent.exists()
    results.create_run("fb-1", "bench", {}, "local", "us-east-1")
    assert path.exists() and results.run_ids() == ["fb-1"]
    assert Results(path).run_ids() == ["fb-1"]  # on disk, for the next reader
    results.close()
