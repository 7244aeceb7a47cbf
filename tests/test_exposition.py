"""The endpoint's own renderers give prometheus_client's bytes, and concurrent scrapes share collections.

The renderers are checked on the daemon's real metric set (a real probe's flows, with scenario labels that
need escaping) and on families they must hand to the library. The sharing is checked with a collection held
open while requests pile up behind it: the count of collections is exact, not a timing.
"""

from __future__ import annotations

import contextlib
import math
import socket
import threading
from collections.abc import Iterator

import pytest
from ccscope.exporter import FlowCollector
from ccscope.exposition import render_openmetrics, render_text
from ccscope.flows import FlowSelection, FlowTable
from ccscope.loader import ProbeOptions, TelemetryProbe
from ccscope.metrics_endpoint import SharedCollection
from ccscope_testkit.net import free_port, wait_for
from ccscope_testkit.prereqs import require_bpf_object, require_root
from prometheus_client import exposition
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)
from prometheus_client.openmetrics import exposition as om_exposition

TRICKY = 'quote " backslash \\ newline \n tab \t ü'


class Fixed:
    """One collection, rendered any number of times: the real collector's counters move between calls."""

    def __init__(self, metrics: list[Metric]) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        return iter(self.metrics)


def _synthetic() -> list[Metric]:
    gauge = GaugeMetricFamily("g_value", "help with \\ and \n", labels=["a", "b"])
    gauge.add_metric([TRICKY, ""], 1.5)
    gauge.add_metric(["x", "y"], math.nan)
    gauge.add_metric(["x", "z"], -math.inf)
    counter = CounterMetricFamily("c_events", "counted", labels=["k"], created=None)
    counter.add_metric(["v"], 2**53 + 1)
    histogram = HistogramMetricFamily("h_seconds", "a histogram", labels=["k"])
    histogram.add_metric(["v"], [("0.001", 1), ("0.01", 3), ("+Inf", 4)], sum_value=0.02)
    info = InfoMetricFamily("build", "not a simple type: the library renders it", value={"version": TRICKY})
    stamped = GaugeMetricFamily("stamped", "with a timestamp: the library renders it")
    stamped.add_metric([], 1.0, timestamp=1700000000.5)
    return [gauge, counter, histogram, info, stamped]


def _daemon_metrics(flows: int) -> list[Metric]:
    """One collection of the daemon's collector with `flows` loopback flows tracked."""
    require_root()
    require_bpf_object()
    with TelemetryProbe(ProbeOptions()) as probe, _open_flows(flows):
        table = FlowTable(probe, grace_s=5.0)
        collector = FlowCollector(table, FlowSelection("all"))
        assert wait_for(lambda: len(table.snapshot()) >= flows), f"tcp_probe did not track {flows} flows"
        # Every flow of the host namespace carries the tricky value in a scenario label.
        collector.set_netns_labels({flow.netns: {"scenario": TRICKY, "profile": "p"} for flow in table.snapshot()})
        try:
            return list(collector.collect())
        finally:
            collector.close()


@pytest.mark.parametrize("escaping", [om_exposition.UNDERSCORES, om_exposition.ALLOWUTF8, om_exposition.DOTS,
                                      om_exposition.VALUES])
def test_renderers_give_the_librarys_bytes(escaping: str) -> None:
    source = Fixed(_synthetic())
    assert render_text(source, escaping) == exposition.generate_latest(source, escaping)
    assert render_openmetrics(source, escaping) == om_exposition.generate_latest(source, escaping)


def test_renderers_give_the_librarys_bytes_for_the_daemons_metrics() -> None:
    source = Fixed(_daemon_metrics(20))
    flows = [m for m in source.metrics if m.name == "ccscope_flow_cwnd_segments"]
    assert flows and len(flows[0].samples) >= 20
    text = render_text(source)
    assert text == exposition.generate_latest(source)
    assert render_openmetrics(source) == om_exposition.generate_latest(source)
    assert b'scenario="quote \\" backslash \\\\ newline \\n tab \t \xc3\xbc"' in text


@contextlib.contextmanager
def _open_flows(count: int) -> Iterator[None]:
    """`count` loopback connections, each having carried a segment, so tcp_probe tracks them."""
    with socket.create_server(("127.0.0.1", free_port())) as listener, contextlib.ExitStack() as held:
        for _ in range(count):
            client = held.enter_context(socket.create_connection(listener.getsockname()))
            server = held.enter_context(listener.accept()[0])
            client.sendall(b"x")
            server.recv(1)
        yield


def test_requests_that_arrive_during_a_collection_share_the_next_one() -> None:
    release = threading.Event()
    produced: list[int] = []

    def produce(_key: str) -> bytes:
        produced.append(len(produced) + 1)
        if len(produced) == 1:
            release.wait(10)  # the first collection is held open while the others arrive
        return b"collection %d" % len(produced)

    shared = SharedCollection(produce)
    answers: list[bytes] = []
    first = threading.Thread(target=lambda: answers.append(shared.get("text").body))
    first.start()
    assert wait_for(lambda: produced == [1])
    waiters = [threading.Thread(target=lambda: answers.append(shared.get("text").body)) for _ in range(49)]
    for thread in waiters:
        thread.start()
    assert wait_for(lambda: shared.waiting == 49)
    release.set()
    for thread in [first, *waiters]:
        thread.join(10)
    # None of the 49 is answered with the collection that began before it arrived; all share one more.
    assert sorted(answers) == [b"collection 1"] + [b"collection 2"] * 49
    assert shared.collections == 2 and shared.requests == 50


def test_a_lone_request_always_gets_a_new_collection() -> None:
    shared = SharedCollection(lambda key: key.encode())
    numbers = [shared.get("text").number for _ in range(3)] + [shared.get("openmetrics").number]
    assert numbers == [1, 2, 3, 1] and shared.collections == 4
