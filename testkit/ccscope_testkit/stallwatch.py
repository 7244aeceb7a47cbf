"""What the machine did while each test ran: how late a top-priority thread per CPU woke, and the host's steal.

The suite's timing tests measure an emulated path through our own processes, so a moment in which the machine
runs nothing of ours shows up in their numbers. On the CI machine of 2026-11-28 a SCHED_FIFO 99 thread per CPU,
woken every millisecond, woke 5-10 ms late in a typical second and up to 80 ms late several times a minute, idle or
beside two busy loops (the host preempting our vCPUs; the steal counter mostly misses it). A failure report then
needs the machine's record beside the test's own: `Watch(directory)` starts one watcher process per CPU, and
`during(start, end)` says what they saw in that span (conftest.py prints it for each failed test).

A watcher wakes every PERIOD_S at SCHED_FIFO 99, pinned to its CPU, and writes one line per second: the second's
end (CLOCK_MONOTONIC), its worst lateness, and its lost time (each wake-up's lateness past LATE_FLOOR_MS, summed: an
estimate of the time its CPU ran nothing of ours, since nothing of ours outranks the watcher; good for stalls of a
period and longer, while the host's slices of a few ms mostly fall between wake-ups, which the steal counter sees).
Its cost: 100 wake-ups a second per CPU, 0.8 % of a CPU.

A span's `share` is the part of the machine's time we had: one less the larger of the steal and the lost time. The
timing tests scale the rates they expect by it. On the CI run of 2026-11-29 (steal 31-37 % for 53 minutes) flows
through the emulated links carried 75-90 % of what a quiet machine gives them: a link emulated by our own
processes runs at the speed of the machine it is given.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

PERIOD_S = 0.01
STALL_MS = 10.0  # a second whose worst wake-up was this late counts as a stalled one
LATE_FLOOR_MS = 1.0  # a wake-up this late is the sleep's own slack (0.05-0.1 ms on a quiet CPU), not lost time


@dataclass(frozen=True)
class Span:
    worst_ms: float  # the latest wake-up of any watcher in the span
    stalled_seconds: int  # seconds of the span in which some watcher woke over STALL_MS late
    seconds: int  # seconds of the span with a record
    steal: float | None  # share of the CPUs' time the host took (/proc/stat)
    lost: float | None = None  # share of the span's seconds the watchers' CPUs ran nothing of ours (their mean)

    @property
    def share(self) -> float:
        """The part of the machine's time we had in the span: 1.0 when nothing says otherwise."""
        return 1.0 - max(self.steal or 0.0, self.lost or 0.0)

    def describe(self) -> str:
        if not self.seconds:
            return "machine: no record of this span"
        steal = "" if self.steal is None else f", steal {self.steal:.1%}"
        lost = "" if self.lost is None else f", lost {self.lost:.1%}"
        return (f"machine: worst wake-up {self.worst_ms:.0f} ms late; {self.stalled_seconds} of {self.seconds} s "
                f"had one over {STALL_MS:.0f} ms{steal}{lost}")


class Watch:
    """The watcher processes and their records; stop() ends them."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.procs = [subprocess.Popen([sys.executable, "-m", "ccscope_testkit.stallwatch", str(cpu),
                                        str(directory / f"cpu{cpu}.log")], stdin=subprocess.DEVNULL)
                      for cpu in sorted(os.sched_getaffinity(0))]
        self.steal: list[tuple[float, int, int]] = []  # (monotonic, steal ticks, all ticks)
        self.started = self.mark()

    def mark(self) -> float:
        """Records the steal counter now, and returns when (monotonic): the ends of the spans asked about."""
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:9]]
        now = time.monotonic()
        self.steal.append((now, ticks[7], sum(ticks)))
        return now

    def during(self, start: float, end: float) -> Span:
        worst, stalled, seconds, lost_shares = 0.0, 0, 0, []
        for log in sorted(self.directory.glob("cpu*.log")):
            lines = log.read_text().splitlines()
            per_second = [[float(x) for x in line.split()] for line in lines if len(line.split()) in (2, 3)]
            inside = [fields for fields in per_second if start <= fields[0] <= end + 1.0]
            worst = max([worst, *(late for _, late, *_ in inside)])
            stalled = max(stalled, sum(late > STALL_MS for _, late, *_ in inside))
            seconds = max(seconds, len(inside))
            if inside and all(len(fields) == 3 for fields in inside):
                lost_shares.append(sum(fields[2] for fields in inside) / 1e3 / len(inside))
        lost = sum(lost_shares) / len(lost_shares) if lost_shares else None
        return Span(worst, stalled, seconds, self._steal(start, end), lost)

    def _steal(self, start: float, end: float) -> float | None:
        before = [s for s in self.steal if s[0] <= start + 1e-6]
        after = [s for s in self.steal if s[0] >= end - 1e-6]
        if not before or not after or after[0][2] == before[-1][2]:
            return None
        return (after[0][1] - before[-1][1]) / (after[0][2] - before[-1][2])

    def stop(self) -> None:
        for proc in self.procs:
            proc.terminate()
        for proc in self.procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _watch_cpu(cpu: int, log: Path) -> None:
    os.sched_setaffinity(0, {cpu})
    with contextlib.suppress(PermissionError):  # without root: the ordinary scheduler, a coarser record
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(99))
    parent = os.getppid()
    with log.open("a", buffering=1) as out:
        due = time.monotonic()
        second_ends, worst, lost = due + 1.0, 0.0, 0.0
        while True:
            due += PERIOD_S
            time.sleep(max(0.0, due - time.monotonic()))
            now = time.monotonic()
            worst = max(worst, now - due)
            lost += max(0.0, now - due - LATE_FLOOR_MS / 1e3)
            if now >= second_ends:
                out.write(f"{now:.3f} {worst * 1e3:.2f} {lost * 1e3:.2f}\n")
                second_ends, worst, lost = now + 1.0, 0.0, 0.0
                if os.getppid() != parent:  # the suite was killed (SIGKILL runs no teardown): do not outlive it
                    return
            if now - due > PERIOD_S:  # a stall: start the cadence again from now, not with a burst of catch-ups
                due = now


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C reaches the suite's whole process group
        _watch_cpu(int(sys.argv[1]), Path(sys.argv[2]))
