"""The hostile probe's attack on the metrics endpoint (issue 17), and a scraper that behaves, shared by
tests/test_endpoint.py and bench/endpoint.py.

The attack: many connections that each send `GET /metrics ...` one byte at a time and never finish the head,
reopened as soon as the server closes them (a 408 at the request deadline, a 503, or a displacement). Against a
shared cap of 128 connections, 150 of these took /metrics away from every other client before the fix.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time

HEAD = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Padding: " + b"a" * 100_000
SCRAPE = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: well-behaved-scraper\r\nConnection: close\r\n\r\n"


class DripFlood:
    """`count` connections from 127.0.0.1, each sending one more byte of a request head every `interval_s`; a
    connection the server closed or answered is reopened at the next tick. Counts how often that happened."""

    def __init__(self, port: int, count: int, interval_s: float = 1.0) -> None:
        self.port = port
        self.reopened = 0
        self.socks: list[socket.socket | None] = [self._open() for _ in range(count)]
        self.offsets = [0] * count
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(interval_s,), daemon=True)
        self._thread.start()

    def _open(self) -> socket.socket | None:
        try:
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=2)
        except OSError:
            return None
        sock.setblocking(False)
        return sock

    def _run(self, interval_s: float) -> None:
        while not self._stop.wait(interval_s):
            for i, sock in enumerate(self.socks):
                if sock is None or _closed(sock):
                    if sock is not None:
                        sock.close()
                    sock = self.socks[i] = self._open()
                    self.offsets[i] = 0
                    self.reopened += 1
                    if sock is None:
                        continue
                try:
                    sock.send(HEAD[self.offsets[i]:self.offsets[i] + 1])
                    self.offsets[i] += 1
                except OSError:  # reset: reopened at the next tick
                    sock.close()
                    self.socks[i] = None

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for sock in self.socks:
            if sock is not None:
                sock.close()

    def __enter__(self) -> DripFlood:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _closed(sock: socket.socket) -> bool:
    """The server said something (a 408 or 503) or closed: either way this connection is done."""
    poller = select.poll()  # not select(): the test process may hold descriptors above 1024
    poller.register(sock, select.POLLIN)
    if not poller.poll(0):
        return False
    with contextlib.suppress(OSError):
        sock.recv(65536)
    return True


def scrape(port: int, timeout_s: float = 10.0) -> tuple[float, str | None]:
    """One GET /metrics on a new connection, read to the end: (seconds, None) or (seconds, what went wrong)."""
    started = time.perf_counter()
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as sock:
            sock.sendall(SCRAPE)
            received = bytearray()
            while chunk := sock.recv(65536):
                received += chunk
                if time.perf_counter() - started > timeout_s:
                    raise TimeoutError("slower than the scrape timeout")
    except OSError as exc:
        return time.perf_counter() - started, type(exc).__name__
    took = time.perf_counter() - started
    head, _, body = bytes(received).partition(b"\r\n\r\n")
    status = head.split(b" ", 2)[1].decode() if head.startswith(b"HTTP/1.1 ") else "no answer"
    if status != "200":
        return took, f"HTTP {status}"
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                   if line.lower().startswith(b"content-length:")), -1)
    if length != len(body) or b"ccscope_build_info" not in body:
        return took, "truncated body"
    return took, None


def serial_scrapes(port: int, count: int, every_s: float) -> tuple[list[float], list[str]]:
    """`count` scrapes one after another, one every `every_s`: latencies of the good ones, and the failures."""
    latencies, failures = [], []
    for _ in range(count):
        started = time.monotonic()
        took, failure = scrape(port)
        if failure is None:
            latencies.append(took)
        else:
            failures.append(failure)
        time.sleep(max(0.0, every_s - (time.monotonic() - started)))
    return latencies, failures
