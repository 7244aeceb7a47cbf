"""The metrics endpoint: /metrics (and a landing page at /) on the hardened web server."""

from __future__ import annotations

import gzip
import ssl
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import Collector

from . import __version__
from .exposition import fast_encoder
from .web.http import Authenticator, HttpServer, Limits, Request, Response, Route

LANDING = """<!doctype html>
<html><head><meta charset="utf-8"><title>ccscope</title></head>
<body><h1>ccscope {version}</h1><p>Live TCP congestion telemetry: <a href="metrics">metrics</a></p></body></html>
"""
GZIP_LEVEL = 6  # ~1 ms for the ~170 kB of --flows top:50, to ~10 % of its size; once per collection, not per request


@dataclass
class Collection:
    """One rendering of the registry, numbered per format, shared by every request that waited for it."""

    number: int
    body: bytes = b""
    error: Exception | None = None
    _gzipped: bytes | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def gzipped(self) -> bytes:
        with self._lock:  # the first request that asks compresses; the others wait for its bytes
            if self._gzipped is None:
                self._gzipped = gzip.compress(self.body, compresslevel=GZIP_LEVEL)
            return self._gzipped


@dataclass
class _Format:
    started: int = 0                  # collections of this format started so far
    latest: Collection | None = None  # the last one finished
    running: bool = False


class SharedCollection:
    """Concurrent scrapes share collections instead of each reading the kernel maps and rendering the text.

    Fifty scrapers at once would otherwise run fifty collections, serialized by the GIL, and the last one would
    wait for all the others. Freshness: a request is only ever answered with a collection that *started after it
    arrived*, so it never sees data older than itself, as if it had collected alone. A request that arrives while
    a collection runs waits for the next one, and every request that arrived meanwhile shares that next one: a
    burst costs two collections, and a request waits at most two collections' time for its own.
    """

    def __init__(self, produce: Callable[[str], bytes]) -> None:
        self._produce = produce
        self._changed = threading.Condition()
        self._formats: dict[str, _Format] = {}
        self.requests = 0     # get() calls
        self.collections = 0  # produce() calls
        self.waiting = 0      # requests waiting for a collection another request runs

    def get(self, key: str) -> Collection:
        with self._changed:
            self.requests += 1
            state = self._formats.setdefault(key, _Format())
            wanted = state.started + 1  # the first collection to start from now on
            found = self._wait_for(state, wanted)
            if found is not None:
                return found
            state.started = wanted
            state.running = True
            self.collections += 1
        collection = Collection(wanted)
        try:
            collection.body = self._produce(key)
        except Exception as exc:  # every request that waited for this collection answers 500
            collection.error = exc
        finally:
            with self._changed:
                state.latest, state.running = collection, False
                self._changed.notify_all()
        return collection

    def _wait_for(self, state: _Format, wanted: int) -> Collection | None:
        """A collection numbered `wanted` or later once one finished, or None when this request is to run it."""
        self.waiting += 1
        try:
            while state.latest is None or state.latest.number < wanted:
                if not state.running:
                    return None
                self._changed.wait()
            return state.latest
        finally:
            self.waiting -= 1


class ScrapeCollector(Collector):
    """How much sharing happens: requests to /metrics against the collections run for them; and how often the
    connection limit was reached: connections turned away, and waiting ones closed to make room."""

    def __init__(self, shared: SharedCollection, server: HttpServer | None = None) -> None:
        self.shared = shared
        self.server = server

    def collect(self) -> Iterator[Metric]:
        if self.server is not None:
            yield CounterMetricFamily("ccscope_http_connections_refused", "Connections answered 503 and closed: "
                                      "every slot (--max-connections) was answering a request.",
                                      value=self.server.refused_total)
            yield CounterMetricFamily("ccscope_http_connections_displaced", "Waiting connections (silent, sending a "
                                      "request head, or idle keep-alive) closed to make room for a new one at "
                                      "--max-connections.", value=self.server.displaced_total)
        yield CounterMetricFamily("ccscope_scrape_requests", "Requests for /metrics, in every format.",
                                  value=self.shared.requests)
        yield CounterMetricFamily("ccscope_scrape_collections", "Collections run for /metrics requests (this one "
                                  "included); requests that arrive while one runs share the next.",
                                  value=self.shared.collections)


class MetricsEndpoint:
    """GET /metrics: the registry in the format the Accept header asks for, gzipped when accepted."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._encoders: dict[str, Callable[[CollectorRegistry], bytes]] = {}
        self.shared = SharedCollection(self._render)

    def _render(self, content_type: str) -> bytes:
        return self._encoders[content_type](self.registry)

    def __call__(self, request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        self._encoders.setdefault(content_type, fast_encoder(encoder))
        collection = self.shared.get(content_type)
        if collection.error is not None:
            raise collection.error
        if "gzip" in request.headers.get("accept-encoding", "").lower():
            return Response(200, collection.gzipped(), content_type, [("Content-Encoding", "gzip")])
        return Response(200, collection.body, content_type)


def landing_page(_request: Request) -> Response:
    return Response(200, LANDING.format(version=__version__).encode(), "text/html; charset=utf-8")


class MetricsServer(HttpServer):
    """Serves the registry at /metrics in background threads until close(). More routes: add_route()."""

    def __init__(self, registry: CollectorRegistry, host: str, port: int, *, tls: ssl.SSLContext | None = None,
                 auth: Authenticator | None = None, limits: Limits | None = None,
                 extra_headers: list[tuple[str, str]] | None = None) -> None:
        self.metrics = MetricsEndpoint(registry)
        routes = {"/metrics": Route(self.metrics), "/": Route(landing_page)}
        super().__init__(host, port, routes, tls=tls, auth=auth, limits=limits, extra_headers=extra_headers)
        registry.register(ScrapeCollector(self.metrics.shared, self))
