"""Dependency floors are the versions tools/test-lowest installs, and the daemon's commands load no scenario stack."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib

from prereqs import ROOT

_FLOOR = re.compile(r"^([A-Za-z0-9_.-]+)\s*>=\s*([0-9][0-9A-Za-z.]*)")


def _floors() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"]) + list(project["optional-dependencies"]["dev"])
    floors = {}
    for spec in specs:
        match = _FLOOR.match(spec)
        assert match, f"{spec!r}: every dependency names its lowest version with >="
        floors[match.group(1).lower()] = match.group(2)
    return floors


def _pins() -> dict[str, str]:
    lines = (ROOT / "tools" / "lowest-versions.txt").read_text().splitlines()
    pairs = [line.split("==") for line in lines if line.strip() and not line.startswith("#")]
    return {name.strip().lower(): version.strip() for name, version in pairs}


def test_lowest_versions_file_pins_exactly_the_floors() -> None:
    assert _pins() == _floors()


def _modules_loaded_by(statement: str) -> set[str]:
    code = f"import sys\n{statement}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_daemon_commands_load_no_scenario_stack() -> None:
    """`ccscope daemon`, `flows` and `trace` run from cli.main: everything cli.py imports at start is theirs."""
    loaded = _modules_loaded_by("import ccscope.cli; ccscope.cli.build_parser()")
    heavy = sorted(m for m in loaded if m.split(".")[0] in ("pyroute2", "matplotlib"))
    stack = sorted(m for m in loaded if m.startswith(("ccscope.scenario.", "ccscope.emulation")))
    allowed = {"ccscope.scenario.cli"}  # the `scenario` subcommands' parser: it imports its stack lazily
    assert heavy == []
    assert sorted(set(stack) - allowed) == []
