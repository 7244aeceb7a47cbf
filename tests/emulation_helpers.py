"""Checks that an emulation test left the host as it found it: no new ccs- namespace, no changed init-ns
qdisc, iptables rule or sysctl, no leftover delay-line/iperf3/ping process, no state file.

Other runs (other test sessions, other engineers) may share the machine, so we compare before/after and
only count what belongs to this process or to a dead run: their live testbeds are not our leftovers."""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from ccscope.cc import registry
from ccscope.emulation import Testbed
from ccscope.host import state
from pyroute2 import IPRoute

SYSCTLS = (
    "net/ipv4/tcp_allowed_congestion_control",
    "net/ipv4/tcp_congestion_control",
    "net/ipv4/ip_forward",
    "net/ipv4/tcp_ecn",  # `ecn:` sets it in the scenario's namespaces only
)
WATCHED_COMMS = {"ccscope-delayli", "iperf3", "ping"}


def _qdiscs() -> set[tuple]:
    with IPRoute() as ipr:
        return {(q["index"], q.get_attr("TCA_KIND"), q["handle"], q["parent"]) for q in ipr.get_qdiscs()}


def _iptables() -> str:
    out = subprocess.run(["iptables-save"], capture_output=True, text=True, check=False).stdout
    lines = [re.sub(r"\[\d+:\d+\]", "", ln) for ln in out.splitlines() if not ln.startswith("#")]
    return "\n".join(lines)


def _procs() -> set[int]:
    pids = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if Path(f"/proc/{entry}/comm").read_text().strip() in WATCHED_COMMS:
                    pids.add(int(entry))
            except OSError:
                pass
    return pids


def _netns_inode(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}/ns/net").st_ino
    except OSError:
        return None


def _mounted_netns_inodes() -> set[int]:
    inodes = {os.stat("/proc/self/ns/net").st_ino}  # the tests run in the init namespace
    for name in os.listdir("/run/netns") if os.path.isdir("/run/netns") else []:
        with contextlib.suppress(OSError):
            inodes.add(os.stat(f"/run/netns/{name}").st_ino)
    return inodes


def _ours_or_dead(run: state.RunState | None) -> bool:
    return run is None or run.pid == os.getpid() or not run.alive()


def _foreign_live_runs() -> list[state.RunState]:
    return [r for r in state.all_states() if r.pid != os.getpid() and r.alive()]


def foreign_live_namespaces() -> set[str]:
    """Namespaces of other processes' live runs: never a test's leftovers."""
    return {ns for r in _foreign_live_runs() for ns in r.namespaces}


def _foreign_registrations() -> set[str]:
    """BPF congestion controls that another live process uses (a scenario, `ccscope cc load`)."""
    me = os.getpid()
    return {name for name, reg in registry.current().items() if any(u["pid"] != me for u in reg.live_users())}


def _foreign_allowed() -> set[str]:
    """Names other live processes added to tcp_allowed_congestion_control (or may add or remove meanwhile)."""
    return {a for r in _foreign_live_runs() for a in r.allowed_added} | _foreign_registrations()


def _state_files() -> set[str]:
    d = state.state_dir()
    return {p.name for p in d.iterdir() if p.name != ".lock"} if d.is_dir() else set()


@dataclass
class HostSnapshot:
    namespaces: set[str]
    qdiscs: set[tuple]
    iptables: str
    sysctls: dict[str, str]
    procs: set[int]
    state_files: set[str]
    foreign_allowed: set[str]

    @classmethod
    def take(cls) -> HostSnapshot:
        return cls(
            namespaces=set(state.list_namespaces()),
            qdiscs=_qdiscs(),
            iptables=_iptables(),
            sysctls={k: Path("/proc/sys", k).read_text().strip() for k in SYSCTLS},
            procs=_procs(),
            state_files=_state_files(),
            foreign_allowed=_foreign_allowed(),
        )

    def assert_unchanged(self) -> None:
        after = HostSnapshot.take()
        runs = {ns: r for r in state.all_states() for ns in r.namespaces}
        new_ns = {ns for ns in after.namespaces - self.namespaces
                  if not ns.startswith("ccs-probe-") and _ours_or_dead(runs.get(ns))}
        assert not new_ns, f"namespaces left behind: {sorted(new_ns)}"
        assert after.qdiscs == self.qdiscs, f"init-ns qdiscs changed: {after.qdiscs ^ self.qdiscs}"
        assert after.iptables == self.iptables, "init-ns iptables rules changed"
        allowed = "net/ipv4/tcp_allowed_congestion_control"
        foreign = self.foreign_allowed | after.foreign_allowed
        for key in SYSCTLS:
            if key == allowed:  # a foreign run live before or after may have added or removed its algorithms
                b, a = set(self.sysctls[key].split()) - foreign, set(after.sysctls[key].split()) - foreign
                assert a == b, f"{key} changed: {self.sysctls[key]} -> {after.sysctls[key]}"
            else:
                assert after.sysctls[key] == self.sysctls[key], f"{key} changed"
        # Our leftovers: new processes in a namespace that no longer exists (or in ours).
        left: set[int] = set()
        for _ in range(20):
            live_ns = _mounted_netns_inodes()
            left = {p for p in after.procs - self.procs
                    if (ino := _netns_inode(p)) is not None and ino not in live_ns}
            if not left:
                break
            time.sleep(0.1)
            after.procs = _procs()
        assert not left, f"processes left behind: {sorted(left)}"
        new_state = {f for f in after.state_files - self.state_files
                     if not f.endswith(".json") or _ours_or_dead(state.RunState.load(state.state_dir() / f))}
        new_state = {f for f in new_state if (state.state_dir() / f).exists()}
        new_state -= {f"{r.run_id}.d" for r in _foreign_live_runs()}
        if _foreign_registrations():  # shared by every process that registers an algorithm
            new_state.discard(registry.FILENAME)
        assert not new_state, f"state files left behind: {sorted(new_state)}"


def left_by(pid: int) -> list[str]:
    """What the finished process `pid` left behind: its run-state files, their namespaces, and the scratch
    namespace of its backend probe. Other runs on this machine are not counted."""
    runs = [r for r in state.all_states() if r.pid == pid]
    names = set(state.list_namespaces())
    return ([f"state file {r.run_id}" for r in runs] + [ns for r in runs for ns in r.namespaces if ns in names]
            + sorted(ns for ns in names if ns.startswith(f"ccs-probe-{pid}-")))


def iperf3(tb: Testbed, *args: str, seconds: float = 3, omit: float = 1, port_offset: int = 0,
           port: int | None = None) -> dict:
    """One iperf3 run sender -> receiver (TCP unless `args` say -u); returns the -J document. Runs side by side
    take different `port_offset`s; `port` fixes the server's port instead."""
    port = str(port if port is not None else 5201 + os.getpid() % 1000 + port_offset)
    server = tb.popen(tb.receiver_ns, ["iperf3", "-s", "-1", "-p", port], stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        listening = tb.run(tb.receiver_ns, ["ss", "-Hltn", f"sport = :{port}"], timeout=5).stdout
        if listening.strip():
            break
        time.sleep(0.02)
    res = tb.run(tb.sender_ns, ["iperf3", "-c", tb.receiver_addr, "-p", port, "-J", "-t", str(seconds),
                                "-O", str(omit), *args], timeout=seconds + omit + 20)
    server.wait(timeout=5)
    data = json.loads(res.stdout)
    assert "error" not in data, data.get("error")
    return data


def tcp_ext(tb: Testbed, ns: str, *names: str) -> dict[str, int]:
    """The namespace's own TCP counters `names` (nstat -a: absolute, and a testbed's namespaces are new; -s: its
    history file left alone). One the kernel does not count fails the test, saying which."""
    out = tb.run(ns, ["nstat", "-asz", *names], timeout=5).stdout
    found = {name: int(value) for name, value, *_ in (line.split() for line in out.splitlines()[1:])}
    missing = [name for name in names if name not in found]
    assert not missing, f"this kernel does not count {', '.join(missing)}"
    return found
