"""One run, for every kind of path: its record, the recorder and labels around its traffic, its progress,
then the record from what was measured (flows, downloads, pings, the common window, per-algorithm results).

A path opens for one run and says what only it knows: which namespaces its flows live in, how its traffic
runs, which series is each flow's sender's, and what it adds to the record. `emulated.py` wraps a testbed,
`realrun.py` this host's own network to a far end. A fix or a feature written here reaches both."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from ccscope.exporter import FlowCollector
from ccscope.flows import FlowFilter

from . import analysis, linkmeter
from .document import FlowResult, RunResult
from .environment import now_iso
from .progress import Progress
from .record import RunRecord
from .recorder import FlowSeries, Recorder, write_flow_csv, write_ping_csv, write_state_csv
from .spec import Scenario, mix_label
from .store import Store, quarantined, signals_held
from .traffic import FETCH_PORT, BulkFlow, TrafficResult


@dataclass
class Session:
    """What the runs of one invocation share: the scenario, where its results go, telemetry, progress."""
    scenario: Scenario
    out: Path
    recorder: Recorder
    collector: FlowCollector
    progress: Progress


@dataclass
class FlowViews:
    """The series of one bulk flow that a path found."""
    sender: FlowSeries | None  # the sending socket's: the algorithm's own view
    receiver: FlowSeries | None = None  # this host's receiving socket's, where it only received
    refused: bool = False  # the far end did not give (or sent a malformed) sender series: its error is recorded


class OpenPath(Protocol):
    """A path, up for one run."""
    netns: int  # where the sender's sockets are recorded
    watched: set[int]  # the namespaces whose flows are exported, labelled with the run
    link_samples: list[tuple[float, int]] | None  # the bottleneck's own byte counter, once the run is over
    keep_own_goodput: bool  # a flow without a sender series keeps iperf3's goodput (analysis.apply_common_window)
    sender_expected: bool  # a flow whose sender series is missing is an error

    def run_traffic(self, scenario: Scenario, mix: tuple[str, ...], progress: Callable[[float], None],
                    log_dir: Path) -> TrafficResult: ...

    def views(self, flow: BulkFlow, series: dict[int, FlowSeries], traffic: TrafficResult,
              errors: list[str]) -> FlowViews: ...

    def describe(self, views: FlowViews) -> dict: ...

    def finish(self, record: RunRecord) -> None: ...


class RunPath(Protocol):
    def open(self, session: Session, unit, position: int,
             record: RunRecord) -> AbstractContextManager[OpenPath | None]:
        """Up for one run (None: the run cannot go ahead; the record says why); down on exit."""
        ...


def stem(unit) -> str:
    """The run's file names: no two runs of a plan (or of merged shards) share one."""
    return f"{unit.profile}_{mix_label(unit.mix)}_r{unit.repetition}"


def run_unit(session: Session, unit, position: int, path: RunPath) -> RunRecord:
    scenario, recorder, collector, progress = session.scenario, session.recorder, session.collector, session.progress
    record = RunRecord.planned(unit, position)
    with path.open(session, unit, position, record) as opened:
        if opened is None:
            return record
        collector.filter = FlowFilter(netns=set(opened.watched))
        labels = {"scenario": scenario.name, "profile": unit.profile, "algorithm": mix_label(unit.mix),
                  "run": str(unit.repetition)}
        collector.set_netns_labels({netns: labels for netns in opened.watched})
        recorder.start(opened.netns)
        record.started_at = now_iso()
        progress.start(position, unit.label, profile=unit.profile, algorithm=mix_label(unit.mix),
                       repetition=unit.repetition)
        try:
            traffic = opened.run_traffic(scenario, unit.mix, progress.update, session.out / "raw" / stem(unit))
        finally:
            series = recorder.stop()
            collector.set_netns_labels({})
    record.duration_s = round(traffic.end_mono - traffic.start_mono, 3)
    fill(record, session, unit, opened, traffic, series)
    opened.finish(record)
    return record


def keep(doc: dict, store: Store, run: RunResult) -> RunResult:
    """A completed run (RunRecord.document()) into the document, what follows from it derived
    (analysis.derive), both saved: at once, or (a signal arriving) not at all. A run the document cannot
    hold is kept quarantined (store.quarantined); what was kept."""
    with signals_held():
        kept = quarantined(doc, run)
        doc["runs"].append(kept)
        analysis.derive(doc)
        store.add_run(doc, kept)
    return kept


def fill(record: RunRecord, session: Session, unit, path: OpenPath, traffic: TrafficResult,
         series: dict[int, FlowSeries]) -> None:
    """The run's record from its traffic and its series."""
    t0 = traffic.start_mono
    record.errors += traffic.errors
    srtt_by_algorithm: dict[str, list[float]] = {}
    sender_series: dict[str, FlowSeries] = {}
    for flow in traffic.bulk:
        views = path.views(flow, series, traffic, record.errors)
        entry, srtts = _bulk_entry(record, session, unit, t0, path, flow, views)
        if views.sender is not None:
            sender_series[entry["id"]] = views.sender
            srtt_by_algorithm.setdefault(flow.algorithm, []).extend(srtts)
        record.flows.append(entry)
    _downloads(record, session, unit, traffic, series)
    bulk_end = max((s.samples[-1].t for s in sender_series.values()), default=traffic.end_mono)
    _ping(record, session, unit, traffic, bulk_end)
    _common_window(record, t0, [(f, sender_series.get(f["id"])) for f in record.flows], path)
    record.per_algorithm = analysis.per_algorithm(record.flows, srtt_by_algorithm, unit.mix, record.downloads)


def _bulk_entry(record: RunRecord, session: Session, unit, t0: float, path: OpenPath, flow: BulkFlow,
                views: FlowViews) -> tuple[FlowResult, list[float]]:
    """A bulk flow's entry and its srtt samples in the measured window."""
    name, sender = f"{stem(unit)}_bulk{flow.index}", views.sender
    s = sender or views.receiver
    entry, srtts = analysis.flow_metrics(s, session.scenario.warmup_s, t0) if s else (analysis.empty_flow(), [])
    entry.update({"id": f"bulk{flow.index}", "kind": "bulk", "algorithm": flow.algorithm,
                  "start_offset_s": round(flow.start_offset_s, 3), "iperf3": flow.iperf,
                  "algorithm_iperf3": flow.iperf.get("sender_tcp_congestion"), **path.describe(views)})
    if flow.ect1_packets is not None:
        entry["ect1_packets"] = flow.ect1_packets
    if sender is not None:
        entry["csv"] = write_flow_csv(session.out, f"{name}.csv", sender, t0)
        if sender.states:
            entry["state_csv"] = write_state_csv(session.out, f"{name}_state.csv", sender.states, t0)
    else:
        # no sender series: a socket this host only received on has cwnd/srtt that are not the algorithm's;
        # iperf3 says what the sender ran, and its report gives the goodput
        entry.update(goodput_bps=flow.iperf.get("goodput_bps"), algorithm_kernel=None, srtt_ms=analysis.summary([]))
        if views.receiver is not None:
            entry["receiver_csv"] = write_flow_csv(session.out, f"{name}_receiver.csv", views.receiver, t0)
        if flow.error is None and views.receiver is None:
            record.errors.append(f"bulk{flow.index}: no telemetry for the flow (server port {flow.port}, "
                                    f"local port {flow.local_port})")
        elif flow.error is None and path.sender_expected and not views.refused:
            record.errors.append(f"bulk{flow.index}: no sender telemetry for the flow (local port "
                                    f"{flow.local_port})")
    _check_algorithm(record, entry, flow, kernel_known=sender is not None)
    return entry, srtts


def _check_algorithm(record: RunRecord, entry: FlowResult, flow: BulkFlow, kernel_known: bool) -> None:
    """The sender's kernel (where its series is here) and iperf3's report (where there is one) must both have
    run what was asked; without iperf3's report (its failure is an error of its own) the kernel's word stands."""
    kernel, iperf = entry["algorithm_kernel"], entry["algorithm_iperf3"]
    entry["algorithm_ok"] = ok = (kernel == flow.algorithm or not kernel_known) and \
        (iperf == flow.algorithm or not flow.iperf)
    if not ok and flow.error is None:
        record.errors.append(f"{entry['id']}: requested {flow.algorithm}, the sender's kernel ran {kernel}, "
                                f"iperf3 reports {iperf}")


def _downloads(record: RunRecord, session: Session, unit, traffic: TrafficResult,
               series: dict[int, FlowSeries]) -> None:
    t0 = traffic.start_mono
    by_port = {s.dport: s for s in series.values() if s.sport == FETCH_PORT}
    for i, d in enumerate(traffic.downloads):
        s = by_port.get(d.get("local_port"))
        entry = {"id": f"download{i}", "size_bytes": d["size_bytes"], "complete": d["complete"],
                 "completion_time_s": d["completion_time_s"], "received_bytes": d["received_bytes"],
                 "start_s": round(d["start"] - t0, 3), "error": d["error"], "algorithm": unit.mix[0],
                 "algorithm_kernel": s.cc if s else None, "retransmits": s.samples[-1].retransmits if s else None,
                 "csv": write_flow_csv(session.out, f"{stem(unit)}_download{i}.csv", s, t0) if s else None}
        if s is not None and s.cc != unit.mix[0]:
            record.errors.append(f"download{i}: requested {unit.mix[0]}, the kernel ran {s.cc}")
        record.downloads.append(entry)


def _ping(record: RunRecord, session: Session, unit, traffic: TrafficResult, bulk_end: float) -> None:
    """Each ping stream's RTT over the measured window: from the warm-up's end to the last bulk sample (the
    run's end without bulk flows), so that pings after the load are not counted as pings under it."""
    t0 = traffic.start_mono
    start = t0 + session.scenario.warmup_s
    for name, ping in traffic.pings.items():
        if not ping.sent:
            continue
        rtts = [rtt * 1e3 for t, rtt in ping.replies if start <= t <= bulk_end]
        record.pings[name] = {"sent": ping.sent, "received": len(ping.replies), "rtt_ms": analysis.summary(rtts),
                              "csv": write_ping_csv(session.out, f"{stem(unit)}_{name}.csv", ping.replies, t0)}


def _common_window(record: RunRecord, t0: float, flows: list[tuple[dict, FlowSeries | None]],
                   path: OpenPath) -> None:
    """Goodput of every bulk flow over the run's one common window (analysis.py), their sum, Jain's index
    of them, and the link's own egress counter over the same window where the path has one."""
    record.window, window = analysis.apply_common_window(t0, flows, keep_own=path.keep_own_goodput)
    if path.link_samples is None:
        return
    wire = None if window is None else linkmeter.bytes_between(path.link_samples, *window)
    link_bps = record.link_window_bps = None if wire is None else wire * 8 / (window[1] - window[0])
    goodput = record.window.goodput_bps  # layer 4 against layer 2 (up direction, what left the router)
    if link_bps is not None and goodput is not None and goodput > link_bps:
        record.errors.append(f"goodput {goodput / 1e6:.2f} Mbit/s is above what the link's counter shows over "
                             f"the same window ({link_bps / 1e6:.2f} Mbit/s)")
