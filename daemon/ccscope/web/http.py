"""A small hardened HTTP/1.1 server: a table of path -> handler behind optional TLS and basic auth.

Why not http.server: its TLS variant handshakes inside accept(), on the one thread that accepts, and its
request parsing only has a per-recv timeout, so a client that says nothing (or one byte every few
seconds) holds the endpoint. Here the accept loop only accepts. Each connection gets its own thread,
bounded by `Limits.max_connections`, and that thread does the TLS handshake and reads the request head
against one overall deadline each. Long-lived streaming responses (server-sent events) have their own,
smaller limit, so streams can never take the slots that scrapes need.

When every slot is taken, a new connection does not simply get a 503: it takes the slot of a connection that is
*waiting* (silent, dripping a request head, or idle between keep-alive requests), chosen from the source address
that holds the most connections, the one waiting longest. One client that fills the table with slow requests
(150 connections each sending `GET /metrics` a byte a second against 128 slots: 0 of 50 scrapes answered before
this) then only displaces its own connections, and a scraper's fresh, complete request is read within a
millisecond of its connect, long before 127 later connections could make it the oldest. The address matters for a
scraper elsewhere (Prometheus on another host is never the address with the most connections while an attacker
floods); on loopback, where an attacker and the scraper share 127.0.0.1, the age does: the scraper's connection is
the newest. Connections being answered (a head read, a handler running, a response or stream being written) are
never displaced; only when all are, the newcomer gets the 503. The displaced connection is closed without an
answer: an idle keep-alive client reconnects (Go's net/http, which Prometheus uses, does so by itself for a
GET), a half-sent request was not going to finish in time anyway.
"""

from __future__ import annotations

import contextlib
import errno
import select
import socket
import ssl
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from email.utils import formatdate
from http import HTTPStatus
from urllib.parse import urlsplit

from ..errors import PrerequisiteError

LISTEN_BACKLOG = 128  # the kernel queue in front of accept(); the accept loop drains it at once
STREAM_SNDBUF = 32 * 1024  # bytes; the kernel doubles it
# How long a thread that holds the GIL keeps it while others wait (CPython's default is 5 ms). Every accept(),
# recv() and send() gives the GIL up and then waits for it again: behind a collection that renders for 10-20 ms,
# each of those waits a whole interval, so 50 connections were accepted one per 5 ms, over 250 ms, and the late
# ones each started another collection. At 0.5 ms they all arrive within one collection and share the next;
# the extra switches cost the CPU-bound thread well under 1 %.
GIL_SWITCH_INTERVAL_S = 0.0005


def serve_promptly() -> None:
    """Sets the process-wide GIL switch interval to GIL_SWITCH_INTERVAL_S (never raises a lower one): for a
    process whose threads are mostly this server's, as the daemon's are. The owner of the process decides."""
    sys.setswitchinterval(min(sys.getswitchinterval(), GIL_SWITCH_INTERVAL_S))

# close() lets streams write what their source still has queued for this long before it shuts them down: a
# scenario's last event (the report link) is queued a moment before the process closes its server and exits.
STREAM_DRAIN_S = 1.0


@dataclass(frozen=True)
class Limits:
    max_connections: int = 128      # open client connections; beyond, a waiting one is displaced, else a 503
    max_streams: int = 8            # of those, long-lived streaming responses
    handshake_timeout_s: float = 5.0
    request_timeout_s: float = 5.0  # the whole request head, from its first byte (or from connect)
    idle_timeout_s: float = 30.0    # keep-alive: wait this long for the next request
    write_timeout_s: float = 10.0   # one response (or one chunk of a stream) to a slow reader
    max_line_bytes: int = 8192      # request line
    max_head_bytes: int = 16384     # request line and headers together
    max_headers: int = 64


@dataclass
class Request:
    method: str
    path: str
    query: str
    version: str
    headers: Mapping[str, str]  # names lower-cased; repeated headers joined with ", "
    client: str
    stopping: threading.Event   # set when the server closes: streams end their loop on it
    user: str | None = None


@dataclass
class Response:
    status: int
    body: bytes = b""
    content_type: str = "text/plain; charset=utf-8"
    headers: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class Stream:
    """A response of unknown length, written chunk by chunk as `chunks` yields them; the connection closes after."""

    chunks: Iterator[bytes]
    content_type: str = "text/event-stream"
    headers: list[tuple[str, str]] = field(default_factory=list)


Handler = Callable[[Request], Response | Stream]


@dataclass(eq=False)
class _Connection:
    """One admitted connection, as the admission decision sees it (fields guarded by HttpServer._lock)."""

    sock: socket.socket
    peer: str            # the source address, without the port
    since: float         # monotonic: when it began waiting for its current request (accepted, or last answered)
    busy: bool = False   # a request head is in and being answered: never displaced
    displaced: bool = False


@dataclass(frozen=True)
class Route:
    handler: Handler
    methods: frozenset[str] = frozenset({"GET", "HEAD"})
    stream: bool = False   # takes a stream slot (Limits.max_streams) for as long as it runs
    public: bool = False   # served without authentication


class Authenticator:
    """Checks an Authorization header; returns the user name, or None to answer 401."""

    realm = "ccscope"

    def check(self, authorization: str | None) -> str | None:
        raise NotImplementedError


class HttpError(Exception):
    def __init__(self, status: int, detail: str = "") -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail or HTTPStatus(status).phrase


def text_response(status: int, text: str = "", headers: list[tuple[str, str]] | None = None) -> Response:
    return Response(status, ((text or HTTPStatus(status).phrase) + "\n").encode(), headers=headers or [])


class HttpServer:
    """Serves `routes` on host:port in background threads until close()."""

    def __init__(self, host: str, port: int, routes: Mapping[str, Route], *, tls: ssl.SSLContext | None = None,
                 auth: Authenticator | None = None, limits: Limits | None = None,
                 extra_headers: list[tuple[str, str]] | None = None) -> None:
        self.routes = dict(routes)
        self.tls = tls
        self.auth = auth
        self.limits = limits or Limits()
        self.extra_headers = list(extra_headers or [])
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self._connections: set[_Connection] = set()
        self._streams = threading.BoundedSemaphore(self.limits.max_streams)
        self._active_streams = 0
        self._streams_ended = threading.Condition(self._lock)
        self._cut_streams = threading.Event()  # set by close() once the drain is over: streams stop writing
        # Connection threads are kept for the next connections: starting one made the accept loop wait for the
        # new thread to run (Thread.start), a GIL handoff per connection on the path every connection waits on.
        self._workers = ThreadPoolExecutor(max_workers=self.limits.max_connections, thread_name_prefix="http-conn")
        self.refused_total = 0    # turned away with a 503: every slot was busy answering
        self.displaced_total = 0  # waiting connections closed to make room for a new one
        self.listener = _listen(host, port)
        self.port = self.listener.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, name="http-accept", daemon=True)
        self._acceptor.start()

    def add_route(self, path: str, route: Route) -> None:
        self.routes[path] = route

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._connections)

    def close(self) -> None:
        """Stops accepting; streams whose source has ended (the live hub's `bye`) may finish writing for up to
        STREAM_DRAIN_S; then every connection is shut down under its thread."""
        self.stopping.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the blocked accept()
        self._acceptor.join(timeout=5)
        self._workers.shutdown(wait=False)
        self.listener.close()
        with self._lock:
            self._streams_ended.wait_for(lambda: self._active_streams == 0, timeout=STREAM_DRAIN_S)
            self._cut_streams.set()
            connections = list(self._connections)
        for connection in connections:
            _wake(connection.sock)

    # --- accepting -------------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, addr = self.listener.accept()
            except OSError as exc:
                if self.stopping.is_set():
                    return
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    time.sleep(0.05)  # out of descriptors: let connections finish rather than spin
                continue
            connection = _Connection(conn, addr[0], time.monotonic())
            if not self._admit(connection):
                self._refuse(conn)
                continue
            client = f"[{addr[0]}]:{addr[1]}" if conn.family == socket.AF_INET6 else f"{addr[0]}:{addr[1]}"
            try:
                self._workers.submit(self._serve, connection, client)
            except RuntimeError:  # no thread to be had (memory, pids.max): refuse this one, keep accepting
                with self._lock:
                    self._connections.discard(connection)
                self._refuse(conn)

    def _admit(self, connection: _Connection) -> bool:
        """Take a free slot, or a waiting connection's (see the module's docstring); False: all slots are busy."""
        with self._lock:
            displaced = None
            if len(self._connections) >= self.limits.max_connections:
                displaced = self._displaceable()
                if displaced is None:
                    self.refused_total += 1
                    return False
                self._connections.discard(displaced)
                displaced.displaced = True
                self.displaced_total += 1
            self._connections.add(connection)
        if displaced is not None:
            _wake(displaced.sock)  # its thread's recv() returns; the thread then closes it and is free again
        return True

    def _displaceable(self) -> _Connection | None:
        """The waiting connection to close for a newcomer: from the address holding the most connections, the one
        waiting longest. O(connections), and only when the table is full."""
        waiting = [c for c in self._connections if not c.busy]
        if not waiting:
            return None
        per_peer = Counter(c.peer for c in self._connections)
        return min(waiting, key=lambda c: (-per_peer[c.peer], c.since))

    def _mark(self, connection: _Connection, *, busy: bool) -> bool:
        """Record that a request head is in (busy) or answered (waiting again); False if it was displaced."""
        with self._lock:
            if connection.displaced:
                return False
            connection.busy = busy
            if not busy:
                connection.since = time.monotonic()
            return True

    def _refuse(self, conn: socket.socket) -> None:
        """Over the connection limit: a 503 without reading (plain HTTP only), then close. Never blocks."""
        if self.tls is None:
            with contextlib.suppress(OSError):
                conn.setblocking(False)
                conn.send(_head(503, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", "20"),
                                      ("Retry-After", "1"), ("Connection", "close")]) + b"too many connections\n")
        conn.close()

    # --- one connection ------------------------------------------------------------------------------

    def _serve(self, connection: _Connection, client: str) -> None:
        conn = connection.sock
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.tls is not None:
                conn.setblocking(False)
                with self._lock:  # no I/O yet; under the lock so that a displacement wakes the wrapped socket
                    if connection.displaced:
                        return
                    conn = connection.sock = self.tls.wrap_socket(conn, server_side=True,
                                                                  do_handshake_on_connect=False)
                self._handshake(conn)
            buffer = bytearray()
            wait_s = self.limits.request_timeout_s
            while not self.stopping.is_set():
                if not self._exchange(connection, conn, buffer, client, wait_s):
                    break
                wait_s = self.limits.idle_timeout_s
        except (OSError, ssl.SSLError, TimeoutError):
            pass  # the client went away, was too slow, or spoke no TLS: nothing to answer
        except Exception as exc:  # a bug of ours: one line in the daemon's log, and the server lives on
            print(f"ccscope: error on connection from {client}: {type(exc).__name__}: {exc}", file=sys.stderr)
        finally:
            with self._lock:
                self._connections.discard(connection)
            with contextlib.suppress(OSError):
                conn.close()

    def _handshake(self, wrapped: ssl.SSLSocket) -> None:
        deadline = time.monotonic() + self.limits.handshake_timeout_s
        while True:
            try:
                wrapped.do_handshake()
                break
            except ssl.SSLWantReadError:
                ready = select.select([wrapped], [], [], _remaining(deadline))[0]
            except ssl.SSLWantWriteError:
                ready = select.select([], [wrapped], [], _remaining(deadline))[1]
            if not ready:
                raise TimeoutError("TLS handshake")
        wrapped.setblocking(True)

    def _exchange(self, connection: _Connection, conn: socket.socket, buffer: bytearray, client: str,
                  wait_s: float) -> bool:
        """Read one request, answer it; False when the connection is to be closed."""
        try:
            head = _read_head(conn, buffer, wait_s, self.limits)
            if head is None or not self._mark(connection, busy=True):
                return False
            request = _parse(head, client, self.stopping, self.limits)
        except HttpError as exc:
            self._send(conn, "GET", text_response(exc.status, exc.detail), close=True)
            _drain(conn)
            return False
        close = _wants_close(request)
        route = self.routes.get(request.path)
        if self.auth is not None and not (route and route.public) and not self._authorize(request):
            # before routing, as exporter-toolkit does: without credentials, no path says whether it exists
            response: Response | Stream = text_response(
                401, headers=[("WWW-Authenticate", f'Basic realm="{self.auth.realm}"')])
        elif route is None:
            response = text_response(404)
        elif request.method not in route.methods:
            response = text_response(405, headers=[("Allow", ", ".join(sorted(route.methods)))])
        elif route.stream:
            return self._stream(conn, request, route)
        else:
            response = self._call(route, request)
        if isinstance(response, Stream):  # a handler that streams on a route not declared as a stream
            response = text_response(500, "stream on a non-stream route")
        self._send(conn, request.method, response, close=close)
        return not close and self._mark(connection, busy=False)

    def _authorize(self, request: Request) -> bool:
        request.user = self.auth.check(request.headers.get("authorization"))
        return request.user is not None

    def _call(self, route: Route, request: Request) -> Response | Stream:
        try:
            return route.handler(request)
        except Exception as exc:  # one line in the daemon's log, a 500 for the client; the server lives on
            print(f"ccscope: error serving {request.path}: {type(exc).__name__}: {exc}", file=sys.stderr)
            return text_response(500)

    def _stream(self, conn: socket.socket, request: Request, route: Route) -> bool:
        if not self._streams.acquire(blocking=False):
            self._send(conn, request.method, text_response(503, "too many streams", [("Retry-After", "5")]),
                       close=True)
            return False
        try:
            response = self._call(route, request)
            if not isinstance(response, Stream):
                self._send(conn, request.method, response, close=True)
                return False
            # A reader that stalls then holds at most this much in the kernel (autotuning would let the buffer
            # grow to tcp_wmem's 4 MB); the stream's own bounded queue takes over from there.
            with contextlib.suppress(OSError):
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SNDBUF)
            headers = [("Content-Type", response.content_type), ("Cache-Control", "no-cache"),
                       *response.headers, *self.extra_headers, ("Connection", "close")]
            _send_all(conn, _head(200, headers), self.limits.write_timeout_s)
            if request.method == "HEAD":
                return False
            with self._lock:
                self._active_streams += 1
            try:
                for chunk in response.chunks:
                    if self._cut_streams.is_set():
                        break
                    _send_all(conn, chunk, self.limits.write_timeout_s)
            finally:
                close = getattr(response.chunks, "close", None)
                if close:
                    close()
                with self._lock:
                    self._active_streams -= 1
                    self._streams_ended.notify_all()
            return False
        finally:
            self._streams.release()

    def _send(self, conn: socket.socket, method: str, response: Response, *, close: bool) -> None:
        headers = [("Content-Type", response.content_type), ("Content-Length", str(len(response.body))),
                   *response.headers, *self.extra_headers]
        if close:
            headers.append(("Connection", "close"))
        body = b"" if method == "HEAD" else response.body
        _send_all(conn, _head(response.status, headers) + body, self.limits.write_timeout_s)


# --- the wire ------------------------------------------------------------------------------------------


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=LISTEN_BACKLOG)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise PrerequisiteError(f"port {port} on {host} is already in use",
                                    "stop the other process or pick another --listen") from None
        raise PrerequisiteError(f"cannot listen on {host}:{port}: {exc.strerror}") from None


def _wake(conn: socket.socket) -> None:
    """Shut a connection down under the thread that serves it, so that its recv()/send() returns at once. The
    base-class shutdown: on an SSLSocket the override would drop the TLS state under the thread."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(conn, socket.SHUT_RDWR)


def _remaining(deadline: float) -> float:
    return max(0.0, deadline - time.monotonic())


def _head(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}", f"Date: {formatdate(usegmt=True)}",
             *(f"{name}: {value}" for name, value in headers)]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _send_all(conn: socket.socket, data: bytes, timeout_s: float) -> None:
    """sendall() against one deadline: a client that reads a byte at a time cannot hold the thread longer."""
    deadline = time.monotonic() + timeout_s
    view = memoryview(data)
    while view:
        remaining = _remaining(deadline)
        if remaining <= 0:
            raise TimeoutError("write")
        conn.settimeout(remaining)
        sent = conn.send(view)
        view = view[sent:]


def _drain(conn: socket.socket, timeout_s: float = 1.0, limit: int = 1 << 16) -> None:
    """Lingering close: after an error answer, read what the client is still sending (briefly, boundedly), so
    that closing with unread input does not reset the connection and destroy the answer before it is read."""
    with contextlib.suppress(OSError):
        if isinstance(conn, ssl.SSLSocket):
            socket.socket.shutdown(conn, socket.SHUT_WR)
        else:
            conn.shutdown(socket.SHUT_WR)
    deadline = time.monotonic() + timeout_s
    with contextlib.suppress(OSError):
        while limit > 0 and (remaining := _remaining(deadline)) > 0:
            conn.settimeout(remaining)
            chunk = conn.recv(min(limit, 16384))
            if not chunk:
                return
            limit -= len(chunk)


def _read_head(conn: socket.socket, buffer: bytearray, wait_s: float, limits: Limits) -> bytes | None:
    """The request line and headers, read against deadlines: `wait_s` for the first byte, then
    `limits.request_timeout_s` for the whole head. None when the client closes or stays silent."""
    deadline = time.monotonic() + wait_s
    started = False
    while True:
        while buffer[:2] == b"\r\n" or buffer[:1] == b"\n":  # RFC 9112 2.2: ignore empty lines before a request
            del buffer[: 2 if buffer[:1] == b"\r" else 1]
        if buffer and not started:
            started = True
            deadline = min(deadline, time.monotonic() + limits.request_timeout_s)
        end = _head_end(buffer)
        line_end = buffer.find(b"\n")
        if (line_end < 0 and len(buffer) > limits.max_line_bytes) or line_end > limits.max_line_bytes:
            raise HttpError(414, "request line too long")
        if (end or len(buffer)) > limits.max_head_bytes:
            raise HttpError(431, "request header fields too large")
        if end:
            head = bytes(buffer[:end])
            del buffer[:end]
            return head
        remaining = _remaining(deadline)
        if remaining <= 0:
            if buffer:
                raise HttpError(408, "request head not complete in time")
            return None
        conn.settimeout(remaining)
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            continue
        if not chunk:
            if buffer:
                raise HttpError(400, "connection closed inside the request head")
            return None
        buffer += chunk


def _head_end(buffer: bytearray) -> int:
    """Index just past the blank line that ends the head (CRLF, or a bare LF as RFC 9112 tolerates), or 0."""
    ends = [i + n for i, n in ((buffer.find(b"\r\n\r\n"), 4), (buffer.find(b"\n\n"), 2)) if i >= 0]
    return min(ends) if ends else 0


def _parse(head: bytes, client: str, stopping: threading.Event, limits: Limits) -> Request:
    lines = head.replace(b"\r\n", b"\n").rstrip(b"\n").split(b"\n")
    parts = lines[0].decode("latin-1").split(" ")
    if len(parts) != 3 or not parts[0].isalpha() or not parts[1]:
        raise HttpError(400, "malformed request line")
    method, target, version = parts
    if not version.startswith("HTTP/1."):
        raise HttpError(505 if version.startswith("HTTP/") else 400)
    if len(lines) - 1 > limits.max_headers:
        raise HttpError(431, f"more than {limits.max_headers} header fields")
    headers: dict[str, str] = {}
    for raw in lines[1:]:
        name, sep, value = raw.decode("latin-1").partition(":")
        if not sep or not name or name != name.strip() or " " in name:
            raise HttpError(400, "malformed header field")
        name, value = name.lower(), value.strip()
        headers[name] = f"{headers[name]}, {value}" if name in headers else value
    if "transfer-encoding" in headers:
        raise HttpError(501, "request bodies are not accepted")
    if headers.get("content-length", "0").strip() != "0":
        raise HttpError(413, "request bodies are not accepted")
    if target.startswith("/"):
        path, _, query = target.partition("?")
    elif "://" in target:  # absolute form, as sent to proxies
        parts_ = urlsplit(target)
        path, query = parts_.path or "/", parts_.query
    else:
        raise HttpError(400, "malformed request target")
    return Request(method=method, path=path, query=query, version=version, headers=headers, client=client,
                   stopping=stopping)


def _wants_close(request: Request) -> bool:
    tokens = {t.strip().lower() for t in request.headers.get("connection", "").split(",")}
    if request.version == "HTTP/1.0":
        return "keep-alive" not in tokens
    return "close" in tokens
