"""BPF time series of the flows in one namespace, from the ring buffer of per-flow samples."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from ccscope.flows import decode
from ccscope.sample import Sample

from . import analysis


def _ms(seconds: float | None) -> str:
    return "" if seconds is None else f"{seconds * 1e3:.3f}"


# The per-flow CSV, column by column as in the metric table: (name, value from the sample, its time since the
# run started and the windowed throughput in bit/s, None before a full window).
CsvGetter = Callable[[Sample, float, float | None], object]
CSV_COLUMNS: tuple[tuple[str, CsvGetter], ...] = (
    ("time_s", lambda s, t, bps: f"{t:.4f}"),
    ("cwnd_segments", lambda s, t, bps: s.cwnd_segments),
    ("srtt_ms", lambda s, t, bps: _ms(s.srtt_s)),
    ("retransmits", lambda s, t, bps: s.retransmits),
    ("throughput_mbps", lambda s, t, bps: "" if bps is None else f"{bps / 1e6:.4f}"),
    ("bytes_acked", lambda s, t, bps: s.bytes_acked),
    ("bytes_sent", lambda s, t, bps: s.bytes_sent),
    ("ssthresh_segments", lambda s, t, bps: "" if s.ssthresh_segments is None else s.ssthresh_segments),
    ("min_rtt_ms", lambda s, t, bps: _ms(s.min_rtt_s)),
    ("packets_in_flight", lambda s, t, bps: s.packets_in_flight),
    ("delivery_rate_mbps", lambda s, t, bps: f"{s.delivery_rate_Bps * 8 / 1e6:.4f}"),
    ("ca_state", lambda s, t, bps: s.ca_state),
    ("cc", lambda s, t, bps: s.cc),
    ("event", lambda s, t, bps: s.event),
)
CSV_HEADER = tuple(name for name, _ in CSV_COLUMNS)
CSV_TEXT_COLUMNS = frozenset({"ca_state", "cc"})  # every other column holds numbers


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


def csv_text(samples: list[Sample], t0: float, throughput_bps: list[float | None]) -> str:
    rows = [",".join(CSV_HEADER)]
    rows += [",".join(str(get(s, s.t - t0, bps)) for _, get in CSV_COLUMNS)
             for s, bps in zip(samples, throughput_bps, strict=True)]
    return "\n".join(rows) + "\n"


@dataclass
class FlowSeries:
    cookie: int
    src: str
    sport: int
    dst: str
    dport: int
    samples: list[Sample]

    @property
    def cc(self) -> str:
        ccs = [s.cc for s in self.samples if s.cc and s.cc != "unknown"]
        return ccs[-1] if ccs else "unknown"


class Recorder:
    """Polls the probe's ring buffer in a thread; keeps the samples of the watched namespace."""

    def __init__(self, probe, listener: Callable | None = None) -> None:
        """`listener` also gets the watched namespace's raw samples (the live page)."""
        self._probe = probe
        self._listener = listener
        self._lock = threading.Lock()
        self._netns: int | None = None
        self._flows: dict[int, FlowSeries] = {}
        self._stop = threading.Event()
        self._ring = probe.ring_buffer(self._on_samples)
        self._thread = threading.Thread(target=self._poll, name="ccscope-recorder", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._ring.poll(50)

    def _on_samples(self, raws: list) -> None:
        for raw in raws:
            self._on_sample(raw)

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
                                                               flow.dport, [])
            series.samples.append(Sample.of(flow))

    def start(self, netns: int) -> None:
        with self._lock:
            self._flows = {}
            self._netns = netns

    def stop(self) -> dict[int, FlowSeries]:
        """Samples since start(), per socket cookie, in time order."""
        time.sleep(0.2)  # the poll thread drains what is already in the buffer (polls every 50 ms)
        with self._lock:
            flows, self._flows, self._netns = self._flows, {}, None
        for series in flows.values():
            series.samples.sort(key=lambda s: s.t)
        return flows

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._ring.close()
