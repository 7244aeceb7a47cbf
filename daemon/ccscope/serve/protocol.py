"""The control protocol of `ccscope serve`, and its client (used by the scenario runner on real paths).

One TCP connection per test on the control port (the first of serve's port range, 5201 by default):

    client -> serve   HELLO (37 bytes, the size of iperf3's cookie)
    serve -> client   {"ccscope_serve": 2, "ports": [5201, 5216], "max_seconds": 120, "telemetry": true,
                       "auth": "token", "nonce": "<32 hex digits>"}
    client -> serve   {"op": "test", "cc": "bbr", "seconds": 12, "reverse": true, "proof": "<hex>"}
    serve -> client   {"ok": true, "port": 5203, "iperf3": {"username": U, "password": P, "public_key": PEM}}
                      (an `iperf3 -s -1` listens there now, and admits only U with P)
                      ... the client runs iperf3 -c HOST -p 5203 -C bbr [-R] --username U ...
    client -> serve   {"op": "done"}
    serve -> client   {"ok": true, "now": T, "fields": ["t", "cwnd_segments", ...],
                       "flows": [{"src", "sport", "dst", "dport", "cc", "samples": [[...]]}]}

`proof` is HMAC-SHA256 of the greeting's nonce under serve's token (auth "token"); a serve started --open
says auth "open" and needs none. {"op": "check", "proof": ...} asks only whether the proof holds (the
runner's check before any run). A refusal is {"ok": false, "error": "one line"}. The client speaks first,
with a HELLO of the size of iperf3's cookie, so a plain `iperf3 -s` is never left waiting: it answers that
one byte (PARAM_EXCHANGE, or ACCESS_DENIED when busy) and sees the client close, as after any aborted test;
serve answers a JSON greeting. The first byte of the answer tells them apart; anything else, or nothing
within GREETING_TIMEOUT_S, is a far end that speaks neither. Every line is JSON, one per message; the
telemetry reply is bounded by MAX_REPLY_BYTES, and everything in it is checked here before use.
Standard library only.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import math
import re
import socket
import time
from dataclasses import dataclass

VERSION = 2  # 2: token proof, per-test iperf3 credentials
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
    auth: str = "open"  # "token": requests carry a proof of serve's token
    nonce: str = ""


@dataclass(frozen=True)
class Iperf3Credentials:
    """The one user a test's `iperf3 -s` admits (iperf3's RSA authentication)."""

    username: str
    password: str
    public_key: str  # PEM

    def as_dict(self) -> dict:
        return {"username": self.username, "password": self.password, "public_key": self.public_key}


@dataclass(frozen=True)
class TestGrant:
    port: int
    credentials: Iperf3Credentials | None


def proof(token: str, nonce: str) -> str:
    """What a request shows for the token: HMAC-SHA256 of the greeting's nonce (the token never travels)."""
    return hmac.new(token.encode(), f"ccscope-serve-{VERSION}:{nonce}".encode(), hashlib.sha256).hexdigest()


def proof_holds(token: str, nonce: str, shown: object) -> bool:
    return isinstance(shown, str) and shown.isascii() and hmac.compare_digest(proof(token, nonce), shown)


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


class NotIperf3(ServeError):
    """The far end answered HELLO with neither serve's greeting nor iperf3's one byte, or not at all."""


IPERF3_PARAM_EXCHANGE = 9  # iperf3's first answer to a client's cookie: the parameter exchange
IPERF3_STATES = (IPERF3_PARAM_EXCHANGE, IPERF3_ACCESS_DENIED)


def greeting(sock: socket.socket, timeout: float = GREETING_TIMEOUT_S) -> Greeting | None:
    """Sends HELLO; serve's greeting (checked), or None from a plain iperf3 server. NotIperf3 when the
    far end speaks neither within `timeout` (an HTTP server, a silent port); ServeError when it claims to
    be serve and its greeting is malformed."""
    try:
        sock.sendall(HELLO)
        sock.settimeout(timeout)
        first = sock.recv(1)
    except TimeoutError:
        raise NotIperf3(f"no answer to the iperf3 cookie within {timeout:g} s: not an iperf3 server or "
                        "ccscope serve") from None
    except OSError as exc:
        raise ServeError(f"the control connection failed: {exc.strerror or exc}") from None
    if first and first[0] in IPERF3_STATES:
        return None
    if first != b"{":
        raise NotIperf3(f"it answered {_printable(first + _peek(sock))!r}: not an iperf3 server or ccscope serve"
                        if first else "it closed the connection at the iperf3 cookie: not an iperf3 server or "
                        "ccscope serve")
    try:
        data = json.loads(b"{" + read_line(sock, MAX_LINE_BYTES, time.monotonic() + timeout))
    except (ValueError, RecursionError):
        raise ServeError("a greeting that is not JSON") from None
    except OSError as exc:
        raise ServeError(f"the control connection failed: {exc.strerror or exc}") from None
    if isinstance(data, dict) and data.get("ccscope_serve") == VERSION and "refused" in data:
        raise ServeError(f"ccscope serve refused this host: {_printable_text(data['refused'])}")
    return parse_greeting(data)


def _peek(sock: socket.socket) -> bytes:
    try:
        sock.settimeout(0.2)
        return sock.recv(15)
    except OSError:
        return b""


def _printable(data: bytes) -> str:
    return "".join(c if c.isprintable() else "?" for c in data.decode("latin-1"))[:16]


def parse_greeting(data: object) -> Greeting:
    """serve's greeting, every value checked: ServeError (one line) on anything else."""
    if not isinstance(data, dict) or data.get("ccscope_serve") != VERSION:
        version = data.get("ccscope_serve") if isinstance(data, dict) else None
        raise ServeError(f"a greeting of protocol version {_short(version)} (this ccscope speaks {VERSION})")
    ports = data.get("ports")
    if not (isinstance(ports, list) and len(ports) == 2 and all(_is_port(p) for p in ports) and ports[0] < ports[1]):
        raise ServeError(f"the greeting's ports {_short(ports)}: expected [first, last], two TCP ports")
    max_seconds = data.get("max_seconds")
    if not _is_number(max_seconds) or not 0 <= max_seconds <= 86400:
        raise ServeError(f"the greeting's max_seconds {_short(max_seconds)}: expected 0 to 86400")
    telemetry = data.get("telemetry")
    if not isinstance(telemetry, bool):
        raise ServeError(f"the greeting's telemetry {_short(telemetry)}: expected true or false")
    auth, nonce = data.get("auth"), data.get("nonce")
    if auth not in ("token", "open"):
        raise ServeError(f"the greeting's auth {_short(auth)}: expected \"token\" or \"open\"")
    if not (isinstance(nonce, str) and len(nonce) == 32 and all(c in "0123456789abcdef" for c in nonce)):
        raise ServeError(f"the greeting's nonce {_short(nonce)}: expected 32 hex digits")
    return Greeting(ports=(ports[0], ports[1]), max_seconds=float(max_seconds), telemetry=telemetry, auth=auth,
                    nonce=nonce)


def test_grant(reply: dict, greeting: Greeting) -> TestGrant:
    """What a test reply hands out: one of the greeting's test ports and the iperf3 user for it, or
    ServeError."""
    port = reply.get("port")
    if not _is_port(port) or not greeting.ports[0] < port <= greeting.ports[1]:
        raise ServeError(f"a test port {_short(port)} outside its test ports {greeting.ports[0] + 1}-"
                         f"{greeting.ports[1]}")
    given = reply.get("iperf3")
    if given is None:
        return TestGrant(port, None)
    username, password, key = (given.get(k) for k in ("username", "password", "public_key")) \
        if isinstance(given, dict) else (None, None, None)
    if not (isinstance(username, str) and _WORD.fullmatch(username) and isinstance(password, str)
            and _WORD.fullmatch(password) and isinstance(key, str) and len(key) < 4096
            and key.startswith("-----BEGIN PUBLIC KEY-----")):
        raise ServeError("iperf3 credentials that are not a user name, a password and a PEM public key")
    return TestGrant(port, Iperf3Credentials(username, password, key))


@dataclass(frozen=True)
class RemoteFlow:
    """One flow of serve's telemetry reply: its addresses are checked, its sample rows are not yet (the
    runner types them as samples)."""

    src: str
    sport: int
    dst: str
    dport: int
    rows: list


@dataclass(frozen=True)
class RemoteTelemetry:
    now: float  # serve's CLOCK_MONOTONIC when it answered
    received_mono: float  # ours when the answer arrived
    flows: list[RemoteFlow]
    fields: tuple[str, ...] | None = None  # the rows' field names; None from a serve that did not name them


MAX_ROW_FIELDS = 256


MAX_REMOTE_FLOWS = 4096
_WORD = re.compile(r"[A-Za-z0-9_-]{1,64}")


def parse_telemetry(reply: dict, received_mono: float) -> RemoteTelemetry:
    """serve's answer to "done", its shape checked: ServeError (one line) on anything else."""
    now, flows = reply.get("now"), reply.get("flows")
    if not _is_number(now) or abs(now) > 1e12:
        raise ServeError(f"telemetry with a clock reading of {_short(now)}")
    if not isinstance(flows, list) or len(flows) > MAX_REMOTE_FLOWS:
        raise ServeError(f"telemetry whose flows are {_short(flows)}: expected a list of at most "
                         f"{MAX_REMOTE_FLOWS}")
    out = []
    for i, flow in enumerate(flows):
        if not isinstance(flow, dict):
            raise ServeError(f"telemetry flow {i}: {_short(flow)} is not an object")
        src, dst, sport, dport, rows = (flow.get(k) for k in ("src", "dst", "sport", "dport", "samples"))
        if not (isinstance(src, str) and isinstance(dst, str) and len(src) <= 64 and len(dst) <= 64):
            raise ServeError(f"telemetry flow {i}: addresses {_short(src)}, {_short(dst)}")
        if not (_is_port(sport) and _is_port(dport)):
            raise ServeError(f"telemetry flow {i}: ports {_short(sport)}, {_short(dport)}")
        if not isinstance(rows, list):
            raise ServeError(f"telemetry flow {i}: samples {_short(rows)} are not a list")
        out.append(RemoteFlow(src, sport, dst, dport, rows))
    return RemoteTelemetry(float(now), received_mono, out, _row_fields(reply.get("fields")))


def _row_fields(fields: object) -> tuple[str, ...] | None:
    """The rows' field names (a serve since 2026-11-28 names them, so that a quantity added on either side
    does not break the other), checked: distinct words, at most MAX_ROW_FIELDS."""
    if fields is None:
        return None
    if not (isinstance(fields, list) and len(fields) <= MAX_ROW_FIELDS
            and all(isinstance(f, str) and _WORD.fullmatch(f) for f in fields) and len(set(fields)) == len(fields)):
        raise ServeError(f"telemetry whose fields are {_short(fields)}: expected at most {MAX_ROW_FIELDS} "
                         "distinct words")
    return tuple(fields)


def _is_port(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 65535


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _printable_text(value: object) -> str:
    """A far end's own words, cut to one short printable line."""
    text = value if isinstance(value, str) else ""
    return "".join(c if c.isprintable() else "?" for c in text)[:200]


def _short(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


class Session:
    """One test on a `ccscope serve`: ask for a server port, run the test, collect the far end's telemetry."""

    def __init__(self, sock: socket.socket, greeting: Greeting, token: str | None = None) -> None:
        self.sock = sock
        self.greeting = greeting
        self.token = token

    def request(self, message: dict, timeout: float = 10.0) -> dict:
        try:
            send(self.sock, message)
            line = read_line(self.sock, MAX_REPLY_BYTES, time.monotonic() + timeout)
            reply = json.loads(line)
        except (OSError, ValueError) as exc:
            raise ServeError(f"ccscope serve: {exc}") from None
        except RecursionError:
            raise ServeError("ccscope serve: an answer nested too deeply") from None
        if not isinstance(reply, dict):
            raise ServeError("ccscope serve: an answer that is not a JSON object")
        if reply.get("ok") is not True:
            raise ServeError(f"ccscope serve refused: {_printable_text(reply.get('error')) or 'no reason given'}")
        return reply

    def authenticated(self, message: dict) -> dict:
        return {**message, "proof": proof(self.token, self.greeting.nonce)} if self.token else message

    def check(self) -> None:
        """Whether serve takes our proof of its token (ServeError with its words if not)."""
        self.request(self.authenticated({"op": "check"}))

    def start_test(self, cc: str, seconds: float, reverse: bool) -> TestGrant:
        """Asks for a test; the port its server listens on, and who it admits."""
        request = {"op": "test", "cc": cc, "seconds": seconds, "reverse": reverse}
        return test_grant(self.request(self.authenticated(request)), self.greeting)

    def finish(self, timeout: float) -> RemoteTelemetry:
        """Says the test is done; the far end's telemetry of it."""
        reply = self.request({"op": "done"}, timeout=timeout)
        return parse_telemetry(reply, time.clock_gettime(time.CLOCK_MONOTONIC))

    def close(self) -> None:
        self.sock.close()
