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
on by default, as the kernel's. PIE (RFC 8033) and DualPI2 (RFC 9332) decide as sch_pie.c and
sch_dualpi2.c (pi.c): PIE drops (or, with `ecn`, marks while its probability is at most 10 %) at enqueue
with a probability its PI controller updates every `tupdate` from the queue delay (fq_pie: fq_codel's flow
queues and round robin, with a PIE of its own per flow, as sch_fq_pie.c); DualPI2 puts ECT(1) and CE
packets (`ecn_mask: l4s_ect`; `any_ect` adds ECT(0), as the kernel's option does) in an L queue marked at
`coupling` x p and, past `step` of sojourn, always, and the rest in a C queue
dropped or marked at p^2, the L queue served first but for 10 % of the link kept for C.

Where the kernel has the qdisc and the netem backend runs, the kernel's own runs instead, under the shaper
(kernel_aqm.py): `implementation: auto` (the default) picks it there and ccscope's elsewhere; `kernel` or
`ccscope` insists on one (the lab compares the two this way). `cake` is the kernel's alone.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ccscope.errors import UsageError
from ccscope.units import format_seconds, parse_duration

KNOWN = ("fifo", "codel", "fq_codel", "pie", "fq_pie", "cake", "dualpi2")
IN_DELAYLINE = ("fifo", "codel", "fq_codel", "pie", "fq_pie", "dualpi2")
# What the netem backend can put under its shaper where the kernel has the qdisc (kernel_aqm.py); dualpi2 is
# in mainline since 6.17 and often left out (Debian's 7.2 has none; the kernel lab builds it).
IN_KERNEL = ("codel", "fq_codel", "pie", "fq_pie", "cake", "dualpi2")
IMPLEMENTATIONS = ("auto", "kernel", "ccscope")
# Each AQM's parameters and the kernel's defaults (codel_params_init: RFC 8289 section 4.2-4.3; sch_pie.c:
# RFC 8033's; sch_dualpi2.c: RFC 9332's target with a 16 ms update and a 1 ms L step), and whether it marks
# by default (codel and pie: off; fq_codel: `ecn` on; dualpi2 always marks, its L queue is ECN by definition).
DEFAULTS: dict[str, dict[str, Any]] = {
    "codel": {"target": 0.005, "interval": 0.100, "ecn": False},
    "fq_codel": {"target": 0.005, "interval": 0.100, "ecn": True},
    "pie": {"target": 0.015, "tupdate": 0.015, "ecn": False},
    "fq_pie": {"target": 0.015, "tupdate": 0.015, "ecn": False},  # sch_fq_pie.c: pie's, per flow queue
    "dualpi2": {"target": 0.015, "tupdate": 0.016, "step": 0.001, "coupling": 2.0, "ecn_mask": "l4s_ect"},
    "cake": {},  # the kernel's defaults: diffserv3 triple-isolate rtt 100ms
    "fifo": {},
}
# DualPI2's classifier (sch_dualpi2.c's TCA_DUALPI2_ECN_MASK): the L queue takes packets whose ECN field
# shares a bit with the mask. any_ect lets a scalable sender that can only send ECT(0) (the kernel's dctcp;
# ccscope's prague gets ECT(1) from Testbed.send_ect1) reach the L queue; it also takes classic ECN flows
# there, so it is for labs.
ECN_MASKS = {"l4s_ect": 1, "cla_ect": 2, "any_ect": 3}
# The hard limit without `queue`, as the kernel's: sch_codel and sch_pie 1000 packets, sch_fq_codel and
# sch_fq_pie 10240, sch_dualpi2 10000 (both queues).
DEFAULT_LIMIT_PACKETS = {"codel": 1000, "fq_codel": 10240, "pie": 1000, "fq_pie": 10240, "dualpi2": 10000}
# A duration parameter's allowed range in seconds.
_RANGES = {"target": (1e-4, 1.0), "interval": (1e-3, 10.0), "tupdate": (1e-3, 1.0), "step": (0.0, 1.0)}


@dataclass(frozen=True)
class Aqm:
    name: str
    target_s: float | None = None  # the acceptable standing queue (sojourn time)
    interval_s: float | None = None  # CoDel: how long the queue may stay above target (about a worst RTT)
    ecn: bool = False  # marks ECN-capable packets instead of dropping them
    tupdate_s: float | None = None  # PIE, DualPI2: how often the PI controller updates its probability
    step_s: float | None = None  # DualPI2: the L queue's sojourn past which every packet is marked
    coupling: float | None = None  # DualPI2: k, the L queue's marking k p against the C queue's p^2
    ecn_mask: str | None = None  # DualPI2: which ECN codepoints go to the L queue (ECN_MASKS)
    implementation: str = "auto"  # kernel: the kernel's qdisc; ccscope: the delay line; auto: resolved per run

    @classmethod
    def parse(cls, raw: Any, where: str) -> Aqm | None:
        """'codel', {name: codel, target: 5ms, interval: 100ms}; None for null."""
        if raw is None:
            return None
        data = {"name": raw} if isinstance(raw, str) else raw
        if not isinstance(data, dict):
            raise UsageError(f"{where}: expected an AQM's name ({', '.join(KNOWN)}) or a mapping with `name`, "
                             f"got {raw!r}")
        if "name" not in data:
            raise UsageError(f"{where}: the mapping needs `name`, the AQM ({', '.join(KNOWN)})")
        name = _name(data["name"], where)
        defaults = DEFAULTS.get(name, {})
        keys = ("name", *defaults, *(("implementation",) if name != "fifo" else ()))
        for key in data:
            if key not in keys:
                raise UsageError(f"{where}.{key}: unknown key for {name} (known: {', '.join(keys)})")
        implementation = _implementation(name, data.get("implementation", "auto"), f"{where}.implementation")
        if not defaults:
            return cls(name, implementation=implementation)
        values = {key: _parameter(key, data.get(key, default), f"{where}.{key}") for key, default in defaults.items()}
        if "interval" in values and values["target"] >= values["interval"]:
            raise UsageError(f"{where}.target: {format_seconds(values['target'])} is not below the interval "
                             f"{format_seconds(values['interval'])} (RFC 8289: 5 % to 10 % of it)")
        return cls(name, values["target"], values.get("interval"), values.get("ecn", name == "dualpi2"),
                   values.get("tupdate"), values.get("step"), values.get("coupling"), values.get("ecn_mask"),
                   implementation)

    @property
    def manages(self) -> bool:
        """Anything but drop-tail."""
        return self.name != "fifo"

    @property
    def in_kernel(self) -> bool:
        """The kernel's qdisc runs it (resolved: kernel_aqm.resolve); otherwise the delay line owns the bottleneck."""
        return self.implementation == "kernel"

    def _durations(self) -> dict[str, float]:
        """Its duration parameters that apply, by name (the delay line's and tc's)."""
        named = {"target": self.target_s, "interval": self.interval_s, "tupdate": self.tupdate_s, "step": self.step_s}
        return {key: value for key, value in named.items() if value is not None}

    def delayline_args(self) -> list[str]:
        args = ["--aqm", self.name]
        for key, value in self._durations().items():
            args += [f"--{key}-us", str(round(value * 1e6))]
        if self.coupling is not None:
            args += ["--coupling", repr(self.coupling)]
        if self.ecn_mask is not None:
            args += ["--ecn-mask", str(ECN_MASKS[self.ecn_mask])]
        return [*args, "--ecn"] if self.ecn and self.name != "dualpi2" else args

    def describe(self) -> str:
        words = [self.name, *(f"{key} {format_seconds(value)}" for key, value in self._durations().items())]
        if self.coupling is not None:
            words.append(f"coupling {self.coupling:g}")
        if self.ecn_mask not in (None, "l4s_ect"):
            words.append(self.ecn_mask)
        if self.ecn and self.name != "dualpi2":
            words.append("ecn")
        return " ".join(words)

    def as_dict(self) -> dict:
        """results.json's record of it: the name, its parameters, and which implementation ran it
        ("kernel": a qdisc; "ccscope": the delay line; "auto" where nothing ran yet)."""
        extra = {key: value for key, value in (("tupdate_s", self.tupdate_s), ("step_s", self.step_s),
                                               ("coupling", self.coupling), ("ecn_mask", self.ecn_mask))
                 if value is not None}
        return {"name": self.name, "target_s": self.target_s, "interval_s": self.interval_s, "ecn": self.ecn,
                **extra, "implementation": self.implementation}


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


def _parameter(key: str, raw: Any, where: str) -> float | bool | str:
    if key == "ecn":
        if not isinstance(raw, bool):
            raise UsageError(f"{where}: expected true or false, got {raw!r}")
        return raw
    if key == "ecn_mask":
        if raw not in ECN_MASKS:
            raise UsageError(f"{where}: {raw!r} is not a DualPI2 classifier (known: {', '.join(ECN_MASKS)})")
        return raw
    if key == "coupling":
        if isinstance(raw, bool) or not isinstance(raw, int | float) or not 1 <= raw <= 16:
            raise UsageError(f"{where}: expected a number from 1 to 16 (RFC 9332: 2), got {raw!r}")
        return float(raw)
    return parse_duration(raw, where, *_RANGES[key])


def _name(raw: Any, where: str) -> str:
    if not isinstance(raw, str) or raw not in KNOWN:
        raise UsageError(f"{where}: {raw!r} is not an AQM (known: {', '.join(KNOWN)})")
    return raw


KERNEL_ONLY = ("cake: the kernel's sch_cake alone (Linux 4.19 and later; Debian's and Ubuntu's stock kernels "
               "have it), under the netem backend")


def _implementation(name: str, raw: Any, where: str) -> str:
    if raw not in IMPLEMENTATIONS:
        raise UsageError(f"{where}: {raw!r} is not an implementation (known: {', '.join(IMPLEMENTATIONS)})")
    if raw == "ccscope" and name not in IN_DELAYLINE:
        raise UsageError(f"{where}: ccscope's delay line has no {name} ({KERNEL_ONLY}); it runs "
                         f"{', '.join(IN_DELAYLINE)}")
    return raw
