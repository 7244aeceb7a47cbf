"""Path profiles: what an emulated link does to packets, per direction.

Semantics
- A PathProfile has two one-way LinkProfiles. `up` is sender -> receiver (the data direction), `down`
  is receiver -> sender (the ACK direction). Every impairment of a direction sits on the router's
  egress of that direction.
- `delay` is one-way, per direction: a flat `delay: 20ms` gives 20 ms each way, so the base RTT is
  up.delay + down.delay = 40 ms.
- `rate` is the bottleneck rate of that direction in bits per second counted at layer 2 (what tbf
  counts: the Ethernet frame without preamble/FCS). TCP goodput over a 1514-byte frame is 1448/1514 of
  it (~95.6 %).
- `jitter` adds a uniform random value in [-jitter, +jitter] to each packet's delay, without
  reordering (a packet never overtakes the one ahead of it).
- `loss` is the probability that a packet is dropped at random, before the bottleneck queue.
- `queue` is the bottleneck queue (drop-tail) in packets ("100p"), bytes ("64KB") or multiples of the
  path's bandwidth-delay product ("1.5bdp", BDP = rate of that direction x base RTT). The default is
  1 BDP, at least 10 packets. It is separate from the delay line: packets in flight on the "wire" never
  count against it.
- `trace` is a Mahimahi packet-delivery trace (one millisecond timestamp per line, each a 1500-byte
  delivery opportunity, looping with the last timestamp as period). It replaces `rate`.
- `isolate` splits the bottleneck into two drop-tail queues that share the rate: an interactive one
  for ping (ICMP) and short flows (TCP/UDP with one of `ports` on either side, by default the scenario
  download port 5300) with its own `queue` (default as for `queue`), served first, and the bulk one
  for everything else with the link's `queue`. `isolate: short` is the defaults; the mapping form is
  `isolate: {queue: 20p, ports: [5300]}`. The interactive class is guaranteed 90 % of the rate, the
  bulk one 10 %, and either may use all of it when the other is idle. It needs a `rate` (not a trace).
- `aqm` names the bottleneck queue's active queue management (aqm.py): `fifo` (drop-tail, the default),
  `codel`, `fq_codel`, `pie`, `fq_pie` or `dualpi2`; `queue` stays its hard limit (without it, the kernel's:
  aqm.DEFAULT_LIMIT_PACKETS). An AQM link's rate and queue run in the delay line, or, under netem where
  the kernel has the qdisc, in the kernel (kernel_aqm.py).
- `ecn` (on the profile, not a direction) is what the endpoints' TCP negotiates: `off`, `on` or `accecn`
  (aqm.ENDPOINT_ECN), set in the scenario's namespaces only.

YAML accepts either `up:`/`down:` sections or flat keys, which apply to both directions. Flat keys
next to `up:`/`down:` are defaults that the sections override.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ccscope import units
from ccscope.errors import UsageError
from ccscope.safe_input import read_text
from ccscope.units import NUMBER, is_number, parse_loss, require_finite

from .aqm import DEFAULT_LIMIT_PACKETS, Aqm, endpoint_ecn

ETH_FRAME = 1514  # bytes of a full-MSS frame as tbf counts it (1500 IP + 14 Ethernet)
MIN_DEFAULT_QUEUE_PACKETS = 10
SHORT_FLOW_PORT = 5300  # the scenario download server's port (scenario.traffic.FETCH_PORT)
MAX_ISOLATE_PORTS = 16
MAX_RATE_BPS = 10e9  # beyond what a veth path through a userspace stage or tbf (32-bit) can emulate
MAX_DELAY_S = 10.0
MAX_QUEUE_PACKETS = 1_000_000
TRACE_OPPORTUNITY_BYTES = 1500
MAX_TRACE_BYTES = 64 << 20  # an hour of a 100 Mbit/s trace is about 30 MB
MAX_TEXT_CHARS = 2000  # a description; it is copied into results.json and the report



def check_text(raw: Any, where: str) -> str:
    """A free-text field such as a description: text of at most MAX_TEXT_CHARS characters."""
    if not isinstance(raw, str):
        raise UsageError(f"{where}: expected text, got {type(raw).__name__} {raw!r}")
    if len(raw) > MAX_TEXT_CHARS:
        raise UsageError(f"{where}: {len(raw)} characters, more than the {MAX_TEXT_CHARS} a description may have")
    return raw


def parse_rate(raw: Any, where: str) -> float | None:
    """A link rate the emulator can shape, in bit/s (None: unlimited)."""
    return units.parse_rate(raw, where, 1e3, MAX_RATE_BPS,
                            too_low="is below {low}, too slow to emulate (write units: 10mbit)",
                            too_high="is above the {high} the emulator can shape")


def parse_delay(raw: Any, where: str) -> float:
    """A one-way delay or jitter the emulator can hold, in seconds."""
    return units.parse_duration(raw, where, 0.0, MAX_DELAY_S, too_high="is longer than {high}, too long to emulate")


@dataclass(frozen=True)
class QueueSize:
    """The bottleneck queue; exactly one of packets, bytes, bdp is set."""

    packets: int | None = None
    bytes: int | None = None
    bdp: float | None = None

    def __post_init__(self) -> None:
        if sum(v is not None for v in (self.packets, self.bytes, self.bdp)) != 1:
            raise UsageError("queue: exactly one of packets, bytes or bdp must be set")

    @classmethod
    def parse(cls, raw: Any, where: str) -> QueueSize:
        """'100p', '100 packets', 100 (packets), '64KB', '1.5bdp', {'packets': 100}."""
        if isinstance(raw, QueueSize):
            return raw
        if is_number(raw):
            return cls._checked(packets=raw, where=where, raw=raw)
        if isinstance(raw, dict):
            if len(raw) != 1 or next(iter(raw)) not in ("packets", "bytes", "bdp"):
                raise UsageError(f"{where}: give exactly one of packets, bytes, bdp (got {sorted(raw)})")
            key, value = next(iter(raw.items()))
            if not is_number(value):
                raise UsageError(f"{where}.{key}: expected a number, got {value!r}")
            return cls._checked(where=f"{where}.{key}", raw=value, **{key: value})
        if not isinstance(raw, str):
            raise UsageError(f"{where}: expected a queue size such as 100p, 64KB or 1bdp, got {raw!r}")
        m = re.fullmatch(r"(-?)" + NUMBER + r"\s*([a-z]*)", raw.strip().lower())
        if not m:
            raise UsageError(f"{where}: {raw!r} is not a queue size (examples: 100p, 100 packets, 64KB, 1.5bdp)")
        value = float(m.group(2)) * (-1 if m.group(1) else 1)
        unit = m.group(3)
        if unit in ("p", "pkt", "pkts", "packet", "packets"):
            return cls._checked(packets=value, where=where, raw=raw)
        if unit == "bdp":
            return cls._checked(bdp=value, where=where, raw=raw)
        if unit and unit in units.BYTES_PER:  # a unitless string is refused below: packets or bytes?
            return cls._checked(bytes=value * units.BYTES_PER[unit], where=where, raw=raw)
        raise UsageError(f"{where}: unknown queue unit {unit!r} in {raw!r} (use p, packets, B, KB, MB or bdp)")

    @classmethod
    def _checked(cls, *, where: str, raw: Any, packets: float | None = None, bytes: float | None = None,
                 bdp: float | None = None) -> QueueSize:
        value = next(v for v in (packets, bytes, bdp) if v is not None)
        require_finite(float(value), raw, where)
        if value <= 0:
            raise UsageError(f"{where}: {raw!r} is not a positive queue size")
        if packets is not None:
            if packets != int(packets):
                raise UsageError(f"{where}: {raw!r} is not a whole number of packets")
            if packets > MAX_QUEUE_PACKETS:
                raise UsageError(f"{where}: {raw!r} is more than {MAX_QUEUE_PACKETS} packets")
            return cls(packets=int(packets))
        if bytes is not None:
            if bytes < ETH_FRAME:
                raise UsageError(f"{where}: {raw!r} is smaller than one {ETH_FRAME}-byte packet")
            if bytes > MAX_QUEUE_PACKETS * ETH_FRAME:
                raise UsageError(f"{where}: {raw!r} is an absurd queue size")
            return cls(bytes=int(bytes))
        assert bdp is not None
        if bdp > 1000:
            raise UsageError(f"{where}: {raw!r} is more than 1000 BDP")
        return cls(bdp=float(bdp))

    def to_bytes(self, bdp_bytes: float) -> int:
        """Queue size in bytes for a link whose BDP is `bdp_bytes` (packets count as full frames)."""
        if self.packets is not None:
            return self.packets * ETH_FRAME
        if self.bytes is not None:
            return self.bytes
        assert self.bdp is not None
        return max(ETH_FRAME, int(self.bdp * bdp_bytes))

    def __str__(self) -> str:
        if self.packets is not None:
            return f"{self.packets}p"
        if self.bytes is not None:
            return f"{self.bytes}B"
        return f"{self.bdp:g}bdp"


def trace_stamps_ms(path: Path) -> list[int]:
    """The delivery opportunities of a Mahimahi trace (checked by _check_trace), in ms."""
    return [int(x) for x in read_text(path, "a Mahimahi trace", MAX_TRACE_BYTES).split()]


def trace_mean_rate_bps(path: Path) -> float:
    """Mean delivery rate of a Mahimahi trace (1500 bytes per opportunity over the looping period)."""
    stamps = trace_stamps_ms(path)
    return len(stamps) * TRACE_OPPORTUNITY_BYTES * 8 / (stamps[-1] / 1000.0)


def _check_trace(raw: Any, where: str) -> Path:
    if not isinstance(raw, str | Path):
        raise UsageError(f"{where}: expected the path of a Mahimahi trace file, got {raw!r}")
    path = Path(raw).expanduser()
    try:
        words = read_text(path, "a Mahimahi trace", MAX_TRACE_BYTES).split()
    except UsageError as exc:
        raise UsageError(f"{where}: {exc.problem}") from None
    try:
        stamps = [int(w) for w in words]
    except ValueError:
        raise UsageError(f"{where}: {path} is not a Mahimahi trace (one integer ms per line)") from None
    if not stamps or stamps[0] < 0 or stamps[-1] <= 0 or any(b < a for a, b in itertools.pairwise(stamps)):
        raise UsageError(f"{where}: {path} needs ascending ms timestamps ending after 0 ms")
    return path.resolve()


@dataclass(frozen=True)
class Isolation:
    """Queue isolation: an interactive class (ICMP, `ports`) with its own queue next to the bulk one."""

    queue: QueueSize | None = None  # None: the default size (1 BDP, at least 10 packets)
    ports: tuple[int, ...] = (SHORT_FLOW_PORT,)

    @classmethod
    def parse(cls, raw: Any, where: str) -> Isolation | None:
        """'short' / true -> the defaults; false / 'none' -> None; {queue: 20p, ports: [5300]}."""
        if raw is None or raw is False or (isinstance(raw, str) and raw.strip().lower() in ("none", "off")):
            return None
        if raw is True or (isinstance(raw, str) and raw.strip().lower() == "short"):
            return cls()
        if isinstance(raw, Isolation):
            return raw
        if not isinstance(raw, dict):
            raise UsageError(f"{where}: expected `short` or a mapping of queue, ports, got {raw!r}")
        for key in raw:
            if key not in ("queue", "ports"):
                raise UsageError(f"{where}.{key}: unknown key (known: queue, ports)")
        queue = QueueSize.parse(raw["queue"], f"{where}.queue") if raw.get("queue") is not None else None
        ports = raw.get("ports", [SHORT_FLOW_PORT])
        if isinstance(ports, int) and not isinstance(ports, bool):
            ports = [ports]
        if not isinstance(ports, list) or not ports:
            raise UsageError(f"{where}.ports: expected a list of port numbers such as [5300], got {ports!r}")
        if len(ports) > MAX_ISOLATE_PORTS:
            raise UsageError(f"{where}.ports: at most {MAX_ISOLATE_PORTS} ports, got {len(ports)}")
        for i, port in enumerate(ports):
            if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
                raise UsageError(f"{where}.ports[{i}]: {port!r} is not a port number (1..65535)")
        if len(set(ports)) != len(ports):
            raise UsageError(f"{where}.ports: {ports!r} lists a port twice")
        return cls(queue=queue, ports=tuple(ports))

    def describe(self) -> str:
        queue = f" queue {self.queue}" if self.queue is not None else ""
        return f"isolate icmp+port {','.join(map(str, self.ports))}{queue}"


def _check_aqm(raw: Any, where: str, rate: float | None, trace: Path | None, isolate: Isolation | None) -> Aqm | None:
    aqm = Aqm.parse(raw, where)
    if aqm is None:
        return None
    if rate is None and trace is None:
        raise UsageError(f"{where}: an AQM manages a bottleneck queue; give a rate")
    if aqm.manages and trace is not None:
        raise UsageError(f"{where}: ccscope's delay line runs an AQM at a rate, not on a trace")
    if aqm.manages and isolate is not None:
        raise UsageError(f"{where}: give either aqm or isolate (isolate's two drop-tail queues are a cure of their "
                         "own)")
    return aqm


_LINK_KEYS = ("rate", "delay", "jitter", "loss", "queue", "trace", "isolate", "aqm")


def _check_flat_keys(flat: dict, where: str) -> None:
    parsers = {
        "rate": parse_rate, "delay": parse_delay, "jitter": parse_delay, "loss": parse_loss,
        "queue": QueueSize.parse, "trace": _check_trace, "isolate": Isolation.parse, "aqm": Aqm.parse,
    }  # fmt: skip
    for key, value in flat.items():
        if key not in parsers:
            raise UsageError(f"{where}.{key}: unknown key (known: up, down, description, ecn, {', '.join(_LINK_KEYS)})")
        if value is not None:
            parsers[key](value, f"{where}.{key}")


@dataclass(frozen=True)
class LinkProfile:
    """One direction of the emulated path (see the module docstring for the semantics)."""

    rate_bps: float | None
    delay_s: float = 0.0
    jitter_s: float = 0.0
    loss: float = 0.0
    queue: QueueSize | None = None
    trace: Path | None = None
    isolate: Isolation | None = None
    aqm: Aqm | None = None  # None: drop-tail, as `fifo`

    def __post_init__(self) -> None:
        if self.trace is not None and self.rate_bps is not None:
            raise UsageError("a link takes either a rate or a trace, not both")

    @classmethod
    def from_dict(cls, data: dict, where: str) -> LinkProfile:
        if not isinstance(data, dict):
            raise UsageError(f"{where}: expected a mapping of {', '.join(_LINK_KEYS)}, got {data!r}")
        for key in data:
            if key not in _LINK_KEYS:
                raise UsageError(f"{where}.{key}: unknown key (known: {', '.join(_LINK_KEYS)})")
        rate = parse_rate(data.get("rate"), f"{where}.rate")
        trace = _check_trace(data["trace"], f"{where}.trace") if data.get("trace") is not None else None
        if rate is not None and trace is not None:
            raise UsageError(f"{where}: give either rate or trace, not both")
        delay = parse_delay(data.get("delay", 0), f"{where}.delay")
        jitter = parse_delay(data.get("jitter", 0), f"{where}.jitter")
        if jitter > 0 and jitter > delay:
            raise UsageError(f"{where}.jitter: {data['jitter']!r} is larger than the delay {data.get('delay')!r}")
        loss = parse_loss(data.get("loss", 0), f"{where}.loss")
        queue = None
        if data.get("queue") is not None:
            if rate is None and trace is None:
                raise UsageError(f"{where}.queue: a queue needs a rate or a trace to drain it")
            queue = QueueSize.parse(data["queue"], f"{where}.queue")
        isolate = Isolation.parse(data.get("isolate"), f"{where}.isolate")
        if isolate is not None and trace is not None:
            raise UsageError(f"{where}.isolate: a trace link has one queue in the delay line; isolate needs a rate")
        if isolate is not None and rate is None:
            raise UsageError(f"{where}.isolate: the queues share a bottleneck rate; give a rate")
        aqm = _check_aqm(data.get("aqm"), f"{where}.aqm", rate, trace, isolate)
        if queue is None and aqm is not None and aqm.name in DEFAULT_LIMIT_PACKETS:
            queue = QueueSize(packets=DEFAULT_LIMIT_PACKETS[aqm.name])
        return cls(rate_bps=rate, delay_s=delay, jitter_s=jitter, loss=loss, queue=queue, trace=trace,
                   isolate=isolate, aqm=aqm)

    @property
    def in_delayline(self) -> bool:
        """The delay line owns this direction's bottleneck (its rate or trace, and its queue)."""
        return self.trace is not None or (self.aqm is not None and self.aqm.manages and not self.aqm.in_kernel)

    def effective_rate_bps(self) -> float | None:
        if self.trace is not None:
            return trace_mean_rate_bps(self.trace)
        return self.rate_bps

    def queue_bytes(self, base_rtt_s: float) -> int | None:
        """Bottleneck queue in bytes (None when the link has no rate)."""
        rate = self.effective_rate_bps()
        if rate is None:
            return None
        bdp = rate * base_rtt_s / 8
        return _queue_bytes(self.queue, bdp)

    def isolate_queue_bytes(self, base_rtt_s: float) -> int | None:
        """The interactive class's queue in bytes (None without isolation)."""
        rate = self.effective_rate_bps()
        if self.isolate is None or rate is None:
            return None
        return _queue_bytes(self.isolate.queue, rate * base_rtt_s / 8)

    def describe(self) -> str:
        parts = []
        if self.rate_bps is not None:
            parts.append(f"{self.rate_bps / 1e6:g} Mbit/s")
        if self.trace is not None:
            parts.append(f"trace {self.trace.name}")
        parts.append(f"{self.delay_s * 1e3:g} ms")
        if self.jitter_s:
            parts.append(f"±{self.jitter_s * 1e3:g} ms")
        if self.loss:
            parts.append(f"{self.loss * 100:g}% loss")
        if self.queue is not None:
            parts.append(f"queue {self.queue}")
        if self.isolate is not None:
            parts.append(self.isolate.describe())
        if self.aqm is not None and self.aqm.manages:
            parts.append(self.aqm.describe())
        return ", ".join(parts)


def _queue_bytes(queue: QueueSize | None, bdp_bytes: float) -> int:
    if queue is None:
        return max(MIN_DEFAULT_QUEUE_PACKETS * ETH_FRAME, int(bdp_bytes))
    return queue.to_bytes(bdp_bytes)


@dataclass(frozen=True)
class PathProfile:
    name: str
    up: LinkProfile  # sender -> receiver (data)
    down: LinkProfile  # receiver -> sender (ACKs)
    ecn: str | None = None  # the endpoints' net.ipv4.tcp_ecn mode (aqm.ENDPOINT_ECN); None: the kernel's default

    @classmethod
    def from_dict(cls, name: str, data: dict, where: str) -> PathProfile:
        if not isinstance(data, dict):
            raise UsageError(f"{where}: expected a mapping (rate, delay, ... or up:/down:), got {data!r}")
        check_text(data.get("description", ""), f"{where}.description")
        flat = {k: v for k, v in data.items() if k not in ("up", "down", "description", "ecn")}
        ecn = endpoint_ecn(data.get("ecn"), f"{where}.ecn")
        _check_flat_keys(flat, where)  # errors in flat keys name the key where it was written
        links = {}
        for direction in ("up", "down"):
            section = data.get(direction, {})
            if section is None:
                section = {}
            if not isinstance(section, dict):
                raise UsageError(f"{where}.{direction}: expected a mapping, got {section!r}")
            merged = {**flat, **section}
            links[direction] = LinkProfile.from_dict(merged, f"{where}.{direction}")
        return cls(name=name, up=links["up"], down=links["down"], ecn=ecn)

    @property
    def base_rtt_s(self) -> float:
        return self.up.delay_s + self.down.delay_s

    @property
    def bdp_bytes(self) -> float:
        """Bandwidth-delay product of the data direction (0 when it has no rate)."""
        rate = self.up.effective_rate_bps()
        return 0.0 if rate is None else rate * self.base_rtt_s / 8

    def describe(self) -> str:
        return f"{self.name}: up {self.up.describe()}; down {self.down.describe()}"
