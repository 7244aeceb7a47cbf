"""The flow table: decoded per-flow records, filters, top-N selection and closed-flow expiry."""

from __future__ import annotations

import functools
import ipaddress
import operator
import socket
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from . import bpf_types as bt
from .errors import UsageError

CA_STATES = ("open", "disorder", "cwr", "recovery", "loss")
TCP_STATES = {
    1: "established", 2: "syn-sent", 3: "syn-recv", 4: "fin-wait1", 5: "fin-wait2", 6: "time-wait",
    7: "close", 8: "close-wait", 9: "last-ack", 10: "listen", 11: "closing", 12: "new-syn-recv",
}
INFINITE_SSTHRESH = 0x7FFFFFFF
UNLIMITED_PACING = (1 << 64) - 1


def monotonic_ns() -> int:
    """Same clock as bpf_ktime_get_ns()."""
    return time.clock_gettime_ns(time.CLOCK_MONOTONIC)


@dataclass(slots=True, unsafe_hash=True)
class FlowRecord:
    """One flow as users see it: addresses decoded, units converted to base units.

    Treated as immutable (hashable by value); not frozen because frozen construction is slower and
    decode() runs per trace sample and per flow per scrape.
    """

    cookie: int
    netns: int
    family: str
    src: str
    sport: int
    dst: str
    dport: int
    cc: str
    ca_state: str
    state: str
    cwnd_segments: int
    ssthresh_segments: int | None  # None while infinite (slow start never left)
    srtt_s: float
    rttvar_s: float
    min_rtt_s: float | None
    mss_bytes: int
    packets_in_flight: int
    bytes_acked: int
    bytes_sent: int
    bytes_received: int
    retransmits: int
    lost_packets: int
    pacing_rate_Bps: float | None
    delivery_rate_Bps: float
    first_ns: int
    last_ns: int
    closed_ns: int
    event: int = 0
    tgid: int = 0       # process that connected, or listened for an accepted flow; 0 if unknown
    comm: str = ""      # its name then
    cgroup_id: int = 0  # cgroup v2 id of the socket; 0 if unknown

    @property
    def bytes_total(self) -> int:
        return self.bytes_acked + self.bytes_received

    @property
    def queueing_delay_s(self) -> float:
        return max(0.0, self.srtt_s - self.min_rtt_s) if self.min_rtt_s is not None else 0.0

    @property
    def name(self) -> str:
        return f"{_hostport(self.src, self.sport)}->{_hostport(self.dst, self.dport)}"

    def as_dict(self) -> dict:
        data = dict(zip(_RECORD_FIELDS, _record_values(self), strict=True))
        data["flow"] = self.name
        data["queueing_delay_s"] = self.queueing_delay_s
        return data


_RECORD_FIELDS = tuple(FlowRecord.__dataclass_fields__)
_record_values = operator.attrgetter(*_RECORD_FIELDS)  # one C call for all fields: as_dict() runs per trace sample


def _hostport(addr: str, port: int) -> str:
    return f"[{addr}]:{port}" if ":" in addr else f"{addr}:{port}"


_V4_MAPPED = bytes(10) + b"\xff\xff"


@functools.lru_cache(maxsize=65536)
def _address(family: int, raw: bytes) -> str:
    # inet_ntop and a cache, not ipaddress: decode() runs for every flow at every scrape (10k flows) and for every
    # trace sample, and ipaddress made it ~10 us per flow. Same text: RFC 5952 form, v4-mapped shown as IPv4.
    if family == socket.AF_INET6:
        if raw[:12] == _V4_MAPPED:
            return socket.inet_ntop(socket.AF_INET, raw[12:16])
        if raw[:12] == bytes(12):  # glibc writes ::/96 as "::a.b.c.d"; keep ipaddress's text there
            return str(ipaddress.IPv6Address(raw))
        return socket.inet_ntop(socket.AF_INET6, raw)
    return socket.inet_ntop(socket.AF_INET, raw[:4])


def decode(flow: bt.Flow | bt.FlowTuple) -> FlowRecord:
    if isinstance(flow, bt.Flow):  # one struct unpack beats ~35 ctypes attribute reads
        flow = bt.unpack_flow(bytes(flow))
    family = socket.AF_INET6 if flow.family == socket.AF_INET6 else socket.AF_INET
    delivery = 0.0
    if flow.rate_delivered and flow.rate_interval_us:
        # tcp_get_info(): rate_delivered * mss * USEC_PER_SEC / rate_interval_us
        delivery = flow.rate_delivered * flow.mss_cache * 1e6 / flow.rate_interval_us
    in_flight = flow.packets_out - flow.sacked_out - flow.lost_out + flow.retrans_out
    return FlowRecord(
        cookie=flow.cookie,
        netns=flow.netns,
        family="ipv6" if family == socket.AF_INET6 else "ipv4",
        src=_address(family, flow.saddr),
        sport=flow.sport,
        dst=_address(family, flow.daddr),
        dport=flow.dport,
        cc=flow.ca_name.split(b"\0", 1)[0].decode(errors="replace") or "unknown",
        ca_state=CA_STATES[flow.ca_state] if flow.ca_state < len(CA_STATES) else str(flow.ca_state),
        state=TCP_STATES.get(flow.sk_state, str(flow.sk_state)),
        cwnd_segments=flow.snd_cwnd,
        ssthresh_segments=None if flow.snd_ssthresh >= INFINITE_SSTHRESH else flow.snd_ssthresh,
        srtt_s=flow.srtt_us / 1e6,
        rttvar_s=flow.rttvar_us / 1e6,
        min_rtt_s=None if flow.min_rtt_us in (0, 0xFFFFFFFF) else flow.min_rtt_us / 1e6,
        mss_bytes=flow.mss_cache,
        packets_in_flight=max(0, in_flight),
        bytes_acked=flow.bytes_acked,
        bytes_sent=flow.bytes_sent,
        bytes_received=flow.bytes_received,
        retransmits=flow.total_retrans,
        lost_packets=flow.lost,
        pacing_rate_Bps=None if flow.pacing_rate >= UNLIMITED_PACING >> 1 else float(flow.pacing_rate),
        delivery_rate_Bps=delivery,
        first_ns=flow.first_ns,
        last_ns=flow.last_ns,
        closed_ns=flow.closed_ns,
        event=flow.event,
        tgid=flow.tgid,
        comm=_comm(flow.comm),
        cgroup_id=flow.cgroup_id,
    )


@functools.lru_cache(maxsize=4096)
def _comm(raw: bytes) -> str:
    return raw.split(b"\0", 1)[0].decode(errors="replace")


@dataclass
class FlowFilter:
    """Which flows get per-flow series and trace output. Empty sets match everything."""

    netns: set[int] = field(default_factory=set)
    ports: set[int] = field(default_factory=set)
    cidrs: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = field(default_factory=list)
    comms: set[str] = field(default_factory=set)
    cgroups: list[str] = field(default_factory=list)  # path prefixes, matched on whole components
    cgroup_path: Callable[[int], str | None] | None = None  # cgroup id -> path; needed with `cgroups`

    def matches(self, flow: FlowRecord) -> bool:
        if self.netns and flow.netns not in self.netns:
            return False
        if self.comms and flow.comm not in self.comms:
            return False
        if self.cgroups and not self._in_cgroups(flow.cgroup_id):
            return False
        if self.ports and flow.sport not in self.ports and flow.dport not in self.ports:
            return False
        if self.cidrs:
            addrs = (ipaddress.ip_address(flow.src), ipaddress.ip_address(flow.dst))
            return any(a.version == n.version and a in n for a in addrs for n in self.cidrs)
        return True

    def _in_cgroups(self, cgroup_id: int) -> bool:
        path = self.cgroup_path(cgroup_id) if self.cgroup_path and cgroup_id else None
        return path is not None and any(path == p or path.startswith(p.rstrip("/") + "/") for p in self.cgroups)

    @classmethod
    def parse(cls, netns: Iterable[str] = (), ports: Iterable[str] = (), cidrs: Iterable[str] = (),
              comms: Iterable[str] = (), cgroups: Iterable[str] = ()) -> FlowFilter:
        return cls(
            netns={_parse_int("--netns", v, 1, 2**32 - 1) for v in netns},
            ports={_parse_int("--port", v, 1, 65535) for v in ports},
            cidrs=[_parse_cidr(v) for v in cidrs],
            comms={_parse_comm(v) for v in comms},
            cgroups=[_parse_cgroup(v) for v in cgroups],
        )


def _parse_int(flag: str, value: str, low: int, high: int) -> int:
    try:
        number = int(value, 0)
    except ValueError:
        raise UsageError(f"{flag} {value!r} is not a number") from None
    if not low <= number <= high:
        raise UsageError(f"{flag} {value} is out of range {low}..{high}")
    return number


def _parse_comm(value: str) -> str:
    if not value or len(value.encode()) > bt.COMM_LEN - 1:
        raise UsageError(f"--comm {value!r} is not a process name (1..{bt.COMM_LEN - 1} bytes, as in ps -o comm)")
    return value


def _parse_cgroup(value: str) -> str:
    if not value.startswith("/"):
        raise UsageError(f"--cgroup {value!r} is not a cgroup path like /system.slice or /kubepods.slice")
    return value


def _parse_cidr(value: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network:
    try:
        return ipaddress.ip_network(value, strict=False)
    except ValueError:
        raise UsageError(f"--cidr {value!r} is not an address or network like 10.0.0.0/8 or fd00::/8") from None


@dataclass(frozen=True)
class FlowSelection:
    """--flows top:N | all | none."""

    mode: str  # "top", "all", "none"
    limit: int = 0

    @classmethod
    def parse(cls, text: str) -> FlowSelection:
        if text in ("all", "none"):
            return cls(text)
        if text.startswith("top:"):
            return cls("top", _parse_int("--flows top:N", text[4:], 1, 100_000))
        raise UsageError(f"--flows {text!r} is not one of top:N, all, none")

    def pick(self, flows: list[FlowRecord]) -> list[FlowRecord]:
        if self.mode == "none":
            return []
        if self.mode == "all":
            return flows
        return sorted(flows, key=lambda f: f.bytes_total, reverse=True)[: self.limit]


@dataclass
class TableStats:
    tracked: int = 0
    expired_total: int = 0   # closed flows removed by us after the grace period
    evictions_total: int = 0  # flows the kernel's LRU map pushed out to make room


class FlowTable:
    """Reads the kernel flow map; removes closed flows once their grace period has passed."""

    def __init__(self, probe, grace_s: float = 10.0) -> None:
        self.probe = probe
        self.grace_ns = int(grace_s * 1e9)
        self.stats = TableStats()
        self._lock = threading.Lock()

    def snapshot(self) -> list[FlowRecord]:
        """Open flows and closed flows still within their grace period."""
        with self._lock:
            now = monotonic_ns()
            flows = []
            for raw in self.probe.read_flows():
                if raw.closed_ns and now - raw.closed_ns > self.grace_ns:
                    self.probe.delete_flow(raw.cookie)
                    self.stats.expired_total += 1
                    continue
                flows.append(decode(raw))
            self.stats.tracked = len(flows)
            created = self.probe.counters()[bt.Counter.FLOWS_CREATED]
            self.stats.evictions_total = max(0, created - self.stats.expired_total - len(flows))
            return flows
