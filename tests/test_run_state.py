"""Runs that share the init namespace's tcp_allowed_congestion_control: a name two runs need stays allowed
until the last of them ends, and then goes. Real sysctl, real run-state files, real live processes as the
runs' owners (two `sleep`s), all restored on failure."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator

import pytest
from ccscope.host import algorithms, state
from ccscope_testkit.prereqs import require, require_root


def _run_owned_by(proc: subprocess.Popen, run_id: str) -> state.RunState:
    return state.RunState(run_id=run_id, pid=proc.pid, pid_start=state.pid_start(proc.pid), created=time.time(),
                          namespaces=[], allowed_original=" ".join(algorithms.allowed_algorithms()))


@pytest.fixture
def two_runs() -> Iterator[tuple[state.RunState, state.RunState, str]]:
    require_root()
    spare = sorted(algorithms.available_algorithms() - set(algorithms.allowed_algorithms()))
    require(bool(spare), "every available algorithm is already allowed: nothing to add")
    name = spare[0]
    before = algorithms.allowed_algorithms()
    owners = [subprocess.Popen(["sleep", "120"]) for _ in range(2)]
    runs = [_run_owned_by(p, f"test-shared-{p.pid}") for p in owners]
    try:
        yield runs[0], runs[1], name
    finally:
        for run in runs:
            run.path.unlink(missing_ok=True)
        for proc in owners:
            proc.kill()
            proc.wait()
        with state.locked():
            if name in algorithms.allowed_algorithms() and name not in before:
                algorithms.write_allowed([a for a in algorithms.allowed_algorithms() if a != name])


def test_a_shared_addition_stays_until_the_last_run_ends(two_runs) -> None:
    first, second, name = two_runs
    state.allow_algorithm(first, name)
    state.allow_algorithm(second, name)  # already allowed, but only because `first` added it
    assert name in algorithms.allowed_algorithms()
    assert second.allowed_added == [name]

    with state.locked():
        assert state.release_algorithms(first, [second]) is None
    assert name in algorithms.allowed_algorithms(), "removed while another run still needs it"

    with state.locked():
        value = state.release_algorithms(second, [])
    assert value is not None and name not in value.split()
    assert name not in algorithms.allowed_algorithms(), "left allowed after the last run ended"


def test_a_name_the_user_allowed_is_never_taken_away(two_runs) -> None:
    first, _, name = two_runs
    with state.locked():
        algorithms.write_allowed([*algorithms.allowed_algorithms(), name])
    state.allow_algorithm(first, name)
    assert first.allowed_added == []
    with state.locked():
        assert state.release_algorithms(first, []) is None
    assert name in algorithms.allowed_algorithms()
