"""What the bench scripts share (bench/*.py): a result row, the conditions a run was measured under, a
process's CPU time. Here, not in one bench script imported by the others by bare module name."""

from __future__ import annotations

import contextlib
import os
import platform
import time
from dataclasses import dataclass
from pathlib import Path

CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass
class Row:
    what: str
    value: str
    target: str
    ok: bool | None
    detail: str = ""


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process from /proc (fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def cpu_ns(pid: int) -> int:
    """Nanoseconds a process's live threads have run (the first field of each /proc/PID/task/TID/schedstat: the
    scheduler's exact sum_exec_runtime). /proc/PID/stat gives the same time in 10 ms ticks, too coarse for a
    process that runs 80 ms in a 10 s window (bench/telemetry.py measure 5 read +-1.8 us a sample through it)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            total += int((task / "schedstat").read_text().split()[0])
    return total


def conditions() -> str:
    load = os.getloadavg()
    return (f"{time.strftime('%Y-%m-%d %H:%M %Z')}; kernel {platform.release()}; {os.cpu_count()} CPUs "
            f"({cpu_model()}); load average {load[0]:.2f} / {load[1]:.2f} / {load[2]:.2f} at the end")


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()
