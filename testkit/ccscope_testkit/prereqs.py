"""The prerequisite policy and the repo root, for every test module to import.

A plain, uniquely named module: `from conftest import ...` would bind to whichever conftest.py pytest
loaded last (tests/ and tests/vm/ each have one). Locally a missing prerequisite skips; under CI=true it
fails, so real tests are never silently skipped.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]  # the checkout: testkit/ccscope_testkit/
# Modules that take minutes (seconds on 2 cores, from pytest --durations, 2026-11-26; test_live includes the quick
# scenario run it shares with test_scenario_run): conftest.py marks them `slow`, so `tools/run-tests --fast`
# (-m "not slow and not stock_kernel") runs the rest in ~4 minutes.
SLOW_MODULES = {"test_scenario_full": 482, "test_scenario_run": 62, "test_cc_claims": 149, "test_live": 86}
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def require(condition: bool, reason: str) -> None:
    """Skip locally when a prerequisite is missing; fail under CI=true."""
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


def require_scenario() -> None:
    """What a real `ccscope scenario` run needs."""
    require_root()
    require_tools("iperf3", "ping", "ip", "tc", "ethtool", "ss", "iptables")
    require_bpf_object()
