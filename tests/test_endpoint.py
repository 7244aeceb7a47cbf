"""The daemon's HTTP endpoint under hostile and unlucky clients: a real `ccscope daemon`, real sockets, real TLS.

Idle and slowloris connections must not hold up scrapes (over plain HTTP and TLS), malformed and oversize
requests get their 4xx, the connection limit refuses the excess without touching admitted connections, and
credentials come from an exporter-toolkit web config file (bcrypt users, TLS, client certificates).
"""

from __future__ import annotations

import contextlib
import os
import socket
import ssl
import subprocess
import sys
import threading
import time
from pathlib import Path

import bcrypt
import pytest
from ccscope.web.http import Limits
from ccscope_testkit.hostile import DripFlood, serial_scrapes
from ccscope_testkit.net import daemon, wait_for
from ccscope_testkit.prereqs import require_bpf_object, require_root, require_tools

SCRAPE_TIMEOUT_S = 10.0  # Prometheus's default scrape_timeout: a scrape slower than this is a failed scrape
# The server closes a connection that has not sent a complete request head (or TLS handshake) by then.
CLOSE_BOUND_S = max(Limits.request_timeout_s, Limits.handshake_timeout_s) + 5.0


@pytest.fixture(autouse=True)
def _prerequisites() -> None:
    require_root()
    require_tools("openssl")
    require_bpf_object()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Path:
    """A throwaway CA, a server certificate for 127.0.0.1 and a client certificate, all signed by the CA."""
    root = tmp_path_factory.mktemp("pki")
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _openssl("req", "-x509", *ec, "-keyout", str(root / "ca.key"), "-out", str(root / "ca.crt"), "-days", "2",
             "-subj", "/CN=ccscope test CA")
    (root / "server.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    (root / "client.ext").write_text("extendedKeyUsage=clientAuth\n")
    for name in ("server", "client"):
        _openssl("req", *ec, "-keyout", str(root / f"{name}.key"), "-out", str(root / f"{name}.csr"),
                 "-subj", f"/CN=ccscope test {name}")
        _openssl("x509", "-req", "-in", str(root / f"{name}.csr"), "-CA", str(root / "ca.crt"),
                 "-CAkey", str(root / "ca.key"), "-CAcreateserial", "-days", "2", "-out", str(root / f"{name}.crt"),
                 "-extfile", str(root / f"{name}.ext"))
    return root


def client_tls(pki: Path, cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki / "ca.crt"))
    if cert:
        context.load_cert_chain(str(pki / "client.crt"), str(pki / "client.key"))
    return context


USERS = {"prometheus": "s3cret pass", "alice": "wonderland"}


@pytest.fixture(scope="module")
def web_config(pki: Path) -> Path:
    """TLS (relative file names: relative to the config file) and two bcrypt users, as node_exporter reads it."""
    hashes = {user: bcrypt.hashpw(pw.encode(), bcrypt.gensalt(10)).decode() for user, pw in USERS.items()}
    path = pki / "web-config.yml"
    path.write_text(
        "tls_server_config:\n  cert_file: server.crt\n  key_file: server.key\n  min_version: TLS12\n"
        "http_server_config:\n  headers:\n    X-Content-Type-Options: nosniff\n"
        "basic_auth_users:\n" + "".join(f"  {user}: '{hashed}'\n" for user, hashed in hashes.items()))
    return path


# --- hostile clients -------------------------------------------------------------------------------------------


def raw_connection(port: int, tls: ssl.SSLContext | None = None) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=SCRAPE_TIMEOUT_S)
    return tls.wrap_socket(sock, server_hostname="127.0.0.1") if tls else sock


def closed_by_server(sock: socket.socket, deadline: float) -> bytes | None:
    """Everything the server sent until it closed the connection; None if it was still open at the deadline."""
    received = b""
    while (remaining := deadline - time.monotonic()) > 0:
        sock.settimeout(remaining)
        try:
            chunk = sock.recv(4096)
        except TimeoutError:
            return None
        except (ConnectionResetError, ssl.SSLError):
            return received
        if not chunk:
            return received
        received += chunk
    return None


class Slowloris:
    """Connections that send a request head one byte every `interval_s`, never finishing it."""

    HEAD = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 10_000

    def __init__(self, port: int, count: int, tls: ssl.SSLContext | None, interval_s: float = 0.2) -> None:
        self.socks = [raw_connection(port, tls) for _ in range(count)]
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._drip, args=(interval_s,), daemon=True)
        self._thread.start()

    def _drip(self, interval_s: float) -> None:
        for byte in self.HEAD:
            for sock in self.socks:
                with contextlib.suppress(OSError):
                    sock.send(bytes([byte]))
            self.sent += 1
            if self._stop.wait(interval_s):
                return

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


@pytest.mark.parametrize("scheme", ["http", "https"])
def test_idle_and_slowloris_connections_do_not_block_scrapes(scheme: str, pki: Path, web_config: Path) -> None:
    tls = client_tls(pki) if scheme == "https" else None
    args = ("--flows", "none", *(("--web.config.file", str(web_config)) if tls else ()))
    auth = {"user": "prometheus", "password": USERS["prometheus"]} if tls else {}
    idle: list[socket.socket] = []
    slow = None
    with daemon(*args, tls=tls) as running:
        try:
            # Idle: TCP connected, nothing said (over TLS: not even a ClientHello). Before the fix, one of these
            # stalled the TLS endpoint for everyone: the handshake ran in accept() on the serving thread.
            idle = [socket.create_connection(("127.0.0.1", running.port)) for _ in range(16)]
            slow = Slowloris(running.port, 8, tls)
            started = time.monotonic()
            took = []
            for _ in range(5):
                begin = time.monotonic()
                status, _, body = running.get("/metrics", timeout=SCRAPE_TIMEOUT_S, **auth)
                took.append(time.monotonic() - begin)
                assert status == 200, (status, body)
                assert b"ccscope_build_info" in body
            assert max(took) < SCRAPE_TIMEOUT_S, took
            # ... and the server lets go of them: silent ones are closed, the slowloris ones get a 408.
            deadline = started + CLOSE_BOUND_S
            silent = [closed_by_server(sock, deadline) for sock in idle]
            assert all(got is not None for got in silent), "an idle connection stayed open past the timeouts"
            dripped = [closed_by_server(sock, deadline) for sock in slow.socks]
            assert all(got is not None and got.startswith(b"HTTP/1.1 408") for got in dripped), dripped
            assert slow.sent < len(Slowloris.HEAD)  # cut off while still dripping
            assert running.get("/metrics", **auth)[0] == 200
            # A connection that is open when SIGTERM comes does not hold up the exit (it hung it before the fix).
            idle.append(socket.create_connection(("127.0.0.1", running.port)))
            code, err = running.stop()
            assert code == 0 and "detached" in err, err
        finally:
            if slow:
                slow.close()
            for sock in idle + (slow.socks if slow else []):
                sock.close()


# --- malformed, oversize, unknown --------------------------------------------------------------------------------


def exchange(port: int, request: bytes) -> bytes:
    """Send raw bytes, return everything the server answers before it closes (or 5 s pass)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(request)
        return closed_by_server(sock, time.monotonic() + 5) or b""


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1]) if response.startswith(b"HTTP/1.1 ") else 0


def test_unknown_paths_bad_and_oversize_requests() -> None:
    with daemon("--flows", "none") as running:
        port = running.port
        status, _, body = running.get("/nope")
        assert status == 404, body
        assert running.get("/metricsx")[0] == 404
        assert running.get("/")[0] == 200  # the landing page
        cases = {
            b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n": 414,
            b"GET /metrics HTTP/1.1\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n": 431,
            b"GET /metrics HTTP/1.1\r\n" + b"".join(b"X-%d: 1\r\n" % i for i in range(200)) + b"\r\n": 431,
            b"POST /metrics HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello": 413,
            b"POST /metrics HTTP/1.1\r\nConnection: close\r\n\r\n": 405,
            b"GET /metrics HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n": 501,
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03\r\n\r\n": 400,  # TLS on the plain port
            b"GET /metrics HTTP/2.0\r\n\r\n": 505,
            b"GET /metrics HTTP/1.1\r\nNo colon here\r\n\r\n": 400,
        }
        answers = {request[:30]: status_of(exchange(port, request)) for request in cases}
        assert answers == {request[:30]: status for request, status in cases.items()}
        # A keep-alive connection serves several requests; HEAD has no body.
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\nGET /nope HTTP/1.1\r\nConnection: close\r\n\r\n")
            both = closed_by_server(sock, time.monotonic() + 5)
        assert both is not None and both.count(b"HTTP/1.1 ") == 2
        assert status_of(both) == 200 and b"HTTP/1.1 404" in both
        assert running.get("/metrics")[0] == 200


def connect_from(source: str, port: int) -> socket.socket:
    """A connection to 127.0.0.1 from another loopback address: how a second host looks to the server."""
    sock = socket.socket()
    sock.settimeout(5)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def test_a_full_table_displaces_a_waiting_connection_never_a_busy_one() -> None:
    """At the connection limit a newcomer takes the slot of a connection that waits (here idle): from the address
    with the most connections, the one waiting longest. Only when every slot is answering a request: a 503."""
    from ccscope.web.http import HttpServer, Response, Route

    entered, release = threading.Semaphore(0), threading.Event()

    def slow(_request):
        entered.release()
        release.wait(SCRAPE_TIMEOUT_S)
        return Response(200, b"slow\n")

    routes = {"/slow": Route(slow), "/ok": Route(lambda _request: Response(200, b"ok\n"))}
    server = HttpServer("127.0.0.1", 0, routes, limits=Limits(max_connections=4))
    port, socks = server.port, []
    try:
        socks += [connect_from("127.0.0.2", port)]  # the longest waiting, but its address holds one connection
        socks += [connect_from("127.0.0.1", port) for _ in range(3)]
        other, oldest, younger, busy = socks
        busy.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\n\r\n")
        assert entered.acquire(timeout=5) and wait_for(lambda: server.open_connections == 4)
        # Before, the newcomer got a 503 here (the probe's finding: a slow client could hold every slot).
        assert status_of(exchange(port, b"GET /ok HTTP/1.1\r\nConnection: close\r\n\r\n")) == 200
        assert closed_by_server(oldest, time.monotonic() + 2) == b""  # displaced: closed without an answer
        assert closed_by_server(other, time.monotonic() + 0.2) is None  # 127.0.0.2 kept its one connection
        assert closed_by_server(younger, time.monotonic() + 0.2) is None
        assert server.displaced_total == 1 and server.refused_total == 0
        # Every slot answering a request (the exchange's slot came free when it closed; this one takes it): nothing
        # to displace, so the newcomer is refused, and the others are untouched.
        socks += [connect_from("127.0.0.1", port)]
        for sock in (other, younger, socks[-1]):
            sock.sendall(b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert all(entered.acquire(timeout=5) for _ in range(3))
        assert status_of(exchange(port, b"GET /ok HTTP/1.1\r\n\r\n")) == 503
        release.set()
        replies = [closed_by_server(sock, time.monotonic() + 5) or b"" for sock in (other, younger, socks[-1])]
        assert [status_of(r) for r in replies] == [200] * 3, replies
        assert status_of(busy.recv(4096)) == 200
    finally:
        release.set()
        server.close()
        for sock in socks:
            sock.close()


def test_a_flood_of_slow_requests_does_not_take_metrics_away() -> None:
    """The hostile probe's attack, shortened: more dripping connections than slots, each reopened as soon as the
    server closes it, while a well-behaved scraper scrapes on new connections. Before: every scrape got a 503 or
    a reset. The full version, with its latency target, is bench/endpoint.py's."""
    with daemon("--flows", "none", "--max-connections", "16") as running, \
            DripFlood(running.port, 24, interval_s=0.2) as flood:
        wait_for(lambda: flood.reopened >= 8)  # the table is full and the excess is being turned over
        latencies, failures = serial_scrapes(running.port, 10, every_s=0.3)
        assert failures == [], failures
        assert len(latencies) == 10 and max(latencies) < SCRAPE_TIMEOUT_S
        assert flood.reopened >= 8, flood.reopened


# --- credentials: the exporter-toolkit web config file ---------------------------------------------------------


def test_web_config_tls_and_bcrypt_users(pki: Path, web_config: Path) -> None:
    with daemon("--flows", "none", "--web.config.file", str(web_config), tls=client_tls(pki)) as running:
        for user, password in USERS.items():
            status, headers, body = running.get("/metrics", user, password)
            assert status == 200, body
            assert headers.get("X-Content-Type-Options") == "nosniff"
        for user, password in (("prometheus", "wrong"), ("nobody", "s3cret pass"), ("alice", "x" * 100)):
            assert running.get("/metrics", user, password)[0] == 401
        status, headers, _ = running.get("/metrics")
        assert status == 401 and headers.get("WWW-Authenticate") == 'Basic realm="ccscope"'
        assert running.get("/nope")[0] == 401  # no credentials, no hint which paths exist
        assert running.get("/nope", "alice", USERS["alice"])[0] == 404
        # Plain HTTP on the TLS port gets no metrics, and the certificate is the configured one.
        assert status_of(exchange(running.port, b"GET /metrics HTTP/1.1\r\n\r\n")) != 200
        with raw_connection(running.port, client_tls(pki)) as sock:
            assert sock.version() in ("TLSv1.2", "TLSv1.3")
            assert dict(x[0] for x in sock.getpeercert()["subject"])["commonName"] == "ccscope test server"


def test_web_config_client_certificates(pki: Path) -> None:
    config = pki / "mtls.yml"
    config.write_text(f"tls_server_config:\n  cert_file: {pki / 'server.crt'}\n  key_file: {pki / 'server.key'}\n"
                      f"  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: {pki / 'ca.crt'}\n")
    with daemon("--flows", "none", "--web.config.file", str(config), tls=client_tls(pki, cert=True)) as running:
        assert running.get("/metrics")[0] == 200
        running.tls = client_tls(pki)  # the same daemon, now from a client without a certificate
        with pytest.raises(OSError):  # the handshake fails: SSLError, or a reset when TLS 1.3 reports it late
            running.get("/metrics")


def test_deprecated_basic_auth_file_still_works(tmp_path: Path) -> None:
    import hashlib

    users = tmp_path / "users"
    users.write_text(f"prometheus:{hashlib.sha256(b'pw').hexdigest()}\n")
    with daemon("--flows", "none", "--basic-auth-file", str(users)) as running:
        assert any("deprecated" in line and "--web.config.file" in line for line in running.warnings)
        assert running.get("/metrics", "prometheus", "pw")[0] == 200
        assert running.get("/metrics", "prometheus", "nope")[0] == 401


WEB = "--web.config.file"
BASIC = "--basic-auth-file"


@pytest.mark.parametrize("flag, content, needle", [
    (WEB, b"basic_auth_users:\n  bob: '\xff\xfe'\n", "not UTF-8"),
    (WEB, b"basic_auth_users: [unclosed\n", "not valid YAML"),
    (WEB, b"- a list\n", "must be a mapping"),
    (WEB, b"basic_auth_user:\n  bob: x\n", "unknown field basic_auth_user"),
    (WEB, b"basic_auth_users:\n  bob: 5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8\n",
     "basic_auth_users.bob is not a bcrypt hash"),
    (WEB, b"tls_server_config:\n  cert_file: /nonexistent.crt\n  key_file: /nonexistent.key\n",
     "cannot load the TLS certificate/key"),
    (WEB, b"tls_server_config:\n  cert_file: server.crt\n", "tls_server_config.key_file"),
    (WEB, b"tls_server_config:\n  cert_file: a\n  key_file: b\n  min_version: TLS14\n", "min_version 'TLS14'"),
    (WEB, b"tls_server_config:\n  cert_file: a\n  key_file: b\n  client_auth_type: RequireAnyClientCert\n",
     "client_auth_type 'RequireAnyClientCert'"),
    (WEB, b"tls_server_config:\n  cert_file: a\n  key_file: b\n  cipher_suites: [TLS_AES_128_GCM_SHA256]\n",
     "cipher_suites is not supported"),
    (WEB, b"rate_limit:\n  interval: 1s\n  burst: 5\n", "rate_limit is not supported"),
    (BASIC, b"bob:\xff\xfe\n", "not UTF-8"),
    (BASIC, b"bob:abc\n", "expected user:sha256hex"),
    (BASIC, b"# nobody\n", "no users"),
    (WEB, None, "not a regular file"),  # a FIFO: refused, not waited on
])
def test_bad_credentials_file_is_one_line(tmp_path: Path, flag: str, content: bytes | None, needle: str) -> None:
    path = tmp_path / "credentials"
    if content is None:
        os.mkfifo(path)
    else:
        path.write_bytes(content)
    result = subprocess.run([sys.executable, "-m", "ccscope.cli", "daemon", flag, str(path)],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ccscope: error: {flag}"), result.stderr
    assert needle in lines[0], lines[0]


def test_web_config_excludes_the_older_flags(web_config: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "ccscope.cli", "daemon", "--web.config.file", str(web_config),
                             "--basic-auth-file", "/etc/hostname"], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "--web.config.file replaces" in result.stderr


# --- the streaming hook (server-sent events and other long-lived responses) ------------------------------------------


def test_a_pages_last_events_reach_it_when_the_scenario_closes_at_once() -> None:
    """The live page's report link is the scenario's last event, queued a moment before the process closes the hub
    and the server and exits. The server used to stop its streams at once on close(), so under load the page
    missed the link (test_live saw it in about 1 run of 3). close() now lets them write what was queued, and the
    page's event stream names Cache-Control once."""
    from ccscope.live.app import LiveApp, table_rows
    from ccscope.live.hub import Hub
    from ccscope.metrics_endpoint import MetricsServer
    from prometheus_client import CollectorRegistry

    hub = Hub(mode="scenario", table_rows=table_rows)
    server = MetricsServer(CollectorRegistry(), "127.0.0.1", 0)
    LiveApp(hub).mount(server)
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    try:
        sock.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
        received = sock.recv(65536)
        while b"event: hello" not in received:
            received += sock.recv(65536)
        hub.scenario.report("/results/report.html", "report/report.html")
        hub.close()
        server.close()
        while chunk := sock.recv(65536):
            received += chunk
    finally:
        sock.close()
        hub.close()
        server.close()
    head = received.split(b"\r\n\r\n", 1)[0].lower()
    assert head.count(b"cache-control:") == 1, head
    assert b'"report_url":"report/report.html"' in received
    assert received.rstrip().endswith(b"event: bye\ndata: {}")


def test_streams_have_their_own_limit_and_end_on_close() -> None:
    """Long-lived responses take stream slots, never the ones scrapes need; close() ends them promptly."""
    from ccscope.web.http import HttpServer, Response, Route, Stream

    def events(request):
        def chunks():
            number = 0
            while not request.stopping.wait(0.05):
                number += 1
                yield f"data: {number}\n\n".encode()
        return Stream(chunks())

    limits = Limits(max_connections=16, max_streams=2)
    routes = {"/events": Route(events, stream=True), "/ok": Route(lambda _request: Response(200, b"ok\n"))}
    server = HttpServer("127.0.0.1", 0, routes, limits=limits)
    streams: list[socket.socket] = []
    try:
        for _ in range(limits.max_streams):
            sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            sock.sendall(b"GET /events HTTP/1.1\r\nHost: x\r\n\r\n")
            head = sock.recv(4096)
            assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head, head
            streams.append(sock)
        assert status_of(exchange(server.port, b"GET /events HTTP/1.1\r\n\r\n")) == 503
        for _ in range(3):  # the streams keep flowing, and plain requests are served beside them
            assert status_of(exchange(server.port, b"GET /ok HTTP/1.1\r\nConnection: close\r\n\r\n")) == 200
        assert all(b"data: " in sock.recv(4096) for sock in streams)
        started = time.monotonic()
    finally:
        server.close()
    try:
        ends = [closed_by_server(sock, time.monotonic() + 5) for sock in streams]
        assert all(end is not None for end in ends), "a stream outlived close()"
        assert time.monotonic() - started < 5
    finally:
        for sock in streams:
            sock.close()
