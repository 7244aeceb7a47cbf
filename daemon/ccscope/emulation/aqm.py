"""Active queue management at an emulated bottleneck: which AQM manages the queue, with what parameters.

A link profile's `aqm` names one: `aqm: codel`, or a mapping with its parameters,
`aqm: {name: codel, target: 5ms, interval: 100ms, ecn: true}`. `fifo` is today's drop-tail queue (the
default). With `ecn: true` CoDel marks ECN-capable packets (CE) where it would drop them, as the kernel's
codel does with its `ecn` flag (off by default there too); it still drops what cannot carry a mark.
`queue` stays the bottleneck's hard limit: the AQM drops before it is full, the limit drops at it.

Where it runs: ccscope's userspace delay line (delayline.c) owns the bottleneck of an AQM link, its rate
and queue, on either backend (as for a trace). It runs CoDel (RFC 8289) as the kernel's codel_impl.h does,
dropping or marking, and fq_codel (RFC 8290) as sch_fq_codel.c does: 1024 flow queues by 5-tuple, each
with its own CoDel, served by deficit round robin (a quantum of 1514 bytes), new flows first; ECN marking
on by default, as the kernel's. The other AQMs the field uses are named here so that a scenario that asks
for one gets one clear line, not "unknown key"; they are not in the delay line yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ccscope.errors import UsageError
from ccscope.units import format_seconds, parse_duration

KNOWN = ("fifo", "codel", "fq_codel", "pie", "fq_pie", "cake", "dualpi2")
IN_DELAYLINE = ("fifo", "codel", "fq_codel")
# RFC 8289 section 4.2-4.3 and the kernel's defaults (codel_params_init): 5 ms target, 100 ms interval.
CODEL_TARGET_S = 0.005
CODEL_INTERVAL_S = 0.100
_PARAMETERS = {"codel": ("target", "interval", "ecn"), "fq_codel": ("target", "interval", "ecn")}
# Whether each marks by default, as the kernel's (codel: off; fq_codel: `ecn` on).
_ECN_DEFAULT = {"codel": False, "fq_codel": True}
# The hard limit without `queue`, as the kernel's: sch_codel 1000 packets, sch_fq_codel 10240.
DEFAULT_LIMIT_PACKETS = {"codel": 1000, "fq_codel": 10240}


@dataclass(frozen=True)
class Aqm:
    name: str
    target_s: float | None = None  # CoDel: the acceptable standing queue (sojourn time)
    interval_s: float | None = None  # CoDel: how long the queue may stay above target (about a worst RTT)
    ecn: bool = False  # marks ECN-capable packets instead of dropping them

    @classmethod
    def parse(cls, raw: Any, where: str) -> Aqm | None:
        """'codel', {name: codel, target: 5ms, interval: 100ms}; None for null."""
        if raw is None:
            return None
        data = {"name": raw} if isinstance(raw, str) else raw
        if not isinstance(data, dict):
            raise UsageError(f"{where}: expected an AQM's name ({', '.join(KNOWN)}) or a mapping with `name`, "
                             f"got {raw!r}")
        name = _name(data.get("name"), where)
        allowed = _PARAMETERS.get(name, ())
        for key in data:
            if key != "name" and key not in allowed:
                known = ", ".join(("name", *allowed))
                raise UsageError(f"{where}.{key}: unknown key for {name} (known: {known})")
        if name not in _PARAMETERS:
            return cls(name)
        target = parse_duration(data.get("target", CODEL_TARGET_S), f"{where}.target", 1e-4, 1.0)
        interval = parse_duration(data.get("interval", CODEL_INTERVAL_S), f"{where}.interval", 1e-3, 10.0)
        if target >= interval:
            raise UsageError(f"{where}.target: {format_seconds(target)} is not below the interval "
                             f"{format_seconds(interval)} (RFC 8289: 5 % to 10 % of it)")
        ecn = data.get("ecn", _ECN_DEFAULT[name])
        if not isinstance(ecn, bool):
            raise UsageError(f"{where}.ecn: expected true or false, got {ecn!r}")
        return cls(name, target, interval, ecn)

    @property
    def manages(self) -> bool:
        """Anything but drop-tail: the delay line owns the bottleneck."""
        return self.name != "fifo"

    def delayline_args(self) -> list[str]:
        args = ["--aqm", self.name]
        if self.name in _PARAMETERS:
            assert self.target_s is not None and self.interval_s is not None
            args += ["--target-us", str(round(self.target_s * 1e6)), "--interval-us", str(round(self.interval_s * 1e6))]
        return [*args, "--ecn"] if self.ecn else args

    def describe(self) -> str:
        if self.name in _PARAMETERS:
            assert self.target_s is not None and self.interval_s is not None
            marks = " ecn" if self.ecn else ""
            target, interval = format_seconds(self.target_s), format_seconds(self.interval_s)
            return f"{self.name} target {target} interval {interval}{marks}"
        return self.name

    def as_dict(self, implementation: str) -> dict:
        """results.json's record of it: the name, its parameters, and which implementation ran it
        ("kernel": a qdisc; "ccscope": the delay line)."""
        return {"name": self.name, "target_s": self.target_s, "interval_s": self.interval_s, "ecn": self.ecn,
                "implementation": implementation}


# `ecn:` on a profile: what the sender's and receiver's TCP ask for and accept (net.ipv4.tcp_ecn, set in the
# scenario's namespaces only). off: never; on: RFC 3168 ECN; accecn: Accurate ECN (RFC 9768), which counts
# CE marks exactly. Without the key the namespaces keep the kernel's default (2: accept, never ask).
ENDPOINT_ECN = {"off": 0, "on": 1, "accecn": 3}


def endpoint_ecn(raw: Any, where: str) -> str | None:
    if raw is None:
        return None
    if raw is False:
        return "off"
    if raw is True:
        return "on"
    if not isinstance(raw, str) or raw not in ENDPOINT_ECN:
        raise UsageError(f"{where}: {raw!r} is not an ECN mode (known: {', '.join(ENDPOINT_ECN)})")
    return raw


def _name(raw: Any, where: str) -> str:
    if not isinstance(raw, str) or raw not in KNOWN:
        raise UsageError(f"{where}: {raw!r} is not an AQM (known: {', '.join(KNOWN)})")
    if raw not in IN_DELAYLINE:
        raise UsageError(f"{where}: {raw} is not in ccscope's delay line yet; it runs {', '.join(IN_DELAYLINE)}")
    return raw
