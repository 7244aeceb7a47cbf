"""Run state on disk, and `cleanup_all()` for whatever a killed run left behind.

Every Testbed writes /run/ccscope/<run_id>.json *before* it changes anything: its namespaces and the
init-namespace sysctl values it found. Everything else a run creates lives inside its own "ccs-"
namespaces (veths, qdiscs, iptables rules, the delay line and traffic processes), so deleting those
namespaces after killing their processes removes it all. The only host-wide change is
net.ipv4.tcp_allowed_congestion_control, which gains the algorithms a run needs; runs record what
they added and give back only additions no other live run still needs.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ccscope.hosttools import sh

from . import algorithms

NS_PREFIX = "ccs-"
_PROBE_NS = re.compile(r"^ccs-probe-(\d+)-")


def state_dir() -> Path:
    return Path(os.environ.get("CCSCOPE_STATE_DIR", "/run/ccscope"))


def pid_start(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[19])  # field 22, starttime


def pid_alive(pid: int, start: int | None = None) -> bool:
    now = pid_start(pid)
    return now is not None and (start is None or now == start)


@dataclass
class RunState:
    run_id: str
    pid: int
    pid_start: int | None
    created: float
    namespaces: list[str]
    allowed_original: str
    allowed_added: list[str] = field(default_factory=list)
    backend: str | None = None

    @property
    def path(self) -> Path:
        return state_dir() / f"{self.run_id}.json"

    @classmethod
    def new(cls, run_id: str, namespaces: list[str]) -> RunState:
        pid = os.getpid()
        return cls(run_id=run_id, pid=pid, pid_start=pid_start(pid), created=time.time(),
                   namespaces=list(namespaces), allowed_original=" ".join(algorithms.allowed_algorithms()))

    def save(self) -> None:
        state_dir().mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(self.path)

    @classmethod
    def load(cls, path: Path) -> RunState | None:
        try:
            data = json.loads(path.read_text())
            return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def alive(self) -> bool:
        return pid_alive(self.pid, self.pid_start)


def all_states() -> list[RunState]:
    d = state_dir()
    if not d.is_dir():
        return []
    return [s for p in sorted(d.glob("*.json")) if (s := RunState.load(p)) is not None]


@contextlib.contextmanager
def locked() -> Iterator[None]:
    """Serializes changes to the shared sysctl and the state files between concurrent runs."""
    state_dir().mkdir(parents=True, exist_ok=True)
    with open(state_dir() / ".lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def allow_algorithm(state: RunState, name: str) -> None:
    """Adds `name` to the init namespace's allowed list, recording the addition first. A name that another
    live run added is shared: this run records it too, so whichever run ends last removes it."""
    with locked():
        current = algorithms.allowed_algorithms()
        if name in current and not _added_by_another(state, name):
            return
        if name not in state.allowed_added:
            state.allowed_added.append(name)
        state.save()
        if name not in current:
            algorithms.write_allowed([*current, name])


def _added_by_another(state: RunState, name: str) -> bool:
    return any(name in other.allowed_added for other in all_states()
               if other.run_id != state.run_id and other.alive())


def release_algorithms(state: RunState, others: list[RunState]) -> str | None:
    """Removes this run's additions that no other run still needs; returns the new value if changed.
    Call with the lock held. A run that shared another's addition saw it in the list when it started, so
    its own `allowed_original` is no proof that the user allowed the name."""
    if not state.allowed_added:
        return None
    needed = set(state.allowed_original.split()) - set(state.allowed_added)
    for other in others:
        needed.update(other.allowed_added)
    current = algorithms.allowed_algorithms()
    keep = [a for a in current if a not in state.allowed_added or a in needed]
    if keep == current:
        return None
    algorithms.write_allowed(keep)
    return " ".join(keep)


def list_namespaces() -> list[str]:
    try:
        return sorted(n for n in os.listdir("/run/netns") if n.startswith(NS_PREFIX))
    except FileNotFoundError:
        return []


def namespace_pids(ns: str) -> list[int]:
    """The processes in network namespace `ns`, as `ip netns pids` finds them: each /proc/PID/ns/net that is the
    namespace's file (read here, not by running `ip`: one process fewer per namespace a run removes)."""
    try:
        target = os.stat(f"/run/netns/{ns}")
    except OSError:
        return []
    pids = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            found = os.stat(f"/proc/{entry.name}/ns/net")
        except OSError:  # gone meanwhile, or a kernel thread's
            continue
        if (found.st_dev, found.st_ino) == (target.st_dev, target.st_ino):
            pids.append(int(entry.name))
    return pids


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


def remove_namespace(ns: str) -> list[str]:
    """Kills every process in `ns`, then deletes it; returns what it removed."""
    removed = []
    for attempt in range(50):
        pids = namespace_pids(ns)
        if not pids:
            break
        for pid in pids:
            if attempt == 0:
                removed.append(f"process {pid} ({_comm(pid)}) in {ns}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    if Path(f"/run/netns/{ns}").exists():
        sh(["ip", "netns", "del", ns], check=False)
        removed.append(f"netns {ns}")
    return removed


def _owner_alive(ns: str, states: dict[str, RunState]) -> bool:
    m = _PROBE_NS.match(ns)
    if m:
        return pid_alive(int(m.group(1)))
    for state in states.values():
        if ns in state.namespaces:
            return state.alive()
    return False


@dataclass
class Leftovers:
    """What runs whose process is gone left behind (never anything of a live run)."""

    namespaces: list[str]
    processes: list[str]  # command names of the processes still running in those namespaces
    nfqueue_rules: int
    states: list[RunState]

    def __bool__(self) -> bool:
        return bool(self.namespaces or self.states)

    def describe(self) -> str:
        parts = []
        if self.namespaces:
            shown = ", ".join(self.namespaces[:6]) + (", ..." if len(self.namespaces) > 6 else "")
            parts.append(f"{len(self.namespaces)} namespace{'s' if len(self.namespaces) != 1 else ''} ({shown})")
        if self.processes:
            counts = {c: self.processes.count(c) for c in sorted(set(self.processes))}
            parts.append(f"{len(self.processes)} process{'es' if len(self.processes) != 1 else ''} ("
                         + ", ".join(f"{c} x{n}" if n > 1 else c for c, n in counts.items()) + ")")
        if self.nfqueue_rules:
            parts.append(f"{self.nfqueue_rules} NFQUEUE rule{'s' if self.nfqueue_rules != 1 else ''}")
        if self.states:
            parts.append(f"{len(self.states)} run state file{'s' if len(self.states) != 1 else ''}")
        return ", ".join(parts)


def _nfqueue_rules(ns: str) -> int:
    proc = subprocess.run(["ip", "netns", "exec", ns, "iptables", "-t", "mangle", "-S"], capture_output=True,
                          text=True, check=False)
    return sum("NFQUEUE" in line for line in proc.stdout.splitlines())


def dead_leftovers() -> Leftovers:
    """What `cleanup_all(include_live=False)` (`ccscope cleanup`) would remove, without removing it."""
    with locked():
        states = {s.run_id: s for s in all_states()}
        namespaces = [ns for ns in list_namespaces() if not _owner_alive(ns, states)]
        dead = [s for s in states.values() if not s.alive()]
    processes = [_comm(pid) for ns in namespaces for pid in namespace_pids(ns)]
    rules = sum(_nfqueue_rules(ns) for ns in namespaces if ns.endswith("-rtr")) if shutil.which("iptables") else 0
    return Leftovers(namespaces, processes, rules, dead)


def cleanup_all(*, include_live: bool = True) -> list[str]:
    """Removes every "ccs-" namespace (killing the processes in it), restores the sysctls recorded in
    state files, and removes those files. With include_live=False, runs whose process is still alive
    are left alone (for tests sharing a machine). Returns what it removed, one item per line."""
    removed: list[str] = []
    with locked():
        states = {s.run_id: s for s in all_states()}
        for ns in list_namespaces():
            if not include_live and _owner_alive(ns, states):
                continue
            removed += remove_namespace(ns)
        doomed = [s for s in states.values() if include_live or not s.alive()]
        survivors = [s for s in states.values() if s not in doomed]
        for i, state in enumerate(doomed):
            value = release_algorithms(state, survivors + doomed[i + 1:])
            if value is not None:
                removed.append(f"sysctl {algorithms.ALLOWED_KEY} = {value}")
            state.path.unlink(missing_ok=True)
            removed.append(f"state {state.path}")
        # Delay-line counters of runs without a state file (dead, or cleaned above).
        for d in state_dir().glob("*.d"):
            if not d.with_suffix(".json").exists():
                shutil.rmtree(d, ignore_errors=True)
                removed.append(f"state {d}")
    return removed
