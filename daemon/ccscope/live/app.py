"""The live page's HTTP side: its routes on the daemon's (or a scenario's) HTTP server, next to /metrics (same
listener, same auth, same TLS), answered in the server's own Response and Stream.

GET /            the page
GET /static/F    its script, stylesheet and the vendored chart library (a fixed list, nothing else on disk)
GET /events      Server-Sent Events: `hello` (everything so far), then `points`, `table`, `scenario`, `run`,
                 `lag` (this client lost updates), `bye`
GET /report/F    a scenario's report.html and plots, once written
"""

from __future__ import annotations

import dataclasses
import heapq
import mimetypes
import re
from collections.abc import Callable
from importlib import resources
from pathlib import Path

from prometheus_client import CollectorRegistry

from ccscope.attribution import Attributor
from ccscope.errors import PrerequisiteError
from ccscope.flows import FLOW_COLUMNS, UNKNOWN, FlowFilter, FlowRecord, attribution_columns, decode
from ccscope.metrics_endpoint import MetricsServer
from ccscope.web.http import HttpServer, Limits, Request, Response, Route, Stream, text_response

from . import vendor
from .clients import MAX_CLIENTS, TooManyClients, event
from .health import LiveCollector
from .hub import Hub

TABLE_ROWS = 500
KEEPALIVE_S = 15.0  # an idle stream still writes, so a vanished client is noticed and its slot freed
PAGE_FILES = ("index.html", "live.js", "live.css")
_REPORT_FILE = re.compile(r"^(report\.html|plots/[A-Za-z0-9_.-]+\.png)$")


def static_files() -> dict[str, Path]:
    base = Path(str(resources.files("ccscope.live") / "static"))
    files = {name: base / name for name in PAGE_FILES}
    files.update({name: base / "vendor" / name for name in vendor.UPLOT_FILES.values()})
    missing = [name for name, path in files.items() if not path.is_file()]
    if missing:
        raise PrerequisiteError(f"live page assets missing: {', '.join(missing)}",
                                "build them with `make assets` (or start the daemon with --no-live)")
    return files


def table_source(probe, flow_filter: Callable[[], FlowFilter], attributor: Attributor | None = None,
                 grace_s: float = 0.0) -> Callable[[], tuple[list[FlowRecord], int]]:
    """Reads the kernel flow map for the table by columns: the filters (FlowFilter.select) and the top TABLE_ROWS
    by bytes are applied to the columns, so only the rows shown are decoded. `attributor`: a cgroup resolver the
    page has to itself, kept small here as the exporter keeps its own: cgroups deleted longer than grace_s ago
    that no flow in the map refers to are forgotten."""

    def read() -> tuple[list[FlowRecord], int]:
        columns = probe.read_flow_columns()
        if attributor:
            attributor.refresh()
            attributor.expired(grace_s, set(columns.column("cgroup_id")))
        chosen = flow_filter().select(columns, range(len(columns)))
        acked, received = columns.column("bytes_acked"), columns.column("bytes_received")
        busiest = heapq.nlargest(TABLE_ROWS, chosen, key=lambda i: acked[i] + received[i])
        return [decode(columns.record(i)) for i in busiest], len(chosen)

    return read


def table_rows(source: tuple[list[FlowRecord], int], attributor: Attributor | None = None) -> dict:
    """The `ccscope flows` columns, as text, as sort keys and whether numeric (right-aligned there); COMM and
    CGROUP/POD only while some flow has a process, or a cgroup `attributor` resolves."""
    flows, total = source
    columns = (*FLOW_COLUMNS, *attribution_columns(attributor))
    texts = [[c.text(f) for c in columns] for f in flows]
    shown = [i for i in range(len(columns)) if i < len(FLOW_COLUMNS) or any(t[i] != UNKNOWN for t in texts)]
    return {"columns": [columns[i].title for i in shown], "numeric": [columns[i].spec[0] == ">" for i in shown],
            "total": total,
            "rows": [{"id": str(f.cookie), "cells": [t[i] for i in shown], "keys": [columns[i].key(f) for i in shown],
                      "closed": bool(f.closed_ns), "queueing_delay_ms": round(f.queueing_delay_s * 1e3, 2),
                      "ratio": round(f.srtt_s / f.min_rtt_s, 2) if f.min_rtt_s else None}
                     for f, t in zip(flows, texts, strict=True)]}


class EventStream:
    """One page's event stream: an iterator of SSE chunks; close() (also when never iterated) frees the slot."""

    headers = (("X-Accel-Buffering", "no"),)  # (the server sends Cache-Control: no-cache with every stream)

    def __init__(self, hub: Hub) -> None:
        self._hub = hub
        self._client = hub.connect()  # TooManyClients when full
        self._started = False
        self._done = False

    def __iter__(self) -> EventStream:
        return self

    def __next__(self) -> bytes:
        if self._done:
            self.close()
            raise StopIteration
        if not self._started:
            self._started = True
            return b"retry: 2000\n\n"
        messages = self._client.take(KEEPALIVE_S)
        if not messages:
            return b": keepalive\n\n"
        self._done = messages[-1] == _BYE
        return b"".join(messages)

    def close(self) -> None:
        if self._client is not None:
            self._hub.disconnect(self._client)
            self._client = None
            self._done = True


class LiveApp:
    """The page's routes: mount() adds them to the HTTP server; show_report() adds a scenario's report."""

    def __init__(self, hub: Hub) -> None:
        self.hub = hub
        self.files = {name: (path.read_bytes(), _content_type(name)) for name, path in static_files().items()}
        self.report_dir: Path | None = None
        self._server: HttpServer | None = None

    def mount(self, server: HttpServer) -> None:
        """The page's paths on the daemon's server, beside /metrics: same listener, same TLS and auth."""
        server.add_route("/", Route(self._file("index.html")))
        server.add_route("/index.html", Route(self._file("index.html")))
        for name in self.files:
            server.add_route(f"/static/{name}", Route(self._file(name)))
        server.add_route("/events", Route(self._events, stream=True))
        self._server = server

    def show_report(self, directory: Path, report: Path) -> str:
        """Serves the report and its plots (the files there now, nothing else); returns its path on the page."""
        self.report_dir = directory
        if self._server is not None:
            names = [report.name, *(f"plots/{p.name}" for p in sorted((directory / "plots").glob("*.png")))]
            for name in names:
                if _REPORT_FILE.match(name):
                    self._server.add_route(f"/report/{name}", Route(self._report(directory / name)))
        return f"report/{report.name}"

    def _file(self, name: str) -> Callable[[Request], Response]:
        body, content_type = self.files[name]
        response = Response(200, body, content_type, [("Cache-Control", "no-cache"), *SECURITY_HEADERS])
        return lambda _request: response

    def _report(self, path: Path) -> Callable[[Request], Response]:
        def handle(_request: Request) -> Response:
            try:
                return Response(200, path.read_bytes(), _content_type(path.name))
            except OSError:
                return text_response(404)
        return handle

    def _events(self, _request: Request) -> Response | Stream:
        try:
            stream = EventStream(self.hub)
        except TooManyClients as exc:
            return text_response(503, str(exc), [("Retry-After", "10")])
        return Stream(stream, "text/event-stream", list(stream.headers))


def serve_page(app: LiveApp, registry: CollectorRegistry, host: str, port: int, *, limits: Limits,
               **server_options) -> MetricsServer:
    """/metrics and the live page on one listener, as the daemon and a scenario both serve them: the page's
    health on /metrics, one stream slot for every page the hub admits, the page's routes."""
    server = MetricsServer(registry, host, port, limits=dataclasses.replace(limits, max_streams=MAX_CLIENTS),
                           **server_options)
    registry.register(LiveCollector(app.hub))
    app.mount(server)
    app.hub.serving_on(server.port)
    return server


_BYE = event("bye", {})
SECURITY_HEADERS = [("X-Content-Type-Options", "nosniff"),
                     ("Content-Security-Policy",
                      "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:")]


def _content_type(name: str) -> str:
    kind = mimetypes.guess_type(name)[0] or "text/plain"
    return f"{kind}; charset=utf-8" if kind.startswith("text/") or kind.endswith("javascript") else kind
