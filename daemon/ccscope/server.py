"""The metrics endpoint: /metrics (and a landing page at /) on the hardened web server."""

from __future__ import annotations

import gzip
import ssl
import threading
from collections.abc import Callable

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from . import __version__
from .web.server import Authenticator, HttpServer, Limits, Request, Response, Route

LANDING = """<!doctype html>
<html><head><meta charset="utf-8"><title>ccscope</title></head>
<body><h1>ccscope {version}</h1><p>Live TCP congestion telemetry: <a href="metrics">metrics</a></p></body></html>
"""


class Flight:
    """One collection, shared by every request that joined it."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.body = b""
        self.error: Exception | None = None
        self._gzipped: bytes | None = None
        self._lock = threading.Lock()

    def gzipped(self) -> bytes:
        with self._lock:
            if self._gzipped is None:
                self._gzipped = gzip.compress(self.body, compresslevel=6)
            return self._gzipped


class SharedCollection:
    """Concurrent scrapes share one collection instead of each reading the kernel maps and rendering the text.

    Fifty scrapers at once would otherwise run fifty collections, serialized by the GIL, and the last one
    would wait for all the others. A request that arrives while a collection of the same format is running
    takes its result (as Go's singleflight does): it may have started a few milliseconds before the request,
    never more than one collection's duration.
    """

    def __init__(self, produce: Callable[[str], bytes]) -> None:
        self._produce = produce
        self._lock = threading.Lock()
        self._running: dict[str, Flight] = {}

    def get(self, key: str) -> Flight:
        with self._lock:
            flight = self._running.get(key)
            owner = flight is None
            if owner:
                flight = self._running[key] = Flight()
        if not owner:
            flight.done.wait()
            return flight
        try:
            flight.body = self._produce(key)
        except Exception as exc:
            flight.error = exc
        finally:
            with self._lock:
                del self._running[key]
            flight.done.set()
        return flight


def metrics_handler(registry: CollectorRegistry) -> Callable[[Request], Response]:
    encoders: dict[str, Callable] = {}

    def produce(content_type: str) -> bytes:
        return encoders[content_type](registry)

    shared = SharedCollection(produce)

    def handle(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        encoders.setdefault(content_type, encoder)
        flight = shared.get(content_type)
        if flight.error is not None:
            raise flight.error
        if "gzip" in request.headers.get("accept-encoding", "").lower():
            return Response(200, flight.gzipped(), content_type, [("Content-Encoding", "gzip")])
        return Response(200, flight.body, content_type)

    return handle


def landing_page(_request: Request) -> Response:
    return Response(200, LANDING.format(version=__version__).encode(), "text/html; charset=utf-8")


class MetricsServer(HttpServer):
    """Serves the registry at /metrics in background threads until close(). More routes: add_route()."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int, *, tls: ssl.SSLContext | None = None,
                 auth: Authenticator | None = None, limits: Limits | None = None,
                 extra_headers: list[tuple[str, str]] | None = None) -> None:
        routes = {"/metrics": Route(metrics_handler(registry)), "/": Route(landing_page)}
        super().__init__(host, port, routes, tls=tls, auth=auth, limits=limits, extra_headers=extra_headers)
