"""Link backends: what the kernel offers, and how one direction's impairments are applied.

Both backends put every impairment of a direction on the router namespace's egress interface of that
direction, and keep the delay line separate from the bottleneck queue:

- "netem": netem (delay, jitter, random loss) as the root qdisc with a large limit, so its tfifo is only
  the delay line, and tbf (rate, burst, drop-tail bottleneck queue) as its child; an AQM the kernel has
  replaces the drop-tail queue as tbf's child (kernel_aqm.py).
- "userspace": for kernels without sch_netem. tbf (rate and bottleneck queue) stays in the kernel as
  root qdisc; delay, jitter and loss happen in ccscope-delayline, bound to an NFQUEUE queue that an
  iptables FORWARD rule in the router namespace feeds with that direction's packets. A Mahimahi trace
  (rate from delivery opportunities, with its own drop-tail queue) also runs in the delay line.

With `isolate`, htb takes tbf's place (same position on either backend, the delay line stays
separate): a root class at the link rate and two leaf classes that share it, guaranteed 90 %
(interactive) and 10 % (bulk) of it and each allowed to borrow all of it (ceil = rate). 2:10 (prio 0,
served first) holds ping and short flows, chosen by u32 filters (ICMP; TCP/UDP source or destination
port in `ports`), with its own drop-tail queue 4:; 2:20 (prio 1, htb's default class) holds everything
else with the link's queue 3:.

Qdiscs are managed with pyroute2. `tc` is not used.
"""

from __future__ import annotations

import contextlib
import functools
import os
import secrets
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from pyroute2 import IPRoute
from pyroute2.netlink.exceptions import NetlinkError
from pyroute2.netlink.rtnl import tcmsg

from ccscope.errors import CcscopeError, PrerequisiteError
from ccscope.hosttools import need, sh

from . import kernel_aqm
from .aqm import IN_KERNEL
from .netns import iproute_in, ns_argv
from .profile import ETH_FRAME, LinkProfile

DELAYLINE = Path(__file__).with_name("ccscope-delayline")
NETEM_LIMIT = 1_000_000  # packets the delay line may hold: never the bottleneck
NFQUEUE_MAXLEN = 1 << 17
# netem keeps packets in order under jitter only when its own rate is set (it then schedules each packet
# after the previous one); a rate far above any emulated link gives ordering without shaping.
NETEM_ORDER_RATE_BPS = 32e9
PROBED_QDISCS = ("netem", "tbf", "htb", "fq", *IN_KERNEL)
SHAPER_HANDLE = 0x20000  # tbf 2: or htb 2: -- the bottleneck; its drops include its children's
BULK_LEAF, INTERACTIVE_LEAF = 0x30000, 0x40000  # drop-tail queues: the link's (3:) and isolate's (4:)
INTERACTIVE_CLASS, BULK_CLASS = 0x20010, 0x20020
ETH_P_IP = 0x0800
HTB_MAX_QUANTUM = 200_000  # the kernel clamps (and warns) above this
# Guaranteed shares of the link rate; each class may borrow up to all of it. htb serves a class within
# its guarantee before any class that borrows, so the interactive share must cover a short flow's
# bursts (a 50/50 split would halve its rate whenever the bulk flow is busy).
INTERACTIVE_SHARE, BULK_SHARE = 0.9, 0.1

# pyroute2 0.9 knows pfifo but not bfifo; both take the same options (struct tc_fifo_qopt {u32 limit}).
tcmsg.plugins.setdefault("bfifo", tcmsg.sched_pfifo)


@dataclass(frozen=True)
class Capabilities:
    qdiscs: frozenset[str]
    nfqueue: bool
    delayline: Path | None
    nfqueue_error: str = ""

    @property
    def netem(self) -> bool:
        return "netem" in self.qdiscs

    @property
    def userspace(self) -> bool:
        return "tbf" in self.qdiscs and self.nfqueue and self.delayline is not None


@functools.cache
def probe_backends() -> Capabilities:
    """Which qdiscs and NFQUEUE work, tried for real in a scratch namespace (cached per process)."""
    need("ip")
    ns = f"ccs-probe-{os.getpid()}-{secrets.token_hex(3)}"
    sh(["ip", "netns", "add", ns])
    nfqueue_error = ""

    def try_qdiscs(ipr: IPRoute) -> set[str]:
        found = set()
        lo = ipr.link_lookup(ifname="lo")[0]
        ipr.link("set", index=lo, state="up")
        for kind in PROBED_QDISCS:
            kw = {"rate": "10mbit", "burst": 20000, "limit": 100000} if kind == "tbf" else {}
            try:
                ipr.tc("add", kind, lo, handle=0x10000, **kw)
            except NetlinkError:
                continue  # EOPNOTSUPP / ENOENT: "Specified qdisc kind is unknown"
            found.add(kind)
            with contextlib.suppress(NetlinkError):
                ipr.tc("del", kind, lo, handle=0x10000, **kw)
        return found

    try:
        found = iproute_in(ns, try_qdiscs)
        try:
            need("iptables")
            rule = ["-t", "mangle", "-A", "FORWARD", "-j", "NFQUEUE", "--queue-num", "0"]
            proc = sh(ns_argv(ns, ["iptables", "-w", *rule]), check=False)
            nfqueue_error = "" if proc.returncode == 0 else (proc.stderr.strip() or "iptables failed")
        except PrerequisiteError as exc:
            nfqueue_error = str(exc)
    finally:
        sh(["ip", "netns", "del", ns], check=False)
    delayline = DELAYLINE if os.access(DELAYLINE, os.X_OK) else None
    return Capabilities(qdiscs=frozenset(found), nfqueue=not nfqueue_error, delayline=delayline,
                        nfqueue_error=nfqueue_error.splitlines()[0] if nfqueue_error else "")


def choose_backend(requested: str, caps: Capabilities) -> str:
    if requested not in ("auto", "netem", "userspace"):
        raise CcscopeError(f"unknown emulation backend {requested!r} (use auto, netem or userspace)")
    if requested in ("auto", "netem") and caps.netem and "tbf" in caps.qdiscs:
        return "netem"
    if requested == "netem":
        raise PrerequisiteError("sch_netem is not in this kernel", "use backend auto or userspace")
    if "tbf" not in caps.qdiscs:
        raise PrerequisiteError("the tbf qdisc is not in this kernel (CONFIG_NET_SCH_TBF)")
    if not caps.nfqueue:
        raise PrerequisiteError(f"NFQUEUE does not work here: {caps.nfqueue_error}",
                                "needs CONFIG_NETFILTER_XT_TARGET_NFQUEUE and iptables")
    if caps.delayline is None:
        raise PrerequisiteError(f"{DELAYLINE.name} is not built", "run make (needs gcc, libnetfilter-queue-dev)")
    return "userspace"


def shaper_burst(rate_bps: float) -> int:
    """The bucket of a kernel shaper (tbf, or an htb class at rate_bps): SHAPER_BUCKET_S of the rate, and at
    least two full frames."""
    return max(2 * ETH_FRAME, int(rate_bps / 8 * SHAPER_BUCKET_S) + 1)


# A token bucket is not a serial line: what it saved while the link was idle leaves at once, and while it
# lasts, a sender above the rate builds no queue. A delay-based algorithm reads that as room. So the bucket
# is as small as lets tbf keep its rate: rate/HZ at Debian's HZ 250, 4 ms. Copa alone at 12 Mbit/s, 40 ms
# RTT, 4 BDP (tests/test_cc_claims.py), three runs each, at 2-7 % steal: 11.02-11.33 Mbit/s with 4 ms,
# 9.46-10.54 with 8, 9.23-10.50 with 12, 9.37-9.66 with 20 (its median srtt 85 ms instead of 44: the hidden
# excess doubled its velocity again and again). The price is the host's stalls: a stall longer than the
# bucket costs the link the rest of that time (at about 20 % steal, UDP at 10 Mbit/s carried 9.06-9.81
# with 4 ms against 9.96-9.98 with 20); the path check leaves such stalls out (pathcheck's module doc).
SHAPER_BUCKET_S = 0.004


def tbf_params(rate_bps: float, queue_bytes: int) -> dict:
    """tbf with its bucket (shaper_burst) and an explicit limit."""
    return {"rate": f"{int(rate_bps)}bit", "burst": shaper_burst(rate_bps), "limit": queue_bytes}


def apply_link(ipr: IPRoute, ifindex: int, link: LinkProfile, backend: str, base_rtt_s: float) -> dict:
    """Installs the kernel part of one direction on `ifindex`; returns what was installed."""
    installed: dict = {"qdiscs": []}
    # A trace or AQM link runs wholly in the delay line (its queue is there too), on either backend.
    netem_root = backend == "netem" and not link.in_delayline and (link.delay_s or link.jitter_s or link.loss)
    tbf_parent = None
    if netem_root:
        kw = {"delay": int(link.delay_s * 1e6), "jitter": int(link.jitter_s * 1e6), "limit": NETEM_LIMIT,
              "loss": link.loss * 100}
        if link.jitter_s:
            kw["rate"] = f"{int(NETEM_ORDER_RATE_BPS)}bit"
        ipr.tc("add", "netem", ifindex, handle=0x10000, **kw)
        installed["qdiscs"].append("netem 1: root")
        tbf_parent = 0x10001
    if link.rate_bps is not None and link.isolate is not None:
        lines, installed["isolate"] = _apply_isolation(ipr, ifindex, link, base_rtt_s, tbf_parent)
        installed["qdiscs"] += lines
    elif link.rate_bps is not None and not link.in_delayline:
        queue_bytes = link.queue_bytes(base_rtt_s)
        assert queue_bytes is not None
        params = tbf_params(link.rate_bps, queue_bytes)
        where = {"parent": tbf_parent} if tbf_parent else {}
        ipr.tc("add", "tbf", ifindex, handle=0x20000, **where, **params)
        installed["qdiscs"].append(f"tbf 2: rate {params['rate']} burst {params['burst']} limit {queue_bytes}")
        if link.aqm is not None and link.aqm.in_kernel:
            installed["qdiscs"].append(kernel_aqm.apply(ipr, ifindex, link, base_rtt_s, parent=0x20001))
        elif link.queue is not None and link.queue.packets is not None:
            # A queue in packets: a pfifo child counts packets (tbf's own limit counts bytes).
            ipr.tc("add", "pfifo", ifindex, parent=0x20001, handle=0x30000, limit=link.queue.packets)
            installed["qdiscs"].append(f"pfifo 3: limit {link.queue.packets}p")
    return installed


def htb_class_params(rate_bps: float, ceil_bps: float, prio: int) -> dict:
    burst = shaper_burst(ceil_bps)  # as tbf's
    quantum = max(ETH_FRAME, min(HTB_MAX_QUANTUM, int(rate_bps / 8 / 10)))
    return {"rate": f"{int(rate_bps)}bit", "ceil": f"{int(ceil_bps)}bit", "burst": burst, "cburst": burst,
            "prio": prio, "quantum": quantum}


def _leaf_queue(ipr: IPRoute, ifindex: int, parent: int, handle: int, packets: int | None, nbytes: int) -> str:
    """A drop-tail queue under an htb class: pfifo for a queue in packets, else bfifo in bytes."""
    if packets is not None:
        ipr.tc("add", "pfifo", ifindex, parent=parent, handle=handle, limit=packets)
        return f"pfifo {handle >> 16:x}: limit {packets}p"
    ipr.tc("add", "bfifo", ifindex, parent=parent, handle=handle, limit=nbytes)
    return f"bfifo {handle >> 16:x}: limit {nbytes}B"


def _port_keys(port: int) -> list[list[str]]:
    # u32 keys are value/mask+offset from the IPv4 header (20 bytes: our packets carry no IP options)
    return [[f"0x{port:04x}/0xffff+20"], [f"0x{port:04x}/0xffff+22"]]  # source port, destination port


def _apply_isolation(ipr: IPRoute, ifindex: int, link: LinkProfile, base_rtt_s: float,
                     parent: int | None) -> tuple[list[str], dict]:
    assert link.rate_bps is not None and link.isolate is not None
    rate = link.rate_bps
    where = {"parent": parent} if parent else {}
    ipr.tc("add", "htb", ifindex, handle=SHAPER_HANDLE, default=BULK_CLASS & 0xFFFF, **where)
    ipr.tc("add-class", "htb", ifindex, handle=SHAPER_HANDLE | 1, parent=SHAPER_HANDLE,
           **htb_class_params(rate, rate, 0))
    lines = [f"htb 2: default 20; class 2:1 rate {int(rate)}bit"]
    leaves = (("interactive", INTERACTIVE_CLASS, INTERACTIVE_LEAF, 0, INTERACTIVE_SHARE, link.isolate.queue,
               link.isolate_queue_bytes(base_rtt_s)),
              ("bulk", BULK_CLASS, BULK_LEAF, 1, BULK_SHARE, link.queue, link.queue_bytes(base_rtt_s)))
    classes = {}
    for name, classid, leaf, prio, share, queue, queue_bytes in leaves:
        assert queue_bytes is not None
        ipr.tc("add-class", "htb", ifindex, handle=classid, parent=SHAPER_HANDLE | 1,
               **htb_class_params(rate * share, rate, prio))
        packets = queue.packets if queue is not None else None
        leaf_line = _leaf_queue(ipr, ifindex, classid, leaf, packets, queue_bytes)
        classes[name] = (f"2:{classid & 0xFFFF:x} rate {int(rate * share)}bit ceil {int(rate)}bit prio {prio}; "
                         f"{leaf_line}")
        lines.append(f"class {classes[name]}")
    matches = {"icmp": [["0x01/0xff+9"]]}
    for port in link.isolate.ports:
        matches[f"port {port}"] = _port_keys(port)
    for keyset in (k for keys in matches.values() for k in keys):
        ipr.tc("add-filter", "u32", ifindex, parent=SHAPER_HANDLE, prio=1, protocol=ETH_P_IP,
               target=INTERACTIVE_CLASS, keys=keyset)
    lines.append(f"u32 -> 2:10: {', '.join(matches)}")
    return lines, {"classes": classes, "interactive_match": list(matches)}


def class_stats(ipr: IPRoute, ifindex: int) -> dict[int, dict[str, int]]:
    """{classid: {"packets", "bytes", "drops"}} of the htb classes on ifindex."""
    out: dict[int, dict[str, int]] = {}
    for c in ipr.get_classes(ifindex):
        stats2 = c.get_attr("TCA_STATS2")
        if stats2 is None:
            continue
        basic = stats2.get_attr("TCA_STATS_BASIC") or {}
        queue = stats2.get_attr("TCA_STATS_QUEUE") or {}
        out[c["handle"]] = {"packets": basic.get("packets", 0), "bytes": basic.get("bytes", 0),
                            "drops": queue.get("drops", 0)}
    return out


def qdisc_stats_by_handle(ipr: IPRoute, ifindex: int) -> dict[int, dict]:
    """{handle: {"kind", "packets", "bytes", "drops", "backlog"}} of the qdiscs on ifindex."""
    out: dict[int, dict] = {}
    for q in ipr.get_qdiscs(ifindex):
        kind = q.get_attr("TCA_KIND")
        stats2 = q.get_attr("TCA_STATS2")
        if stats2 is None:
            continue
        basic = stats2.get_attr("TCA_STATS_BASIC") or {}
        queue = stats2.get_attr("TCA_STATS_QUEUE") or {}
        out[q["handle"]] = {"kind": kind, "packets": basic.get("packets", 0), "bytes": basic.get("bytes", 0),
                            "drops": queue.get("drops", 0), "backlog": queue.get("backlog", 0)}
    return out


class DelayLine:
    """One ccscope-delayline process serving one direction's NFQUEUE queue in the router namespace."""

    def __init__(self, ns: str, queue_num: int, link: LinkProfile, base_rtt_s: float, stats_path: Path,
                 seed: int) -> None:
        self.ns = ns
        self.queue_num = queue_num
        self.stats_path = stats_path
        argv = [str(DELAYLINE), "--queue", str(queue_num), "--delay-us", str(round(link.delay_s * 1e6)),
                "--jitter-us", str(round(link.jitter_s * 1e6)), "--loss", repr(link.loss), "--seed", str(seed),
                "--maxlen", str(NFQUEUE_MAXLEN), "--stats", str(stats_path), "--realtime"]
        if link.in_delayline:  # the bottleneck too: a trace, or a rate and its AQM
            if link.trace is not None:
                argv += ["--trace", str(link.trace)]
            else:
                assert link.rate_bps is not None and link.aqm is not None
                argv += ["--rate-bps", str(round(link.rate_bps)), *link.aqm.delayline_args()]
            if link.queue is not None and link.queue.packets is not None:
                argv += ["--queue-packets", str(link.queue.packets)]
            else:
                argv += ["--queue-bytes", str(link.queue_bytes(base_rtt_s))]
        self.argv = argv
        self.proc: subprocess.Popen | None = None

    def start(self, popen) -> subprocess.Popen:
        # stderr to a file: a pipe nobody reads during the run would stall the delay line once full
        err_path = self.stats_path.with_suffix(".err")
        with err_path.open("wb") as err_file:
            self.proc = popen(self.ns, self.argv, stdout=subprocess.PIPE, stderr=err_file, text=True)
        line = self.proc.stdout.readline() if self.proc.stdout else ""
        if line.strip() != "ready":
            self.proc.kill()
            self.proc.wait()
            err = err_path.read_text(errors="replace").strip()
            raise CcscopeError(f"ccscope-delayline did not start: {err or line.strip() or 'no output'}")
        return self.proc

    def stats(self, fresh: bool = True) -> dict[str, int]:
        """Counters from the stats file; with fresh, asks the process to rewrite it first."""
        before = self._read()
        if fresh and self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGUSR1)
            deadline = time.monotonic() + 1.0
            while time.monotonic() < deadline:
                now = self._read()
                if now.get("seq", 0) > before.get("seq", 0):
                    return now
                time.sleep(0.005)
        return before

    def _read(self) -> dict[str, int]:
        try:
            text = self.stats_path.read_text()
        except OSError:
            return {}
        return {k: int(v) for k, v in (line.split() for line in text.splitlines() if line.strip())}
