"""Running host tools with one-line errors."""

from __future__ import annotations

import subprocess

from ccscope.errors import CcscopeError
from ccscope.hosttools import need


def sh(argv: list[str], *, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command; a failure becomes one line naming the command and its first error line."""
    need(argv[0])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise CcscopeError(f"{' '.join(argv)} did not finish within {timeout:g} s") from None
    if check and proc.returncode != 0:
        msg = (proc.stderr.strip() or proc.stdout.strip() or f"exit status {proc.returncode}").splitlines()[0]
        raise CcscopeError(f"{' '.join(argv)} failed: {msg}")
    return proc


def in_ns(ns: str, argv: list[str]) -> list[str]:
    return ["ip", "netns", "exec", ns, *argv]
