"""Fixtures shared by the tests. The prerequisite policy lives in ccscope_testkit.prereqs (testkit/)."""

from __future__ import annotations

import sys

import pytest
from ccscope_testkit.prereqs import SLOW_MODULES


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__ in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def ccscope_cmd() -> list[str]:
    """Run the CLI exactly as a user would, with this interpreter."""
    return [sys.executable, "-m", "ccscope.cli"]
