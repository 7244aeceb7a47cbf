"""Helpers for the tests of ccscope's BPF congestion controls (tests/test_cc*.py)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from prereqs import require, require_root

AVAILABLE = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")

# A process that uses BPF congestion controls like a scenario does, until its stdin closes.
USER_SCRIPT = """
import sys
from ccscope.cc import provided
with provided(sys.argv[1:], "test user") as chosen:
    print(" ".join(f"{n}={i.implementation}" for n, i in chosen.items()), flush=True)
    sys.stdin.read()
"""


def available() -> set[str]:
    return set(AVAILABLE.read_text().split())


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def require_cc_objects() -> None:
    from ccscope.cc import catalog, structops

    require_root()
    missing = [a for a in catalog.BPF_ALGORITHMS if not catalog.object_path(a).is_file()]
    require(not missing, f"BPF congestion controls not built ({', '.join(missing)}): run make bpf")
    require(structops.supported(), "kernel without struct_ops congestion controls")


def start_user(env: dict[str, str], *names: str) -> tuple[subprocess.Popen, str]:
    """Starts a process holding `names` registered; returns it and its first line (name=implementation)."""
    proc = subprocess.Popen([sys.executable, "-c", USER_SCRIPT, *names], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if not line:
        proc.kill()
        raise AssertionError(f"user process failed: {proc.stderr.read().strip()}")
    return proc, line


def stop_user(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.stdin.close()
        proc.wait(timeout=20)
