"""A real `ccscope daemon` subprocess for the tests, scraped over HTTP(S) like Prometheus would."""

from __future__ import annotations

import base64
import contextlib
import signal
import ssl
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator

from nethelpers import free_port, parse_metrics


class Daemon:
    """`ccscope daemon` on a free port of 127.0.0.1; started when the constructor returns."""

    def __init__(self, *args: str, tls: ssl.SSLContext | None = None) -> None:
        self.port = free_port()
        self.tls = tls  # the client side: trusts the daemon's certificate
        self.proc = subprocess.Popen([sys.executable, "-m", "ccscope.cli", "daemon", "--listen",
                                      f"127.0.0.1:{self.port}", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.first_lines = []
        line = self.proc.stderr.readline()  # "serving ..." once attached, or the one-line error
        while line.startswith("ccscope: warning:"):
            self.first_lines.append(line)
            line = self.proc.stderr.readline()
        self.first_lines.append(line)
        if "serving" not in line:
            self.stop()
            raise AssertionError(f"daemon did not start: {''.join(self.first_lines)}{self.proc.stderr.read()}")

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def get(self, path: str = "/metrics", user: str | None = None, password: str | None = None,
            timeout: float = 10) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) of one GET; HTTP errors are returned, not raised."""
        request = urllib.request.Request(self.url + path)
        if user is not None:
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self.tls) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def scrape_text(self, **auth: str) -> str:
        status, _, body = self.get("/metrics", **auth)
        assert status == 200, (status, body)
        return body.decode()

    def scrape(self, **auth: str) -> list[tuple[str, dict[str, str], float]]:
        return parse_metrics(self.scrape_text(**auth))

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return self.proc.returncode, self.proc.stderr.read()


@contextlib.contextmanager
def daemon(*args: str, tls: ssl.SSLContext | None = None) -> Iterator[Daemon]:
    running = Daemon(*args, tls=tls)
    try:
        yield running
    finally:
        running.stop()
