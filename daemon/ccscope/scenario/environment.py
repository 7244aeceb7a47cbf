"""What a scenario records about the machine it ran on: kernel, tool versions, TCP sysctls, clocks."""

from __future__ import annotations

import contextlib
import os
import platform
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

from ccscope import __version__

SYSCTLS = ("net.ipv4.tcp_congestion_control", "net.ipv4.tcp_allowed_congestion_control",
           "net.ipv4.tcp_available_congestion_control", "net.core.default_qdisc", "net.ipv4.tcp_rmem",
           "net.ipv4.tcp_wmem", "net.ipv4.tcp_ecn", "net.ipv4.tcp_no_metrics_save", "net.ipv4.tcp_sack",
           "net.ipv4.tcp_timestamps", "net.ipv4.tcp_slow_start_after_idle")


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def capture(seed: int, order: list[str]) -> dict:
    """The host's side: the sender namespace's own values are added by the first run (namespace_sysctls)."""
    return {
        "kernel": platform.release(), "machine": platform.machine(), "cpus": os.cpu_count(),
        "python": platform.python_version(), "ccscope_version": __version__,
        "iperf3_version": _tool_version(["iperf3", "-v"]), "ping_version": _tool_version(["ping", "-V"]),
        "sysctls": _host_sysctls(), "offloads": {}, "seed": seed, "run_order": order, "hostname": platform.node(),
        "time_started": now_iso(), "monotonic_started": round(time.monotonic(), 3),
    }


def namespace_sysctls(tb) -> dict[str, str]:
    """The sender namespace's own values: many TCP sysctls are per namespace and start from defaults."""
    keys = [k for k in SYSCTLS if k.startswith("net.ipv4")]
    try:
        out = tb.run(tb.sender_ns, ["sysctl", "-e", *keys], timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return {}
    return {k.strip(): " ".join(v.split()) for k, _, v in (line.partition("=") for line in out.splitlines()) if _}


def _host_sysctls() -> dict[str, str]:
    values = {}
    for key in SYSCTLS:
        path = Path("/proc/sys") / key.replace(".", "/")
        with contextlib.suppress(OSError):
            values[key] = " ".join(path.read_text().split())
    return values


def _tool_version(argv: list[str]) -> str | None:
    try:
        res = subprocess.run(argv, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return (res.stdout or res.stderr).strip().splitlines()[0] if (res.stdout or res.stderr) else None
