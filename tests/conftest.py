"""Fixtures shared by the tests. The prerequisite policy lives in ccscope_testkit.prereqs (testkit/)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import pytest
from ccscope.cc import registry
from ccscope.host import state
from ccscope_testkit.net import process_states, remove_stale_namespaces
from ccscope_testkit.prereqs import SLOW_MODULES
from ccscope_testkit.stallwatch import Watch
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


_WATCH: list[Watch] = []  # the session's machine watcher (ccscope_testkit.stallwatch)
_MODULE_START: dict[str, float] = {}  # monotonic time each module's first test began: its fixtures' runs too


def _start_watch() -> None:
    _WATCH.append(Watch(Path(tempfile.mkdtemp(prefix="ccscope-stallwatch-"))))


def pytest_unconfigure() -> None:
    for watcher in _WATCH:
        watcher.stop()
        shutil.rmtree(watcher.directory, ignore_errors=True)


_TEST_START: dict[str, float] = {}  # monotonic time each test's setup began


def pytest_runtest_setup(item: pytest.Item) -> None:
    if _WATCH:
        _TEST_START[item.nodeid] = _WATCH[0].mark()
        if item.module is not None and item.module.__name__ not in _MODULE_START:
            _MODULE_START[item.module.__name__] = _TEST_START[item.nodeid]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo) -> Iterator[None]:
    """A failure's report carries what the machine did since its module began (its fixtures' scenario runs are
    the numbers it asserts on): how late a watcher woke at worst, and the steal."""
    outcome = yield
    report = outcome.get_result()
    if _WATCH and report.failed and item.module is not None:
        end = _WATCH[0].mark()
        start = _MODULE_START.get(item.module.__name__, end)
        report.sections.append(("machine since the module began", _WATCH[0].during(start, end).describe()))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _WATCH:
        end = _WATCH[0].mark()
        terminalreporter.write_line(f"over the session, {_WATCH[0].during(_WATCH[0].started, end).describe()}")


def pytest_sessionstart(session: pytest.Session) -> None:
    """What killed runs could not remove (SIGKILL runs no teardown), so that it fails no test of this one:
    test namespaces by their owner's pid, and what `ccscope cleanup` removes (never a live run's). A suite
    killed by a restart in test_scenario_full left a pantheon-12mbit run's three namespaces and Copa
    registered; every later scenario run on that machine then refused to start (30 failed, 12 errors)."""
    _start_watch()
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


MIN_MACHINE_SHARE = 0.5  # below it, a rate measured on an emulated link says more about the host than about us


class MachineShare(Protocol):
    def __call__(self, this_test: bool = False, span: tuple[float, float] | None = None) -> float: ...


@pytest.fixture
def machine_share(request: pytest.FixtureRequest) -> MachineShare:
    """The part of the machine's time we had (stallwatch's Span.share) since this module began, its module fixtures'
    runs included; with this_test=True since this test's setup began; or over a span (time.monotonic) a session
    fixture's run recorded. A test scales the rate it expects of an emulated link by it, since our processes are
    the link. The CI run of 2026-11-29 read steal of 31-37 % (a share of 0.63-0.69), where flows carried 75-90 % of
    their quiet goodput; this machine under load read 0.72 the same day, and 0.98 idle. Under MIN_MACHINE_SHARE
    the test fails, saying so: no bound is left worth asserting."""

    def share(this_test: bool = False, span: tuple[float, float] | None = None) -> float:
        if not _WATCH:
            return 1.0
        now = _WATCH[0].mark()
        if span is not None:
            what, (start, end) = "the run this test reads", span
        elif this_test:
            what, start, end = "this test", _TEST_START.get(request.node.nodeid, now), now
        else:
            what, start, end = "this module", _MODULE_START.get(request.module.__name__, now), now
        found = _WATCH[0].during(start, end)
        if found.share < MIN_MACHINE_SHARE:
            pytest.fail(f"the machine gave {what} {found.share:.0%} of its time, under {MIN_MACHINE_SHARE:.0%}: "
                        f"{found.describe()}")
        return found.share

    return share


@pytest.fixture
def ccscope_cmd() -> list[str]:
    """Run the CLI exactly as a user would, with this interpreter."""
    return [sys.executable, "-m", "ccscope.cli"]


@pytest.fixture(scope="session")
def watched_quick_scenario(tmp_path_factory: pytest.TempPathFactory) -> WatchedScenario:
    """wired-vs-wireless --quick run once, its live page watched and /metrics scraped (tests/watched_scenario.py)."""
    return watch(tmp_path_factory.mktemp("watched"))
