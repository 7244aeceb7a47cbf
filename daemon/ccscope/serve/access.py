"""Who may use `ccscope serve`: its token (every test request proves it, protocol.proof), the networks it
admits (--allow), and the per-source limits that keep one address from locking out the others.

The token is made on first start (secrets.token_urlsafe, 32 bytes of randomness) and kept in --token-file
(created 0600, never followed through a symlink), as Jupyter keeps its own; later starts read it back.
`--open` is the explicit choice to run without one.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import threading
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from ccscope.errors import UsageError

DEFAULT_TOKEN_FILE = Path("/var/lib/ccscope/serve-token")
MAX_TOKEN_BYTES = 1024

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


def load_or_create_token(path: Path) -> tuple[str, bool]:
    """The token in `path`, or a new one written there; (token, created)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return _create(path), True
    except OSError as exc:
        raise UsageError(f"--token-file {path}: cannot read: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as fh:
        data = fh.read(MAX_TOKEN_BYTES + 1)
    token = data.decode("utf-8", "replace").strip()
    if not token or len(data) > MAX_TOKEN_BYTES or any(c.isspace() for c in token):
        raise UsageError(f"--token-file {path}: does not hold one token (one word, at most {MAX_TOKEN_BYTES} "
                         "bytes); remove it to have a new one made")
    return token, False


def _create(path: Path) -> str:
    token = secrets.token_urlsafe(32)
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        raise UsageError(f"--token-file {path}: cannot create: {exc.strerror}",
                         "choose a writable --token-file, or run --open on an isolated network") from None
    with os.fdopen(fd, "w") as fh:
        fh.write(token + "\n")
    return token


def parse_networks(text: str) -> list[Network]:
    """--allow 10.0.0.0/8,192.0.2.7: networks (an address is its own /32 or /128)."""
    networks = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        try:
            networks.append(ipaddress.ip_network(part, strict=False))
        except ValueError:
            raise UsageError(f"--allow {part!r}: not a network or address (e.g. 10.0.0.0/8, 192.0.2.7, "
                             "2001:db8::/32)") from None
    if not networks:
        raise UsageError("--allow: give networks such as 10.0.0.0/8,192.0.2.7")
    return networks


def _address(peer: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    address = ipaddress.ip_address(peer.split("%", 1)[0])
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def source(peer: str) -> str:
    """Whom the per-source limits count: an IPv4 address, or an IPv6 /64 (one host's usual share: an
    address per connection would slip past a per-address limit)."""
    address = _address(peer)
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((address, 64), strict=False))
    return str(address)


@dataclass
class Access:
    """The token (None: --open), the admitted networks (None: any), and the per-source counts."""

    token: str | None
    allow: list[Network] | None
    max_connections: int  # control connections at once, all sources
    max_connections_per_source: int
    max_tests_per_source: int
    _connections: Counter = field(default_factory=Counter)
    _tests: Counter = field(default_factory=Counter)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def admits(self, peer: str) -> bool:
        if self.allow is None:
            return True
        address = _address(peer)
        return any(address in network for network in self.allow)

    def open_connection(self, peer: str) -> str | None:
        """Counts a control connection in; why not (one line) if a limit says no."""
        key = source(peer)
        with self._lock:
            if sum(self._connections.values()) >= self.max_connections:
                return f"{self.max_connections} control connections open, its limit"
            if not _count_in(self._connections, key, self.max_connections_per_source):
                return f"{self.max_connections_per_source} control connections open from {key}, its limit"
            return None

    def close_connection(self, peer: str) -> None:
        with self._lock:
            _count_out(self._connections, source(peer))

    def start_test(self, peer: str) -> bool:
        with self._lock:
            return _count_in(self._tests, source(peer), self.max_tests_per_source)

    def end_test(self, peer: str) -> None:
        with self._lock:
            _count_out(self._tests, source(peer))

    def connections(self) -> int:
        with self._lock:
            return sum(self._connections.values())


def _count_in(counts: Counter, key: str, limit: int) -> bool:
    if counts[key] >= limit:
        return False
    counts[key] += 1
    return True


def _count_out(counts: Counter, key: str) -> None:
    counts[key] -= 1
    if counts[key] <= 0:
        del counts[key]
