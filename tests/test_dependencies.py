"""Dependency floors are the versions tools/test-lowest installs, and the daemon's commands load no scenario stack."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import tomllib

from ccscope_testkit.prereqs import ROOT, SLOW_MODULES

_FLOOR = re.compile(r"^([A-Za-z0-9_.-]+)\s*(?:>=|==)\s*([0-9][0-9A-Za-z.!]*)")


def _floors() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"]) + [s for group in project["optional-dependencies"].values() for s in group]
    floors = {}
    for spec in specs:
        match = _FLOOR.match(spec)
        assert match, f"{spec!r}: every dependency names its lowest version with >= (or its one version with ==)"
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


def test_a_run_without_its_report_loads_no_matplotlib() -> None:
    """`ccscope scenario run --no-report` prints the summary table from summary.py: importing report.py for
    it cost 20 s of matplotlib (its import and font cache) at each boot of the stock-kernel lab under TCG."""
    loaded = _modules_loaded_by("import ccscope.scenario.cli, ccscope.scenario.runner, ccscope.scenario.summary")
    assert not any(m.split(".")[0] == "matplotlib" for m in loaded)


def test_report_and_merge_stand_without_the_runner() -> None:
    """`ccscope report` and `ccscope merge` need the store and the report, not the run lifecycle (merge used
    to borrow the runner's report writer and out-dir check, and with them the probe and the live page)."""
    for module in ("ccscope.scenario.report", "ccscope.scenario.merge"):
        loaded = _modules_loaded_by(f"import {module}")
        assert not {"ccscope.scenario.runner", "ccscope.loader", "ccscope.live.app"} & loaded, module


# The layers of docs/architecture.md, lowest first: a module may import its own layer and those below.
LAYERS = (
    {"ccscope", "errors", "units", "safe_input", "hosttools", "libbpf", "ringbuf", "bpf_types", "exposition",
     "flowscan", "linewriter", "otlp_http"},
    {"host"},
    {"telemetry", "cc", "attribution", "flows", "tracejson", "sample", "loader", "ccstate", "exporter",
     "metrics_endpoint", "web", "live", "otlp"},
    {"emulation"},
    {"scenario", "serve", "results"},  # serve: the far end of a real-path scenario; results: its tables
    {"cli", "check"},
)
PACKAGE = ROOT / "daemon" / "ccscope"
ALL_GROUPS = set().union(*LAYERS)


def _layer(group: str) -> int:
    return next(i for i, members in enumerate(LAYERS) if group in members)


def _group(module: str) -> str:
    """ccscope.cc.registry -> cc; ccscope.units -> units; ccscope -> ccscope."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _is_module(parts: list[str]) -> bool:
    """`from . import x`: x is a module or package, not a name (like __version__)."""
    path = PACKAGE.parent.joinpath(*parts)
    return path.is_dir() or path.with_suffix(".py").is_file()


def _imports(path) -> list[str]:
    """Every ccscope module a file imports, at the top or inside a function."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level:
            base = package.split(".")[: len(package.split(".")) - node.level + 1]
            found += [".".join([*base, node.module])] if node.module else \
                [".".join([*base, alias.name]) if _is_module([*base, alias.name]) else ".".join(base)
                 for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            found.append(node.module or "")
    return [name for name in found if name.split(".")[0] == "ccscope"]


def test_no_package_imports_a_layer_above_its_own() -> None:
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        group = _group(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        for name in _imports(path):
            if _layer(_group(name)) > _layer(group):
                upward.append(f"{path.relative_to(ROOT)} imports {name}")
    assert upward == []


def test_no_two_packages_import_each_other() -> None:
    """Within a layer an import goes one way: scenario/ uses serve/'s protocol client, serve/ uses nothing of
    scenario/ (what both need, a flow's sample, sits below them in sample.py)."""
    edges = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        group = _group(".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts))
        edges |= {(group, _group(name)) for name in _imports(path) if _group(name) != group}
    assert sorted((a, b) for a, b in edges if (b, a) in edges) == []


def test_the_architecture_document_draws_these_layers() -> None:
    """docs/architecture.md's layer table, row by row from the top, names every group of LAYERS from the
    bottom up in its own row and no other row (it had cc/ in the host row and left out web/ and otlp.py)."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text.split("## The packages, in layers", 1)[1].split("\n\n")[2]
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| layer")]
    cells = [row.split(" | ")[1] for row in rows]
    assert len(cells) == len(LAYERS)
    for cell, members in zip(reversed(cells), LAYERS, strict=True):
        named = {m for m in ALL_GROUPS if f"`{m}/`" in cell or f"`{m}.py`" in cell}
        assert named - {"ccscope"} >= members - {"ccscope"} and not named - members, (cell[:60], named ^ members)


def test_slow_modules_exist() -> None:
    """A renamed module would silently leave the fast tier's list."""
    assert [name for name in SLOW_MODULES if not (ROOT / "tests" / f"{name}.py").is_file()] == []
