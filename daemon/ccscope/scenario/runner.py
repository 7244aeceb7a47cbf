"""Runs a scenario: profiles x algorithm sets x repetitions, in seeded random order, one fresh Testbed
per run, with the BPF recorder and the live Prometheus endpoint on for the whole scenario."""

from __future__ import annotations

import contextlib
import os
import random
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from prometheus_client import CollectorRegistry

from ccscope.emulation.algorithms import available_algorithms
from ccscope.emulation.testbed import Testbed
from ccscope.errors import PrerequisiteError, UsageError
from ccscope.exporter import FlowCollector
from ccscope.flows import FlowFilter, FlowSelection, FlowTable
from ccscope.hosttools import SCENARIO_TOOLS, need
from ccscope.loader import ProbeOptions, TelemetryProbe, preflight
from ccscope.server import MetricsServer
from ccscope.units import parse_listen

from . import analysis, results
from .environment import namespace_sysctls, now_iso
from .progress import Progress
from .recorder import FlowSeries, Recorder, csv_text
from .spec import Scenario, mix_label
from .traffic import FETCH_PORT, BulkFlow, TrafficResult, planned_seconds, run_traffic

THROUGHPUT_WINDOW_S = 0.2  # flent samples throughput every 0.2 s


@dataclass
class Options:
    out: Path | None = None
    listen: str | None = None
    listen_explicit: bool = False
    skip_unavailable: bool = False
    backend: str = "auto"
    quick: bool = False
    verify: bool = True


@dataclass(frozen=True)
class Unit:
    profile: str
    mix: tuple[str, ...]
    repetition: int

    @property
    def label(self) -> str:
        return f"{self.profile}/{mix_label(self.mix)}#{self.repetition}"


def check_prerequisites() -> None:
    if os.geteuid() != 0:
        raise PrerequisiteError("scenarios need root (network namespaces, BPF, sysctls)", "run with sudo")
    need(*SCENARIO_TOOLS)
    preflight()


def select_algorithms(scenario: Scenario, skip_unavailable: bool) -> tuple[Scenario, list[str]]:
    """Drops algorithms the kernel lacks if optional (or with --skip-unavailable); else one clear error."""
    available = available_algorithms()
    missing = [a for a in scenario.all_algorithms if a not in available]
    required = [a for a in missing if a not in scenario.optional_algorithms]
    if required and not skip_unavailable:
        raise PrerequisiteError(f"{', '.join(required)} {'is' if len(required) == 1 else 'are'} not available "
                                f"in this kernel (available: {', '.join(sorted(available))})",
                                "use --skip-unavailable to run without it, or --algorithms")
    scenario = scenario.without(set(missing))
    if not scenario.algorithms:
        raise PrerequisiteError(f"none of the scenario's algorithms is available here "
                                f"(available: {', '.join(sorted(available))})")
    return scenario, missing


def plan(scenario: Scenario) -> list[Unit]:
    units = [Unit(p, mix, r) for r in range(1, scenario.runs + 1) for p in scenario.profiles
             for mix in scenario.algorithms]
    random.Random(scenario.seed).shuffle(units)
    return units


def default_out(scenario: Scenario) -> Path:
    return Path("results") / f"{scenario.name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def run(scenario: Scenario, options: Options) -> tuple[Path, dict]:
    check_prerequisites()
    scenario, skipped = select_algorithms(scenario, options.skip_unavailable)
    out = options.out or default_out(scenario)
    if out.exists() and any(out.iterdir()):
        raise UsageError(f"--out {out}: directory exists and is not empty")
    units = plan(scenario)
    for name in skipped:
        print(f"ccscope: {name} is not available in this kernel; running without it", file=sys.stderr)
    (out / "flows").mkdir(parents=True, exist_ok=True)
    doc = results.new_document(scenario, units, skipped, options.quick)
    with _telemetry(scenario, options) as (recorder, collector, endpoint):
        if endpoint:
            print(f"ccscope: live per-flow telemetry on http://{endpoint}/metrics", file=sys.stderr)
        progress = Progress(len(units), planned_seconds(scenario))
        verified: set[str] = set()
        for position, unit in enumerate(units, 1):
            record = _run_unit(scenario, unit, position, out, recorder, collector, progress, options,
                               verify=options.verify and unit.profile not in verified, doc=doc)
            verified.add(unit.profile)
            doc["runs"].append(record)
            progress.done(record)
    doc["finished_at"] = now_iso()
    doc["summary"] = analysis.summarize(doc["runs"], scenario)
    doc["errors"] += [f"{r['label']}: {e}" for r in doc["runs"] for e in r["errors"]]
    results.validate(doc)
    results.write(out, doc)
    return out, doc


@contextlib.contextmanager
def _telemetry(scenario: Scenario, options: Options):
    listen = parse_listen(options.listen) if options.listen else None
    probe_options = ProbeOptions(emit_samples=True, sample_interval_ns=int(scenario.sample_interval_s * 1e9))
    with TelemetryProbe(probe_options) as probe:
        table = FlowTable(probe, grace_s=5.0)
        collector = FlowCollector(table, FlowSelection("all"), FlowFilter(netns={0}))
        server = None
        if listen:
            registry = CollectorRegistry()
            registry.register(collector)
            try:
                server = MetricsServer(registry, *listen)
            except PrerequisiteError as exc:
                if options.listen_explicit:
                    raise
                print(f"ccscope: live endpoint off: {exc.line()}", file=sys.stderr)
        recorder = Recorder(probe)
        try:
            yield recorder, collector, options.listen if server else None
        finally:
            recorder.close()
            if server:
                server.close()


def _run_unit(scenario: Scenario, unit: Unit, position: int, out: Path, recorder: Recorder, collector,
              progress: Progress, options: Options, verify: bool, doc: dict) -> dict:
    profile = scenario.profiles[unit.profile]
    record = results.new_run(unit, position)
    with Testbed(profile, backend=options.backend, seed=scenario.seed + position) as tb:
        tb.set_algorithm(unit.mix[0])
        netns = tb.netns_inode(tb.sender_ns)
        record["netns"] = netns
        record["backend"] = tb.backend
        if not doc["environment"].get("offloads"):
            doc["environment"]["offloads"] = getattr(tb, "offloads", {})
            doc["environment"]["sysctls_sender_ns"] = namespace_sysctls(tb)
        if verify:
            progress.note(f"checking the emulated path {unit.profile}")
            check = tb.verify()
            doc["emulation_checks"][unit.profile] = {
                "ok": check.ok, "message": check.message, "rtt_expected_s": check.rtt_expected_s,
                "rtt_measured_s": check.rtt_measured_s, "rate_expected_bps": check.rate_expected_bps,
                "rate_measured_bps": check.rate_measured_bps}
            if not check.ok:  # recorded and shown; the measurements themselves are still valid
                doc["warnings"].append(f"emulation check of {unit.profile}: {check.message}")
        collector.filter = FlowFilter(netns={netns, tb.netns_inode(tb.receiver_ns)})
        labels = {"scenario": scenario.name, "profile": unit.profile, "algorithm": mix_label(unit.mix),
                  "run": str(unit.repetition)}
        collector.set_netns_labels({netns: labels, tb.netns_inode(tb.receiver_ns): labels})
        link_before = tb.link_stats()  # the verify probe above went through the same queues
        recorder.start(netns)
        record["started_at"] = now_iso()
        progress.start(position, unit.label)
        traffic = run_traffic(tb, scenario, unit.mix, progress.update, out / "raw" / _stem(unit))
        series = recorder.stop()
        record["link"] = _link_delta(tb.link_stats(), link_before)
    collector.set_netns_labels({})
    record["duration_s"] = round(traffic.end_mono - traffic.start_mono, 3)
    _fill_run(record, scenario, unit, traffic, series, out)
    return record


def _fill_run(record: dict, scenario: Scenario, unit: Unit, traffic: TrafficResult,
              series: dict[int, FlowSeries], out: Path) -> None:
    t0 = traffic.start_mono
    record["errors"] += traffic.errors
    stem = _stem(unit)
    bulk_end = t0
    srtt_by_algorithm: dict[str, list[float]] = {}
    for flow in traffic.bulk:
        s = bulk_series(flow, series)
        entry, srtts = analysis.flow_metrics(s, scenario.warmup_s, t0) if s else (analysis.empty_flow(), [])
        srtt_by_algorithm.setdefault(flow.algorithm, []).extend(srtts)
        entry.update({"id": f"bulk{flow.index}", "kind": "bulk", "algorithm": flow.algorithm,
                      "start_offset_s": round(flow.start_offset_s, 3), "iperf3": flow.iperf,
                      "algorithm_iperf3": flow.iperf.get("sender_tcp_congestion")})
        if s is None:
            record["errors"].append(f"bulk{flow.index}: no telemetry for the flow (server port {flow.port}, "
                                    f"local port {flow.local_port})")
        else:
            entry["csv"] = _write_csv(out, f"{stem}_bulk{flow.index}.csv", s, t0)
            bulk_end = max(bulk_end, s.samples[-1].t)
        _check_algorithm(record, entry, flow.algorithm)
        record["flows"].append(entry)
    downloads_by_port = {s.dport: s for s in series.values() if s.sport == FETCH_PORT}
    for i, d in enumerate(traffic.downloads):
        s = downloads_by_port.get(d.get("local_port"))
        entry = {"id": f"download{i}", "size_bytes": d["size_bytes"], "complete": d["complete"],
                 "completion_time_s": d["completion_time_s"], "received_bytes": d["received_bytes"],
                 "start_s": round(d["start"] - t0, 3), "error": d["error"], "algorithm": unit.mix[0],
                 "algorithm_kernel": s.cc if s else None, "retransmits": s.samples[-1].retransmits if s else None,
                 "csv": _write_csv(out, f"{stem}_download{i}.csv", s, t0) if s else None}
        if s is not None and s.cc != unit.mix[0]:
            record["errors"].append(f"download{i}: requested {unit.mix[0]}, the kernel ran {s.cc}")
        record["downloads"].append(entry)
    if traffic.ping_sent:
        window_start = t0 + scenario.warmup_s
        end = bulk_end if traffic.bulk else traffic.end_mono
        rtts = [rtt * 1e3 for t, rtt in traffic.ping if window_start <= t <= end]
        record["ping"] = {"sent": traffic.ping_sent, "received": len(traffic.ping), "rtt_ms": analysis.summary(rtts),
                          "csv": _write_ping_csv(out, f"{stem}_ping.csv", traffic.ping, t0)}
    goodputs = [f["goodput_bps"] for f in record["flows"] if f["goodput_bps"] is not None]
    record["jain"] = analysis.jain(goodputs)
    record["per_algorithm"] = analysis.per_algorithm(record["flows"], srtt_by_algorithm, unit.mix,
                                                     record["downloads"])


def _stem(unit: Unit) -> str:
    return f"{unit.profile}_{mix_label(unit.mix)}_r{unit.repetition}"


def bulk_series(flow: BulkFlow, series: dict[int, FlowSeries]) -> FlowSeries | None:
    """The BPF series of a bulk flow: by the local port iperf3 reports, else by the server port.

    Each iperf3 server port carries two connections, the control one and the data one, so without
    iperf3's report (a client that failed or was stopped) the data connection is the one that moved
    the most bytes. What the kernel measured is kept either way."""
    if flow.local_port is not None:
        by_sport = [s for s in series.values() if s.sport == flow.local_port]
        if by_sport:
            return by_sport[0]
    to_server = [s for s in series.values() if s.dport == flow.port and s.samples]
    return max(to_server, key=lambda s: s.samples[-1].bytes_acked, default=None)


def _link_delta(after: dict, before: dict) -> dict:
    return {d: {k: v - before.get(d, {}).get(k, 0) if isinstance(v, int) else v for k, v in counters.items()}
            for d, counters in after.items()}


def _check_algorithm(record: dict, entry: dict, requested: str) -> None:
    kernel, iperf = entry.get("algorithm_kernel"), entry.get("algorithm_iperf3")
    # without iperf3's report (its failure is an error of its own) the kernel's word stands alone
    ok = kernel == requested and (iperf == requested or not entry.get("iperf3"))
    entry["algorithm_ok"] = ok
    if not ok:
        record["errors"].append(f"{entry['id']}: requested {requested}, the kernel ran {kernel}, "
                                f"iperf3 reports {iperf}")


def _write_csv(out: Path, name: str, series: FlowSeries, t0: float) -> str:
    times = [s.t for s in series.samples]
    acked = [s.bytes_acked for s in series.samples]
    tput = analysis.windowed_throughput(times, acked, THROUGHPUT_WINDOW_S)
    (out / "flows" / name).write_text(csv_text(series.samples, t0, tput))
    return f"flows/{name}"


def _write_ping_csv(out: Path, name: str, ping: list[tuple[float, float]], t0: float) -> str:
    lines = ["time_s,rtt_ms"] + [f"{t - t0:.4f},{rtt * 1e3:.3f}" for t, rtt in ping]
    (out / "flows" / name).write_text("\n".join(lines) + "\n")
    return f"flows/{name}"
