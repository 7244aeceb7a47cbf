"""Bounded rings of recent samples, one per charted flow: the live page's memory of each flow.

A sample is kept only when its flow's last kept point is DECIMATE_S old (so at most 20 points per flow per
second), and kept as its JSON text: encoded once, sent to every client and to every late-joining page from the
ring. Memory is bounded by MAX_FLOWS x RING_POINTS points and MAX_SKIPPED skipped cookies.
"""

from __future__ import annotations

import itertools
import operator
import os
import re
import struct
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field

from ccscope import bpf_types as bt
from ccscope.ccstate.decoders import ALL_METRICS, AlgorithmState, metrics_of
from ccscope.flows import TCP_STATES, FlowFilter, FlowRecord, decode, monotonic_ns
from ccscope.telemetry import quantities

DECIMATE_S = 0.05
DECIMATE_NS = int(DECIMATE_S * 1e9)
RING_POINTS = 2400          # 2 minutes at 20 points/s
MAX_FLOWS = 32              # flows with a ring; the least recently active one makes room
THROUGHPUT_WINDOW_S = 0.2   # as the report (flent's 200 ms)
IDLE_NS = 10 * 10**9        # a flow without samples this long gives its ring up to a new one
MAX_SKIPPED = 65536
SKIPPED_CLEAR_S = 10.0      # flows refused a ring (or by the filter) are looked at again this often
CLOSED_KEEP_S = 60.0        # a closed flow's ring stays this long (the page can still look at it)

_HEAD = struct.Struct("=QQQQ")  # struct flow's first fields: cookie, first_ns, last_ns, closed_ns
_CHARTED = quantities.charted()
# What a point needs of struct flow: the ring's own fields and each charted quantity's (telemetry/quantities.py),
# in struct order; one unpack of these is ~4x cheaper than the whole struct.
_RING_FIELDS = ("last_ns", "closed_ns", "bytes_acked", "bytes_received", "sk_state", "srtt_us", "min_rtt_us",
                "ca_name")
POINT_FIELDS = tuple(sorted({*_RING_FIELDS, *(q.live.kernel for q in _CHARTED)},
                            key=lambda name: getattr(bt.Flow, name).offset))
_AT = {name: i for i, name in enumerate(POINT_FIELDS)}
_LAST, _CLOSED, _ACKED, _RECEIVED, _SK_STATE, _SRTT, _MIN_RTT, _CA_NAME = (_AT[name] for name in _RING_FIELDS)
_VALUES = tuple((_AT[q.live.kernel], q.live.absent) for q in _CHARTED)
# A point on the wire: [wall-clock s, kbit/s over the throughput window, each charted quantity as the kernel keeps
# it]; the page divides each by its divisor (to ms and Mbit/s) and knows them by name.
# Then each algorithm-state series marked live (ccstate/: BBR's mode, CUBIC's W_max), null where the flow's
# algorithm has none or the state program does not run.
LIVE_STATE = tuple(m for m in ALL_METRICS if m.live)
POINT_LAYOUT = {"fields": ["t", "throughput_bps", *(q.name for q in _CHARTED), *(m.short for m in LIVE_STATE)],
                "divisors": [1, 1e3, *(q.live.divisor for q in _CHARTED), *(1 for _ in LIVE_STATE)]}
_NO_STATE = ",null" * len(LIVE_STATE)
StateReader = Callable[[list[int]], Mapping[int, AlgorithmState]]


def _subset(fields: tuple[str, ...]) -> struct.Struct:
    """struct flow with every other field skipped as padding; fields must come in struct order."""
    full = bt.FLOW_STRUCT.format.removeprefix("=")
    codes = re.findall(r"\d*[A-Za-z]", full)
    names = [name.lstrip("_") for name, _ in bt.Flow._fields_]
    if [n for n in names if n in fields] != list(fields):
        raise RuntimeError(f"{fields} are not in the order of struct flow")
    parts = [code if name in fields else f"{struct.calcsize('=' + code)}x" for name, code in zip(names, codes,
                                                                                                 strict=True)]
    return struct.Struct("=" + "".join(parts))


_POINT = _subset(POINT_FIELDS)

# The thresholds of the CcscopeFlowBufferbloat alert (deploy/prometheus/rules/ccscope-alerts.yml):
#   ccscope_flow_queueing_delay_seconds > 0.1 and ccscope_flow:srtt_over_min_rtt:ratio > 3, for: 2m
BLOAT_QUEUEING_DELAY_S = 0.1
BLOAT_RTT_RATIO = 3.0
BLOAT_FOR_S = 120.0


_point_of = operator.attrgetter(*POINT_FIELDS)


def _state_values(state: AlgorithmState | None) -> str:
    if state is None:
        return _NO_STATE
    own = metrics_of(state)
    values = (m.value(state) if m in own else None for m in LIVE_STATE)
    return "".join(",null" if v is None else f",{v:g}" for v in values)


def bufferbloat(srtt_s: float, min_rtt_s: float | None) -> bool:
    """The alert's condition on one sample (without its `for:`)."""
    if not min_rtt_s:
        return False
    return srtt_s - min_rtt_s > BLOAT_QUEUEING_DELAY_S and srtt_s / min_rtt_s > BLOAT_RTT_RATIO


@dataclass
class FlowRing:
    """Recent decimated points of one flow (POINT_LAYOUT) as JSON text."""

    cookie: int
    info: dict
    points: deque = field(default_factory=lambda: deque(maxlen=RING_POINTS))
    recent: deque = field(default_factory=lambda: deque(maxlen=16))  # (t, bytes) for the throughput window
    last_ns: int = 0
    new: int = 0                  # points kept since the last push
    ca_name: bytes = b""
    cc: str = ""                  # the kernel's name of the algorithm (the page may show another: refresh_info)
    bytes: int = 0
    sk_state: int = 0
    closed_ns: int = 0
    over: bool = False
    wall: float = 0.0
    sent_info: bool = False
    latest: object = None         # the last kept sample, raw (bytes or FlowTuple): the table row decodes it
    bloat_since: float | None = None
    closed: float | None = None   # monotonic seconds when the close was seen

    def add(self, sample: tuple, wall: float, state: AlgorithmState | None = None) -> None:
        """One kept sample, a _POINT tuple, and its flow's algorithm state then: a full decode() per point would
        cost more than all else."""
        closed_ns, sk_state, srtt_us, min_rtt_us = sample[_CLOSED], sample[_SK_STATE], sample[_SRTT], sample[_MIN_RTT]
        total, ca_name = sample[_ACKED] + sample[_RECEIVED], sample[_CA_NAME]
        recent = self.recent
        while len(recent) > 1 and wall - recent[1][0] >= THROUGHPUT_WINDOW_S:
            recent.popleft()
        first = recent[0] if recent else None
        mbps = (total - first[1]) * 8e-6 / (wall - first[0]) if first and wall > first[0] else 0.0
        recent.append((wall, total))
        has_min = min_rtt_us not in (0, 0xFFFFFFFF)
        # integers (µs, kbit/s) format fastest; the page scales them
        values = ",".join("null" if sample[at] in absent else str(sample[at]) for at, absent in _VALUES)
        self.points.append(f"[{wall:.3f},{int(mbps * 1000) if mbps > 0 else 0},{values}{_state_values(state)}]")
        if self.new < RING_POINTS:
            self.new += 1
        over = has_min and bufferbloat(srtt_us / 1e6, min_rtt_us / 1e6)
        if not over:
            self.bloat_since = None
        elif self.bloat_since is None:
            self.bloat_since = wall
        self.bytes, self.sk_state, self.closed_ns, self.over, self.wall = total, sk_state, closed_ns, over, wall
        if ca_name != self.ca_name:
            self.ca_name = ca_name
            self.cc = ca_name.split(b"\0", 1)[0].decode(errors="replace") or "unknown"

    def refresh_info(self, cc_names: dict[str, str]) -> dict:
        """The slowly changing part, sent once a second (not with every push); the algorithm as the page names it."""
        over_for = self.wall - self.bloat_since if self.over and self.bloat_since is not None else 0.0
        self.info.update(cc=cc_names.get(self.cc, self.cc), state=TCP_STATES.get(self.sk_state, str(self.sk_state)),
                         bytes=self.bytes, closed=bool(self.closed_ns), bloat=self.over,
                         bloat_for_s=round(over_for, 1), bloat_alert=over_for >= BLOAT_FOR_S)
        return self.info

    def take_new(self) -> list[str]:
        new, self.new = self.new, 0
        return list(itertools.islice(self.points, len(self.points) - new, None)) if new else []


class Rings:
    """The rings of the flows being charted, fed from any thread; `lock` is the hub's, held while they change."""

    def __init__(self, flow_filter: FlowFilter, lock: threading.Lock, name_of: Callable[[str], str]) -> None:
        self.flow_filter = flow_filter
        self.own_listeners: set[tuple[int, int]] = set()  # (netns inode, port) of the page's own listener
        self.run_label: str | None = None  # the scenario run new flows belong to
        self.samples_in = 0
        self.points_kept = 0
        self._lock = lock
        self._name_of = name_of
        self._by_cookie: dict[int, FlowRing] = {}
        self._skipped: set[int] = set()  # cookies refused by the filter or for want of a ring (cheap to skip)
        self._skipped_at = time.monotonic()
        self._wall_offset = time.time() - monotonic_ns() / 1e9
        self.states: StateReader | None = None  # each flow's algorithm state (the session's state probe), if any

    def __iter__(self) -> Iterator[FlowRing]:
        return iter(self._by_cookie.values())

    def of_run(self, label: str) -> list[FlowRing]:
        with self._lock:
            return [ring for ring in self._by_cookie.values() if ring.info["run"] == label]

    def on_record(self, data: bytes) -> None:
        """A raw ring-buffer record: most are decimated away on the header alone, before any unpacking."""
        cookie, _, last_ns, closed_ns = _HEAD.unpack_from(data)
        if self._wanted(cookie, last_ns, closed_ns):
            self._keep(cookie, _POINT.unpack_from(data), data)

    def on_sample(self, raw) -> None:
        """An unpacked sample (the scenario's recorder has unpacked it already)."""
        if self._wanted(raw.cookie, raw.last_ns, raw.closed_ns):
            self._keep(raw.cookie, _point_of(raw), raw)

    def serving_on(self, port: int) -> None:
        """The page's own listener: the connections to it (the pages' streams, in this network namespace) are
        marked `own`, and the page does not pick them as the busiest flows to chart."""
        self.own_listeners.add((os.stat("/proc/self/ns/net").st_ino, port))

    def expire(self, now: float) -> None:
        """Called with the lock held."""
        if now - self._skipped_at >= SKIPPED_CLEAR_S:
            self._skipped_at = now
            self._skipped.clear()
        expired = [c for c, r in self._by_cookie.items() if r.closed is not None and now - r.closed > CLOSED_KEEP_S]
        for cookie in expired:
            del self._by_cookie[cookie]

    def _wanted(self, cookie: int, last_ns: int, closed_ns: int) -> bool:
        self.samples_in += 1
        ring = self._by_cookie.get(cookie)
        if ring is None:
            return cookie not in self._skipped
        return last_ns - ring.last_ns >= DECIMATE_NS or bool(closed_ns and last_ns >= ring.last_ns)

    def _keep(self, cookie: int, point: tuple, raw) -> None:
        """`raw` (bytes or FlowTuple) is decoded only for a flow's first sample."""
        ring = self._by_cookie.get(cookie)
        last_ns, closed_ns = point[_LAST], point[_CLOSED]
        with self._lock:
            if ring is None:
                flow = decode(bt.unpack_flow(raw) if isinstance(raw, bytes) else raw)
                if not self.flow_filter.matches(flow):
                    self._skip(cookie)
                    return
                ring = self._new_ring(flow, last_ns)
                if ring is None:  # every ring busy: try again after the next clear of _skipped
                    self._skip(cookie)
                    return
            ring.last_ns = last_ns
            ring.latest = raw
            states = self.states
            ring.add(point, last_ns / 1e9 + self._wall_offset, states([cookie]).get(cookie) if states else None)
            if closed_ns and ring.closed is None:
                ring.closed = time.monotonic()
            self.points_kept += 1

    def _skip(self, cookie: int) -> None:
        if len(self._skipped) >= MAX_SKIPPED:
            self._skipped.clear()
        self._skipped.add(cookie)

    def _new_ring(self, flow: FlowRecord, now_ns: int) -> FlowRing | None:
        """A ring for a new flow; when all are taken, the ring of a closed or idle flow makes room, else None."""
        if len(self._by_cookie) >= MAX_FLOWS:
            oldest = min(self._by_cookie.values(), key=lambda r: (r.closed is None, r.last_ns))
            if oldest.closed is None and now_ns - oldest.last_ns < IDLE_NS:
                return None
            del self._by_cookie[oldest.cookie]
        own = (flow.netns, flow.sport) in self.own_listeners or (flow.netns, flow.dport) in self.own_listeners
        ring = FlowRing(flow.cookie, {"id": str(flow.cookie), "flow": flow.name, "netns": flow.netns,
                                      "cc": self._name_of(flow.cc), "sport": flow.sport, "dport": flow.dport,
                                      "run": self.run_label, "own": own})
        self._by_cookie[flow.cookie] = ring
        return ring
