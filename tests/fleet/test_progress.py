"""Progress a person can read (issue 27): one line per event, prefixed with the command's own
name, with elapsed time and an ETA; a redrawn bar (rich) only where a terminal is attached."""

from __future__ import annotations

import io
import logging
import re

import pytest

from amibake import logs, progress
from amibake.cloud import Cloud
from fleet import bench, spec
from fleet.cli import main
from fleet.search.evaluation import Evaluation
from fleet.spec import Metric
from fleet.tune import trial_line

REPLICATE_LINE = re.compile(r"^fleet: \[(fb-\S+)\] (\d+)/(\d+) replicates, (\S+) elapsed(.*)$")


@pytest.mark.e2e
def test_a_bench_says_each_replicate_once_with_elapsed_time_and_eta_as_fleet(
    cloud: Cloud, capsys: pytest.CaptureFixture[str]
) -> None:
    # Two types, three replicates each: 6 replicate events (the issue saw 36 lines for 16, in
    # pairs with the same counter: one when a replicate started, one when it ended).
    bench_spec = spec.load(
        None,
        {
            "types": ["c5a.large", "c6a.large"],
            "command": "sleep 0.2; echo value=1",
            "metric": "value=(\\d+)",
            "replicates": 3,
            "warmups": 0,
        },
    )
    results = bench.results_db(cloud.config.results_dir)
    run_id = bench.create(cloud, bench_spec, results)
    assert main(["bench", "--resume", run_id]) == 0
    err = capsys.readouterr().err.splitlines()
    assert not [line for line in err if line.startswith("amibake:")], err
    counted = [m for line in err if (m := REPLICATE_LINE.match(line))]
    assert [(m[1], int(m[2]), int(m[3])) for m in counted] == [(run_id, n, 6) for n in range(1, 7)]
    for match in counted:  # every one ends a replicate: its pace is known, so its ETA too
        assert re.fullmatch(r"\d+s|\d+m\d\ds", match[4]), match[0]
        assert re.match(r", ~(\d+s|\d+m\d\ds) left; c[56]a\.large plain-r\d done; ", match[5])
    assert counted[-1][5].startswith(", ~0s left")
    # Besides the replicates, each type's end once, and its staging once per instance: once,
    # or again each time spot started it over on a new one (the e2e tests also run under
    # --faults aws, which reclaims instances and raises interruption notices; either way the
    # warning ends "starting over").
    events = [re.sub(r";.*", "", line) for line in err if f"[{run_id}] c" in line]
    for instance_type in bench_spec.types:
        restarts = sum(
            f" {instance_type}] " in line and line.endswith(": starting over") for line in err
        )
        staged = events.count(f"fleet: [{run_id}] {instance_type} staging")
        assert 1 <= staged <= 1 + restarts, (instance_type, staged, restarts, events)
        assert events.count(f"fleet: [{run_id}] {instance_type} done") == 1, events
    assert len(events) == len(bench_spec.types) + sum(" staging" in e for e in events)
    # The run's log file keeps the same plain lines (no bar, no escape codes).
    logged = results.log_path(run_id).read_text()
    assert logged.count(" replicates, ") == 6 and "\x1b" not in logged


def test_the_terminal_prefix_is_the_running_programs(monkeypatch: pytest.MonkeyPatch) -> None:
    stream = io.StringIO()
    monkeypatch.setattr("sys.stderr", stream)
    logs.to_terminal(program="fleet")
    logging.getLogger("amibake").info("one")
    logs.to_terminal(program="amibake")  # the same handler, another program's prefix
    logging.getLogger("amibake").info("two")
    assert stream.getvalue() == "fleet: one\namibake: two\n"


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_redrawn_bar_and_a_pipe_plain_lines(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="amibake")
    pipe = io.StringIO()
    monkeypatch.setattr("sys.stderr", pipe)
    counter = progress.Counter("fb-1", total=3)
    counter.show("c5a.large tuned-r0")
    line = counter.advance("c5a.large tuned-r0 done")
    counter.close()
    assert "\x1b" not in pipe.getvalue() and "━" not in pipe.getvalue()  # a pipe: no bar
    assert re.fullmatch(r"1/3 replicates, 0s elapsed, ~0s left; c5a.large tuned-r0 done", line)
    assert caplog.messages == [f"[fb-1] {line}"]  # the line, logged once

    tty = Tty()
    monkeypatch.setattr("sys.stderr", tty)
    counter = progress.Counter("fb-2", total=4, done=1)  # resumed: one was done before
    assert counter.left() is None  # no pace yet: no ETA
    counter.show("c5a.large tuned-r1")
    assert progress.BARS.active()
    counter.advance()
    counter.close()
    assert not progress.BARS.active()
    drawn = tty.getvalue()
    assert "fb-2" in drawn and "2/4" in drawn and "━" in drawn  # rich's bar


def test_durations_read_as_people_write_them() -> None:
    assert [progress.duration(s) for s in (0.4, 45, 190, 3600 + 300)] == [
        "0s",
        "45s",
        "3m10s",
        "1h05m",
    ]


def test_a_trial_of_a_geomean_metric_says_it_is_one() -> None:
    kernels = Metric("regex", "throughput=([0-9.]+)", "rate", "geomean", "geomean throughput")
    said = trial_line(3, Evaluation("ok", loss=-12.5, metric=12.5), kernels)
    assert said == (
        "trial 3 ok: geomean throughput (geomean of every match of throughput=([0-9.]+), one "
        "number from several) 12.5"
    )
    frames = Metric("regex", "fps=([0-9.]+)", "rate", "last", "frames/s")
    assert trial_line(4, Evaluation("ok", loss=-3, metric=3.0), frames) == "trial 4 ok: frames/s 3"
