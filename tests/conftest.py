"""Shared test policy: real prerequisites, and under CI a missing one fails instead of skipping."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, reason: str) -> None:
    """Skip locally when a prerequisite is missing; fail under CI=true (real tests are never skipped)."""
    if condition:
        return
    if IN_CI:
        pytest.fail(f"prerequisite missing under CI: {reason}")
    pytest.skip(reason)


def require_root() -> None:
    require(os.geteuid() == 0, "needs root (BPF, network namespaces)")


def require_tools(*tools: str) -> None:
    missing = [t for t in tools if not shutil.which(t)]
    require(not missing, f"missing tools: {', '.join(missing)}")


def require_bpf_object() -> None:
    from ccscope.loader import object_path

    require(object_path().is_file(), f"BPF object not built ({object_path()}): run make bpf")


@pytest.fixture
def ccscope_cmd() -> list[str]:
    """Run the CLI exactly as a user would, with this interpreter."""
    return [sys.executable, "-m", "ccscope.cli"]
