"""The kernel's own AQM qdiscs at an emulated bottleneck: where they run, how they are set up, what they count.

Under the netem backend, a link whose AQM the kernel has (aqm.IN_KERNEL: sch_codel, sch_fq_codel, sch_pie,
sch_fq_pie, sch_cake, sch_dualpi2) gets the kernel's qdisc as the shaper's child, in place of the drop-tail queue:
netem 1: (delay, jitter, loss) -> tbf 2: (rate) -> the AQM 3:, so the AQM sees the bottleneck queue alone, as
the delay line's does. One difference stays: tbf peeks its child as soon as the packet before has left, and
for these AQMs a peek is their dequeue, so the kernel's AQM decides (and takes the sojourn) up to one packet's
time before the packet's own tokens are there, where the delay line decides when the wire is free: 6 ms
earlier at 2 Mbit/s, 0.12 ms at 100 Mbit/s.

`resolve` decides per link, once per run: `implementation: auto` becomes `kernel` where this holds and
`ccscope` (the delay line) elsewhere; an explicit `kernel` that cannot run is one line.

The qdiscs' netlink options and counters (include/uapi/linux/pkt_sched.h) are registered here as pyroute2
plugins: pyroute2 0.9 has no pie, fq_pie or dualpi2, and its codel and fq_codel log a warning per parameter.
"""

from __future__ import annotations

import math
from dataclasses import replace

from pyroute2 import IPRoute
from pyroute2.netlink import NLA_F_NESTED, nla
from pyroute2.netlink.rtnl import TC_H_ROOT, tcmsg
from pyroute2.netlink.rtnl.tcmsg.common import stats2 as _stats2

from ccscope.errors import PrerequisiteError

from .aqm import ECN_MASKS, IN_DELAYLINE, IN_KERNEL, Aqm
from .profile import ETH_FRAME, LinkProfile, PathProfile

AQM_HANDLE = 0x30000  # the shaper's child, where the drop-tail queue is otherwise
# The counters each qdisc keeps beside its drops (TCA_STATS_APP), in their uapi order.
_XSTATS = {
    "codel": ("maxpacket", "count", "lastcount", "ldelay", "drop_next", "drop_overlimit", "ecn_mark", "dropping",
              "ce_mark"),
    "fq_codel": ("type", "maxpacket", "drop_overlimit", "ecn_mark", "new_flow_count", "new_flows_len",
                 "old_flows_len", "ce_mark", "memory_usage", "drop_overmemory"),
    "pie": ("prob_lo", "prob_hi", "delay", "avg_dq_rate", "dq_rate_estimating", "packets_in", "dropped",
            "overlimit", "maxq", "ecn_mark"),
    "fq_pie": ("packets_in", "dropped", "overlimit", "overmemory", "ecn_mark", "new_flow_count", "new_flows_len",
               "old_flows_len", "memory_usage"),
    "dualpi2": ("prob", "delay_c", "delay_l", "packets_in_c", "packets_in_l", "maxq", "ecn_mark", "step_marks",
                "credit", "memory_used", "max_memory_used", "memory_limit"),
}
# The netlink attributes of each, TCA_<KIND>_* in uapi order after UNSPEC (u32 but dualpi2's from COUPLING on).
_OPTIONS = {
    "codel": ("TARGET", "LIMIT", "INTERVAL", "ECN", "CE_THRESHOLD"),
    "fq_codel": ("TARGET", "LIMIT", "INTERVAL", "ECN", "FLOWS", "QUANTUM", "CE_THRESHOLD", "DROP_BATCH_SIZE",
                 "MEMORY_LIMIT"),
    "pie": ("TARGET", "LIMIT", "TUPDATE", "ALPHA", "BETA", "ECN", "BYTEMODE", "DQ_RATE_ESTIMATOR"),
    "fq_pie": ("LIMIT", "FLOWS", "TARGET", "TUPDATE", "ALPHA", "BETA", "QUANTUM", "MEMORY_LIMIT", "ECN_PROB", "ECN",
               "BYTEMODE", "DQ_RATE_ESTIMATOR"),
    "dualpi2": ("LIMIT", "MEMORY_LIMIT", "TARGET", "TUPDATE", "ALPHA", "BETA", "STEP_THRESH_PKTS", "STEP_THRESH_US",
                "MIN_QLEN_STEP", "COUPLING", "DROP_OVERLOAD", "DROP_EARLY", "C_PROTECTION", "ECN_MASK", "SPLIT_GSO"),
}
_U8 = {"dualpi2": ("COUPLING", "DROP_OVERLOAD", "DROP_EARLY", "C_PROTECTION", "ECN_MASK", "SPLIT_GSO")}
# Tail drops, which the hard limit makes and the AQM does not decide: kept apart from its own drops (dualpi2
# counts them as the qdisc's overlimits).
_TAIL = {"codel": ("drop_overlimit",), "fq_codel": ("drop_overlimit", "drop_overmemory"),
         "pie": ("overlimit",), "fq_pie": ("overlimit", "overmemory")}


class _Plugin:
    """A pyroute2 tcmsg plugin: parameters in, options and counters out."""

    parent = TC_H_ROOT

    def __init__(self, kind: str) -> None:
        prefix = f"TCA_{kind.upper()}_"
        self.kind = kind
        # NLA_F_NESTED on TCA_OPTIONS, as iproute2's tc sets it: qdiscs that parse their options strictly
        # (sch_dualpi2) refuse them without it (EINVAL), the older ones do not look
        self.options = type(f"{kind}_options", (nla,), {
            "nla_flags": NLA_F_NESTED,
            "nla_map": tuple((prefix + name, "uint8" if name in _U8.get(kind, ()) else "uint32")
                             for name in ("UNSPEC", *_OPTIONS[kind]))})
        xstats = type(f"{kind}_xstats", (nla,), {"fields": tuple((name, "i" if name == "credit" else "I")
                                                                 for name in _XSTATS[kind])})
        self.stats2 = type(f"{kind}_stats2", (_stats2,), {"stats_app": xstats})
        self.stats = xstats

    def get_parameters(self, kwarg: dict) -> dict:
        prefix = f"TCA_{self.kind.upper()}_"
        return {"attrs": [[prefix + name.upper(), kwarg[name]] for name in (n.lower() for n in _OPTIONS[self.kind])
                          if name in kwarg]}


for _kind in _OPTIONS:
    tcmsg.plugins[_kind] = _Plugin(_kind)


def resolve(profile: PathProfile, backend: str, qdiscs: frozenset[str]) -> PathProfile:
    """The profile with each AQM's implementation made concrete for this backend and kernel."""
    links = {}
    for direction in ("up", "down"):
        link: LinkProfile = getattr(profile, direction)
        aqm = link.aqm
        if aqm is None or not aqm.manages or aqm.implementation == "ccscope":
            links[direction] = link
            continue
        if backend == "netem" and _kernel_takes(aqm) and aqm.name in qdiscs:
            links[direction] = replace(link, aqm=replace(aqm, implementation="kernel"))
        elif aqm.implementation == "kernel" or aqm.name not in IN_DELAYLINE:
            raise PrerequisiteError(f"profiles.{profile.name}.{direction}.aqm: the kernel's {aqm.name} "
                                    f"{_why_not(aqm, backend, qdiscs)}")
        else:
            links[direction] = replace(link, aqm=replace(aqm, implementation="ccscope"))
    return replace(profile, up=links["up"], down=links["down"])


def _kernel_takes(aqm: Aqm) -> bool:
    """The kernel's qdisc can do what is asked: dualpi2's coupling is a whole number there (a u8)."""
    return aqm.name in IN_KERNEL and (aqm.coupling is None or float(aqm.coupling).is_integer())


def _why_not(aqm: Aqm, backend: str, qdiscs: frozenset[str]) -> str:
    if not _kernel_takes(aqm):
        return f"takes a whole coupling only, not {aqm.coupling:g}"
    if aqm.name not in qdiscs:
        return (f"is not in this kernel (sch_{aqm.name}; Debian's and Ubuntu's stock kernels have it, and "
                f"tools/kernel-lab --kernel 7.2 boots one)")
    return f"runs under the netem backend only (this run: {backend})"


def limit_packets(link: LinkProfile, base_rtt_s: float) -> int:
    """The hard limit in packets: `queue` in packets, or in bytes over full-sized frames."""
    if link.queue is not None and link.queue.packets is not None:
        return link.queue.packets
    queue_bytes = link.queue_bytes(base_rtt_s)
    assert queue_bytes is not None
    return max(1, math.ceil(queue_bytes / ETH_FRAME))


def apply(ipr: IPRoute, ifindex: int, link: LinkProfile, base_rtt_s: float, parent: int) -> str:
    """Puts the kernel's AQM qdisc under the shaper (`parent`, tbf's class); returns its description."""
    aqm = link.aqm
    assert aqm is not None and aqm.in_kernel
    limit = limit_packets(link, base_rtt_s)
    params: dict = {"limit": limit}
    if aqm.target_s is not None:
        params["target"] = round(aqm.target_s * 1e6)
    if aqm.interval_s is not None:
        params["interval"] = round(aqm.interval_s * 1e6)
    if aqm.tupdate_s is not None:
        params["tupdate"] = round(aqm.tupdate_s * 1e6)
    if aqm.name == "dualpi2":
        assert aqm.step_s is not None and aqm.coupling is not None and aqm.ecn_mask is not None
        params.update(step_thresh_us=round(aqm.step_s * 1e6), coupling=int(aqm.coupling),
                      ecn_mask=ECN_MASKS[aqm.ecn_mask])
        ipr.tc("add", "dualpi2", ifindex, parent=parent, handle=AQM_HANDLE, **params)
    elif aqm.name != "cake":
        params["ecn"] = int(aqm.ecn)
        ipr.tc("add", aqm.name, ifindex, parent=parent, handle=AQM_HANDLE, **params)
    else:  # cake's own shaper off: tbf above sets the rate; its memory limit is the hard limit
        ipr.tc("add", "cake", ifindex, parent=parent, handle=AQM_HANDLE, bandwidth="unlimited",
               memlimit=limit * ETH_FRAME)
    return f"{aqm.name} 3: (the kernel's) limit {limit}p {aqm.describe()}"


def counters(ipr: IPRoute, ifindex: int, kind: str) -> dict[str, int]:
    """The AQM qdisc's drops (its own decisions), marks and tail drops, apart."""
    for q in ipr.get_qdiscs(ifindex):
        if q["handle"] != AQM_HANDLE or q.get_attr("TCA_KIND") != kind:
            continue
        stats2 = q.get_attr("TCA_STATS2")
        queue = (stats2.get_attr("TCA_STATS_QUEUE") or {}) if stats2 is not None else {}
        app = stats2.get_attr("TCA_STATS_APP") if stats2 is not None else None
        xstats = {name: app[name] for name in _XSTATS.get(kind, ())} if app is not None else {}
        tail = sum(xstats.get(name, 0) for name in _TAIL.get(kind, ()))
        if kind == "dualpi2":
            tail = queue.get("overlimits", 0)
        out = {"aqm_drops": queue.get("drops", 0) - tail, "aqm_tail_drops": tail}
        if "ecn_mark" in xstats:  # cake counts its marks per tin: not read yet
            out["aqm_marks"] = xstats["ecn_mark"]
        if "step_marks" in xstats:
            out["aqm_step_marks"] = xstats["step_marks"]
        return out
    return {}
