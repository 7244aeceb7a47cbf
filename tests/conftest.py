"""Fixtures shared by the tests. The prerequisite policy lives in ccscope_testkit.prereqs (testkit/)."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time

import pytest
from ccscope.cc import registry
from ccscope.host import state
from ccscope_testkit.net import process_states, remove_stale_namespaces
from ccscope_testkit.prereqs import SLOW_MODULES
from watched_scenario import WatchedScenario, watch


def pytest_configure() -> None:
    """Ctrl-C as a user's terminal delivers it, also when the suite itself was started in the background.

    A non-interactive shell starts `cmd &` with SIGINT ignored, the ignore is inherited across exec, and
    Python then keeps it instead of raising KeyboardInterrupt: run that way (`nohup bash .ci/run &`), the four
    tests that press Ctrl-C on a child saw it ignored (exit 0 instead of 130; a testbed that never left). A
    Python handler here is reset to the default in every child at exec, so each child starts as from a
    terminal."""
    signal.signal(signal.SIGINT, _interrupted)
    signal.signal(signal.SIGTERM, _interrupted)


CHILD_SIGNAL_WAIT_S = 2.0  # for children that got the same signal (a terminal's Ctrl-C, a job's group kill)
CHILD_TEARDOWN_S = 60.0  # a scenario's teardown takes 1-3 s; the bound for children that never exit
_STOPPING: list[int] = []  # the signal being handled, once one came


def _interrupted(signum: int, frame: object) -> None:
    """SIGINT and SIGTERM (a CI job's timeout, `kill`, the end of a session) as Ctrl-C: pytest then tears
    every fixture down, as it does on KeyboardInterrupt. Python's default for SIGTERM ends the process on the
    spot, and a suite stopped that way in test_realpath left its four namespaces (ccrp729-*) and their delay
    lines. First the session's children get their Ctrl-C and the time to act on it: subprocess.run kills its
    child 0.25 s after a KeyboardInterrupt, and a SIGTERM during test_bbr_vs_cubic's sweep so left the
    scenario's three namespaces and two delay lines behind. A second signal meanwhile stops the waiting."""
    if not _STOPPING:
        _STOPPING.append(signum)
        children = _running_children()
        _wait_gone(children, CHILD_SIGNAL_WAIT_S)
        for pid in _running(children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGINT)
        _wait_gone(children, CHILD_TEARDOWN_S)
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}")


def _running_children() -> list[int]:
    """This process's children that have not exited (a zombie is left for its Popen to reap)."""
    me = os.getpid()
    return [pid for pid, ppid, process_state in process_states() if ppid == me and process_state != "Z"]


def _running(pids: list[int]) -> list[int]:
    alive = {pid for pid, _, process_state in process_states() if process_state != "Z"}
    return [pid for pid in pids if pid in alive]


def _wait_gone(pids: list[int], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while _running(pids) and time.monotonic() < deadline:
        time.sleep(0.05)


def pytest_sessionstart(session: pytest.Session) -> None:
    """What killed runs could not remove (SIGKILL runs no teardown), so that it fails no test of this one:
    test namespaces by their owner's pid, and what `ccscope cleanup` removes (never a live run's). A suite
    killed by a restart in test_scenario_full left a pantheon-12mbit run's three namespaces and Copa
    registered; every later scenario run on that machine then refused to start (30 failed, 12 errors)."""
    if os.geteuid() != 0:
        return
    if removed := remove_stale_namespaces():
        print(f"ccscope tests: removed {len(removed)} namespaces of test processes that no longer exist: "
              f"{' '.join(removed)}", file=sys.stderr)
    if removed := state.cleanup_all(include_live=False) + registry.cleanup():
        print(f"ccscope tests: removed what killed runs left: {'; '.join(removed)}", file=sys.stderr)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.module is not None and item.module.__name__ in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def ccscope_cmd() -> list[str]:
    """Run the CLI exactly as a user would, with this interpreter."""
    return [sys.executable, "-m", "ccscope.cli"]


@pytest.fixture(scope="session")
def watched_quick_scenario(tmp_path_factory: pytest.TempPathFactory) -> WatchedScenario:
    """wired-vs-wireless --quick run once, its live page watched and /metrics scraped (tests/watched_scenario.py)."""
    return watch(tmp_path_factory.mktemp("watched"))
