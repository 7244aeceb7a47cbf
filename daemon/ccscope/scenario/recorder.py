"""BPF time series of the flows in one namespace, from the ring buffer of per-flow samples."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from ccscope.flows import FlowRecord, decode

CSV_COLUMNS = ("time_s", "cwnd_segments", "srtt_ms", "retransmits", "throughput_mbps", "bytes_acked",
               "bytes_sent", "ssthresh_segments", "min_rtt_ms", "packets_in_flight", "delivery_rate_mbps",
               "ca_state", "cc", "event")


@dataclass(frozen=True)
class Sample:
    t: float  # CLOCK_MONOTONIC seconds
    cwnd: int
    srtt_s: float
    retransmits: int
    bytes_acked: int
    bytes_sent: int
    ssthresh: int | None
    min_rtt_s: float | None
    in_flight: int
    delivery_Bps: float
    ca_state: str
    cc: str
    event: int
    mss: int

    @classmethod
    def of(cls, f: FlowRecord) -> Sample:
        return cls(t=f.last_ns / 1e9, cwnd=f.cwnd_segments, srtt_s=f.srtt_s, retransmits=f.retransmits,
                   bytes_acked=f.bytes_acked, bytes_sent=f.bytes_sent, ssthresh=f.ssthresh_segments,
                   min_rtt_s=f.min_rtt_s, in_flight=f.packets_in_flight, delivery_Bps=f.delivery_rate_Bps,
                   ca_state=f.ca_state, cc=f.cc, event=f.event, mss=f.mss_bytes)


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
        self._ring = probe.ring_buffer(self._on_sample)
        self._thread = threading.Thread(target=self._poll, name="ccscope-recorder", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._ring.poll(50)

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
