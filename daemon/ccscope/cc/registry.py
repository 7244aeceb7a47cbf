"""Who uses which BPF registration: shared between concurrent ccscope processes, survives kill -9.

A registration is host-wide, so one record per kernel name in <state dir>/cc-registrations.json lists
its users (process id + start time + a token per use) and whether `ccscope cc load` holds it. The first
user registers; the last one to leave unregisters, so two scenarios running at once never pull each
other's algorithm away. Every change happens under the same lock as the run state (host.state), so
it is ordered with the init namespace's tcp_allowed_congestion_control changes. `cleanup()` drops users
whose process died (kill -9) and unregisters what nobody uses any more.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ccscope.host import state

from . import catalog, structops

FILENAME = "cc-registrations.json"
_HELD_SIGNALS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}


@dataclass
class Registration:
    name: str                 # kernel name: vegas, bpf_vegas ...
    algorithm: str            # the BPF source: vegas
    map_id: int
    sha256: str
    object: str
    registered_at: float
    users: list[dict] = field(default_factory=list)   # {"token", "pid", "pid_start", "what"}
    held: bool = False        # `ccscope cc load` keeps it until `ccscope cc unload`

    def live_users(self) -> list[dict]:
        return [u for u in self.users if state.pid_alive(u["pid"], u.get("pid_start"))]


def _path() -> Path:
    return state.state_dir() / FILENAME


def _load() -> dict[str, Registration]:
    try:
        raw = json.loads(_path().read_text())
        return {name: Registration(**entry) for name, entry in raw.items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, TypeError):
        return {}


def _save(regs: dict[str, Registration]) -> None:
    path = _path()
    if not regs:
        path.unlink(missing_ok=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({n: asdict(r) for n, r in regs.items()}, indent=1))
    tmp.replace(path)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Registering and recording it must not be split by Ctrl-C (a registration nobody knows about)."""
    signal.pthread_sigmask(signal.SIG_BLOCK, _HELD_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD_SIGNALS)


def _prune(regs: dict[str, Registration]) -> None:
    """Forgets records whose registration is gone (unregistered by hand, or a reboot)."""
    for name in [n for n, r in regs.items() if not structops.is_registered(r.map_id, n)]:
        del regs[name]


def registrations() -> dict[str, Registration]:
    with state.locked():
        regs = _load()
        _prune(regs)
        _save(regs)
        return regs


def current() -> dict[str, Registration]:
    """The registrations in place now, for observers (the daemon's live page): read without the lock and
    without writing, so that they neither wait for a run's state changes nor change the state directory."""
    return {name: reg for name, reg in _load().items() if structops.is_registered(reg.map_id, name)}


def abandoned() -> list[str]:
    """Registrations that only dead processes used (a scenario or `cc load --foreground` killed with -9) and that
    `cc load` does not hold: what cleanup() would unregister, without unregistering it."""
    return sorted(name for name, reg in current().items() if not reg.held and not reg.live_users())


def acquire(name: str, what: str) -> tuple[Registration, str]:
    """Registers `name` (or joins the existing registration); returns it and this use's token."""
    token = uuid.uuid4().hex
    pid = os.getpid()
    user = {"token": token, "pid": pid, "pid_start": state.pid_start(pid), "what": what}
    with state.locked(), _signals_held():
        regs = _load()
        _prune(regs)
        reg = regs.get(name)
        if reg is None:
            algorithm = catalog.bpf_source(name) or name
            map_id = structops.register(name)
            reg = Registration(name=name, algorithm=algorithm, map_id=map_id,
                               sha256=catalog.object_sha256(algorithm),
                               object=str(catalog.object_path(algorithm)), registered_at=time.time())
            regs[name] = reg
        reg.users.append(user)
        _save(regs)
    return reg, token


def release(name: str, token: str) -> bool:
    """Ends one use; unregisters when it was the last and `cc load` does not hold it. True if unregistered."""
    with state.locked(), _signals_held():
        regs = _load()
        reg = regs.get(name)
        if reg is None:
            return False
        reg.users = [u for u in reg.users if u["token"] != token]
        gone = _drop_if_unused(regs, name, live_only=True)
        _save(regs)
        return gone


def _drop_if_unused(regs: dict[str, Registration], name: str, live_only: bool) -> bool:
    reg = regs[name]
    users = reg.live_users() if live_only else reg.users
    reg.users = users
    if users or reg.held:
        return False
    structops.unregister(reg.map_id, name)
    del regs[name]
    return True


def hold(name: str) -> tuple[Registration, bool]:
    """`ccscope cc load`: registers `name` if needed and keeps it. Returns it and whether it was new."""
    with state.locked(), _signals_held():
        regs = _load()
        _prune(regs)
        new = name not in regs
        if new:
            algorithm = catalog.bpf_source(name) or name
            regs[name] = Registration(name=name, algorithm=algorithm, map_id=structops.register(name),
                                      sha256=catalog.object_sha256(algorithm),
                                      object=str(catalog.object_path(algorithm)), registered_at=time.time())
        regs[name].held = True
        _save(regs)
        return regs[name], new


def unhold(name: str) -> tuple[bool, list[dict]] | None:
    """`ccscope cc unload`: None if ccscope has no such registration; else (unregistered?, live users)."""
    with state.locked(), _signals_held():
        regs = _load()
        _prune(regs)
        reg = regs.get(name)
        if reg is None:
            _save(regs)
            return None
        reg.held = False
        users = reg.live_users()
        gone = _drop_if_unused(regs, name, live_only=True)
        _save(regs)
        return gone, users


def cleanup(include_live: bool = False) -> list[str]:
    """Unregisters what dead runs left (or, with include_live, every registration not held by `cc load`)."""
    removed = []
    with state.locked(), _signals_held():
        regs = _load()
        _prune(regs)
        for name in list(regs):
            if include_live:
                regs[name].users = []
            if _drop_if_unused(regs, name, live_only=True):
                removed.append(f"BPF congestion control {name}")
        _save(regs)
    return removed
