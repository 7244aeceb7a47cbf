"""Prometheus exposition: a custom collector that reads the BPF maps at scrape time.

Metric names follow Prometheus conventions (base units, `_total` counters). Per-flow series exist only
for the flows --flows selects (top-N by bytes by default); everything else is in host aggregates
computed in the kernel, so cardinality stays bounded whatever the host does.
"""

from __future__ import annotations

import itertools
import operator
import platform
import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping, Sequence

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from . import __version__
from . import bpf_types as bt
from .attribution import OTHER, UNATTRIBUTED, Attributor, LabelOptions
from .ccstate.decoders import ALL_METRICS, AlgorithmState, metrics_of
from .flows import FlowFilter, FlowRecord, FlowSelection, FlowTable, decode
from .flowscan import FlowColumns
from .telemetry import quantities

FLOW_LABELS = ("netns", "flow", "src", "sport", "dst", "dport", "cc", "scenario", "profile", "algorithm", "run")
SCENARIO_LABELS = ("scenario", "profile", "algorithm", "run")


def _family(name: str, help_text: str, kind: str, labels: tuple[str, ...]) -> Metric:
    if kind == "counter":
        return CounterMetricFamily(name, help_text, labels=labels)
    return GaugeMetricFamily(name, help_text, labels=labels)


def histogram_buckets(hist: bt.Hist) -> list[tuple[str, float]]:
    """Kernel log2 slots -> cumulative Prometheus buckets; slot i holds [2^i, 2^(i+1)) us."""
    buckets, cumulative = [], 0
    for i in range(bt.HIST_SLOTS - 1):
        cumulative += hist.slots[i]
        buckets.append((repr(2 ** (i + 1) / 1e6), cumulative))
    buckets.append(("+Inf", cumulative + hist.slots[bt.HIST_SLOTS - 1]))
    return buckets


# By-cgroup histograms keep the bounds 1.024 ms .. 4.19 s (log2 slots 9..21) and +Inf: 14 buckets instead of
# 32 per cgroup, over the range where queueing delay matters. The bounds are a subset of the host
# histogram's, so both aggregate alike.
GROUP_HIST_SLOTS = range(9, 22)


def group_histogram_buckets(slots: list[int]) -> list[tuple[str, float]]:
    """Kernel log2 slots -> the cumulative buckets of GROUP_HIST_SLOTS (first bucket: everything below)."""
    buckets = []
    for i in GROUP_HIST_SLOTS:
        buckets.append((repr(2 ** (i + 1) / 1e6), sum(slots[: i + 1])))
    buckets.append(("+Inf", sum(slots)))
    return buckets

RETRANSMIT_CAUSES = ("ccscope_flow_retransmits_by_cause",
                     "Retransmitted segments by cause: rto (timeout, and the slow start after it), fast (fast "
                     "retransmit and recovery), tlp (tail-loss probe), other.", "counter")


class FlowCollector(Collector):
    """Collect-on-scrape view of the kernel maps."""

    def __init__(self, table: FlowTable, selection: FlowSelection, flow_filter: FlowFilter | None = None,
                 labels: LabelOptions | None = None, attributor: Attributor | None = None,
                 states: Callable[[list[int]], Mapping[int, AlgorithmState]] | None = None) -> None:
        self.table = table
        self.states = states  # each flow's algorithm state by cookie (ccstate.probe.StateProbe.states)
        self.selection = selection
        self.filter = flow_filter or FlowFilter()
        self.labels = labels or LabelOptions()
        self.attributor = attributor  # set when labels need cgroups
        self.flow_label_names = FLOW_LABELS + self.labels.flow_labels
        self._netns_labels: dict[int, dict[str, str]] = {}
        self._lock = threading.RLock()  # scenario labels, and the attributor (scrape thread and maintain())
        self.last_scrape_s = 0.0
        self.exported_flows = 0
        # A scrape reads the probe's maps; close() waits for it, so the probe never closes under a scrape.
        self._collecting = threading.Lock()
        self._closed = False

    def set_netns_labels(self, labels: dict[int, dict[str, str]]) -> None:
        """Scenario runs label the flows of their namespaces (scenario, profile, algorithm, run)."""
        with self._lock:
            self._netns_labels = {ns: dict(values) for ns, values in labels.items()}

    def describe(self) -> Iterator[Metric]:
        return iter(())  # unchecked collector: the metric set is only known at scrape time

    def close(self) -> None:
        """Waits for a scrape in progress; later scrapes export nothing. Call before the probe closes: an
        endpoint may still scrape the collector after it is unregistered (the scrape began before)."""
        with self._collecting:
            self._closed = True

    def collect(self) -> Iterator[Metric]:
        with self._collecting:
            metrics = [] if self._closed else list(self._collect())
        yield from metrics

    def _collect(self) -> Iterator[Metric]:
        started = time.perf_counter()
        columns, shown = self.table.scan()
        if self.attributor:
            with self._lock:
                self.attributor.refresh()  # before the --cgroup filter and the labels read paths
        chosen = self.selection.pick_indexes(columns, self.filter.select(columns, shown))
        selected = [decode(columns.record(i)) for i in chosen]
        self.exported_flows = len(selected)
        yield from self._flow_metrics(selected)
        yield from self._host_metrics(columns)
        if self.attributor:
            with self._lock:
                cgroup_metrics = list(self._cgroup_metrics(columns, shown))
            yield from cgroup_metrics
        yield from self._health_metrics()
        self.last_scrape_s = time.perf_counter() - started
        yield from self._scrape_metric()

    def _flow_labels(self, flow: FlowRecord) -> list[str]:
        extra = self._netns_labels.get(flow.netns, {})
        values = [str(flow.netns), flow.name, flow.src, str(flow.sport), flow.dst, str(flow.dport), flow.cc,
                  *(extra.get(k, "") for k in SCENARIO_LABELS)]
        if self.labels.enabled:
            attribution = self.attributor(flow.cgroup_id) if self.attributor else UNATTRIBUTED
            values.extend(self.labels.values(attribution, flow.comm))
        return values

    def _flow_metrics(self, flows: list[FlowRecord]) -> Iterator[Metric]:
        with self._lock:
            labels = [self._flow_labels(f) for f in flows]
        for quantity in quantities.exported():  # the per-flow series: quantities.QUANTITIES' Prometheus names
            family = _family(quantity.prometheus, quantity.help, quantity.kind, self.flow_label_names)
            for flow, values in zip(flows, labels, strict=True):
                value = quantity.number(flow)
                if value is not None:
                    family.add_metric(values, value)
            yield family
        yield self._cause_metric(flows, labels)
        if self.states is not None:
            yield from self._state_metrics(flows, labels)

    def _cause_metric(self, flows: list[FlowRecord], labels: list[list[str]]) -> Metric:
        """Retransmitted segments by cause, for the flows that retransmitted (the kernel's own map)."""
        family = _family(*RETRANSMIT_CAUSES, (*self.flow_label_names, "cause"))
        found = self.table.probe.retransmit_causes([f.cookie for f in flows])
        for flow, values in zip(flows, labels, strict=True):
            for cause, segments in found.get(flow.cookie, {}).items():
                family.add_metric([*values, cause.name.lower()], segments)
        return family

    def _state_metrics(self, flows: list[FlowRecord], labels: list[list[str]]) -> Iterator[Metric]:
        """Each algorithm's own series (ccstate), for the flows that have its state: absent for the others."""
        found = self.states([f.cookie for f in flows])
        for metric in ALL_METRICS:
            family = _family(metric.name, metric.help, metric.kind, self.flow_label_names)
            for flow, values in zip(flows, labels, strict=True):
                state = found.get(flow.cookie)
                if state is not None and metric in metrics_of(state):
                    value = metric.value(state)
                    if value is not None:
                        family.add_metric(values, value)
            yield family

    def _host_metrics(self, columns: FlowColumns) -> Iterator[Metric]:
        open_by_cc: Tally[str] = Tally()
        is_open = map(operator.not_, columns.column("closed_ns"))
        for key, count in Tally(itertools.compress(columns.ca_names(), is_open)).items():  # C calls only
            open_by_cc[columns.name(key)] += count  # one algorithm may leave different bytes after its NUL
        stats = self.table.probe.cc_stats()
        current = GaugeMetricFamily("ccscope_tcp_flows", "Tracked open TCP flows by congestion algorithm.",
                                    labels=("cc",))
        for cc in sorted(set(open_by_cc) | set(stats)):
            current.add_metric([cc], open_by_cc.get(cc, 0))
        yield current
        started = CounterMetricFamily("ccscope_tcp_flows_started", "TCP flows first seen, by algorithm.",
                                      labels=("cc",))
        retrans = CounterMetricFamily("ccscope_tcp_retransmits",
                                      "Retransmitted segments on all flows of the host, by algorithm.",
                                      labels=("cc",))
        for cc, value in sorted(stats.items()):
            started.add_metric([cc], value.flows)
            retrans.add_metric([cc], value.retransmits)
        yield started
        yield retrans
        hists = self.table.probe.hists()
        for kind, name, help_text in (
            (bt.HistKind.SRTT, "ccscope_tcp_srtt_seconds",
             "Smoothed RTT of all flows, observed once per sample interval per flow."),
            (bt.HistKind.QUEUE_DELAY, "ccscope_tcp_queueing_delay_seconds",
             "srtt - min_rtt of all flows, observed once per sample interval per flow."),
        ):
            family = HistogramMetricFamily(name, help_text, labels=("cc",))
            for (cc, hist_kind), hist in sorted(hists.items()):
                if hist_kind == kind:
                    family.add_metric([cc], histogram_buckets(hist), sum_value=hist.sum_us / 1e6)
            yield family

    def maintain(self) -> None:
        """Between scrapes: expire closed flows, and follow cgroup deletions so they expire on time."""
        columns, shown = self.table.scan()
        if self.attributor:
            with self._lock:
                self.attributor.refresh()
                self._expire_cgroups(_cgroups_in_use(columns, shown), self.table.probe.cgroup_stats())

    def _expire_cgroups(self, in_use: set[int], stats: dict[int, bt.CgroupStats]) -> None:
        """Deleted cgroups no flow refers to any more leave the kernel map after --grace: their series vanish
        as closed flows' do, and their slots go to new cgroups."""
        for cgroup_id in self.attributor.expired(self.table.grace_ns / 1e9, in_use):
            if cgroup_id in stats and cgroup_id != bt.CGROUP_OTHER:
                self.table.probe.delete_cgroup(cgroup_id)
                del stats[cgroup_id]

    def _group(self, stats: dict[int, bt.CgroupStats], columns: FlowColumns) -> tuple[dict, Tally]:
        """Kernel entries and open flows merged by their group's label values (cgroups that share a truncated
        path, or a pod, fall together): {key: [flows, retransmits, slots, sum_us]}, {key: open flows}."""
        other = (OTHER,) * len(self.labels.group_labels)  # no path, pod UID or container ID reads "other"
        keys: dict[int, tuple[str, ...]] = {}  # once per cgroup id: 10k flows share a few hundred cgroups

        def group(cgroup_id: int) -> tuple[str, ...]:
            key = keys.get(cgroup_id)
            if key is None:
                found = self.attributor(cgroup_id) if cgroup_id != bt.CGROUP_OTHER and cgroup_id in stats else None
                key = keys[cgroup_id] = self.labels.group_values(found) if found and found.cgroup else other
            return key

        merged: dict[tuple[str, ...], list] = {}
        for cgroup_id, value in stats.items():
            entry = merged.setdefault(group(cgroup_id), [0, 0, [0] * bt.HIST_SLOTS, 0])
            entry[0] += value.flows
            entry[1] += value.retransmits
            entry[2] = [a + b for a, b in zip(entry[2], value.queue_delay.slots, strict=True)]
            entry[3] += value.queue_delay.sum_us
        open_flows: Tally[tuple[str, ...]] = Tally()
        is_open = map(operator.not_, columns.column("closed_ns"))
        for cgroup_id, count in Tally(itertools.compress(columns.column("cgroup_id"), is_open)).items():
            open_flows[group(cgroup_id)] += count
        return merged, open_flows

    def _cgroup_metrics(self, columns: FlowColumns, shown: Sequence[int]) -> Iterator[Metric]:
        """Host aggregates by cgroup, kernel-side bounded by --max-cgroups (the rest in cgroup="other")."""
        stats = self.table.probe.cgroup_stats()
        self._expire_cgroups(_cgroups_in_use(columns, shown), stats)
        names = self.labels.group_labels
        merged, open_flows = self._group(stats, columns)
        current = GaugeMetricFamily("ccscope_cgroup_flows", "Tracked open TCP flows by cgroup.", labels=names)
        started = CounterMetricFamily("ccscope_cgroup_flows_started", "TCP flows first seen, by cgroup.",
                                      labels=names)
        retrans = CounterMetricFamily("ccscope_cgroup_retransmits", "Retransmitted segments, by cgroup.",
                                      labels=names)
        delay = HistogramMetricFamily("ccscope_cgroup_queueing_delay_seconds",
                                      "srtt - min_rtt of the cgroup's flows, observed once per sample interval "
                                      "per flow.", labels=names)
        for key in sorted(set(merged) | set(open_flows)):
            flows_started, retransmits, slots, sum_us = merged.get(key, (0, 0, [0] * bt.HIST_SLOTS, 0))
            current.add_metric(list(key), open_flows.get(key, 0))
            started.add_metric(list(key), flows_started)
            retrans.add_metric(list(key), retransmits)
            delay.add_metric(list(key), group_histogram_buckets(slots), sum_value=sum_us / 1e6)
        yield from (current, started, retrans, delay)
        yield CounterMetricFamily("ccscope_cgroup_scans", "Walks of the cgroup hierarchy (start, misses, "
                                  "inotify overflows); creations and deletions otherwise arrive by inotify.",
                                  value=self.attributor.resolver.scans)

    def _health_metrics(self) -> Iterator[Metric]:
        counters = self.table.probe.counters()
        stats = self.table.stats
        yield GaugeMetricFamily("ccscope_tracked_flows", "Flows in the kernel flow map.", value=stats.tracked)
        yield GaugeMetricFamily("ccscope_exported_flows", "Flows exported with per-flow series.",
                                value=self.exported_flows)
        yield CounterMetricFamily("ccscope_flow_evictions", "Flows pushed out of the full kernel flow map.",
                                  value=stats.evictions_total)
        yield CounterMetricFamily("ccscope_flows_expired", "Closed flows removed after the grace period.",
                                  value=stats.expired_total)
        for counter, name, help_text in (
            (bt.Counter.PROBE_EVENTS, "ccscope_bpf_probe_events", "tcp_probe tracepoint hits."),
            (bt.Counter.SAMPLES, "ccscope_bpf_samples", "Samples written to the ring buffer."),
            (bt.Counter.SAMPLES_LOST, "ccscope_bpf_samples_lost", "Samples dropped because the ring buffer was full."),
            (bt.Counter.RETRANSMIT_EVENTS, "ccscope_bpf_retransmit_events", "tcp_retransmit_skb tracepoint hits."),
            (bt.Counter.FLOWS_CLOSED, "ccscope_bpf_flows_closed", "Tracked flows that reached TCP_CLOSE."),
            (bt.Counter.FLOW_MAP_FULL, "ccscope_bpf_flow_insert_failures",
             "New flows the kernel side could not add to its flow map (not tracked until a later segment)."),
        ):
            yield CounterMetricFamily(name, help_text, value=counters[counter])
        yield self._build_info()

    def _build_info(self) -> Metric:
        family = GaugeMetricFamily("ccscope_build_info", "ccscope version and the kernel it runs on.",
                                   labels=("version", "kernel"))
        family.add_metric([__version__, platform.release()], 1)
        return family

    def _scrape_metric(self) -> Iterator[Metric]:
        yield GaugeMetricFamily("ccscope_scrape_duration_seconds",
                                "Time spent reading the kernel maps for this scrape.", value=self.last_scrape_s)


def _cgroups_in_use(columns: FlowColumns, shown: Sequence[int]) -> set[int]:
    """The cgroup ids of the flows the table still holds (open, or closed within --grace)."""
    ids = columns.column("cgroup_id")
    return set(ids) if isinstance(shown, range) else set(map(ids.__getitem__, shown))
