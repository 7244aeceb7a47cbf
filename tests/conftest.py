"""Fixtures shared by the tests. The prerequisite policy lives in tests/prereqs.py."""

from __future__ import annotations

import sys

import pytest


@pytest.fixture
def ccscope_cmd() -> list[str]:
    """Run the CLI exactly as a user would, with this interpreter."""
    return [sys.executable, "-m", "ccscope.cli"]
