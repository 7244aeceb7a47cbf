"""Bounded rings of recent samples per flow, and the clients of the event stream.

The BPF ring-buffer consumer calls Hub.on_sample() for every sample. A sample is kept only when its flow's
last kept point is DECIMATE_S old (so at most 20 points per flow per second), and kept as its JSON text: encoded
once, sent to every client and to every late-joining page from the ring. A broadcaster thread batches new points
PUSH_HZ times a second into one message for all clients.

A client is a bounded queue (drop-oldest): a slow reader loses updates, counted and shown on its page as
"lagging", and never holds up the consumer or the broadcaster, which only append. Memory is bounded by
MAX_FLOWS x RING_POINTS points, MAX_CLIENTS x CLIENT_QUEUE messages, and MAX_RUNS finished-run curves.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import operator
import os
import re
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from ccscope import bpf_types as bt
from ccscope.flows import TCP_STATES, FlowFilter, FlowRecord, decode, monotonic_ns

DECIMATE_S = 0.05
DECIMATE_NS = int(DECIMATE_S * 1e9)
RING_POINTS = 2400          # 2 minutes at 20 points/s
MAX_FLOWS = 32              # flows with a ring; the least recently active one makes room
PUSH_HZ = 10                # batched pushes per second per client (>= 5 updates/s on the page)
TABLE_INTERVAL_S = 1.0      # the flows table is re-read from the kernel map once a second,
TABLE_COST_FACTOR = 100     # or less often, so that reading it costs at most 1% of a core
MAX_CLIENTS = 16
CLIENT_QUEUE = 64           # messages, ~6 s of pushes; older ones are dropped first
THROUGHPUT_WINDOW_S = 0.2   # as the report (flent's 200 ms)
RUN_CURVE_POINTS = 600      # a finished run's cwnd curve, thinned to this many points per flow
MAX_RUNS = 256
PROGRESS_INTERVAL_S = 0.2
IDLE_NS = 10 * 10**9        # a flow without samples this long gives its ring up to a new one
MAX_SKIPPED = 65536
SKIPPED_CLEAR_S = 10.0      # flows refused a ring (or by the filter) are looked at again this often
CLOSED_ROW_S = 5.0          # a closed flow's row stays in the table this long (as the scenario's flow table)
CLOSED_KEEP_S = 60.0        # a closed flow's ring stays this long (the page can still look at it)
CC_NAMES_INTERVAL_S = 2.0   # how often the daemon's page looks again at which algorithms ccscope's BPF runs

_HEAD = struct.Struct("=QQQQ")  # struct flow's first fields: cookie, first_ns, last_ns, closed_ns
# What a point needs of struct flow, in struct order; one unpack of these is ~4x cheaper than the whole struct.
POINT_FIELDS = ("last_ns", "closed_ns", "bytes_acked", "bytes_received", "sk_state", "snd_cwnd", "srtt_us",
                "min_rtt_us", "total_retrans", "ca_name")


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


TableSource = Callable[[], tuple[list[FlowRecord], int]]
CcNames = Callable[[], dict[str, str]]  # kernel name -> the name the page shows: "vegas (BPF)" (cc.display_name)


class TooManyClients(Exception):
    pass


def bufferbloat(srtt_s: float, min_rtt_s: float | None) -> bool:
    """The alert's condition on one sample (without its `for:`)."""
    if not min_rtt_s:
        return False
    return srtt_s - min_rtt_s > BLOAT_QUEUEING_DELAY_S and srtt_s / min_rtt_s > BLOAT_RTT_RATIO


@dataclass
class FlowRing:
    """Recent decimated points of one flow: [t, cwnd, srtt_us, min_rtt_us, kbit/s, retransmits] as JSON text."""

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

    def add(self, sample: tuple, wall: float) -> None:
        """One kept sample, a _POINT tuple: a full decode() per point would cost more than all else."""
        _, closed_ns, acked, received, sk_state, cwnd, srtt_us, min_rtt_us, retrans, ca_name = sample
        total = acked + received
        recent = self.recent
        while len(recent) > 1 and wall - recent[1][0] >= THROUGHPUT_WINDOW_S:
            recent.popleft()
        first = recent[0] if recent else None
        mbps = (total - first[1]) * 8e-6 / (wall - first[0]) if first and wall > first[0] else 0.0
        recent.append((wall, total))
        has_min = min_rtt_us not in (0, 0xFFFFFFFF)
        # integers (µs, kbit/s) format fastest; the page scales them
        self.points.append(f"[{wall:.3f},{cwnd},{srtt_us},{min_rtt_us if has_min else 'null'},"
                           f"{int(mbps * 1000) if mbps > 0 else 0},{retrans}]")
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


class Client:
    """One page's bounded queue of encoded SSE messages."""

    def __init__(self, ident: int) -> None:
        self.ident = ident
        self.queue: deque[bytes] = deque(maxlen=CLIENT_QUEUE)
        self.dropped = 0
        self._unreported = 0
        self._wake = threading.Event()
        self._lock = threading.Lock()

    def put(self, message: bytes) -> bool:
        """Queues a message; False when that pushed the oldest one out."""
        with self._lock:
            full = len(self.queue) == CLIENT_QUEUE
            if full:
                self.dropped += 1
                self._unreported += 1
            self.queue.append(message)
        self._wake.set()
        return not full

    def take(self, timeout: float) -> list[bytes]:
        """Everything queued (waits up to `timeout`), led by a `lag` event when updates were dropped."""
        self._wake.wait(timeout)
        with self._lock:
            self._wake.clear()
            messages = list(self.queue)
            self.queue.clear()
            lost, self._unreported = self._unreported, 0
        if lost:
            messages.insert(0, event("lag", {"dropped": lost, "dropped_total": self.dropped}))
        return messages


def event(name: str, data: object) -> bytes:
    return f"event: {name}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


class Hub:
    """Samples in (any thread), messages out to every client (broadcaster thread)."""

    def __init__(self, *, flow_filter: FlowFilter | None = None, table_source: TableSource | None = None,
                 table_rows: Callable[[tuple[list[FlowRecord], int]], dict] | None = None,
                 on_clients: Callable[[int], None] | None = None, mode: str = "daemon",
                 cc_names: CcNames | None = None) -> None:
        """table_source() gives the kernel map's flows for the table (the shown ones, and how many matched);
        cc_names(), asked every CC_NAMES_INTERVAL_S while a page is open, how to name algorithms (set_cc_names()
        sets them once instead)."""
        self.flow_filter = flow_filter or FlowFilter()
        self.own_listeners: set[tuple[int, int]] = set()  # (netns inode, port) of the page's own listener
        self.mode = mode
        self.table_source = table_source  # replace it with set_table_source() while the hub runs
        self._reading = threading.Lock()  # held while table_source() reads the probe
        self._table_rows = table_rows or (lambda flows: {})
        self.cc_names = cc_names
        self._cc_names: dict[str, str] = {}
        self._cc_names_at = float("-inf")
        self._cc_names_failed = False
        self._planned: list[str] = []  # the scenario's algorithm sets, as the kernel names them
        self.on_clients = on_clients
        self._lock = threading.Lock()
        self._rings: dict[int, FlowRing] = {}
        self._skipped: set[int] = set()  # cookies refused by the filter or for want of a ring (cheap to skip)
        self._skipped_at = time.monotonic()
        self._clients: dict[int, Client] = {}
        self._ids = itertools.count(1)
        self._wall_offset = time.time() - monotonic_ns() / 1e9
        self._table: dict = {}
        self._table_at = 0.0
        self._map_flows: list[FlowRecord] = []
        self._map_total = 0
        self._table_read_at = 0.0
        self._table_every = TABLE_INTERVAL_S
        self.scenario: dict = {}
        self.runs: deque[dict] = deque(maxlen=MAX_RUNS)
        self._run_label: str | None = None
        self._run_t0 = 0.0
        self._run_cookies: list[int] = []
        self._progress_at = 0.0
        self.samples_in = 0
        self.points_kept = 0
        self.updates_dropped = 0
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._broadcast_loop, name="ccscope-live", daemon=True)
        self._thread.start()

    # --- input -------------------------------------------------------------------------------------

    def on_records(self, records: list[bytes]) -> None:
        """One poll's raw ring-buffer records (the daemon's feed)."""
        for data in records:
            self.on_record(data)

    def on_record(self, data: bytes) -> None:
        """A raw ring-buffer record: most are decimated away on the header alone, before any unpacking."""
        cookie, _, last_ns, closed_ns = _HEAD.unpack_from(data)
        if self._wanted(cookie, last_ns, closed_ns):
            self._keep(cookie, _POINT.unpack_from(data), data)

    def on_sample(self, raw) -> None:
        """An unpacked sample (the scenario's recorder has unpacked it already)."""
        if self._wanted(raw.cookie, raw.last_ns, raw.closed_ns):
            self._keep(raw.cookie, _point_of(raw), raw)

    def _wanted(self, cookie: int, last_ns: int, closed_ns: int) -> bool:
        self.samples_in += 1
        ring = self._rings.get(cookie)
        if ring is None:
            return cookie not in self._skipped
        return last_ns - ring.last_ns >= DECIMATE_NS or bool(closed_ns and last_ns >= ring.last_ns)

    def _keep(self, cookie: int, point: tuple, raw) -> None:
        """`raw` (bytes or FlowTuple) is decoded only for a flow's first sample."""
        ring = self._rings.get(cookie)
        last_ns, closed_ns = point[0], point[1]
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
            ring.add(point, last_ns / 1e9 + self._wall_offset)
            if closed_ns and ring.closed is None:
                ring.closed = time.monotonic()
            self.points_kept += 1

    def _skip(self, cookie: int) -> None:
        if len(self._skipped) >= MAX_SKIPPED:
            self._skipped.clear()
        self._skipped.add(cookie)

    def _new_ring(self, flow: FlowRecord, now_ns: int) -> FlowRing | None:
        """A ring for a new flow; when all are taken, the ring of a closed or idle flow makes room, else None."""
        if len(self._rings) >= MAX_FLOWS:
            oldest = min(self._rings.values(), key=lambda r: (r.closed is None, r.last_ns))
            if oldest.closed is None and now_ns - oldest.last_ns < IDLE_NS:
                return None
            del self._rings[oldest.cookie]
        own = (flow.netns, flow.sport) in self.own_listeners or (flow.netns, flow.dport) in self.own_listeners
        ring = FlowRing(flow.cookie, {"id": str(flow.cookie), "flow": flow.name, "netns": flow.netns,
                                      "cc": self.cc_name(flow.cc), "sport": flow.sport, "dport": flow.dport,
                                      "run": self._run_label, "own": own})
        self._rings[flow.cookie] = ring
        if self._run_label is not None:
            self._run_cookies.append(flow.cookie)
        return ring

    def serving_on(self, port: int) -> None:
        """The page's own listener: the connections to it (the pages' streams, in this network namespace) are
        marked `own`, and the page does not pick them as the busiest flows to chart."""
        self.own_listeners.add((os.stat("/proc/self/ns/net").st_ino, port))

    # --- scenario ------------------------------------------------------------------------------------

    def scenario_plan(self, name: str, profiles: list[str], algorithms: list[str], total: int) -> None:
        """`algorithms`: the algorithm sets as the kernel names them (cubic+bbr); the page gets them as it names
        them, again when set_cc_names() tells it more."""
        self._planned = list(algorithms)
        self._scenario_update("plan", {"scenario": name, "profiles": profiles, "total": total,
                                       "algorithms": [self.mix_name(a) for a in algorithms]})

    def scenario_event(self, kind: str, data: dict) -> None:
        """From the scenario's progress: `note`, `run` (one starts), `progress`, `done` (one finished)."""
        if kind == "progress":
            now = time.monotonic()
            if now - self._progress_at < PROGRESS_INTERVAL_S:
                return
            self._progress_at = now
        if kind == "run":
            data = {**data, "t0": round(time.time(), 3), "elapsed_s": 0.0}
            if "algorithm" in data:
                data["algorithm"] = self.mix_name(data["algorithm"])
            self._run_label, self._run_t0, self._run_cookies = data["label"], data["t0"], []
        if kind == "done":
            finished = {**data, "profile": self.scenario.get("profile"), "repetition": self.scenario.get("repetition"),
                        "flows": self._run_curves()}
            with self._lock:
                self.runs.append(finished)
            self._send_all(event("run", finished))
            self._run_label = None
        self._scenario_update(kind, data)

    def scenario_report(self, path: str, url: str) -> None:
        self._scenario_update("report", {"report": path, "report_url": url})

    def _scenario_update(self, phase: str, data: dict) -> None:
        with self._lock:
            self.scenario.update(data)
            self.scenario["phase"] = phase
            message = event("scenario", self.scenario)
        self._send_all(message)

    def _run_curves(self) -> list[dict]:
        """cwnd of the finished run's busy flows (>= 10% of the busiest's bytes), time from the run's start."""
        with self._lock:
            rings = [self._rings[c] for c in self._run_cookies if c in self._rings]
        most = max((r.bytes for r in rings), default=0)
        curves = []
        for ring in rings:
            if not ring.points or ring.bytes < 0.1 * most:
                continue
            points = thin((json.loads(p) for p in ring.points), RUN_CURVE_POINTS)
            curves.append({"cc": self.cc_name(ring.cc), "flow": ring.info["flow"],
                           "t": [round(p[0] - self._run_t0, 3) for p in points], "cwnd": [p[1] for p in points]})
        return curves

    # --- algorithm names -------------------------------------------------------------------------------

    def set_cc_names(self, names: dict[str, str]) -> None:
        """Kernel name -> the name the page shows (a scenario's implementations: `vegas (BPF)` where ccscope's
        BPF program runs, cc.display_name); the flows, the table and the plan follow."""
        self._cc_names = dict(names)
        if self._planned:
            self._scenario_update(self.scenario.get("phase", "plan"),
                                  {"algorithms": [self.mix_name(a) for a in self._planned]})

    def cc_name(self, name: str) -> str:
        return self._cc_names.get(name, name)

    def mix_name(self, label: str) -> str:
        """An algorithm set's label (cubic+vegas) with each name as the page shows it."""
        return "+".join(self.cc_name(name) for name in label.split("+"))

    def _refresh_cc_names(self, now: float) -> None:
        if self.cc_names is None or now - self._cc_names_at < CC_NAMES_INTERVAL_S:
            return
        self._cc_names_at = now
        try:
            self._cc_names = self.cc_names()
        except Exception as exc:  # the names stay as they were; said once
            if not self._cc_names_failed:
                print(f"ccscope: live page: cannot tell which algorithms are ccscope's BPF ones: "
                      f"{type(exc).__name__}: {exc}", file=sys.stderr)
            self._cc_names_failed = True

    def _named(self, source: tuple[list[FlowRecord], int]) -> tuple[list[FlowRecord], int]:
        """The table's flows with the algorithm as the page names it (the records of renamed ones copied)."""
        flows, total = source
        names = self._cc_names
        if not names:
            return source
        return [dataclasses.replace(f, cc=names[f.cc]) if f.cc in names else f for f in flows], total

    # --- clients ---------------------------------------------------------------------------------------

    def connect(self) -> Client:
        self._refresh_cc_names(time.monotonic())  # the first page names the algorithms right from its hello
        with self._lock:
            if len(self._clients) >= MAX_CLIENTS:
                raise TooManyClients(f"{MAX_CLIENTS} live pages are open already")
            client = Client(next(self._ids))
            self._clients[client.ident] = client
            self.connections += 1
            count = len(self._clients)
            client.put(self._hello())
        if self.on_clients:
            self.on_clients(count)
        return client

    def disconnect(self, client: Client) -> None:
        with self._lock:
            self._clients.pop(client.ident, None)
            count = len(self._clients)
        if self.on_clients:
            self.on_clients(count)

    @property
    def client_count(self) -> int:
        return len(self._clients)

    def _hello(self) -> bytes:
        """Everything a page needs when it (re)connects: the rings, the table, the scenario so far."""
        flows = [{**r.refresh_info(self._cc_names), "points": f"[{','.join(r.points)}]"} for r in self._rings.values()]
        body = json.dumps({"mode": self.mode, "push_hz": PUSH_HZ, "ring_points": RING_POINTS,
                           "flows": [{k: v for k, v in f.items() if k != "points"} for f in flows],
                           "table": self._table, "scenario": self.scenario, "runs": list(self.runs),
                           "bloat": {"queueing_delay_s": BLOAT_QUEUEING_DELAY_S, "ratio": BLOAT_RTT_RATIO,
                                     "for_s": BLOAT_FOR_S}}, separators=(",", ":"))
        # the points are JSON text already: spliced in, not decoded and encoded again
        history = ",".join(f'"{f["id"]}":{f["points"]}' for f in flows)
        return f"event: hello\ndata: {body[:-1]},\"history\":{{{history}}}}}\n\n".encode()

    # --- broadcasting ----------------------------------------------------------------------------------

    def _broadcast_loop(self) -> None:
        period = 1.0 / PUSH_HZ
        next_at = time.monotonic()
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += period
            if time.monotonic() > next_at + 1.0:  # fell behind (suspended, overloaded): do not catch up in a burst
                next_at = time.monotonic() + period
            if not self._clients:
                continue
            try:
                self.tick()
            except Exception as exc:  # e.g. a failed map read: the pages go on
                print(f"ccscope: live page: {type(exc).__name__}: {exc}", file=sys.stderr)

    def tick(self) -> None:
        now = time.monotonic()
        slow = now - self._table_at >= TABLE_INTERVAL_S
        if slow:
            self._refresh_cc_names(now)
        with self._lock:
            self._expire(now)
            parts = []
            for ring in self._rings.values():
                new = ring.take_new()
                if new or (slow and ring.wall):
                    info = ""
                    if slow or not ring.sent_info:
                        info = f'"info":{json.dumps(ring.refresh_info(self._cc_names), separators=(",", ":"))},'
                    ring.sent_info = True
                    parts.append(f'"{ring.cookie}":{{{info}"points":[{",".join(new)}]}}')
        if parts:
            self._send_all(f"event: points\ndata: {{{','.join(parts)}}}\n\n".encode())
        if slow:
            self._table_at = now
            if self.table_source:
                self._table = self._table_rows(self._named(self._read_table(now)))
                self._send_all(event("table", self._table))

    def set_table_source(self, source: TableSource | None) -> None:
        """Replaces the table's source; waits for a read in progress, so that after set_table_source(None) nothing
        reads the old source's probe and the probe may close (as FlowCollector.close() waits for a scrape)."""
        with self._reading:
            self.table_source = source

    def _read_table(self, now: float) -> tuple[list[FlowRecord], int]:
        """The kernel map's flows (re-read as often as its cost allows), with the sampled flows' rows replaced by
        their latest sample: the flows being charted stay current even when the map is read rarely."""
        if now - self._table_read_at >= self._table_every:
            with self._reading:
                source = self.table_source  # None once the probe is closing: the table keeps the sampled flows
                self._map_flows, self._map_total = source() if source else ([], 0)
            took = time.monotonic() - now
            self._table_read_at = now
            # reading every flow of a busy host (10k flows: ~0.1 s) must not become the daemon's main work
            self._table_every = max(TABLE_INTERVAL_S, took * TABLE_COST_FACTOR)
        with self._lock:
            latest = [r.latest for r in self._rings.values()
                      if r.latest is not None and (r.closed is None or now - r.closed < CLOSED_ROW_S)]
        fresh = {f.cookie: f for f in (decode(bt.unpack_flow(raw) if isinstance(raw, bytes) else raw)
                                       for raw in latest)}
        flows = [fresh.pop(f.cookie, f) for f in self._map_flows]
        return flows + list(fresh.values()), self._map_total + len(fresh)

    def _expire(self, now: float) -> None:
        if now - self._skipped_at >= SKIPPED_CLEAR_S:
            self._skipped_at = now
            self._skipped.clear()
        for cookie in [c for c, r in self._rings.items() if r.closed is not None and now - r.closed > CLOSED_KEEP_S]:
            del self._rings[cookie]

    def _send_all(self, message: bytes) -> None:
        for client in list(self._clients.values()):
            if not client.put(message):
                self.updates_dropped += 1

    def close(self) -> None:
        """Stops the pushes and says `bye` to the pages (once; later calls do nothing); returns once no table read
        is in progress (also when the broadcaster is still busy after the join's timeout), so the caller may
        close the probe the table source reads. Close the hub before the HTTP server: the server lets streams
        write their last events and the bye before it shuts them down."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=2)
        self.set_table_source(None)
        for client in list(self._clients.values()):
            client.put(event("bye", {}))


def thin(values: Iterable, limit: int) -> list:
    values = list(values)
    if len(values) <= limit:
        return values
    step = len(values) / limit
    return [values[int(i * step)] for i in range(limit)] + [values[-1]]
