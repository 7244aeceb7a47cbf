"""The metrics endpoint: /metrics (and a landing page at /) on the hardened web server."""

from __future__ import annotations

import gzip
import ssl

from prometheus_client import CollectorRegistry
from prometheus_client.exposition import choose_encoder

from . import __version__
from .web.server import Authenticator, HttpServer, Limits, Request, Response, Route

LANDING = """<!doctype html>
<html><head><meta charset="utf-8"><title>ccscope</title></head>
<body><h1>ccscope {version}</h1><p>Live TCP congestion telemetry: <a href="metrics">metrics</a></p></body></html>
"""


def metrics_handler(registry: CollectorRegistry):
    def handle(request: Request) -> Response:
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        body = encoder(registry)
        headers = []
        if "gzip" in request.headers.get("accept-encoding", "").lower():
            body = gzip.compress(body, compresslevel=6)
            headers.append(("Content-Encoding", "gzip"))
        return Response(200, body, content_type, headers)

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
