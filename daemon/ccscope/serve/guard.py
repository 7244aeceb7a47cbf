"""What a test may do, enforced on serve's side while it runs: iperf3 lets its client choose the algorithm
(-C), UDP (-u) and parallel streams (-P) whatever serve was asked for, so a guard looks at the test port
every GUARD_INTERVAL_S (`ss -tin`, /proc/net/udp) and stops the test at the first thing serve does not allow:

- a data connection sending with an algorithm other than the one requested, or one whose algorithm `ss`
  does not show (checked once it has sent CC_CHECK_BYTES, past what the control connection and the handshake
  carry; the data socket briefly shows the listener's algorithm before iperf3 sets -C on it);
- more connections from the requester than the control connection and one stream;
- any UDP socket on the test port (a UDP test, which could be made to send to a spoofed address);
- when iperf3 cannot tell clients apart (no per-test user): a connection from another address.

A test stopped here ends with its reason; the requester's `done` gets it as the refusal.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

GUARD_INTERVAL_S = 0.1
CC_CHECK_BYTES = 256 * 1024
STREAMS = 1  # data connections per test: the runner opens one test per flow
AVAILABLE = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")
_PEER = re.compile(r"^\S+\s+\S+\s+(\S+):(\d+)\s+(\S+):(\d+)")
_SENT = re.compile(r"\bbytes_sent:(\d+)")


@dataclass(frozen=True)
class Connection:
    peer: str
    cc: str | None
    bytes_sent: int


def connections(port: int, algorithms: frozenset[str]) -> list[Connection]:
    """The established TCP connections on local `port` in this namespace, as `ss -tin` shows them; a
    connection's algorithm is the first word of its info line that names one of `algorithms` (ss prints it
    among flags such as ts, sack or ecn, before wscale: when window scaling is on)."""
    out = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{port} )"], capture_output=True,
                         text=True, timeout=5).stdout
    found, peer = [], None
    for line in out.splitlines():
        head = _PEER.match(line)
        if head:
            peer = head.group(3).strip("[]")
            continue
        if peer is not None:
            cc = next((word for word in line.split() if word in algorithms), None)
            sent = _SENT.search(line)
            found.append(Connection(_plain(peer), cc, int(sent.group(1)) if sent else 0))
            peer = None
    return found


def bound(port: int, tables: tuple[str, ...], state: str | None = None) -> bool:
    """A socket of this namespace on local `port` in /proc/net/TABLE (in `state`, hex as the kernel writes
    it, e.g. 0A for a TCP listener; None: any)."""
    for name in tables:
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and int(fields[1].rsplit(":", 1)[1], 16) == port and state in (None, fields[3]):
                return True
    return False


def udp_bound(port: int) -> bool:
    return bound(port, ("udp", "udp6"))


def _plain(address: str) -> str:
    try:
        parsed = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return address
    if isinstance(parsed, ipaddress.IPv6Address) and parsed.ipv4_mapped is not None:
        return str(parsed.ipv4_mapped)
    return str(parsed)


def violation(port: int, requester: str, cc: str, algorithms: frozenset[str], foreign_allowed: bool) -> str | None:
    """What on `port` serve does not allow, in one line; None if nothing."""
    if udp_bound(port):
        return "the client started a UDP test (serve allows TCP only)"
    conns = connections(port, algorithms)
    mine = [c for c in conns if c.peer == _plain(requester)]
    if not foreign_allowed and len(mine) < len(conns):
        other = next(c.peer for c in conns if c.peer != _plain(requester))
        return f"a connection from {other}, not from the client that asked for the test"
    if len(mine) > 1 + STREAMS:
        return f"the client opened {len(mine) - 1} streams (serve allows {STREAMS})"
    for c in mine:
        if c.bytes_sent >= CC_CHECK_BYTES and c.cc != cc:
            return f"the test ran {c.cc or 'an algorithm ss does not show'}, not the {cc} it asked for"
    return None


class Guard:
    """Watches one test's port until stopped; calls `stop_test(reason)` once at the first violation."""

    def __init__(self, port: int, requester: str, cc: str, foreign_allowed: bool,
                 stop_test: Callable[[str], None]) -> None:
        self.reason: str | None = None
        known = frozenset(AVAILABLE.read_text().split())  # the names ss can show
        self._args = port, requester, cc, known, foreign_allowed
        self._stop_test = stop_test
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"serve-guard-{port}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._done.wait(GUARD_INTERVAL_S):
            try:
                reason = violation(*self._args)
            except (OSError, subprocess.SubprocessError, ValueError):
                continue  # ss failed once: look again at the next tick
            if reason is not None:
                self.reason = reason
                self._stop_test(reason)
                return

    def close(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)
