"""`ccscope serve`: the far end of a real-path scenario.

It answers the control protocol (protocol.py) on the first port of its range and, per request, starts
one `iperf3 -s -1` (or the short-download server) on a free port of the rest of the range, records that
test's flows with the BPF probe when it can (the sender's cwnd/srtt when the far end sends), and hands
the series back. It runs nothing but these fixed commands. What it trusts of a client, and what bounds it:

- who: a request proves serve's token (access.py) unless it runs --open; --allow narrows who may connect;
- the test: the algorithm (checked against this kernel's list and --algorithms), a length (at most
  --max-seconds) and the direction; the test's iperf3 admits only a user made for it (credentials.py), and
  a guard stops it if the client runs another algorithm, UDP or more streams (guard.py);
- load: the whole greeting and request within REQUEST_TIMEOUT_S; at most MAX_CONNECTIONS control connections
  (MAX_CONNECTIONS_PER_SOURCE from one address), --max-tests tests (--max-tests-per-source from one
  address); a granted test nobody connects to is given back after CONNECT_GRACE_S; a test still running at
  its length plus SLACK_S is killed; running out of file descriptors sheds connections, never exits;
- memory: telemetry.py's bound per test;
- children die with serve (child.py), and run as the user serve drops to (cli.py).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import secrets
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ccscope.errors import CcscopeError, UsageError
from ccscope.host.privileges import Identity
from ccscope.host.privileges import drop as drop_privileges

from . import protocol
from .access import Access
from .credentials import Iperf3Users
from .guard import Guard, bound
from .telemetry import Telemetry, empty_reply

SLACK_S = 15.0  # connect, iperf3's end-of-test exchange, a slow path
HELLO_TIMEOUT_S = 3.0  # the 37 bytes of HELLO
REQUEST_TIMEOUT_S = 10.0  # HELLO and the request, all of it
REPLY_TIMEOUT_S = 300.0  # sending an answer (a telemetry reply of 13 MB at 1 Mbit/s takes 100 s)
CONNECT_GRACE_S = 10  # a granted test whose client never connects is given back after this (iperf3 --idle-timeout)
DONE_GRACE_S = 5.0  # after iperf3 ended, how long the client has to say "done"
MAX_CONNECTIONS = 64
MAX_CONNECTIONS_PER_SOURCE = 8
MAX_DOWNLOAD_BYTES = 64 << 20
MAX_DOWNLOAD_CONNECTIONS = 16
SHED_ERRNOS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
_ALG = re.compile(r"^[a-z][a-z0-9_]{0,14}$")
AVAILABLE = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


def log(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} ccscope serve: {line}", file=sys.stderr, flush=True)


class _Throttled:
    """A log line that a flood would repeat: at most once per second, with how often it happened."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._count: dict[str, int] = {}
        self._lock = threading.Lock()

    def __call__(self, key: str, line: str) -> None:
        with self._lock:
            now = time.monotonic()
            self._count[key] = self._count.get(key, 0) + 1
            if now - self._last.get(key, 0.0) < 1.0:
                return
            count, self._count[key], self._last[key] = self._count[key], 0, now
        log(line if count == 1 else f"{line} ({count} times in the last second)")


def parse_ports(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)-(\d+)", text.strip())
    if not m or not 1 <= int(m.group(1)) < int(m.group(2)) <= 65535:
        raise UsageError(f"--ports {text!r}: give a range FIRST-LAST such as 5201-5216 (control on FIRST)")
    return int(m.group(1)), int(m.group(2))


def listening(port: int) -> bool:
    """Something listens on TCP `port` in this namespace."""
    return bound(port, ("tcp", "tcp6"), state="0A")


@dataclass(frozen=True)
class Request:
    op: str  # "test" or "download"
    cc: str
    seconds: float
    reverse: bool


@dataclass(frozen=True)
class Policy:
    """What serve allows (its command line)."""

    listen: str
    ports: tuple[int, int]
    max_tests: int
    max_seconds: float
    algorithms: list[str] | None  # None: whatever this kernel offers
    max_rate_bps: float | None = None  # iperf3 --server-bitrate-limit


class Server:
    def __init__(self, policy: Policy, access: Access, telemetry: Telemetry | None,
                 users: Iperf3Users | None) -> None:
        self.policy = policy
        self.access = access
        self.telemetry = telemetry
        self.users = users
        self._slots = threading.BoundedSemaphore(policy.max_tests)
        self._free = list(range(policy.ports[0] + 1, policy.ports[1] + 1))
        self._lock = threading.Lock()
        self._children: set[subprocess.Popen] = set()
        self._throttled = _Throttled()
        family = socket.AF_INET6 if ":" in policy.listen else socket.AF_INET
        try:
            self.sock = socket.create_server((policy.listen, policy.ports[0]), family=family, backlog=128)
        except OSError as exc:
            raise CcscopeError(f"cannot listen on {policy.listen}:{policy.ports[0]}: {exc.strerror}",
                               "is another server (iperf3 -s, ccscope serve) there? choose --ports") from None

    def serve_forever(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError as exc:
                if exc.errno in (errno.EBADF, errno.EINVAL):  # our socket is closed: serve is stopping
                    raise
                what = "shedding connections" if exc.errno in SHED_ERRNOS else "a connection failed at accept"
                self._throttled(what, f"{what}: {exc.strerror} ({self.access.connections()} control connections "
                                      "open)")
                time.sleep(0.05)
                continue
            self._admit(conn, peer[0])

    def _admit(self, conn: socket.socket, who: str) -> None:
        if not self.access.admits(who):
            _refuse_early(conn, "not in its --allow")
            self._throttled("allow", f"{who}: refused: not in --allow")
            return
        if (why := self.access.open_connection(who)) is not None:
            _refuse_early(conn, why)
            self._throttled("limit", f"{who}: refused: {why}")
            return
        try:
            threading.Thread(target=self._session, args=(conn, who), daemon=True).start()
        except RuntimeError:  # no thread to be had: shed this one
            self.access.close_connection(who)
            _refuse_early(conn, "no thread for it")
            self._throttled("threads", "shedding connections: no thread could be started")

    def close(self) -> None:
        self.sock.close()
        with self._lock:
            children = list(self._children)
        for proc in children:
            _kill(proc)

    # --- one client --------------------------------------------------------------------------------
    def _session(self, conn: socket.socket, who: str) -> None:
        try:
            with conn:
                self._converse(conn, who)
        except Exception as exc:  # whatever a client did: one throttled line, never a thread traceback
            self._throttled("error", f"{who}: dropped: {type(exc).__name__}: {str(exc)[:120]}")
        finally:
            self.access.close_connection(who)

    def _converse(self, conn: socket.socket, who: str) -> None:
        nonce = secrets.token_hex(16)
        started = time.monotonic()
        deadline = started + REQUEST_TIMEOUT_S  # for HELLO and the request together
        try:
            if _read_exactly(conn, len(protocol.HELLO), started + HELLO_TIMEOUT_S) != protocol.HELLO:
                return  # not a ccscope client
            protocol.send(conn, {"ccscope_serve": protocol.VERSION, "ports": list(self.policy.ports),
                                 "max_seconds": self.policy.max_seconds, "telemetry": self.telemetry is not None,
                                 "auth": "open" if self.access.token is None else "token", "nonce": nonce})
            line = protocol.read_line(conn, protocol.MAX_LINE_BYTES, deadline)
        except (OSError, protocol.ServeError):
            return  # a probe that only wanted the greeting, or too slow
        try:
            message = json.loads(line)
            self._authenticate(message, nonce)
            if isinstance(message, dict) and message.get("op") == "check":
                protocol.send(conn, {"ok": True})
                return
            request = self._check(message)
        except RecursionError:
            self._refuse(conn, who, "a request nested too deeply")
            return
        except (ValueError, UsageError) as exc:
            self._refuse(conn, who, str(exc)[:200])
            return
        if not self.access.start_test(who):
            self._refuse(conn, who, f"{who} runs {self.access.max_tests_per_source} tests already (its limit "
                                    "per source)")
            return
        try:
            if not self._slots.acquire(blocking=False):
                self._refuse(conn, who, f"the server is busy ({self.policy.max_tests} tests running, its limit)")
                return
            try:
                self._test(conn, who, request)
            except (OSError, protocol.ServeError) as exc:
                log(f"{who}: ended: {exc}")
            finally:
                self._slots.release()
        finally:
            self.access.end_test(who)

    def _refuse(self, conn: socket.socket, who: str, why: str) -> None:
        self._throttled("refused", f"{who}: refused: {why}")
        with contextlib.suppress(OSError):
            protocol.send(conn, {"ok": False, "error": why})

    def _authenticate(self, message: object, nonce: str) -> None:
        if self.access.token is None:
            return
        if not isinstance(message, dict) or "proof" not in message:
            raise UsageError("this ccscope serve needs its token (give the runner token_file or "
                             "CCSCOPE_SERVE_TOKEN)")
        if not protocol.proof_holds(self.access.token, nonce, message["proof"]):
            raise UsageError("the proof of the token does not hold (a different token?)")

    def _check(self, request: object) -> Request:
        if not isinstance(request, dict) or request.get("op") not in ("test", "download"):
            raise UsageError("expected {\"op\": \"test\" or \"download\", ...}")
        cc = request.get("cc")
        if not isinstance(cc, str) or not _ALG.match(cc):
            raise UsageError(f"{cc!r} is not a congestion control name")
        offered = self.offered()
        if cc not in offered:
            raise UsageError(f"the far end refused {cc}: not offered here (offered: {' '.join(offered) or 'none'})")
        seconds = request.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or \
                not 0 < seconds <= self.policy.max_seconds:
            raise UsageError(f"seconds {seconds!r}: a test here lasts at most {self.policy.max_seconds:g} s "
                             "(ccscope serve --max-seconds)")
        return Request(request["op"], cc, float(seconds), bool(request.get("reverse")))

    def offered(self) -> list[str]:
        return [a for a in AVAILABLE.read_text().split()
                if self.policy.algorithms is None or a in self.policy.algorithms]

    def _take_port(self) -> int:
        with self._lock:
            for i, port in enumerate(self._free):
                if not listening(port):
                    return self._free.pop(i)
        raise UsageError("no free port in the range")

    def _test(self, conn: socket.socket, who: str, request: Request) -> None:
        try:
            port = self._take_port()
        except UsageError as exc:
            protocol.send(conn, {"ok": False, "error": str(exc)})
            return
        proc, guard, users_file = None, None, None
        try:
            credentials = None
            if self.users is not None and request.op == "test":
                credentials, users_file = self.users.new_user(port)
            proc = self._spawn(request, port, users_file)
            self._wait_listening(proc, request, port)
            if self.telemetry:
                self.telemetry.watch(port, who)
            log(f"{who}: {request.op} cc={request.cc} seconds={request.seconds:g}"
                f"{' reverse' if request.reverse else ''} on port {port}")
            reply: dict = {"ok": True, "port": port}
            if credentials is not None:
                reply["iperf3"] = credentials.as_dict()
            conn.settimeout(REQUEST_TIMEOUT_S)
            protocol.send(conn, reply)
            guard = Guard(port, who, request.cc, foreign_allowed=credentials is not None,
                          stop_test=lambda reason, proc=proc: _kill(proc))
            done = _wait_done(conn, proc, time.monotonic() + request.seconds + SLACK_S)
            guard.close()
            self._finish(conn, who, port, done, guard.reason)
        finally:
            self._release(port, proc, guard, users_file)

    def _release(self, port: int, proc: subprocess.Popen | None, guard: Guard | None,
                 users_file: Path | None) -> None:
        """Everything a test held, each step whatever the others did: the port always comes back."""
        try:
            if guard is not None:
                guard.close()
            if self.telemetry:
                self.telemetry.forget(port)
            if proc is not None:
                with self._lock:
                    self._children.discard(proc)
                _kill(proc)
        finally:
            if users_file is not None:
                users_file.unlink(missing_ok=True)
            with self._lock:
                self._free.append(port)

    def _finish(self, conn: socket.socket, who: str, port: int, done: str, stopped: str | None) -> None:
        if stopped is not None:
            log(f"{who}: stopped the test on port {port}: {stopped}")
            with contextlib.suppress(OSError):
                protocol.send(conn, {"ok": False, "error": f"stopped: {stopped}"})
            return
        if done != "done":
            log(f"{who}: the test on port {port} ended: {done}")
            return
        answer = self.telemetry.reply(port) if self.telemetry else empty_reply()
        conn.settimeout(REPLY_TIMEOUT_S)
        conn.sendall(answer)
        log(f"{who}: done on port {port} ({len(answer)} bytes of telemetry)")

    def _wait_listening(self, proc: subprocess.Popen, request: Request, port: int) -> None:
        deadline = time.monotonic() + 5.0
        while not listening(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise protocol.ServeError(f"the {request.op} server did not start on port {port}")
            time.sleep(0.02)

    def _spawn(self, request: Request, port: int, users_file: Path | None) -> subprocess.Popen:
        bind = [] if self.policy.listen in ("0.0.0.0", "::") else ["-B", self.policy.listen]
        if request.op == "test":
            argv = ["iperf3", "-s", "-1", "-p", str(port), "--idle-timeout", str(CONNECT_GRACE_S), *bind]
            if users_file is not None and self.users is not None:
                argv += self.users.server_args(users_file)
            if self.policy.max_rate_bps:
                argv += ["--server-bitrate-limit", str(int(self.policy.max_rate_bps))]
        else:
            argv = [sys.executable, "-m", "ccscope.scenario.fetch", "serve", "--port", str(port), "--cc",
                    request.cc, "--bind", self.policy.listen, "--max-bytes", str(MAX_DOWNLOAD_BYTES),
                    "--max-connections", str(MAX_DOWNLOAD_CONNECTIONS), "--lifetime",
                    f"{request.seconds + SLACK_S:g}"]
        proc = subprocess.Popen([sys.executable, "-m", "ccscope.serve.child", str(os.getpid()), "--", *argv],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        with self._lock:
            self._children.add(proc)
        return proc


def _refuse_early(conn: socket.socket, why: str) -> None:
    """One line for a client refused before its session (so the runner can say why), never waited on."""
    with contextlib.suppress(OSError), conn:
        conn.setblocking(False)
        conn.send(json.dumps({"ccscope_serve": protocol.VERSION, "refused": why}).encode() + b"\n")


def _wait_done(conn: socket.socket, proc: subprocess.Popen, limit: float) -> str:
    """Until the client says "done" ("done"), or why not: the length bound, the client gone, or iperf3 over
    (a finished test, or nobody connected within CONNECT_GRACE_S) and no "done" within DONE_GRACE_S."""
    ended: float | None = None
    buf = bytearray()
    while True:
        now = time.monotonic()
        if now >= limit:
            return "stopped at its length bound"
        if ended is None and proc.poll() is not None:
            ended = now
        if ended is not None and now - ended > DONE_GRACE_S:
            return "its server ended and the client said nothing"
        readable, _, _ = select.select([conn], [], [], 0.1)
        if not readable:
            continue
        part = conn.recv(protocol.MAX_LINE_BYTES)
        if not part:
            return "the client closed the connection"
        buf += part
        if b"\n" in buf:
            return "done"
        if len(buf) > protocol.MAX_LINE_BYTES:
            return "the client sent an overlong line"


def _read_exactly(conn: socket.socket, size: int, deadline: float) -> bytes:
    buf = b""
    while len(buf) < size:
        left = deadline - time.monotonic()
        if left <= 0:
            break
        conn.settimeout(left)
        try:
            part = conn.recv(size - len(buf))
        except TimeoutError:
            break
        if not part:
            break
        buf += part
    return buf


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


@dataclass(frozen=True)
class Startup:
    """How serve starts: telemetry, the per-test iperf3 users, the user it drops to."""

    telemetry: bool
    sample_interval_s: float
    iperf3_users: bool
    user: Identity | None  # None: stay who we are (not root)


def run(policy: Policy, access: Access, startup: Startup) -> int:
    identity = startup.user
    probe = users = server = None

    def stop(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        if startup.telemetry:
            try:
                probe = Telemetry(startup.sample_interval_s)
            except CcscopeError as exc:
                log(f"no telemetry ({exc.line()}); tests still run, clients get no sender series from here")
        server = Server(policy, access, probe, None)
        if identity is not None:
            drop_privileges(identity, keep=("CAP_NET_ADMIN",))
        if startup.iperf3_users:
            users = server.users = Iperf3Users()
        log(f"listening on {policy.listen}:{policy.ports[0]} (tests on {policy.ports[0] + 1}-{policy.ports[1]}, "
            f"at most {policy.max_tests} at once and {access.max_tests_per_source} per source, each at most "
            f"{policy.max_seconds:g} s; telemetry {'on' if probe else 'off'}; algorithms "
            f"{','.join(policy.algorithms) if policy.algorithms else 'all of this kernel'}; "
            f"{'OPEN: anyone who reaches it may run tests' if access.token is None else 'token required'}; "
            f"{'per-test iperf3 users' if users else 'iperf3 without users: tests bound to the address'}; as "
            f"{identity.user if identity else f'uid {os.geteuid()}'})")
        server.serve_forever()
    except KeyboardInterrupt:
        log("stopped")
        return 0
    finally:
        signal.signal(signal.SIGTERM, old)
        if server is not None:
            server.close()
        if users is not None:
            users.close()
        if probe is not None:
            probe.close()
    return 0
