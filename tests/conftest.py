"""Fixtures shared by the tests. The prerequisite policy lives in ccscope_testkit.prereqs (testkit/)."""

from __future__ import annotations

import signal
import sys

import pytest
from ccscope_testkit.prereqs import SLOW_MODULES


def pytest_configure() -> None:
    """Ctrl-C as a user's terminal delivers it, also when the suite itself was started in the background.

    A non-interactive shell starts `cmd &` with SIGINT ignored, the ignore is inherited across exec, and
    Python then keeps it instead of raising KeyboardInterrupt: run that way (`nohup bash .ci/run &`), the four
    tests that press Ctrl-C on a child saw it ignored (exit 0 instead of 130; a testbed that never left). A
    Python handler here is reset to the default in every child at exec, so each child starts as from a
    terminal."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__ in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def ccscope_cmd() -> list[str]:
    """Run the CLI exactly as a user would, with this interpreter."""
    return [sys.executable, "-m", "ccscope.cli"]
