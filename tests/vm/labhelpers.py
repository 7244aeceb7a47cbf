"""Helpers for the kernel-lab tests."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ccscope_testkit.net import stop_process
from ccscope_testkit.prereqs import ROOT, require

__all__ = ["LAB", "PYTHON", "ROOT", "Boot", "lab", "require"]

LAB = ROOT / "tools" / "kernel-lab"
PYTHON = ROOT / ".venv" / "bin" / "python"


def lab(*args: str, timeout: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """tools/kernel-lab with `args`; the lab bounds its own boots, `timeout` is a backstop."""
    return subprocess.run([str(LAB), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, check=False)


@dataclass
class Boot:
    """`tools/kernel-lab run` in the background, its output in files: a pipe could fill while the suite waits
    for another boot."""

    proc: subprocess.Popen
    directory: Path

    @classmethod
    def start(cls, directory: Path, *args: str) -> Boot:
        with (directory / "stdout").open("wb") as out, (directory / "stderr").open("wb") as err:
            return cls(subprocess.Popen([str(LAB), *args], stdout=out, stderr=err, stdin=subprocess.DEVNULL),
                       directory)

    def wait_for_end(self, stopping: threading.Event, timeout: float = 900) -> None:
        """Until the boot has ended, `stopping` is set or `timeout` has passed."""
        deadline = time.monotonic() + timeout
        while self.proc.poll() is None and time.monotonic() < deadline:
            if stopping.wait(0.5):
                return

    def result(self, timeout: float = 900) -> subprocess.CompletedProcess:
        """Waits for the boot (the lab bounds it with its own --timeout; `timeout` is a backstop)."""
        try:
            self.proc.wait(timeout=timeout)
        finally:
            self.stop()
        return subprocess.CompletedProcess(self.proc.args, self.proc.returncode, self._read("stdout"),
                                           self._read("stderr"))

    def _read(self, name: str) -> str:
        return (self.directory / name).read_text(errors="replace")

    def stop(self) -> None:
        """Ctrl-C, as a user would stop the lab: it kills qemu, keeps the console and removes its files; killed
        if it has not ended 10 s later (its qemu then dies with it: PR_SET_PDEATHSIG)."""
        stop_process(self.proc, signal.SIGINT, timeout=10)
