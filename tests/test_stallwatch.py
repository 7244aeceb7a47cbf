"""The suite's machine record (ccscope_testkit.stallwatch): a real watcher sees a real stall of itself, and a span
reads only its own seconds and steal."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from ccscope_testkit.stallwatch import Watch


def test_a_span_reads_its_own_seconds_and_steal(tmp_path: Path) -> None:
    watch = Watch.__new__(Watch)  # the records alone, no watcher processes
    watch.directory = tmp_path
    (tmp_path / "cpu0.log").write_text("10.0 1.5\n11.0 30.0\n12.0 2.0\n20.0 80.0\n")
    (tmp_path / "cpu1.log").write_text("10.0 12.0\n11.0 1.0\n12.0 1.0\n")
    watch.steal = [(9.5, 100, 1000), (12.5, 130, 1600), (21.0, 500, 2000)]
    span = watch.during(9.5, 12.5)
    assert (span.worst_ms, span.stalled_seconds, span.seconds) == (30.0, 1, 3)
    assert span.steal == pytest.approx(30 / 600)
    assert "worst wake-up 30 ms late; 1 of 3 s had one over 10 ms, steal 5.0%" in span.describe()
    assert watch.during(12.5, 21.0).worst_ms == 80.0
    assert span.lost is None and span.share == pytest.approx(1 - 30 / 600)  # two-field lines: no lost time


def test_a_spans_share_is_the_larger_of_steal_and_lost_time(tmp_path: Path) -> None:
    """Lost time: each CPU's summed lateness per second, averaged over the CPUs (200 and 100 ms of 2 s: 7.5 %)."""
    watch = Watch.__new__(Watch)
    watch.directory = tmp_path
    (tmp_path / "cpu0.log").write_text("10.0 30.0 150.0\n11.0 12.0 50.0\n")
    (tmp_path / "cpu1.log").write_text("10.0 2.0 40.0\n11.0 1.0 60.0\n")
    watch.steal = [(9.5, 100, 1000), (11.5, 130, 1400)]
    span = watch.during(9.5, 11.5)
    assert span.lost == pytest.approx(0.075) and span.steal == pytest.approx(0.075)
    watch.steal = [(9.5, 100, 1000), (11.5, 140, 1400)]
    assert watch.during(9.5, 11.5).share == pytest.approx(0.9)  # steal 10 % over lost 7.5 %
    assert "steal 10.0%, lost 7.5%" in watch.during(9.5, 11.5).describe()


def test_the_watchers_see_a_stall_and_end_with_the_suite(tmp_path: Path) -> None:
    """SIGSTOP one watcher for 0.3 s: its record says so; stop() leaves no process."""
    watch = Watch(tmp_path)
    try:
        log = tmp_path / "cpu0.log"
        deadline = time.monotonic() + 10
        while not (log.exists() and log.read_text().strip()) and time.monotonic() < deadline:
            time.sleep(0.05)
        start = watch.mark()
        os.kill(watch.procs[0].pid, signal.SIGSTOP)
        time.sleep(0.3)  # the stall itself, not a wait for an effect
        os.kill(watch.procs[0].pid, signal.SIGCONT)
        while watch.during(start, time.monotonic()).seconds < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        span = watch.during(start, time.monotonic())
        assert span.worst_ms >= 290 and span.stalled_seconds >= 1, span
        # the stopped watcher lost the 0.3 s (less its 10 ms period), over the span's seconds and the CPUs
        assert span.lost is not None and span.lost >= 0.28 / span.seconds / len(watch.procs), span
    finally:
        watch.stop()
    assert all(proc.poll() is not None for proc in watch.procs)
