"""The live page's own health on /metrics, next to the daemon's."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from .hub import Hub


class LiveCollector(Collector):
    def __init__(self, hub: Hub) -> None:
        self.hub = hub

    def collect(self) -> Iterator[Metric]:
        hub = self.hub
        yield GaugeMetricFamily("ccscope_live_pages", "Live pages connected to the event stream now.",
                                value=hub.client_count)
        yield CounterMetricFamily("ccscope_live_connections", "Event-stream connections accepted.",
                                  value=hub.clients.connections)
        yield CounterMetricFamily("ccscope_live_updates_dropped", "Updates dropped for pages that read too "
                                  "slowly (their oldest queued updates).", value=hub.clients.updates_dropped)
        yield CounterMetricFamily("ccscope_live_samples", "BPF samples the live view read.", value=hub.rings.samples_in)
        yield CounterMetricFamily("ccscope_live_points", "Samples kept as chart points (after decimation).",
                                  value=hub.rings.points_kept)
