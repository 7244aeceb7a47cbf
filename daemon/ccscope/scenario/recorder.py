"""BPF time series of the flows in one namespace, from the ring buffer of per-flow samples, and each flow's
algorithm state changes (ccstate/changes.py) where the state probe runs."""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ccscope.bpf_types import RetransCause
from ccscope.ccstate.changes import ChangeReader, StateChange
from ccscope.ccstate.decoders import TEXT_KEYS
from ccscope.flows import decode
from ccscope.sample import Sample
from ccscope.telemetry import quantities
from ccscope.telemetry.quantities import Quantity
from ccscope.telemetry.session import Session

from . import analysis

# The per-flow CSV: the run's time, then a column per quantity that has one (telemetry/quantities.py), in the
# table's order: a sample's field, or a rate over a window of samples (windowed: the throughput).
CSV_COLUMNS: tuple[Quantity, ...] = tuple(q for q in quantities.QUANTITIES if q.column)
CSV_HEADER = ("time_s", *(q.column.name for q in CSV_COLUMNS))
CSV_TEXT_COLUMNS = frozenset(q.column.name for q in CSV_COLUMNS if q.python_type == "str")  # the rest hold numbers
STATE_CSV_TEXT_COLUMNS = frozenset({"event"}) | TEXT_KEYS  # of write_state_csv's; BBR's mode, Copa's direction


THROUGHPUT_WINDOW_S = 0.2  # flent samples throughput every 0.2 s


def write_flow_csv(out: Path, name: str, series: FlowSeries, t0: float) -> str:
    """flows/NAME in the results directory `out`: the series with its windowed throughput; the relative path."""
    times = [s.t for s in series.samples]
    tput = analysis.windowed_throughput(times, [s.bytes_acked for s in series.samples], THROUGHPUT_WINDOW_S)
    (out / "flows" / name).write_text(csv_text(series.samples, t0, tput))
    return f"flows/{name}"


def write_ping_csv(out: Path, name: str, ping: list[tuple[float, float]], t0: float) -> str:
    """flows/NAME: ping RTTs under load, time from the run's start; the relative path."""
    lines = ["time_s,rtt_ms"] + [f"{t - t0:.4f},{rtt * 1e3:.3f}" for t, rtt in ping]
    (out / "flows" / name).write_text("\n".join(lines) + "\n")
    return f"flows/{name}"


def write_state_csv(out: Path, name: str, changes: list[StateChange], t0: float) -> str:
    """flows/NAME: a flow's algorithm state at each change (the decoder's as_dict(), a column per key, blank
    where a row's algorithm has no such key), time from the run's start; the relative path."""
    rows = [{"time_s": f"{c.time_ns / 1e9 - t0:.4f}", "event": "reading" if c.periodic else "change",
             **c.state.as_dict()} for c in changes]
    header = list(dict.fromkeys(key for row in rows for key in row))
    lines = [",".join(header)] + [",".join(_cell(row.get(key)) for key in header) for row in rows]
    (out / "flows" / name).write_text("\n".join(lines) + "\n")
    return f"flows/{name}"


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(int(value))
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def csv_text(samples: list[Sample], t0: float, throughput_bps: list[float | None]) -> str:
    """The CSV of one flow's samples; `throughput_bps` is the windowed throughput of each (None before a full
    window)."""
    windowed = {"throughput_bps": throughput_bps}
    cells = [[f"{s.t - t0:.4f}" for s in samples]]
    for q in CSV_COLUMNS:
        values = windowed[q.name] if q.windowed else [getattr(s, q.name) for s in samples]
        cells.append([str(q.column.cell(value)) for value in values])
    rows = [",".join(CSV_HEADER), *(",".join(row) for row in zip(*cells, strict=True))]
    return "\n".join(rows) + "\n"


@dataclass
class FlowSeries:
    cookie: int
    src: str
    sport: int
    dst: str
    dport: int
    samples: list[Sample]
    states: list[StateChange] = field(default_factory=list)  # each change of its algorithm's state
    # as of the last sample (the kernel's running totals and the handshake's outcome); None where unknown
    ecn: str | None = None
    delivered_packets: int | None = None
    delivered_ce_packets: int | None = None
    spurious_retransmits: int | None = None
    # the kernel side's count of its retransmitted segments by cause (bt.RetransCause, lower-cased), read at stop()
    retransmits_by_cause: dict[str, int] | None = None

    @property
    def cc(self) -> str:
        ccs = [s.cc for s in self.samples if s.cc and s.cc != "unknown"]
        return ccs[-1] if ccs else "unknown"


POLL_MS = 50  # the session's poll during a scenario
MAX_UNMATCHED = 1024  # flows whose state changes wait for their first sample (or are of other namespaces)
# Between changes the state is read this often: BBR's bandwidth estimate and gains move within a mode, CUBIC's
# Reno estimate within an epoch (the throughput window's period: each plotted point has a reading near it).
STATE_READING_S = THROUGHPUT_WINDOW_S


class Recorder:
    """The samples and state changes of the watched namespace, from the telemetry session's poll (it subscribes
    to the session's samples and, where the state program runs, to its changes)."""

    def __init__(self, session: Session, listener: Callable | None = None) -> None:
        """`listener` also gets the watched namespace's raw samples (the live page)."""
        self._listener = listener
        self._lock = threading.Lock()
        self._netns: int | None = None
        self._flows: dict[int, FlowSeries] = {}
        self._unmatched: OrderedDict[int, list[StateChange]] = OrderedDict()
        self._reader = ChangeReader()
        self._state_probe = session.state
        self._probe = session.probe
        self._next_reading = time.monotonic()
        session.on_samples(self._on_samples)
        session.on_changes(self._on_changes)

    def _read_states(self) -> None:
        """The state of each watched flow that sent in the last second (a closed or idle flow's is its last)."""
        now = time.clock_gettime_ns(time.CLOCK_MONOTONIC)  # bpf_ktime_get_ns()'s clock
        with self._lock:
            cookies = [cookie for cookie, series in self._flows.items()
                       if series.samples and now / 1e9 - series.samples[-1].t < 1.0]
        states = self._state_probe.states(cookies) if cookies else {}
        with self._lock:
            for cookie, state in states.items():
                if (series := self._flows.get(cookie)) is not None:
                    series.states.append(StateChange(cookie, now, state, periodic=True))

    def _on_changes(self, records: list[bytes]) -> None:
        """A change is the flow's if the flow is watched; one not met yet waits for its first sample (the
        kernel copies the state on the segment whose sample may come in the next poll)."""
        with self._lock:
            for change in self._reader.read(records):
                series = self._flows.get(change.cookie)
                if series is not None:
                    series.states.append(change)
                    continue
                self._unmatched.setdefault(change.cookie, []).append(change)
                self._unmatched.move_to_end(change.cookie)
                if len(self._unmatched) > MAX_UNMATCHED:
                    self._unmatched.popitem(last=False)

    def _on_samples(self, raws: list) -> None:
        for raw in raws:
            self._on_sample(raw)
        # between changes, each flow that sends is read this often (a flow that sends nothing changes nothing)
        if self._state_probe is not None and time.monotonic() >= self._next_reading:
            self._next_reading = time.monotonic() + STATE_READING_S
            self._read_states()

    def _on_sample(self, raw) -> None:
        if raw.netns != self._netns:
            return
        if self._listener:
            self._listener(raw)
        flow = decode(raw)
        with self._lock:
            series = self._flows.get(flow.cookie)
            if series is None:
                series = self._flows[flow.cookie] = FlowSeries(flow.cookie, flow.src, flow.sport, flow.dst,
                                                               flow.dport, [], self._unmatched.pop(flow.cookie, []))
            series.samples.append(Sample.of(flow))
            series.ecn, series.delivered_packets = flow.ecn, flow.delivered_packets
            series.delivered_ce_packets = flow.delivered_ce_packets
            series.spurious_retransmits = flow.spurious_retransmits

    def start(self, netns: int) -> None:
        with self._lock:
            self._flows = {}
            self._netns = netns
            self._unmatched.clear()

    def stop(self) -> dict[int, FlowSeries]:
        """Samples since start(), per socket cookie, in time order."""
        time.sleep(0.2)  # the session's poll drains what is already in the buffer (it polls every 50 ms)
        with self._lock:
            flows, self._flows, self._netns = self._flows, {}, None
        causes = self._probe.retransmit_causes(flows.keys())  # a flow that retransmitted nothing has no entry
        for cookie, series in flows.items():
            series.samples.sort(key=lambda s: s.t)
            series.states.sort(key=lambda c: c.time_ns)
            series.retransmits_by_cause = {cause.name.lower(): causes.get(cookie, {}).get(cause, 0)
                                           for cause in RetransCause}
        return flows
