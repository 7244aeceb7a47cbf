"""Fault injection: a real scenario killed with SIGINT, SIGTERM and SIGKILL at several points.

Nothing lost: every completed run is in results.json (or its journal), `ccscope report` renders the
partial directory, `--resume` runs only the missing runs. Nothing left: after the run (SIGINT/SIGTERM)
or `ccscope cleanup` (SIGKILL), none of THIS run's namespaces, processes or BPF programs remain, and the
host's qdiscs, iptables rules and sysctls are as before. Other engineers' scenarios run on this machine
at the same time, so only what the killed process created is checked (by its pid and namespaces).

Each scenario here is 2 profiles x 1 algorithm, 3 s flows, on the userspace backend (so a delay-line
process and NFQUEUE rules are among what a kill leaves behind, also where netem exists): a run takes ~5 s."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from ccscope.emulation import PathProfile, Testbed
from ccscope.host import state
from ccscope.scenario import results, store
from ccscope_testkit.net import held_prog_ids
from ccscope_testkit.prereqs import require_scenario
from emulation_helpers import HostSnapshot

SCENARIO = """
name: faults
algorithms: [cubic]
duration: 3s
warmup: 1s
profiles:
  fast: {rate: 20mbit, delay: 5ms}
  slow: {rate: 5mbit, delay: 10ms}
traffic:
  bulk: {flows: 1}
  ping: {interval: 0.2s}
"""
DEADLINE_S = 120


@pytest.fixture(autouse=True)
def prerequisites():
    require_scenario()


@pytest.fixture
def scenario_file(tmp_path) -> Path:
    path = tmp_path / "faults.yaml"
    path.write_text(SCENARIO)
    return path


def _loaded_prog_ids() -> set[int]:
    return {p["id"] for p in json.loads(subprocess.check_output(["bpftool", "prog", "show", "-j"]))}


def _journal_runs(out: Path) -> list[str]:
    try:
        lines = (out / store.JOURNAL).read_text().split("\n")[:-1]  # a torn last line is not a run yet
    except OSError:
        return []
    return [json.loads(line)["run"]["label"] for line in lines if '"kind":"run"' in line[:20]]


def _results_finished(out: Path) -> bool:
    """Every run is saved and the run phase is over (finished_at is written after the telemetry is torn
    down, just before the report phase; `complete` alone turns true a moment earlier)."""
    try:
        doc = json.loads((out / "results.json").read_text())
    except (OSError, ValueError):
        return False
    return doc.get("complete") is True and bool(doc.get("finished_at"))


def _mangle_nfqueue_rules(ns: str) -> int:
    proc = subprocess.run(["ip", "netns", "exec", ns, "iptables", "-t", "mangle", "-S"], capture_output=True,
                          text=True, check=False)
    return sum("NFQUEUE" in line for line in proc.stdout.splitlines())


def _sigint_default() -> None:
    # A shell without job control starts background children with SIGINT ignored; a user's Ctrl-C is not.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@dataclass
class Scenario:
    """A `ccscope scenario run` process, and what it created: namespaces, their processes, BPF programs."""

    proc: subprocess.Popen
    stderr: Path
    namespaces: set[str] = field(default_factory=set)
    run_ids: set[str] = field(default_factory=set)
    ns_procs: dict[int, int] = field(default_factory=dict)  # pid -> start time
    prog_ids: set[int] = field(default_factory=set)

    @classmethod
    def start(cls, ccscope_cmd, path: Path, tmp_path: Path, *args: str) -> Scenario:
        stderr = tmp_path / f"stderr-{time.monotonic_ns()}"
        with stderr.open("w") as err:
            proc = subprocess.Popen([*ccscope_cmd, "scenario", "run", str(path), "--no-verify", "--listen", "off",
                                     "--backend", "userspace", *args], stdout=subprocess.DEVNULL, stderr=err,
                                    preexec_fn=_sigint_default, start_new_session=True)
        return cls(proc, stderr)

    def watch(self) -> None:
        if self.proc.poll() is not None:
            return
        with contextlib.suppress(OSError):  # it may just have exited
            self.prog_ids |= held_prog_ids(self.proc.pid)
        for run in state.all_states():
            if run.pid == self.proc.pid:
                self.namespaces.update(run.namespaces)
                self.run_ids.add(run.run_id)
        for ns in self.namespaces:
            for pid in state.namespace_pids(ns):
                if (start := state.pid_start(pid)) is not None:
                    self.ns_procs.setdefault(pid, start)

    def sending(self) -> bool:
        """A process (the iperf3 client) runs in the sender namespace of the current testbed."""
        current = [r for r in state.all_states() if r.pid == self.proc.pid]
        return any(state.namespace_pids(r.namespaces[0]) for r in current)

    def wait_for(self, what: str, condition) -> None:
        deadline = time.monotonic() + DEADLINE_S
        while not condition():
            assert self.proc.poll() is None, f"the scenario ended before {what}: {self.err()}"
            assert time.monotonic() < deadline, f"no {what} within {DEADLINE_S} s"
            self.watch()
            time.sleep(0.05)
        self.watch()

    def kill(self, sig: int) -> int:
        self.watch()
        assert self.proc.poll() is None, f"the scenario ended before it could be killed: {self.err()}"
        if sig == signal.SIGINT:  # Ctrl-C: the terminal signals the whole foreground process group
            os.killpg(self.proc.pid, sig)
        else:
            self.proc.send_signal(sig)
        return self.proc.wait(timeout=60)

    def finish(self) -> int:
        deadline = time.monotonic() + DEADLINE_S
        while self.proc.poll() is None and time.monotonic() < deadline:
            self.watch()
            time.sleep(0.1)
        return self.proc.wait(timeout=10)

    def err(self) -> str:
        return self.stderr.read_text()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def assert_nothing_left(self) -> None:
        """None of this run's namespaces, processes or BPF programs exist (programs are freed by the kernel
        a moment after the last fd closes: polled)."""
        assert self.namespaces, "the test never saw the run's namespaces"
        assert not self.namespaces & set(state.list_namespaces()), "namespaces left behind"
        left = {pid for pid, start in self.ns_procs.items() if state.pid_alive(pid, start)}
        assert not left, f"processes left behind: {sorted(left)}"
        assert not any(r.pid == self.proc.pid for r in state.all_states()), "run state file left behind"
        assert self.prog_ids, "the test never saw the run's BPF programs"
        deadline = time.monotonic() + 30
        while self.prog_ids & _loaded_prog_ids() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not self.prog_ids & _loaded_prog_ids(), "BPF programs left loaded"


ALLOWED = "net/ipv4/tcp_allowed_congestion_control"


def _allowed() -> set[str]:
    return set(Path("/proc/sys", ALLOWED).read_text().split())


@pytest.fixture
def host():
    """The init namespace's qdiscs and iptables rules, and whether cubic (the algorithm these scenarios
    add) is allowed, are as before: other sessions may change other algorithms meanwhile."""
    def foreign() -> set[str]:
        return {a for r in state.all_states() if r.alive() and r.pid != os.getpid() for a in r.allowed_added}

    snapshot = HostSnapshot.take()
    cubic_before = "cubic" in _allowed()
    foreign_before = foreign()
    yield
    after = HostSnapshot.take()
    assert after.qdiscs == snapshot.qdiscs, "init-ns qdiscs changed"
    assert after.iptables == snapshot.iptables, "init-ns iptables rules changed"
    if "cubic" not in foreign_before | foreign():  # else another session's run added or removed it meanwhile
        assert ("cubic" in _allowed()) == cubic_before, f"{ALLOWED} not restored"


@pytest.fixture
def started(ccscope_cmd, scenario_file, tmp_path):
    """Starts scenarios; whatever the test leaves running is killed and cleaned up, also on failure."""
    runs: list[Scenario] = []

    def start(*args: str) -> Scenario:
        if "--cleanup-stale" not in args:
            _wait_for_no_dead_leftovers(exclude={ns for r in runs for ns in r.namespaces})
        run = Scenario.start(ccscope_cmd, scenario_file, tmp_path, *args)
        runs.append(run)
        return run

    yield start
    for run in runs:
        run.stop()
        for ns in run.namespaces & set(state.list_namespaces()):
            state.remove_namespace(ns)
        with state.locked():
            for s in state.all_states():
                if s.pid == run.proc.pid:
                    others = [o for o in state.all_states() if o.run_id != s.run_id and o.alive()]
                    state.release_algorithms(s, others)
                    s.path.unlink(missing_ok=True)


def _wait_for_no_dead_leftovers(exclude: set[str]) -> None:
    """Another session's killed run may leave namespaces for a moment (until its own cleanup): a scenario
    started then refuses, rightly. Wait for them to go, with a deadline, so this test measures only itself."""
    deadline = time.monotonic() + 60
    while True:
        left = state.dead_leftovers()
        foreign = (set(left.namespaces) - exclude) | {s.run_id for s in left.states if not set(s.namespaces) <= exclude}
        if not foreign:
            return
        assert time.monotonic() < deadline, f"a killed run's leftovers stay on this host: {left.describe()} " \
                                            "(run `ccscope cleanup`)"
        time.sleep(0.2)


def _report(ccscope_cmd, out: Path) -> subprocess.CompletedProcess:
    for stale in ("report.html",):
        (out / stale).unlink(missing_ok=True)
    res = subprocess.run([*ccscope_cmd, "report", str(out)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    assert (out / "report.html").is_file()
    return res


def _resume_completes(ccscope_cmd, started, out: Path, before: dict, *extra: str) -> Scenario:
    """--resume runs exactly the missing runs, at their planned positions; the saved ones are kept as they are."""
    resumed = started("--resume", str(out), *extra)
    assert resumed.finish() == 0, resumed.err()
    err = resumed.err()
    done = len(before["runs"])
    total = len(before["run_order"])
    assert f"{done} of {total} runs done, {total - done} to run" in err
    ran = [line.split("]")[0].lstrip("[") for line in err.splitlines() if line.endswith("s of traffic)")]
    order = before["run_order"]
    assert ran == [f"{order.index(label) + 1}/{total}" for label in before["missing_runs"]], err
    doc = results.load(out)
    assert doc["complete"] is True and doc["missing_runs"] == [] and doc["interrupted"] is None
    assert doc["run_order"] == order and doc["seed"] == before["seed"]
    assert [r["label"] for r in doc["runs"]] == order
    assert [r["position"] for r in doc["runs"]] == list(range(1, total + 1))
    for saved in before["runs"]:
        assert doc["runs"][saved["position"] - 1] == saved
    assert len(doc["resumed_at"]) == 1
    assert len(_journal_runs(out)) == total
    for run in doc["runs"]:
        assert not run["errors"], run["errors"]
        assert run["flows"][0]["goodput_bps"] > 0.5 * doc["profiles"][run["profile"]]["up_rate_bps"]
    return resumed


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_after_first_run_saves_it_and_resume_completes(ccscope_cmd, tmp_path, started, host, sig):
    out = tmp_path / "out"
    run = started("--out", str(out))
    run.wait_for("a completed run", lambda: len(_journal_runs(out)) >= 1)
    saved = _journal_runs(out)
    code = run.kill(sig)
    err = run.err()
    assert code == 128 + sig, err
    assert "Traceback" not in err
    assert f"interrupted by {signal.Signals(sig).name} after 1 of 2 runs" in err and "--resume" in err
    # the process tore its emulation down itself
    run.assert_nothing_left()

    doc = results.load(out)  # valid against the schema, marked incomplete
    assert doc["complete"] is False and doc["interrupted"] == signal.Signals(sig).name
    assert [r["label"] for r in doc["runs"]] == saved
    assert doc["missing_runs"] == [label for label in doc["run_order"] if label not in saved]
    assert doc["summary"] and doc["summary"][0]["runs"] == 1
    res = _report(ccscope_cmd, out)
    assert "INCOMPLETE: 1 of 2 runs" in res.stdout
    assert "Incomplete: 1 of 2 runs" in (out / "report.html").read_text()

    if sig == signal.SIGTERM:  # (resuming after SIGINT is the same; SIGKILL resumes below)
        other = started("--resume", str(out), "--duration", "4s")  # a different scenario is not mixed in
        assert other.finish() == 2
        assert other.err().count("\n") == 1 and "scenario file duration: '3s' there, " in other.err()
        assert results.load(out)["runs"] == doc["runs"]
        _resume_completes(ccscope_cmd, started, out, doc).assert_nothing_left()


def test_sigkill_after_first_run_loses_nothing_and_blocks_the_next_run(ccscope_cmd, tmp_path, started, host):
    out = tmp_path / "out"
    run = started("--out", str(out))
    run.wait_for("a completed run", lambda: len(_journal_runs(out)) >= 1)
    # into the second run's traffic, so its delay line, iperf3 and NFQUEUE rules are live
    run.wait_for("the second run's traffic", lambda: run.sending() and any(
        _mangle_nfqueue_rules(ns) for ns in run.namespaces if ns.endswith("-rtr")
        and ns in state.list_namespaces()))
    saved = _journal_runs(out)
    assert run.kill(signal.SIGKILL) == -signal.SIGKILL
    ours = run.namespaces & set(state.list_namespaces())
    assert ours, "the killed run left no namespace: nothing to detect"

    doc = store.load(out)  # results.json and the journal hold every completed run
    assert [r["label"] for r in doc["runs"]] == saved and doc["complete"] is False
    assert [r["label"] for r in results.load(out)["runs"]] == saved
    res = _report(ccscope_cmd, out)
    assert "INCOMPLETE: 1 of 2 runs" in res.stdout

    # the next scenario sees the dead run's live leftovers and refuses, naming the fix
    refused = started("--resume", str(out))
    code = refused.finish()
    if ours & set(state.list_namespaces()):  # (unless someone else cleaned them up meanwhile)
        err = refused.err()
        assert code == 3 and err.count("\n") == 1, err
        assert "a killed run left" in err and "ccscope cleanup" in err and "--cleanup-stale" in err
        assert any(ns in err for ns in ours) or "..." in err
        # The kill may land while the run is tearing down (its processes and rules already gone, its
        # namespaces not yet): the message must name what is actually there. Rules cannot vanish after
        # the kill; a process alive now was alive when the refused run looked.
        if any(state.namespace_pids(ns) for ns in ours):
            assert "process" in err, err
        if sum(_mangle_nfqueue_rules(ns) for ns in ours):
            assert "NFQUEUE rule" in err, err
        assert results.load(out)["runs"] == doc["runs"]  # refused before touching anything

    # --cleanup-stale removes them (as `ccscope cleanup` does) and goes on
    resumed = _resume_completes(ccscope_cmd, started, out, doc, "--cleanup-stale")
    if "removed what a killed run left behind" not in resumed.err():
        assert not ours & set(state.list_namespaces())  # someone else's `ccscope cleanup` was faster
    run.assert_nothing_left()
    resumed.assert_nothing_left()
    cleanup = subprocess.run([*ccscope_cmd, "cleanup"], capture_output=True, text=True, timeout=60)
    assert cleanup.returncode == 0, cleanup.stderr
    assert not any(rid in cleanup.stdout for rid in run.run_ids | resumed.run_ids), "left for `ccscope cleanup`"


def test_sigkill_in_report_phase_keeps_all_runs(ccscope_cmd, tmp_path, started, host):
    out = tmp_path / "out"
    run = started("--out", str(out))
    run.wait_for("the report phase", lambda: _results_finished(out))
    assert run.kill(signal.SIGKILL) == -signal.SIGKILL
    run.assert_nothing_left()
    doc = results.load(out)
    assert doc["complete"] is True and len(doc["runs"]) == 2 and doc["finished_at"]
    assert _journal_runs(out) == [r["label"] for r in doc["runs"]]
    res = _report(ccscope_cmd, out)
    assert "INCOMPLETE" not in res.stdout and (out / "plots" / "cwnd.png").is_file()


@pytest.mark.parametrize("args, message", [
    (["--out", "/proc/nope/out"], "--out /proc/nope/out: cannot create"),
    (["--resume", "/proc/self"], "--resume /proc/self: not a results directory"),
    (["--out", "FILE"], "not a directory")])
def test_bad_output_directory_is_one_line(ccscope_cmd, scenario_file, args, message):
    args = [str(scenario_file) if a == "FILE" else a for a in args]
    res = subprocess.run([*ccscope_cmd, "scenario", "run", str(scenario_file), "--listen", "off", *args],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert message in res.stderr


def test_a_live_run_is_never_a_leftover(host):
    """Another scenario running on the machine (here: a testbed of this live process) is not reported."""
    profile = PathProfile.from_dict("live", {"rate": "10mbit", "delay": "5ms"}, "test")
    with Testbed(profile, backend="userspace") as tb:
        left = state.dead_leftovers()
        assert set(tb.namespaces) <= set(state.list_namespaces())
        assert not set(tb.namespaces) & set(left.namespaces)
        assert tb.run_id not in {s.run_id for s in left.states}


def test_ctrl_c_while_the_report_is_written_ends_with_130(tmp_path):
    """Rendering makes garbage; a SIGINT that lands in a finalizer was printed as 'Exception ignored' and lost,
    and the scenario exited 0 (about 2 times in 3 in the probe's runs). Here it lands in one for certain."""
    from ccscope.errors import Interrupted
    from ccscope.scenario.report import guarded

    class Garbage:
        def __del__(self) -> None:
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs inside the finalizer

    def render() -> Path:
        Garbage()  # collected at once: the KeyboardInterrupt is raised inside __del__ and swallowed there
        return tmp_path / "report.html"

    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(Interrupted) as info:
        guarded(render, tmp_path, 4)
    assert info.value.exit_code == 130
    assert "while writing the report; the 4 runs are saved" in info.value.line()
    assert signal.getsignal(signal.SIGINT) is before  # put back
