"""The suite cleans up after itself even when it is stopped: SIGTERM tears the fixtures down as Ctrl-C
does (tests/conftest.py), and what a SIGKILLed run left is removed by the next session, by its owner's
pid: the tests' own namespaces (ccscope_testkit.net.remove_stale_namespaces) and what `ccscope cleanup`
removes (a scenario's namespaces, state and BPF congestion controls)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from ccscope.cc import registry
from ccscope.host import state
from ccscope_testkit.net import CCSCOPE, netns_name, parent_pid, remove_stale_namespaces, run
from ccscope_testkit.prereqs import ROOT, require_root

SLEEPING_TEST = """
import time
import pytest
from ccscope_testkit.net import netns

@pytest.fixture
def scratch():
    with netns("sigterm") as name:
        print("namespace", name, flush=True)
        yield name

def test_sleeps(scratch):
    print("ready", flush=True)
    time.sleep(60)
"""


# A 30 s scenario of one algorithm, to be stopped while it runs.
LONG_SCENARIO = """
name: stopped-ALGORITHM
description: ALGORITHM, to be stopped while it runs
algorithms: [ALGORITHM]
duration: 30s
runs: 1
profiles:
  short: {rate: 10mbit, delay: 10ms, queue: 1bdp}
traffic:
  bulk: {flows: 1}
"""

# A test that runs a scenario as most tests do, with subprocess.run (which kills its child 0.25 s after a
# KeyboardInterrupt).
SCENARIO_CHILD_TEST = """
import subprocess
import sys

def test_runs_a_scenario():
    subprocess.run([sys.executable, "-m", "ccscope.cli", "scenario", "run", "SCENARIO", "--no-verify",
                    "--listen", "off", "--out", "OUT"], timeout=120)
"""


def _namespaces() -> set[str]:
    return set(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else set()


def _session(tmp_path: Path, test_file: str, **popen: object) -> subprocess.Popen:
    """A pytest session of its own over `test_file`, with the suite's conftest."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT / "tests"),
                                                                     os.environ.get("PYTHONPATH")]))}
    return subprocess.Popen([sys.executable, "-m", "pytest", "-s", "-q", "-p", "no:cacheprovider", "-p", "conftest",
                             "--rootdir", str(tmp_path), str(tmp_path / test_file)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path,
                            **popen)


def test_sigterm_tears_the_fixtures_down(tmp_path: Path) -> None:
    require_root()
    (tmp_path / "test_sleeping.py").write_text(SLEEPING_TEST)
    proc = _session(tmp_path, "test_sleeping.py")
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "ready" in line:
                break
        name = next(line.split()[-1] for line in lines if line.startswith("namespace"))
        assert name in _namespaces()
        proc.send_signal(signal.SIGTERM)
        rest = proc.communicate(timeout=30)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, "".join(lines) + rest  # pytest's "interrupted"
    assert name not in _namespaces(), "the fixture's namespace outlived a SIGTERM"


def test_sigterm_gives_a_scenario_child_its_teardown(tmp_path: Path) -> None:
    """SIGTERM to a session whose test waits in subprocess.run for a scenario: the scenario gets its Ctrl-C and
    tears down (namespaces, state) before pytest's KeyboardInterrupt kills what is left, and saves its results
    as interrupted by SIGINT."""
    require_root()
    out = tmp_path / "out"
    (tmp_path / "scenario.yaml").write_text(LONG_SCENARIO.replace("ALGORITHM", "reno"))
    (tmp_path / "test_scenario_child.py").write_text(
        SCENARIO_CHILD_TEST.replace("SCENARIO", str(tmp_path / "scenario.yaml")).replace("OUT", str(out)))
    session = _session(tmp_path, "test_scenario_child.py")
    ours = []
    try:
        deadline = time.monotonic() + 60
        while not ((ours := [r for r in state.all_states() if parent_pid(r.pid) == session.pid])
                   and set(ours[0].namespaces) <= _namespaces() and (out / "results.json").exists()):
            assert session.poll() is None and time.monotonic() < deadline, "the scenario never got going"
            time.sleep(0.1)
        session.send_signal(signal.SIGTERM)
        output = session.communicate(timeout=120)[0]
    finally:
        if session.poll() is None:
            session.kill()
            session.wait()
        for orphan in [r.pid for r in ours if parent_pid(r.pid) is not None]:  # a scenario the failure left running
            os.kill(orphan, signal.SIGINT)
        left = ours and set(ours[0].namespaces) & _namespaces()
        if left:
            subprocess.run([*CCSCOPE, "cleanup"], capture_output=True, timeout=60)
    assert session.returncode == 2, output  # pytest's "interrupted"
    assert not left, f"the scenario's namespaces outlived the session's SIGTERM: {left}"
    assert ours[0].path not in state.state_dir().iterdir()
    assert json.loads((out / "results.json").read_text())["interrupted"] == "SIGINT", output


def test_a_dead_test_process_namespaces_are_removed_and_no_one_elses() -> None:
    require_root()
    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid no longer exists
    alive = subprocess.Popen(["sleep", "60"])
    stale, live, mine, foreign = (f"ccst{gone.pid}-stale", f"ccst{alive.pid}-live", netns_name("mine"),
                                  f"ccscope-foreign{gone.pid}")
    made = [stale, live, mine, foreign]
    holder = None
    try:
        for name in made:
            run("ip", "netns", "add", name)
        holder = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "60"], start_new_session=True)
        deadline = time.monotonic() + 10
        while not run("ip", "netns", "pids", stale, check=False).stdout.strip():  # `sleep` runs in it
            assert time.monotonic() < deadline, "nothing entered the namespace"
            time.sleep(0.02)
        removed = remove_stale_namespaces()
        assert stale in removed and not {live, mine, foreign} & set(removed)
        assert stale not in _namespaces() and {live, mine, foreign} <= _namespaces()
        assert holder.wait(timeout=10) == -signal.SIGKILL  # what ran in it went with it
    finally:
        alive.kill()
        alive.wait()
        if holder is not None and holder.poll() is None:
            holder.kill()
            holder.wait()
        for name in made:
            run("ip", "netns", "del", name, check=False)


def _registered_for(pid: int) -> bool:
    return any(u["pid"] == pid for reg in registry.current().values() for u in reg.users)


def test_a_killed_scenario_is_cleaned_up_by_the_next_session(tmp_path: Path) -> None:
    """SIGKILL a scenario once its namespaces are up and BPF Copa is registered for it: the next session
    starts by removing both, and says so."""
    require_root()
    (tmp_path / "scenario.yaml").write_text(LONG_SCENARIO.replace("ALGORITHM", "copa"))  # BPF Copa
    scenario = subprocess.Popen([*CCSCOPE, "scenario", "run", str(tmp_path / "scenario.yaml"), "--no-verify",
                                 "--listen", "off", "--out", str(tmp_path / "out")],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not (_registered_for(scenario.pid) and (ours := [r for r in state.all_states()
                                                               if r.pid == scenario.pid])
                   and set(ours[0].namespaces) <= _namespaces()):
            assert scenario.poll() is None and time.monotonic() < deadline, "the scenario never got going"
            time.sleep(0.1)
        scenario.kill()
        scenario.wait(timeout=10)
    finally:
        if scenario.poll() is None:
            scenario.kill()
            scenario.wait()
    left = ours[0].namespaces
    assert set(left) <= _namespaces() and _registered_for(scenario.pid)  # SIGKILL ran no teardown
    (tmp_path / "test_nothing.py").write_text("def test_nothing():\n    pass\n")
    session = _session(tmp_path, "test_nothing.py")
    output = session.communicate(timeout=120)[0]
    assert session.returncode == 0, output
    assert "removed what killed runs left" in output and "BPF congestion control copa" in output, output
    assert not set(left) & _namespaces(), output
    assert not _registered_for(scenario.pid) and ours[0].path not in state.state_dir().iterdir()
