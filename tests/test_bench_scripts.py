"""Every benchmark script starts: a number quoted from one that no longer runs cannot be checked again."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from ccscope_testkit.prereqs import ROOT

SCRIPTS = sorted(path for path in (ROOT / "bench").glob("*.py") if "__main__" in path.read_text())


def test_there_are_scripts() -> None:
    assert {path.name for path in SCRIPTS} >= {"telemetry.py", "live.py", "cc.py", "endpoint.py", "emulator.py"}


@pytest.mark.parametrize("script", SCRIPTS, ids=[path.name for path in SCRIPTS])
def test_help_runs(script: Path) -> None:
    """`--help` imports the whole script, as a run does, and needs no root."""
    ran = subprocess.run([sys.executable, script.name, "--help"], cwd=script.parent, capture_output=True, text=True,
                         timeout=60)
    assert ran.returncode == 0 and "usage:" in ran.stdout, ran.stderr[-2000:]
