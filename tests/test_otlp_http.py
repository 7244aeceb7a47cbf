"""The OTLP/HTTP transport against collectors that misbehave (the hostile probe's findings on `daemon --otlp`):
a redirect, an answer trickled a byte at a time, an endless answer, and credentials in the URL. Each server
here is a real TCP listener on loopback that speaks just enough HTTP/1.1 to do its one thing."""

from __future__ import annotations

import base64
import contextlib
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
from ccscope.errors import UsageError
from ccscope.otlp import OtlpOptions, OtlpPush
from ccscope.otlp_http import Endpoint, ExportFailed, post, redact
from prometheus_client.core import GaugeMetricFamily


class Collector:
    """Accepts connections, reads one request each (headers and body), and hands the socket to `answer`."""

    def __init__(self, answer: Callable[[socket.socket], None]) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.written = 0
        self.answered = threading.Event()  # the last answer ended, or the client hung up on it
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            with conn:
                self.requests.append(self._request(conn))
                with contextlib.suppress(OSError):  # the client hung up: what the bounded transport does
                    self.answer(conn)
                self.answered.set()

    @staticmethod
    def _request(conn: socket.socket) -> bytes:
        data = b""
        while b"\r\n\r\n" not in data:
            data += conn.recv(65536)
        head, _, body = data.partition(b"\r\n\r\n")
        length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(
            b"content-length:"))
        while len(body) < length:
            body += conn.recv(65536)
        return head

    def send(self, conn: socket.socket, data: bytes) -> None:
        conn.sendall(data)
        self.written += len(data)

    def close(self) -> None:
        self.listener.close()


@contextmanager
def collector(answer: Callable[[Collector, socket.socket], None]) -> Iterator[Collector]:
    server = Collector(lambda conn: answer(server, conn))
    try:
        yield server
    finally:
        server.close()


def redirect(server: Collector, conn: socket.socket) -> None:
    server.send(conn, b"HTTP/1.1 307 Temporary Redirect\r\nLocation: http://127.0.0.1:9/v1/metrics\r\n"
                      b"Content-Length: 0\r\n\r\n")


def trickle(server: Collector, conn: socket.socket) -> None:
    server.send(conn, b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    for _ in range(1000):
        server.send(conn, b"x")
        time.sleep(0.05)  # the misbehaviour itself: a byte every 50 ms


def trickle_headers(server: Collector, conn: socket.socket) -> None:
    server.send(conn, b"HTTP/1.1 200 OK\r\n")
    for _ in range(1000):
        server.send(conn, b"X")
        time.sleep(0.05)


def continues(server: Collector, conn: socket.socket) -> None:
    for _ in range(1000):
        server.send(conn, b"HTTP/1.1 100 Continue\r\n\r\n")
        time.sleep(0.01)


def endless(server: Collector, conn: socket.socket) -> None:
    server.send(conn, b"HTTP/1.1 200 OK\r\nContent-Length: 200000000\r\n\r\n")
    block = b"\0" * 65536
    while server.written < 200_000_000:
        server.send(conn, block)


def fine(server: Collector, conn: socket.socket) -> None:
    server.send(conn, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")


def refuse(server: Collector, conn: socket.socket) -> None:
    server.send(conn, b"HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\n\r\n")


def test_a_redirect_is_a_failed_export() -> None:
    """Before: the SDK followed the 307 (to a port where nothing listens here) or took it for a delivery."""
    with collector(redirect) as server:
        with pytest.raises(ExportFailed, match="answered 307 Temporary Redirect"):
            post(Endpoint.parse(f"http://127.0.0.1:{server.port}/v1/metrics"), b"x", {}, 2.0)
        assert len(server.requests) == 1  # and nothing was sent elsewhere


@pytest.mark.parametrize("answer", [trickle_headers, continues], ids=["trickled headers", "100 Continue"])
def test_a_trickled_answer_ends_at_the_timeout(answer) -> None:
    """Before: a byte every 8 s held a push about 60 s despite --otlp-timeout 1s (each read had its timeout)."""
    with collector(answer) as server:
        started = time.monotonic()
        with pytest.raises(ExportFailed, match="no answer within 1 s"):
            post(Endpoint.parse(f"http://127.0.0.1:{server.port}/v1/metrics"), b"x", {}, 1.0)
        assert time.monotonic() - started < 3  # 1 s and the thread's wake-up, on a busy machine


def test_a_trickled_body_is_never_waited_for() -> None:
    with collector(trickle) as server:
        started = time.monotonic()
        post(Endpoint.parse(f"http://127.0.0.1:{server.port}/v1/metrics"), b"x", {}, 5.0)
        assert time.monotonic() - started < 3


def test_an_endless_answer_is_not_read() -> None:
    """Before: a 200 MB answer took the daemon from 51 to 459 MB. The body is not read: the connection closes
    after the status and headers, and the server could write no more than the sockets' buffers hold."""
    with collector(endless) as server:
        post(Endpoint.parse(f"http://127.0.0.1:{server.port}/v1/metrics"), b"x", {}, 5.0)
        assert server.answered.wait(10), "the server still writes: the connection stayed open"
    assert server.written < 16 * 1024 * 1024, server.written


def test_credentials_in_the_url_are_sent_and_never_shown() -> None:
    with collector(refuse) as server:
        url = f"http://ops:s3cret@127.0.0.1:{server.port}/v1/metrics"
        endpoint = Endpoint.parse(url)
        assert endpoint.shown == f"http://127.0.0.1:{server.port}/v1/metrics" == redact(url)
        said: list[str] = []
        push = OtlpPush(OtlpOptions.parse(url, None, 60.0, 1.0), lambda: [GaugeMetricFamily("x", "x", value=1)],
                        say=said.append)
        try:
            assert push.push() is False
        finally:
            push.close()
    basic = "Basic " + base64.b64encode(b"ops:s3cret").decode()
    assert f"Authorization: {basic}".encode() in server.requests[0]
    assert said and all("s3cret" not in line and "ops" not in line for line in said), said
    assert "401 Unauthorized" in said[0]


def test_a_collector_that_takes_it_is_a_success() -> None:
    with collector(fine) as server:
        push = OtlpPush(OtlpOptions.parse(f"http://127.0.0.1:{server.port}/v1/metrics", ["X-Scope=a"], 60.0, 1.0),
                        lambda: [GaugeMetricFamily("ccscope_flow_cwnd_segments", "x", value=10)], say=print)
        try:
            assert push.push() is True and push.stats.succeeded >= 1 and push.stats.failed == 0
        finally:
            push.close()
    head = server.requests[0]
    assert head.startswith(b"POST /v1/metrics HTTP/1.1") and b"Content-Type: application/x-protobuf" in head
    assert b"X-Scope: a" in head


@pytest.mark.parametrize("url", ["http://127.0.0.1:99999/v1/metrics", "ftp://h/v1", "http:///v1/metrics",
                                 "http://[::1/v1/metrics", "http://h:0/v1/metrics"])
def test_a_bad_url_is_one_line_without_its_secret(url: str) -> None:
    with pytest.raises(UsageError) as caught:
        OtlpOptions.parse(url.replace("//", "//u:pw@", 1), None, 10.0, 5.0)
    assert "pw" not in caught.value.line()


@pytest.mark.parametrize("header", ["Authorization=Bearer s3cret\n", "X-A=\r\nInjected: 1", "X-B=\u2603s3cret"])
def test_a_header_http_cannot_carry_is_one_line_without_its_value(header: str) -> None:
    """A Kubernetes secret with its trailing newline killed the push thread with the secret in a traceback."""
    with pytest.raises(UsageError, match="may not hold line breaks") as caught:
        OtlpOptions.parse("http://127.0.0.1:4318/v1/metrics", [header], 10.0, 5.0)
    assert "s3cret" not in caught.value.line() and "Injected" not in caught.value.line()


def test_tls_files_that_cannot_be_used_are_one_line(tmp_path) -> None:
    (tmp_path / "ca.pem").write_text("not a certificate")
    for ca in (str(tmp_path / "missing.pem"), str(tmp_path / "ca.pem")):
        with pytest.raises(UsageError, match="--otlp-ca"):
            OtlpOptions.parse("https://127.0.0.1:4318/v1/metrics", None, 10.0, 5.0, ca=ca)


def test_the_sdk_environment_is_said_to_be_unused(monkeypatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_HEADERS", "authorization=Bearer s3cret")
    said: list[str] = []
    push = OtlpPush(OtlpOptions.parse("http://127.0.0.1:9/v1/metrics", None, 60.0, 1.0), list, say=said.append)
    push.close()
    assert said[0] == ("ccscope: note: OTEL_EXPORTER_OTLP_HEADERS not used: --otlp, --otlp-header and the "
                       "--otlp-* TLS flags say where and how to push")
