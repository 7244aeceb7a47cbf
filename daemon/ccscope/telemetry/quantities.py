"""Every per-flow quantity, described once: what the kernel calls it, and what each output calls it.

The Prometheus collector (exporter.py), the OTLP push (otlp.py), a flow's sample and the check of one from
another host (sample.py), the scenario's flow CSV (scenario/recorder.py) and the live page's points
(live/rings.py) are all derived from QUANTITIES, so a new quantity of FlowRecord is one entry here. Each
algorithm's own state has its table in its decoder (ccstate/NAME.py: StateMetric), which the same outputs read.

The outputs are derived from the table when their modules are first imported (a flow's sample is a class made
from it), so a table extended before that is the table every output uses: tests/test_quantities.py adds a
quantity so and finds it in each.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from ccscope.flows import CA_STATES, ECN_CODEPOINTS

ECN_VALUES = {"off": 0, "ecn": 1, "accecn": 2}

Check = Callable[[object], bool]


def int_below(limit: int, optional: bool = False) -> Check:
    """An integer in [0, limit), or None where optional: a kernel counter's range."""
    def ok(v: object) -> bool:
        return (optional and v is None) or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < limit)
    return ok


def seconds(optional: bool = False) -> Check:
    # the kernel keeps RTTs in u32 microseconds: at most 4295 s
    def ok(v: object) -> bool:
        return (optional and v is None) or (number(v) and 0 <= v < 4295.0)
    return ok


def number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def word(v: object) -> bool:
    return isinstance(v, str) and 0 < len(v) <= 16 and v.isascii() and v.replace("_", "").isalnum()


@dataclass(frozen=True, slots=True)
class Otlp:
    """The OpenTelemetry instrument a quantity is pushed as. Quantities with one instrument name are one
    instrument, told apart by their attributes (bytes sent and received: system.network.tcp.io)."""

    name: str
    unit: str  # UCUM
    description: str
    attributes: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Column:
    """A column of the scenario's per-flow CSV: the value times `scale`, with `digits` after the point (None:
    as it is), empty where the value is None."""

    name: str
    scale: float = 1.0
    digits: int | None = None

    def cell(self, value: object) -> object:
        if value is None:
            return ""
        return value if self.digits is None else f"{value * self.scale:.{self.digits}f}"


@dataclass(frozen=True, slots=True)
class Live:
    """A value of the live page's points: struct flow's integer field as the kernel keeps it (one unpack of a few
    fields is what keeps the page's path cheap), null where it is one of `absent`; the page divides it by
    `divisor` for its charts."""

    kernel: str
    divisor: float = 1.0
    absent: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class Quantity:
    """One per-flow quantity: FlowRecord's attribute `name`, and its name in each output (None: not in it)."""

    name: str                    # FlowRecord's attribute, a sample's field
    kind: str                    # "gauge" or "counter"
    help: str                    # what it is (Prometheus's help)
    prometheus: str | None       # the family's name (a counter's, without _total)
    otlp: Otlp | None
    column: Column | None = None  # the scenario's flow CSV (a sample's field then)
    check: Check | None = None   # a sample's field: its check when another host sends it (ccscope serve)
    python_type: str = "int"     # a sample's field: its type
    live: Live | None = None
    value: Callable[[object], object] | None = None  # the exported number of a FlowRecord; None: the attribute
    windowed: bool = False       # a rate the recorder computes over a window of samples, not a FlowRecord's

    @property
    def sampled(self) -> bool:
        """Carried by a flow's sample (sample.Sample), so by serve's rows too."""
        return self.check is not None

    def number(self, flow: object) -> object:
        """The value Prometheus and OTLP get (None leaves the flow's sample out)."""
        return self.value(flow) if self.value is not None else getattr(flow, self.name)


def _ca_state_number(flow) -> int | None:
    return CA_STATES.index(flow.ca_state) if flow.ca_state in CA_STATES else None


def _queueing_delay(flow) -> float | None:
    return flow.queueing_delay_s if flow.min_rtt_s is not None else None


_UNSET_RTT = (0, 0xFFFFFFFF)

# In the order of a flow's sample (the rows `ccscope serve` sends are in this order) and of the CSV's columns.
QUANTITIES: tuple[Quantity, ...] = (
    Quantity("cwnd_segments", "gauge", "Congestion window (snd_cwnd) in segments.", "ccscope_flow_cwnd_segments",
             Otlp("system.network.tcp.congestion_window", "{segment}", "Congestion window (snd_cwnd)."),
             Column("cwnd_segments"), int_below(1 << 32), live=Live("snd_cwnd")),
    Quantity("srtt_s", "gauge", "Smoothed round-trip time.", "ccscope_flow_srtt_seconds",
             Otlp("system.network.tcp.rtt", "s", "Smoothed round-trip time (srtt)."),
             Column("srtt_ms", 1e3, 3), seconds(), "float", Live("srtt_us", 1e3)),
    Quantity("retransmits", "counter", "Retransmitted segments (tcpi_total_retrans).", "ccscope_flow_retransmits",
             Otlp("system.network.tcp.retransmits", "{segment}", "Retransmitted segments (tcpi_total_retrans)."),
             Column("retransmits"), int_below(1 << 32), live=Live("total_retrans")),
    Quantity("throughput_bps", "gauge", "Goodput in bit/s: bytes_acked's rate over the last 200 ms (flent's window).",
             None, None, Column("throughput_mbps", 1e-6, 4), windowed=True),
    Quantity("bytes_acked", "counter", "Bytes acknowledged by the peer.", "ccscope_flow_bytes_acked",
             Otlp("system.network.tcp.acked", "By", "Bytes acknowledged by the peer."),
             Column("bytes_acked"), int_below(1 << 63)),  # int64: export's columns
    Quantity("bytes_sent", "counter", "Bytes sent, retransmissions included.", "ccscope_flow_bytes_sent",
             Otlp("system.network.tcp.io", "By", "Bytes sent (retransmissions included) and received.",
                  (("network.io.direction", "transmit"),)),
             Column("bytes_sent"), int_below(1 << 63)),
    Quantity("ssthresh_segments", "gauge", "Slow-start threshold in segments; absent while still infinite.",
             "ccscope_flow_ssthresh_segments",
             Otlp("system.network.tcp.slow_start_threshold", "{segment}", "Slow-start threshold."),
             Column("ssthresh_segments"), int_below(1 << 32, optional=True), "int | None"),
    Quantity("min_rtt_s", "gauge", "Minimum RTT seen by the kernel's windowed filter.", "ccscope_flow_min_rtt_seconds",
             Otlp("system.network.tcp.rtt.min", "s", "Minimum RTT of the kernel's windowed filter."),
             Column("min_rtt_ms", 1e3, 3), seconds(optional=True), "float | None", Live("min_rtt_us", 1e3, _UNSET_RTT)),
    Quantity("packets_in_flight", "gauge", "Segments in flight (tcp_packets_in_flight).",
             "ccscope_flow_packets_in_flight",
             Otlp("system.network.tcp.packets_in_flight", "{packet}", "Segments in flight."),
             Column("packets_in_flight"), int_below(1 << 32)),
    Quantity("delivery_rate_Bps", "gauge", "Most recent delivery rate sample.",
             "ccscope_flow_delivery_rate_bytes_per_second",
             Otlp("system.network.tcp.delivery_rate", "By/s", "Most recent delivery rate sample."),
             Column("delivery_rate_mbps", 8e-6, 4), lambda v: number(v) and 0 <= v < 2.0 ** 64, "float"),
    Quantity("ca_state", "gauge", "Congestion-avoidance state: 0 open, 1 disorder, 2 cwr, 3 recovery, 4 loss.",
             "ccscope_flow_ca_state",
             Otlp("system.network.tcp.congestion_state", "{state}",
                  "Congestion-avoidance state: 0 open, 1 disorder, 2 cwr, 3 recovery, 4 loss."),
             Column("ca_state"), word, "str", value=_ca_state_number),
    Quantity("cc", "gauge", "The congestion control's name.", None, None, Column("cc"), word, "str"),
    Quantity("event", "gauge", "What sent the sample (the probe's event).", None, None,
             Column("event"), int_below(256)),
    Quantity("mss_bytes", "gauge", "Current sending MSS.", "ccscope_flow_mss_bytes",
             Otlp("system.network.tcp.mss", "By", "Current sending MSS."), None, int_below(1 << 16)),
    Quantity("delivered_packets", "counter", "Packets delivered to the peer (tcpi_delivered).",
             "ccscope_flow_delivered_packets",
             Otlp("system.network.tcp.delivered", "{packet}", "Packets delivered to the peer."),
             Column("delivered_packets"), int_below(1 << 32)),
    Quantity("delivered_ce_packets", "counter", "Packets delivered with a CE mark as the peer fed it back "
             "(tcpi_delivered_ce; with classic ECN, every packet an ECE-flagged ACK covers).",
             "ccscope_flow_delivered_ce_packets",
             Otlp("ccscope.tcp.flow.delivered_ce", "{packet}",
                  "Packets delivered with a CE mark, as the peer fed it back."),
             Column("delivered_ce_packets"), int_below(1 << 32)),
    # not in a sample
    Quantity("rttvar_s", "gauge", "Round-trip time variation (mdev, as in TCP_INFO).", "ccscope_flow_rttvar_seconds",
             Otlp("system.network.tcp.rtt.variation", "s", "Round-trip time variation (mdev).")),
    Quantity("queueing_delay_s", "gauge", "srtt minus min_rtt: delay added by queues on the path.",
             "ccscope_flow_queueing_delay_seconds",
             Otlp("system.network.tcp.queueing_delay", "s", "srtt minus min_rtt."), value=_queueing_delay),
    Quantity("pacing_rate_Bps", "gauge", "Socket pacing rate; absent when unlimited.",
             "ccscope_flow_pacing_rate_bytes_per_second",
             Otlp("system.network.tcp.pacing_rate", "By/s", "Socket pacing rate.")),
    Quantity("bytes_received", "counter", "Bytes received.", "ccscope_flow_bytes_received",
             Otlp("system.network.tcp.io", "By", "Bytes sent (retransmissions included) and received.",
                  (("network.io.direction", "receive"),))),
    Quantity("spurious_retransmits", "counter", "Retransmitted segments the peer reported it already had (DSACK, "
             "tcpi_dsack_dups): a timeout or a recovery that the path's delay or reordering made needless.",
             "ccscope_flow_spurious_retransmits",
             Otlp("ccscope.tcp.flow.spurious_retransmits", "{segment}",
                  "Retransmitted segments the peer already had (DSACK, tcpi_dsack_dups).")),
    Quantity("lost_packets", "counter", "Packets marked lost, retransmissions included.", "ccscope_flow_lost_packets",
             Otlp("system.network.tcp.lost", "{packet}", "Packets marked lost, retransmissions included.")),
    Quantity("ecn", "gauge", "ECN the handshake negotiated: 0 off, 1 classic (RFC 3168), 2 AccECN; absent while "
             "pending.", "ccscope_flow_ecn",
             Otlp("ccscope.tcp.flow.ecn", "1", "ECN negotiated: 0 off, 1 classic (RFC 3168), 2 AccECN."),
             value=lambda flow: ECN_VALUES.get(flow.ecn)),
    Quantity("ecn_codepoint", "gauge", "ECN codepoint of the socket's last segment, as the IP header carries it: "
             "0 Not-ECT, 1 ECT(1) (L4S's identifier, RFC 9331), 2 ECT(0).", "ccscope_flow_ecn_codepoint",
             Otlp("ccscope.tcp.flow.ecn_codepoint", "1",
                  "ECN codepoint of the socket's last segment: 0 Not-ECT, 1 ECT(1) (L4S), 2 ECT(0)."),
             value=lambda flow: ECN_CODEPOINTS.index(flow.ecn_codepoint)),
)


def exported() -> list[Quantity]:
    """The quantities with a Prometheus family, in the table's order."""
    return [q for q in QUANTITIES if q.prometheus]


def sampled() -> list[Quantity]:
    """A flow sample's fields after its time, in order."""
    return [q for q in QUANTITIES if q.sampled]


def charted() -> list[Quantity]:
    """The live page's per-point values, in order."""
    return [q for q in QUANTITIES if q.live]
