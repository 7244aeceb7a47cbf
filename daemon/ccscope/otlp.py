"""OTLP/HTTP push of the daemon's per-flow and host series (`ccscope daemon --otlp URL`).

The series are the Prometheus collector's (exporter.FlowCollector): every push interval one collection (the
same top-N flows and cardinality bounds as a scrape) is sent under OpenTelemetry names. instruments() is the
mapping, documented in docs/monitoring.md: semantic conventions where they exist (`network.*` attributes,
`network.io.direction`), OpenTelemetry semconv issue #3682's proposed `system.network.tcp.*` namespace for
the per-flow values, gRPC A80's meaning for min_rtt and delivery rate, and `ccscope.*` for what no
convention covers (host aggregates by algorithm).

Bounded: each push is built from the current collection alone, as a scrape is (the SDK's data classes and
its protobuf encoder, not its aggregating meter provider, which keeps every attribute set it ever saw: with
connections coming and going, a meter provider pushing to a dead collector grew 60 KB per push). The
state kept between pushes is the start time of each cumulative series still present. One thread pushes
every interval and waits for the export, one request bounded by --otlp-timeout (otlp_http: 2xx alone is a
delivery, the answer's body is not read), and a failed one drops the batch: a collector that is down,
slow, refusing or hostile costs one batch and that thread's time, never the probe or the /metrics scrape
path. Failed pushes and the data points they dropped are counted (ccscope_otlp_* on /metrics) and said in
one line, with why, when pushing starts failing, at most once a minute while it fails, and when it
recovers. The SDK's own log lines are silenced so that it never prints a traceback.
"""

from __future__ import annotations

import logging
import os
import platform
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from types import SimpleNamespace

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from . import __version__
from .ccstate.decoders import ALL_METRICS
from .errors import PrerequisiteError, UsageError
from .otlp_http import Endpoint, ExportFailed, check_header, post, redact, tls_context
from .telemetry import quantities


@dataclass(frozen=True)
class Instrument:
    name: str
    unit: str
    kind: str  # "gauge" or "counter" (a monotonic cumulative sum)
    description: str
    sources: tuple[tuple[str, tuple[tuple[str, str], ...]], ...]  # (Prometheus family, extra attributes)


def _one(name: str, unit: str, kind: str, description: str, family: str) -> Instrument:
    return Instrument(name, unit, kind, description, ((family, ()),))


def _flow_instruments() -> list[Instrument]:
    """The per-flow quantities' instruments (telemetry/quantities.py), those with one name merged into one."""
    merged: dict[str, Instrument] = {}
    for q in quantities.exported():
        if q.otlp is None:
            continue
        sources = merged[q.otlp.name].sources if q.otlp.name in merged else ()
        merged[q.otlp.name] = Instrument(q.otlp.name, q.otlp.unit, q.kind, q.otlp.description,
                                         (*sources, (q.prometheus, q.otlp.attributes)))
    return list(merged.values())


HOST_INSTRUMENTS: tuple[Instrument, ...] = (
    _one("ccscope.tcp.flows", "{flow}", "gauge", "Tracked open TCP flows of the host by algorithm.",
         "ccscope_tcp_flows"),
    _one("ccscope.tcp.flows.started", "{flow}", "counter", "TCP flows first seen on the host, by algorithm.",
         "ccscope_tcp_flows_started"),
    _one("ccscope.tcp.retransmits", "{segment}", "counter",
         "Retransmitted segments on all flows of the host, by algorithm.", "ccscope_tcp_retransmits"),
    _one("ccscope.tcp.flow.retransmits_by_cause", "{segment}", "counter",
         "Retransmitted segments of a flow by cause (ccscope.retransmit.cause).", "ccscope_flow_retransmits_by_cause"),
)


def instruments() -> list[Instrument]:
    """Every instrument pushed: the per-flow quantities', the host's, and each algorithm's own state (named once,
    in its decoder: ccstate/)."""
    states = (_one(m.otlp, m.unit, m.kind, m.help, m.name) for m in ALL_METRICS)
    return [*_flow_instruments(), *HOST_INSTRUMENTS, *states]


# Prometheus label -> OpenTelemetry attribute; an empty label value is no attribute.
ATTRIBUTES = {
    "src": "network.local.address", "sport": "network.local.port",
    "dst": "network.peer.address", "dport": "network.peer.port",
    "cc": "network.tcp.congestion_control",
    "netns": "ccscope.netns", "flow": "ccscope.flow",
    "scenario": "ccscope.scenario", "profile": "ccscope.scenario.profile",
    "algorithm": "ccscope.scenario.algorithm", "run": "ccscope.scenario.run",
    "cause": "ccscope.retransmit.cause",
    "comm": "process.executable.name", "cgroup": "ccscope.cgroup", "container": "container.id",
    "pod": "k8s.pod.name", "namespace": "k8s.namespace.name", "pod_uid": "k8s.pod.uid",
}
INTEGER_ATTRIBUTES = frozenset({"network.local.port", "network.peer.port"})
WARN_EVERY_S = 60.0  # while exports fail, a reminder line at most this often


@dataclass
class OtlpOptions:
    endpoint: str = field(repr=False)  # may hold user:password: `shown` is what is printed
    headers: dict[str, str] = field(default_factory=dict, repr=False)
    interval_s: float = 10.0
    timeout_s: float = 5.0
    certificate_file: str | None = None
    client_certificate_file: str | None = None
    client_key_file: str | None = None

    @property
    def shown(self) -> str:
        """The URL as ccscope prints it: without credentials."""
        return redact(self.endpoint)

    @classmethod
    def parse(cls, url: str, headers: list[str] | None, interval_s: float, timeout_s: float,
              ca: str | None = None, cert: str | None = None, key: str | None = None) -> OtlpOptions:
        endpoint = Endpoint.parse(url)  # a bad URL is one line, without its credentials
        parsed = {}
        for item in headers or []:
            name, sep, value = item.partition("=")
            if not sep or not name.strip():
                raise UsageError(f"--otlp-header {item.partition('=')[0][:40]!r}: use NAME=VALUE")
            check_header(name.strip(), value)
            parsed[name.strip()] = value
        if (cert is None) != (key is None):
            raise UsageError("--otlp-client-cert and --otlp-client-key go together")
        if not 0 < timeout_s < interval_s:
            raise UsageError(f"--otlp-timeout {timeout_s:g}s must be above 0 and below --otlp-interval "
                             f"{interval_s:g}s")
        if endpoint.tls or ca or cert:
            tls_context(ca, cert, key)  # files that cannot be used: one line now, not a failure at every push
        return cls(url, parsed, interval_s, timeout_s, ca, cert, key)


class ExportStats(Collector):
    """Exports and the data points failed ones dropped: for /metrics and the warning lines."""

    def __init__(self, endpoint: str, say: Callable[[str], None]) -> None:
        self.endpoint, self._say = endpoint, say
        self.succeeded = self.failed = self.dropped_points = 0
        self._failing_since: float | None = None
        self._warned_at = 0.0
        self._lock = threading.Lock()

    def record(self, ok: bool, points: int, why: str | None = None) -> None:
        now = time.monotonic()
        with self._lock:
            if ok:
                self.succeeded += 1
                if self._failing_since is not None:
                    self._say(f"ccscope: OTLP export to {self.endpoint} works again after "
                              f"{now - self._failing_since:.0f} s")
                self._failing_since = None
                return
            self.failed += 1
            self.dropped_points += points
            if self._failing_since is None or now - self._warned_at >= WARN_EVERY_S:
                self._say(f"ccscope: warning: OTLP export to {self.endpoint} failed"
                          f"{f' ({why})' if why else ''}; {self.dropped_points} data points dropped so far, "
                          "trying again every interval")
                self._warned_at = now
            if self._failing_since is None:
                self._failing_since = now

    def collect(self) -> Iterator[Metric]:
        exports = CounterMetricFamily("ccscope_otlp_exports", "OTLP exports by result.", labels=("result",))
        with self._lock:
            exports.add_metric(["success"], self.succeeded)
            exports.add_metric(["failure"], self.failed)
            dropped, failing = self.dropped_points, self._failing_since is not None
        yield exports
        yield CounterMetricFamily("ccscope_otlp_dropped_points", "Data points of failed OTLP exports.",
                                  value=dropped)
        yield GaugeMetricFamily("ccscope_otlp_failing", "1 while OTLP exports fail.", value=int(failing))


def observations(families: dict[str, Metric], instrument: Instrument) -> list[tuple[float, dict[str, str | int]]]:
    """(value, attributes) of an instrument's data points in one collection."""
    out = []
    for family_name, extra in instrument.sources:
        family = families.get(family_name)
        if family is None:
            continue
        wanted = family.name + ("_total" if family.type == "counter" else "")
        out.extend((s.value, attributes(s.labels) | dict(extra)) for s in family.samples if s.name == wanted)
    return out


def attributes(labels: dict[str, str]) -> dict[str, str | int]:
    out: dict[str, str | int] = {}
    for label, value in labels.items():
        name = ATTRIBUTES.get(label, f"ccscope.{label}")
        if value != "":
            out[name] = int(value) if name in INTEGER_ATTRIBUTES and value.isdigit() else value
    return out


class OtlpPush:
    """Pushes what `collect` yields every interval over OTLP/HTTP, from a thread of its own, until close()."""

    def __init__(self, options: OtlpOptions, collect: Callable[[], Iterable[Metric]],
                 say: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True)) -> None:
        self._sdk = _import_sdk()
        logging.getLogger("opentelemetry").setLevel(logging.CRITICAL + 1)  # our one-line warnings instead
        self.options, self._collect = options, collect
        self.stats = ExportStats(options.shown, say)
        if ignored := sorted(name for name in os.environ if name.startswith("OTEL_EXPORTER_OTLP_")):
            say(f"ccscope: note: {', '.join(ignored)} not used: --otlp, --otlp-header and the --otlp-* TLS "
                "flags say where and how to push")
        self._endpoint = Endpoint.parse(options.endpoint)
        self._tls = tls_context(options.certificate_file, options.client_certificate_file,
                                options.client_key_file) if self._endpoint.tls else None
        self._resource = self._sdk.Resource.create(_resource())
        self._scope = self._sdk.InstrumentationScope("ccscope", __version__)
        self._starts: dict[tuple, int] = {}  # (instrument, attributes) -> start of a cumulative series, ns
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="ccscope-otlp", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.options.interval_s):
            self.push()

    def push(self) -> bool:
        """One collection, exported; whether the collector took it."""
        batch = self.batch({f.name: f for f in self._collect()}, time.time_ns())
        points = sum(len(m.data.data_points) for m in batch.resource_metrics[0].scope_metrics[0].metrics)
        why = None
        try:
            post(self._endpoint, self._sdk.encode_metrics(batch).SerializeToString(), self.options.headers,
                 self.options.timeout_s, self._tls)
        except ExportFailed as failed:  # counted and said, never raised into the thread
            why = str(failed)
        self.stats.record(why is None, points, why)
        return why is None

    def batch(self, families: dict[str, Metric], now_ns: int):
        sdk, metrics, starts = self._sdk, [], {}
        for instrument in instruments():
            points = []
            for value, attrs in observations(families, instrument):
                key = (instrument.name, tuple(sorted(attrs.items())))
                starts[key] = self._starts.get(key, now_ns)
                points.append(sdk.NumberDataPoint(attrs, starts[key], now_ns, value))
            if not points:
                continue
            data = sdk.Gauge(points) if instrument.kind == "gauge" else \
                sdk.Sum(points, sdk.AggregationTemporality.CUMULATIVE, is_monotonic=True)
            metrics.append(sdk.Metric(instrument.name, instrument.description, instrument.unit, data))
        self._starts = starts  # only the series still present: bounded by one collection
        scope = sdk.ScopeMetrics(self._scope, metrics, schema_url="")
        return sdk.MetricsData([sdk.ResourceMetrics(self._resource, [scope], schema_url="")])

    def close(self) -> None:
        """Stops pushing: one last push, bounded by --otlp-timeout, so the collector sees the final values."""
        self._stop.set()
        self._thread.join(timeout=self.options.timeout_s + 1)
        if not self._thread.is_alive():
            self.push()


def _resource() -> dict[str, str]:
    """The host and the service. OTEL_RESOURCE_ATTRIBUTES adds to it, as in every OpenTelemetry SDK (for the
    daemon's own pod: k8s.pod.name, k8s.node.name from the Downward API)."""
    host = socket.gethostname()
    return {"service.name": "ccscope", "service.version": __version__, "service.instance.id": host,
            "host.name": host, "os.type": "linux", "os.version": platform.release()}


def _import_sdk() -> SimpleNamespace:
    try:
        from opentelemetry.exporter.otlp.proto.common.metrics_encoder import encode_metrics
        from opentelemetry.sdk.metrics.export import (
            AggregationTemporality,
            Gauge,
            Metric,
            MetricsData,
            NumberDataPoint,
            ResourceMetrics,
            ScopeMetrics,
            Sum,
        )
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.util.instrumentation import InstrumentationScope
    except ImportError:
        raise PrerequisiteError("--otlp needs the OpenTelemetry SDK", "pip install 'ccscope[otlp]'") from None
    return SimpleNamespace(**{c.__name__: c for c in (
        encode_metrics, AggregationTemporality, Gauge, Metric, MetricsData, NumberDataPoint, ResourceMetrics,
        ScopeMetrics, Sum, Resource, InstrumentationScope)})
