"""An emulated path for one run (lifecycle.py): a testbed of namespaces with the profile's link, its
check before the first run of each profile, and the bottleneck's own counters around the traffic."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

from ccscope.emulation import backends, kernel_aqm, sojourn
from ccscope.emulation.profile import PathProfile
from ccscope.emulation.testbed import Testbed

from .document import ResultsDocument
from .environment import namespace_sysctls
from .lifecycle import FlowViews, Session
from .linkmeter import LinkMeter
from .record import RunRecord
from .recorder import FlowSeries
from .spec import Scenario
from .traffic import BulkFlow, TrafficResult, run_traffic


def resolve_aqms(scenario: Scenario, backend: str | None) -> Scenario:
    """The scenario with each AQM's implementation decided (the kernel's qdisc or the delay line), so that
    results.json says which ran before the first run; a kernel AQM this kernel cannot run is refused here."""
    emulated = [p for p in scenario.profiles.values() if isinstance(p, PathProfile)]
    if not any(link.aqm is not None and link.aqm.manages for p in emulated for link in (p.up, p.down)):
        return scenario
    caps = backends.probe_backends()
    chosen = backends.choose_backend(backend or "auto", caps)
    return replace(scenario, profiles={name: kernel_aqm.resolve(p, chosen, caps.qdiscs)
                                       if isinstance(p, PathProfile) else p
                                       for name, p in scenario.profiles.items()})


@dataclass
class EmulatedPath:
    """The profile's link between two namespaces; `verify` checks it before the traffic (once per profile)."""
    doc: ResultsDocument  # the environment, the emulation checks and their warnings go there
    backend: str | None
    verify: bool

    @contextlib.contextmanager
    def open(self, session: Session, unit, position: int, record: RunRecord) -> Iterator[OpenTestbed]:
        scenario = session.scenario
        with Testbed(scenario.profiles[unit.profile], backend=self.backend, seed=scenario.seed + position) as tb:
            tb.set_algorithm(unit.mix[0])
            opened = OpenTestbed(tb, tb.netns_inode(tb.sender_ns), {tb.netns_inode(tb.sender_ns),
                                                                    tb.netns_inode(tb.receiver_ns)})
            record.netns, record.backend = opened.netns, tb.backend
            self._environment(tb)
            if self.verify:
                session.progress.note(f"checking the emulated path {unit.profile}")
                self._check(tb, unit.profile)
            link_before = tb.link_stats()  # the check above went through the same queues
            meter = LinkMeter(tb.router_ns)
            try:
                yield opened
            finally:
                opened.link_samples = meter.stop()
            record.link = _link_delta(tb.link_stats(), link_before)
            stalled = machine_stalls(record.link)
            if stalled:
                self.doc["warnings"].append(f"{record.label}: {stalled}")

    def _environment(self, tb: Testbed) -> None:
        environment = self.doc["environment"]
        if not environment.get("offloads"):
            environment["offloads"] = getattr(tb, "offloads", {})
            environment["sysctls_sender_ns"] = namespace_sysctls(tb)

    def _check(self, tb: Testbed, profile: str) -> None:
        check = tb.verify()
        self.doc["emulation_checks"][profile] = {
            "ok": check.ok, "message": check.message, "rtt_expected_s": check.rtt_expected_s,
            "rtt_measured_s": check.rtt_measured_s, "rate_expected_bps": check.rate_expected_bps,
            "rate_measured_bps": check.rate_measured_bps}
        if not check.ok:  # recorded and shown; the measurements themselves are still valid
            self.doc["warnings"].append(f"emulation check of {profile}: {check.message}")


@dataclass
class OpenTestbed:
    tb: Testbed
    netns: int
    watched: set[int]
    link_samples: list[tuple[float, int]] | None = field(default=None)
    keep_own_goodput: bool = False
    sender_expected: bool = True

    def run_traffic(self, scenario: Scenario, mix: tuple[str, ...], progress: Callable[[float], None],
                    log_dir: Path) -> TrafficResult:
        return run_traffic(self.tb, scenario, mix, progress, log_dir)

    def views(self, flow: BulkFlow, series: dict[int, FlowSeries], traffic: TrafficResult,
              errors: list[str]) -> FlowViews:
        return FlowViews(sender=bulk_series(flow, series))

    def describe(self, views: FlowViews) -> dict:
        return {}

    def finish(self, record: RunRecord) -> None:
        pass


def bulk_series(flow: BulkFlow, series: dict[int, FlowSeries]) -> FlowSeries | None:
    """The BPF series of a bulk flow: by the local port iperf3 reports, else by the server port.

    Each iperf3 server port carries two connections, the control one and the data one, so without
    iperf3's report (a client that failed or was stopped) the data connection is the one that moved
    the most bytes. What the kernel measured is kept either way."""
    if flow.local_port is not None:
        by_sport = [s for s in series.values() if s.sport == flow.local_port and s.samples]
        if by_sport:
            # A port can serve twice: the path check's iperf3 closed its control connection from the same local
            # port 60 ms before a run's data connection took it (seen once: the run got that 184-byte series).
            return max(by_sport, key=lambda s: (s.dport == flow.port, s.samples[-1].bytes_acked))
    to_server = [s for s in series.values() if s.dport == flow.port and s.samples]
    return max(to_server, key=lambda s: s.samples[-1].bytes_acked, default=None)


# Late releases beyond this share of the run's packets make a warning. A quiet machine releases none or a few
# (the delay line wakes within 0.14 ms beside two busy loops); a host whose neighbours took 25-38 % of its CPU
# (vmstat's steal, 2026-11-27) released 4-17 % of an l4s run's packets late, by up to 31 ms, and cut cubic's
# goodput from 47.7 to 33-42 Mbit/s of 50.
STALL_WARNING_SHARE = 0.01


def late_share(*directions: dict) -> float:
    """The share of these link directions' packets their delay lines released over 2 ms late (late_releases): the
    machine's delay, not the emulated path's; 0 where they carried none, or where a kernel qdisc ran the link."""
    packets = sum(d.get("packets", 0) for d in directions)
    return sum(d.get("late_releases", 0) for d in directions) / packets if packets else 0.0


def machine_stalls(link: dict) -> str | None:
    """One line when the delay lines released more than STALL_WARNING_SHARE of the run's packets late: then the
    run's delays and rates are partly the machine's, not the emulated path's."""
    if late_share(*link.values()) <= STALL_WARNING_SHARE:
        return None
    late = sum(d.get("late_releases", 0) for d in link.values())
    packets = sum(d.get("packets", 0) for d in link.values())
    worst = max(d.get("max_late_ms", 0.0) for d in link.values())
    return (f"the machine stalled the delay line: {late} of {packets} packets left over 2 ms late (up to "
            f"{worst:.0f} ms); this run's delays and rates are partly the machine's")


def _link_delta(after: dict, before: dict) -> dict:
    """The run's share of the link's counters; the delay line's sojourn buckets become their percentiles."""
    link = {}
    for direction, counters in after.items():
        delta = {k: v - before.get(direction, {}).get(k, 0) if isinstance(v, int) else v for k, v in counters.items()}
        link[direction] = {k: v for k, v in delta.items() if not k.startswith(sojourn.PREFIXES)}
        link[direction].update(sojourn.summaries(delta))
    return link
