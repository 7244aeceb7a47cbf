"""The metrics endpoint: prometheus-client's WSGI app behind optional TLS and basic auth; other paths go to
the live page's app when there is one (same listener, same auth, same TLS)."""

from __future__ import annotations

import base64
import errno
import hashlib
import hmac
import socket
import ssl
import threading
from pathlib import Path
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from .errors import PrerequisiteError, UsageError


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _V6ThreadingServer(_ThreadingServer):
    address_family = socket.AF_INET6


class _QuietHandler(WSGIRequestHandler):
    def setup(self) -> None:
        # A reader that stalls holds at most this much in the kernel (autotuning would let it grow to
        # tcp_wmem's 4 MB per connection); the live page's own bounded queue takes over from there.
        self.request.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, STREAM_SNDBUF)
        super().setup()

    def log_message(self, *args: object) -> None:  # no access log on stderr
        pass


STREAM_SNDBUF = 32 * 1024


def load_basic_auth(path: Path) -> dict[str, str]:
    """A file of `user:sha256hex` lines (hash with: printf %s PASSWORD | sha256sum)."""
    try:
        lines = path.read_text().splitlines()
    except OSError as exc:
        raise UsageError(f"--basic-auth-file {path}: {exc.strerror}") from None
    users = {}
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.startswith("#"):
            continue
        user, sep, digest = line.strip().partition(":")
        if not sep or len(digest) != 64:
            raise UsageError(f"--basic-auth-file {path}:{number}: expected user:sha256hex")
        users[user] = digest.lower()
    if not users:
        raise UsageError(f"--basic-auth-file {path}: no users")
    return users


def _with_basic_auth(app, users: dict[str, str]):
    def guarded(environ, start_response):
        header = environ.get("HTTP_AUTHORIZATION", "")
        if header.startswith("Basic "):
            try:
                user, _, password = base64.b64decode(header[6:]).decode().partition(":")
            except ValueError:
                user, password = "", ""
            digest = hashlib.sha256(password.encode()).hexdigest()
            if user in users and hmac.compare_digest(digest, users[user]):
                return app(environ, start_response)
        start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="ccscope"')])
        return [b"unauthorized\n"]

    return guarded


def _with_live(metrics_app, live_app):
    def route(environ, start_response):
        path = environ.get("PATH_INFO", "/")
        return (metrics_app if path == "/metrics" else live_app)(environ, start_response)

    return route


class MetricsServer:
    """Serves /metrics in a background thread until close()."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int, *,
                 tls: tuple[Path, Path] | None = None, basic_auth: dict[str, str] | None = None,
                 live=None) -> None:
        app = make_wsgi_app(registry)
        if live is not None:
            app = _with_live(app, live)
        if basic_auth:
            app = _with_basic_auth(app, basic_auth)
        server_class = _V6ThreadingServer if ":" in host else _ThreadingServer
        try:
            self.httpd = make_server(host, port, app, server_class, handler_class=_QuietHandler)
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PrerequisiteError(f"port {port} on {host} is already in use",
                                        "stop the other process or pick another --listen") from None
            raise PrerequisiteError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
        if tls:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            try:
                context.load_cert_chain(str(tls[0]), str(tls[1]))
            except (OSError, ssl.SSLError) as exc:
                self.httpd.server_close()
                raise UsageError(f"--tls-cert/--tls-key: cannot load: {exc}") from None
            self.httpd.socket = context.wrap_socket(self.httpd.socket, server_side=True)
        self.port = self.httpd.server_address[1]
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
