"""Helpers for the kernel-lab tests (a plain module: tests/ is not a package, conftest is not importable)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LAB = ROOT / "tools" / "kernel-lab"
PYTHON = ROOT / ".venv" / "bin" / "python"
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, reason: str) -> None:
    """Skip locally when a prerequisite is missing; fail under CI=true."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"prerequisite missing under CI: {reason}")
    pytest.skip(reason)


def lab(*args: str, timeout: float = 900, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """tools/kernel-lab with `args`; the lab bounds its own boots, `timeout` is a backstop."""
    return subprocess.run([str(LAB), *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})}, check=False)
