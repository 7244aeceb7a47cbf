"""The control protocol of `ccscope serve`, and its client (used by the scenario runner on real paths).

One TCP connection per test on the control port (the first of serve's port range, 5201 by default):

    client -> serve   HELLO (37 bytes, the size of iperf3's cookie)
    serve -> client   {"ccscope_serve": 1, "ports": [5201, 5216], "max_seconds": 120, "telemetry": true}
    client -> serve   {"op": "test", "cc": "bbr", "seconds": 12, "reverse": true}
    serve -> client   {"ok": true, "port": 5203}       (an `iperf3 -s -1` listens there now)
                      ... the client runs iperf3 -c HOST -p 5203 -C bbr [-R] ...
    client -> serve   {"op": "done"}
    serve -> client   {"ok": true, "now": T, "flows": [{"src", "sport", "dst", "dport", "cc", "samples": [[...]]}]}

A refusal is {"ok": false, "error": "one line"}. The client speaks first, with a HELLO of the size of
iperf3's cookie, so a plain `iperf3 -s` is never left waiting: it answers that one byte (PARAM_EXCHANGE,
or ACCESS_DENIED when busy) and sees the client close, as after any aborted test; serve answers a JSON
greeting. The first byte of the answer tells them apart. Every line is JSON, one per
message; the telemetry reply is bounded by MAX_REPLY_BYTES. Standard library only.
"""

from __future__ import annotations

import json
import socket
import time
from dataclasses import dataclass

VERSION = 1
DEFAULT_PORTS = (5201, 5216)  # control on the first, tests on the others
MAX_LINE_BYTES = 4096  # a request
MAX_REPLY_BYTES = 64 << 20  # the telemetry of the longest allowed test at 1 ms sampling fits
GREETING_TIMEOUT_S = 3.0
HELLO = b"ccscope-serve-hello-1".ljust(37, b"\0")  # iperf3's COOKIE_SIZE is 37
IPERF3_ACCESS_DENIED = 0xFF  # iperf3's answer to a client while it runs another test


class ServeError(Exception):
    """The far end refused, or the control connection failed: one line."""


@dataclass(frozen=True)
class Greeting:
    ports: tuple[int, int]
    max_seconds: float
    telemetry: bool


def bind_socket(sock: socket.socket, via: str | None, via_is_address: bool) -> None:
    """Out through `via`: an interface (SO_BINDTODEVICE) or a local address."""
    if via is None:
        return
    if via_is_address:
        sock.bind((via, 0))
    else:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, via.encode())


def connect(address: str, port: int, via: str | None, via_is_address: bool, timeout: float) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        bind_socket(sock, via, via_is_address)
        sock.settimeout(timeout)
        sock.connect((address, port))
    except BaseException:
        sock.close()
        raise
    return sock


def read_line(sock: socket.socket, limit: int, deadline: float) -> bytes:
    """One line (without the newline); ServeError on EOF, overlong lines or the deadline."""
    buf = bytearray()
    while True:
        nl = buf.find(b"\n")
        if nl >= 0:
            return bytes(buf[:nl])
        if len(buf) > limit:
            raise ServeError(f"a line longer than {limit} bytes")
        left = deadline - time.monotonic()
        if left <= 0:
            raise ServeError("no answer in time")
        sock.settimeout(left)
        try:
            part = sock.recv(1 << 16)
        except TimeoutError:
            raise ServeError("no answer in time") from None
        if not part:
            raise ServeError("the connection closed")
        buf += part


def send(sock: socket.socket, message: dict) -> None:
    sock.sendall(json.dumps(message, separators=(",", ":")).encode() + b"\n")


def greeting(sock: socket.socket, timeout: float = GREETING_TIMEOUT_S) -> Greeting | None:
    """Sends HELLO; serve's greeting, or None from anything else (a plain iperf3 server)."""
    try:
        sock.sendall(HELLO)
        sock.settimeout(timeout)
        first = sock.recv(1)
        if first != b"{":
            return None
        data = json.loads(b"{" + read_line(sock, MAX_LINE_BYTES, time.monotonic() + timeout))
    except (ServeError, ValueError, OSError):
        return None
    if not isinstance(data, dict) or data.get("ccscope_serve") != VERSION:
        return None
    ports = data.get("ports") or list(DEFAULT_PORTS)
    return Greeting(ports=(int(ports[0]), int(ports[1])), max_seconds=float(data.get("max_seconds", 0)),
                    telemetry=bool(data.get("telemetry")))


class Session:
    """One test on a `ccscope serve`: ask for a server port, run the test, collect the far end's telemetry."""

    def __init__(self, sock: socket.socket, greeting: Greeting) -> None:
        self.sock = sock
        self.greeting = greeting

    def request(self, message: dict, timeout: float = 10.0) -> dict:
        try:
            send(self.sock, message)
            line = read_line(self.sock, MAX_REPLY_BYTES, time.monotonic() + timeout)
            reply = json.loads(line)
        except (OSError, ValueError) as exc:
            raise ServeError(f"ccscope serve: {exc}") from None
        if not isinstance(reply, dict):
            raise ServeError("ccscope serve: an answer that is not a JSON object")
        if not reply.get("ok"):
            raise ServeError(f"ccscope serve refused: {reply.get('error') or 'no reason given'}")
        reply["received_mono"] = time.clock_gettime(time.CLOCK_MONOTONIC)
        return reply

    def close(self) -> None:
        self.sock.close()
