"""The flow table: decoded per-flow records, filters, top-N selection and closed-flow expiry."""

from __future__ import annotations

import functools
import ipaddress
import itertools
import operator
import socket
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from . import bpf_types as bt
from .attribution import Attribution, Attributor
from .errors import UsageError
from .flowscan import FlowColumns
from .units import format_bytes, format_rate

CA_STATES = ("open", "disorder", "cwr", "recovery", "loss")
TCP_STATES = {
    1: "established", 2: "syn-sent", 3: "syn-recv", 4: "fin-wait1", 5: "fin-wait2", 6: "time-wait",
    7: "close", 8: "close-wait", 9: "last-ack", 10: "listen", 11: "closing", 12: "new-syn-recv",
}
# tp->ecn_flags' mode bits (include/net/tcp.h): bit 0 alone is classic ECN (RFC 3168; TCP_ECN_OK before 6.18),
# bit 4 alone AccECN, both while a handshake that asked for AccECN is pending
ECN_MODES = {0x00: "off", 0x01: "ecn", 0x10: "accecn", 0x11: "pending"}
ECN_MODE_BITS = 0x11
# the IP header's two ECN bits (RFC 3168, RFC 9331), by value: what the socket marks its segments with
ECN_CODEPOINTS = ("not-ect", "ect1", "ect0", "ce")
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
    delivered_packets: int = 0     # tcpi_delivered
    delivered_ce_packets: int = 0  # tcpi_delivered_ce: delivered with a CE mark, as the peer fed back
    ecn: str = "off"               # negotiated: ECN_MODES' values
    ecn_codepoint: str = "not-ect"  # ECN_CODEPOINTS': on the socket's last segment; ect1 is L4S's identifier
    spurious_retransmits: int = 0  # tcpi_dsack_dups: retransmitted segments the peer already had (DSACK)

    @property
    def bytes_total(self) -> int:
        return self.bytes_acked + self.bytes_received

    @property
    def queueing_delay_s(self) -> float:
        return queueing_delay_s(self.srtt_s, self.min_rtt_s)

    @property
    def name(self) -> str:
        return flow_name(self.src, self.sport, self.dst, self.dport)

    def as_dict(self) -> dict:
        return with_derived(dict(zip(_RECORD_FIELDS, _record_values(self), strict=True)))


_RECORD_FIELDS = tuple(FlowRecord.__dataclass_fields__)
_record_values = operator.attrgetter(*_RECORD_FIELDS)  # one C call for all fields


def queueing_delay_s(srtt_s: float, min_rtt_s: float | None) -> float:
    return max(0.0, srtt_s - min_rtt_s) if min_rtt_s is not None else 0.0


def flow_name(src: str, sport: int, dst: str, dport: int) -> str:
    return f"{_hostport(src, sport)}->{_hostport(dst, dport)}"


def with_derived(fields: dict) -> dict:
    """FlowRecord's fields (record_fields() or as_dict()) with the values its properties add: as_dict()'s keys."""
    fields["flow"] = flow_name(fields["src"], fields["sport"], fields["dst"], fields["dport"])
    fields["queueing_delay_s"] = queueing_delay_s(fields["srtt_s"], fields["min_rtt_s"])
    return fields


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
    return FlowRecord(**record_fields(flow))


class RecordField(NamedTuple):
    """How one of FlowRecord's fields comes from struct flow: `kernel`, a Python expression over struct flow's
    fields (bt.FlowTuple's names) and the names in RECORD_NAMESPACE. `per_flow`: fixed for the flow's life (given
    the values of the kernel fields it reads), so `ccscope trace` encodes it once per flow (tracejson.py)."""

    name: str
    kernel: str
    per_flow: bool = False


# FlowRecord's fields in its order, each from the kernel once: record_fields() and the trace's encoder are compiled
# from this table, so a field's conversion is written here and nowhere else.
RECORD_FIELDS: tuple[RecordField, ...] = (
    RecordField("cookie", "cookie", True),
    RecordField("netns", "netns", True),
    RecordField("family", "'ipv6' if family == AF_INET6 else 'ipv4'", True),
    RecordField("src", "_address(family, saddr)", True),  # any family but AF_INET6 is read as IPv4
    RecordField("sport", "sport", True),
    RecordField("dst", "_address(family, daddr)", True),
    RecordField("dport", "dport", True),
    RecordField("cc", "_text(ca_name) or 'unknown'", True),  # per flow given ca_name: a switch is a new key
    RecordField("ca_state", "CA_STATES[ca_state] if ca_state < len(CA_STATES) else str(ca_state)"),
    RecordField("state", "TCP_STATES.get(sk_state) or str(sk_state)"),
    RecordField("cwnd_segments", "snd_cwnd"),
    RecordField("ssthresh_segments", "None if snd_ssthresh >= INFINITE_SSTHRESH else snd_ssthresh"),
    RecordField("srtt_s", "srtt_us / 1e6"),
    RecordField("rttvar_s", "rttvar_us / 1e6"),
    RecordField("min_rtt_s", "None if min_rtt_us in (0, 0xFFFFFFFF) else min_rtt_us / 1e6"),
    RecordField("mss_bytes", "mss_cache"),
    RecordField("packets_in_flight", "max(0, packets_out - sacked_out - lost_out + retrans_out)"),
    RecordField("bytes_acked", "bytes_acked"),
    RecordField("bytes_sent", "bytes_sent"),
    RecordField("bytes_received", "bytes_received"),
    RecordField("retransmits", "total_retrans"),
    RecordField("lost_packets", "lost"),
    RecordField("pacing_rate_Bps", "None if pacing_rate >= UNLIMITED_PACING >> 1 else float(pacing_rate)"),
    # tcp_get_info(): rate_delivered * mss * USEC_PER_SEC / rate_interval_us
    RecordField("delivery_rate_Bps",
                "rate_delivered * mss_cache * 1e6 / rate_interval_us if rate_delivered and rate_interval_us else 0.0"),
    RecordField("first_ns", "first_ns", True),
    RecordField("last_ns", "last_ns"),
    RecordField("closed_ns", "closed_ns"),
    RecordField("event", "event"),
    RecordField("tgid", "tgid", True),
    RecordField("comm", "_text(comm)", True),
    RecordField("cgroup_id", "cgroup_id", True),
    RecordField("delivered_packets", "delivered"),
    RecordField("delivered_ce_packets", "delivered_ce"),
    RecordField("ecn", "ECN_MODES[ecn_flags & ECN_MODE_BITS]"),
    RecordField("ecn_codepoint", "ECN_CODEPOINTS[ecn_codepoint & 3]"),
    RecordField("spurious_retransmits", "dsack_dups"),
)


def compile_record(fields: Sequence[RecordField], function: str, *, extra: Sequence[tuple[str, str]] = (),
                   arguments: Sequence[str] = (), result: str = "{entries}",
                   names: Mapping[str, object] | None = None) -> Callable[..., Any]:
    """A function of one struct flow (bt.FlowTuple, or a plain tuple of its fields) returning {field.name: value}: one
    tuple unpack into locals and one dict display, the fastest shape in CPython (~40 namedtuple attribute reads cost
    more than all the conversions). Compiled from the table as namedtuple and dataclasses compile theirs.

    `extra`: more entries (name, expression), whose expressions read a field's value as r_NAME; `arguments` after
    the record; `result`: what is returned, around the dict display ({entries}); `names`: what the expressions
    read besides RECORD_NAMESPACE."""
    lines = [f"def {function}(flow{''.join(', ' + a for a in arguments)}):",
             f"    ({', '.join(bt.FlowTuple._fields)},) = flow"]
    lines += [f"    r_{f.name} = {f.kernel}" for f in fields]
    entries = [f"{f.name!r}: r_{f.name}" for f in fields] + [f"{name!r}: {expression}" for name, expression in extra]
    lines.append("    return " + result.format(entries="{" + ", ".join(entries) + "}"))
    namespace = {**RECORD_NAMESPACE, **(names or {})}
    clash = set(bt.FlowTuple._fields) & {"flow", *arguments, *namespace, *(f"r_{f.name}" for f in fields)}
    if clash:  # a struct flow field would shadow (or be shadowed by) a name the expressions read
        raise ValueError(f"{function}: struct flow's fields {sorted(clash)} clash with the compiled code's names")
    exec(compile("\n".join(lines) + "\n", f"<ccscope.flows {function}>", "exec"), namespace)
    return namespace[function]


def record_fields(flow: bt.Flow | bt.FlowTuple) -> dict:
    """FlowRecord's fields of one kernel record, in its order and units: decode() builds the record from them,
    `ccscope trace --json` writes them as they are (no record in between: it runs per sample)."""
    if isinstance(flow, bt.Flow):  # one struct unpack beats ~35 ctypes attribute reads
        flow = bt.unpack_flow(bytes(flow))
    return _record_fields(flow)


@functools.lru_cache(maxsize=4096)
def _text(raw: bytes) -> str:
    """A NUL-padded kernel string (ca_name, comm): a few distinct values, decoded once each."""
    return raw.split(b"\0", 1)[0].decode(errors="replace")


RECORD_NAMESPACE = {
    "AF_INET6": socket.AF_INET6, "CA_STATES": CA_STATES, "TCP_STATES": TCP_STATES, "ECN_MODES": ECN_MODES,
    "ECN_MODE_BITS": ECN_MODE_BITS, "ECN_CODEPOINTS": ECN_CODEPOINTS, "INFINITE_SSTHRESH": INFINITE_SSTHRESH,
    "UNLIMITED_PACING": UNLIMITED_PACING,
    "_address": _address, "_text": _text,
}
_record_fields = compile_record(RECORD_FIELDS, "record_fields")


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
        if not self.matches_ids(flow):
            return False
        if self.comms and flow.comm not in self.comms:
            return False
        if self.cgroups and not self._in_cgroups(flow.cgroup_id):
            return False
        if self.cidrs:
            addrs = (ipaddress.ip_address(flow.src), ipaddress.ip_address(flow.dst))
            return any(a.version == n.version and a in n for a in addrs for n in self.cidrs)
        return True

    @property
    def beyond_ids(self) -> bool:
        """Whether matches() asks more than matches_ids() does (then a raw record must be decoded to decide)."""
        return bool(self.cidrs or self.comms or self.cgroups)

    def matches_ids(self, flow: FlowRecord | bt.FlowTuple) -> bool:
        """The netns and port conditions alone: they hold for a raw record as for its decoded FlowRecord."""
        if self.netns and flow.netns not in self.netns:
            return False
        return not self.ports or flow.sport in self.ports or flow.dport in self.ports

    def select(self, columns: FlowColumns, indexes: Sequence[int]) -> Sequence[int]:
        """The indexes of the flows that match, reading columns (records are decoded for --cidr only)."""
        if self.netns:
            netns = columns.column("netns")
            indexes = [i for i in indexes if netns[i] in self.netns]
        if self.ports:
            sport, dport = columns.column("sport"), columns.column("dport")
            indexes = [i for i in indexes if sport[i] in self.ports or dport[i] in self.ports]
        if self.comms:
            comms = columns.text_keys("comm")
            wanted = {key for key in set(comms) if columns.text(key) in self.comms}  # per distinct name
            indexes = [i for i in indexes if comms[i] in wanted]
        if self.cgroups:
            cgroups = columns.column("cgroup_id")
            inside = set(filter(self._in_cgroups, set(cgroups)))  # a path lookup per distinct cgroup, not per flow
            indexes = [i for i in indexes if cgroups[i] in inside]
        if self.cidrs:
            indexes = [i for i in indexes if self.matches(decode(columns.record(i)))]
        return indexes

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

    def pick_indexes(self, columns: FlowColumns, indexes: Sequence[int]) -> Sequence[int]:
        """pick() on columns: the top N by bytes (acked + received) without decoding the others."""
        if self.mode == "none":
            return []
        if self.mode == "all":
            return indexes
        totals = list(map(operator.add, columns.column("bytes_acked"), columns.column("bytes_received")))
        if not isinstance(indexes, range):
            totals = list(map(totals.__getitem__, indexes))
        # positions at or above the N-th largest total, found with C calls (sorted, compress, map) rather than a
        # Python loop over 100k flows; a stable sort of those few keeps the map order among ties, as pick() does
        candidates = range(len(totals))
        if len(totals) > self.limit:
            threshold = sorted(totals, reverse=True)[self.limit - 1]
            candidates = itertools.compress(candidates, map(threshold.__le__, totals))
        ranked = sorted(candidates, key=totals.__getitem__, reverse=True)
        return [indexes[j] for j in ranked[: self.limit]]


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
        """Open flows and closed flows still within their grace period, decoded."""
        columns, shown = self.scan()
        return [decode(columns.record(i)) for i in shown]

    def scan(self) -> tuple[FlowColumns, Sequence[int]]:
        """Every tracked flow's record, and the indexes of the open ones and of the closed ones still within
        their grace period; the others are removed from the kernel map."""
        with self._lock:
            cutoff = monotonic_ns() - self.grace_ns
            columns = self.probe.read_flow_columns()
            closed = columns.column("closed_ns")
            # closed flows are few: find them with C-level calls, then look at those alone
            expired = [i for i in itertools.compress(range(len(closed)), closed) if closed[i] < cutoff]
            shown: Sequence[int] = range(len(columns))
            if expired:
                cookies = columns.column("cookie")
                for i in expired:
                    self.probe.delete_flow(cookies[i])
                shown = list(itertools.filterfalse(set(expired).__contains__, shown))
                self.stats.expired_total += len(expired)
            self.stats.tracked = len(shown)
            created = self.probe.counters()[bt.Counter.FLOWS_CREATED]
            self.stats.evictions_total = max(0, created - self.stats.expired_total - len(shown))
            return columns, shown


# --- the columns of `ccscope flows` (also the live page's table) ------------------------------------------


def _rate_cell(bytes_per_s: float | None) -> str:
    return "-" if bytes_per_s is None else format_rate(bytes_per_s * 8, cell=True)


class Column(NamedTuple):
    title: str
    spec: str                                   # format spec of the text table
    text: Callable[[FlowRecord], str]
    key: Callable[[FlowRecord], float | str]    # what the live page sorts by


FLOW_COLUMNS: tuple[Column, ...] = (
    Column("FLOW", "<44", lambda f: f.name, lambda f: f.name),
    Column("NETNS", ">10", lambda f: str(f.netns), lambda f: f.netns),
    Column("CC", "<7", lambda f: f.cc, lambda f: f.cc),
    Column("STATE", "<9", lambda f: f.ca_state, lambda f: f.ca_state),
    Column("CWND", ">6", lambda f: str(f.cwnd_segments), lambda f: f.cwnd_segments),
    Column("SSTHR", ">6", lambda f: "-" if f.ssthresh_segments is None else str(f.ssthresh_segments),
           lambda f: -1 if f.ssthresh_segments is None else f.ssthresh_segments),
    Column("SRTT", ">8", lambda f: f"{f.srtt_s * 1e3:.2f}ms", lambda f: f.srtt_s),
    Column("MINRTT", ">8", lambda f: "-" if f.min_rtt_s is None else f"{f.min_rtt_s * 1e3:.2f}ms",
           lambda f: -1 if f.min_rtt_s is None else f.min_rtt_s),
    Column("DELIVERY", ">9", lambda f: _rate_cell(f.delivery_rate_Bps), lambda f: f.delivery_rate_Bps),
    Column("PACING", ">9", lambda f: _rate_cell(f.pacing_rate_Bps),
           lambda f: -1 if f.pacing_rate_Bps is None else f.pacing_rate_Bps),
    Column("BYTES", ">7", lambda f: format_bytes(f.bytes_total, cell=True), lambda f: f.bytes_total),
    Column("RETRANS", ">7", lambda f: str(f.retransmits), lambda f: f.retransmits),
)


UNKNOWN = "-"  # the text of an attribution column where the flow's process or cgroup is not known


def _fit(text: str, width: int) -> str:
    """Long cgroup paths keep their informative end."""
    return text if len(text) <= width else "…" + text[-(width - 1):]


def _workload(attribution: Attribution) -> str:
    if attribution.pod:
        return _fit(f"{attribution.namespace}/{attribution.pod}", 36)
    return _fit(attribution.cgroup, 36) if attribution.cgroup else UNKNOWN


def attribution_columns(attributor: Attributor | None) -> tuple[Column, ...]:
    """The columns `ccscope flows` and the live page's table add to FLOW_COLUMNS: the process, and the pod or
    else the cgroup (UNKNOWN without a cgroup resolver)."""

    def workload(flow: FlowRecord) -> str:
        return _workload(attributor(flow.cgroup_id)) if attributor else UNKNOWN

    return (Column("COMM", "<15", lambda f: f.comm or UNKNOWN, lambda f: f.comm),
            Column("CGROUP/POD", "<36", workload, workload))
