"""Helpers for the kernel-lab tests."""

from __future__ import annotations

import os
import subprocess

from ccscope_testkit.prereqs import ROOT, require

__all__ = ["LAB", "PYTHON", "ROOT", "lab", "require"]

LAB = ROOT / "tools" / "kernel-lab"
PYTHON = ROOT / ".venv" / "bin" / "python"


def lab(*args: str, timeout: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """tools/kernel-lab with `args`; the lab bounds its own boots, `timeout` is a backstop."""
    return subprocess.run([str(LAB), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, check=False)
