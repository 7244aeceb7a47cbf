#!/usr/bin/env python3
"""Benchmark of the telemetry core: what ccscope costs the host, as ratios measured in one run, each with an
interval over repetitions.

    sudo .venv/bin/python bench/telemetry.py [--quick] [--only 1,4]

Prints a table and writes bench/results/telemetry.md. See bench/README.md for what each number means.
Everything runs in network namespaces and a cgroup this script creates (loopback inside them); they, the
daemons, iperf3 and helper processes and the kernel.bpf_stats_enabled sysctl are restored on exit, also on
failure.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from ccscope.scenario.analysis import mean_ci95
from ccscope_testkit.bench import CLK_TCK, Row, conditions, cpu_ns, cpu_seconds
from ccscope_testkit.cgroups import cgroup_tree, kubepods_systemd, pod_logs
from ccscope_testkit.net import CCSCOPE, ROOT, daemon, held_prog_ids, netns, netns_inode, stop_process

RESULTS = ROOT / "bench" / "results" / "telemetry.md"
STATUS = {True: "met", False: "MISSED", None: "undecided"}
RESULTS_ATTRIBUTION = ROOT / "bench" / "results" / "attribution.md"
ALL_LABELS = ("--labels", "comm,cgroup,container,pod")
OPEN_FILES = 20_000  # per process on this machine: the 100k-flow case spreads its sockets over several


# --- plumbing -------------------------------------------------------------------------------------------------------


def sh(*cmd: str, check: bool = True) -> str:
    return subprocess.run(cmd, check=check, capture_output=True, text=True).stdout


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def host_sys_softirq_s() -> float:
    """System + softirq time of all CPUs from /proc/stat (host-wide: other work on the machine counts too)."""
    fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()
    return (int(fields[3]) + int(fields[7])) / CLK_TCK


def prog_ids(pid: int) -> dict[int, str]:
    """BPF programs a process holds; names from bpftool."""
    ids = held_prog_ids(pid)
    return {p["id"]: p["name"] for p in bpf_progs() if p["id"] in ids}


def bpf_progs() -> list[dict]:
    return json.loads(sh("bpftool", "prog", "show", "-j"))


def prog_stats(ids: dict[int, str]) -> dict[str, tuple[int, int]]:
    """name -> (run_time_ns, run_cnt), the kernel's own accounting (needs kernel.bpf_stats_enabled=1)."""
    return {ids[p["id"]]: (p.get("run_time_ns", 0), p.get("run_cnt", 0)) for p in bpf_progs() if p["id"] in ids}


@contextlib.contextmanager
def bpf_stats_enabled() -> Iterator[None]:
    path = Path("/proc/sys/kernel/bpf_stats_enabled")
    old = path.read_text().strip()
    path.write_text("1")
    try:
        yield
    finally:
        path.write_text(old)


class Cgroup:
    """A scratch cgroup v2 group: the CPU its processes use (cpu.stat usage_usec, the scheduler's exact runtime).

    Without CONFIG_IRQ_TIME_ACCOUNTING the softirq work a task does (loopback receive, and tcp_probe in it) is
    part of that task's runtime, so this counts the kernel's TCP work for the flows, and not the other work of
    a shared machine as /proc/stat does."""

    def __init__(self, tag: str) -> None:
        mount = next(line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                     if line.split()[2] == "cgroup2")
        self.path = Path(mount) / f"ccsbench{os.getpid()}{tag}"
        self.path.mkdir()

    def enter(self) -> None:
        """For preexec_fn: the child joins the group before it execs."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def usage_s(self) -> float:
        stat = dict(line.split() for line in (self.path / "cpu.stat").read_text().splitlines())
        return int(stat["usage_usec"]) / 1e6

    def remove(self) -> None:
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            for pid in (self.path / "cgroup.procs").read_text().split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), signal.SIGKILL)
            try:
                self.path.rmdir()
                return
            except OSError:
                time.sleep(0.05)


@contextlib.contextmanager
def cgroup(tag: str) -> Iterator[Cgroup]:
    group = Cgroup(tag)
    try:
        yield group
    finally:
        group.remove()


@contextlib.contextmanager
def iperf3_server(ns: str, port: int, group: Cgroup | None = None) -> Iterator[None]:
    proc = subprocess.Popen(["ip", "netns", "exec", ns, "iperf3", "-s", "-p", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            preexec_fn=group.enter if group else None)
    try:
        for _ in range(100):
            if f":{port}" in sh("ip", "netns", "exec", ns, "ss", "-Htln"):
                break
            time.sleep(0.05)
        yield
    finally:
        proc.terminate()
        proc.wait()


def iperf3(ns: str, port: int, seconds: float, *extra: str, group: Cgroup | None = None) -> dict:
    out = subprocess.run(["ip", "netns", "exec", ns, "iperf3", "-c", "127.0.0.1", "-p", str(port), "-t",
                          str(seconds), "-J", *extra], check=True, capture_output=True, text=True,
                         preexec_fn=group.enter if group else None).stdout
    return json.loads(out)


# --- statistics: every figure with its interval -----------------------------------------------------------------------


def mean_text(values: list[float], digits: int = 3, scale: float = 1.0, unit: str = "") -> str:
    """mean ± 95% CI (Student t) over the repetitions."""
    ci = mean_ci95(values)
    half = f" ± {ci['ci95'] * scale:.{digits}f}" if ci["ci95"] is not None else " (one repetition: no interval)"
    return f"{ci['mean'] * scale:.{digits}f}{half}{unit}"


def judge(values: list[float], at_most: float | None = None, at_least: float | None = None) -> bool | None:
    """met when the whole 95% interval of the mean is on the right side of the target, MISSED when all of it is
    on the wrong side, None (undecided) when the interval straddles it: more pairs or a quieter machine."""
    ci = mean_ci95(values)
    low, high = ci["mean"] - (ci["ci95"] or 0.0), ci["mean"] + (ci["ci95"] or 0.0)
    if at_most is not None:
        return True if high <= at_most else False if low > at_most else None
    return True if low >= at_least else False if high < at_least else None


def median_interval(values: list[float]) -> tuple[float, float, float, str]:
    """Median and a distribution-free interval from order statistics: the widest (x_k, x_n-k+1) whose binomial
    coverage is at least 95%, or the full range where n is too small for that (n <= 5)."""
    xs, n = sorted(values), len(values)
    k = 0
    while k + 1 <= n // 2 and sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n <= 0.025:
        k += 1
    if k == 0:
        return statistics.median(xs), xs[0], xs[-1], "range"
    return statistics.median(xs), xs[k - 1], xs[n - k], "95% CI"


def median_text(values: list[float], scale: float = 1.0, unit: str = "", digits: int = 0) -> str:
    median, low, high, label = median_interval(values)
    return (f"{median * scale:.{digits}f}{unit} ({label} {low * scale:.{digits}f}-{high * scale:.{digits}f}, "
            f"n={len(values)})")


# --- 1. CPU per GB moved, and throughput ------------------------------------------------------------------------------


def bench_cpu_per_gb(pairs: int, seconds: float, rate: str) -> Row:
    """A paced iperf3 (fixed offered load, CPU to spare) with and without the daemon attached, interleaved with the
    order alternating per pair: CPU time of the iperf3 processes' cgroup (their kernel TCP work included) per GB
    received, and the host's sys + softirq from /proc/stat per GB alongside."""
    cg_ratio, host_ratio, per_gb, achieved = [], [], {True: [], False: []}, []
    with netns("gb") as ns, cgroup("gb") as group, iperf3_server(ns, 5401, group):
        for i in range(pairs):
            measured = {}
            for attached in ((True, False) if i % 2 == 0 else (False, True)):
                with daemon() if attached else contextlib.nullcontext():
                    cg0, host0 = group.usage_s(), host_sys_softirq_s()
                    result = iperf3(ns, 5401, seconds, "-b", rate, group=group)
                    cg1, host1 = group.usage_s(), host_sys_softirq_s()
                gigabytes = result["end"]["sum_received"]["bytes"] / 1e9
                achieved.append(result["end"]["sum_received"]["bits_per_second"])
                measured[attached] = ((cg1 - cg0) / gigabytes, (host1 - host0) / gigabytes)
                per_gb[attached].append(measured[attached][0])
            cg_ratio.append(measured[True][0] / measured[False][0])
            host_ratio.append(measured[True][1] / measured[False][1])
    detail = (f"{pairs} interleaved pairs of {seconds:g} s at {rate}bit/s (iperf3 -b, one stream, loopback in a "
              f"namespace, {mean_text(achieved, 2, 1e-9, ' Gbit/s')} reached); "
              f"CPU s per GB without {mean_text(per_gb[False], 3)}, with {mean_text(per_gb[True], 3)}; "
              f"per-pair ratios {', '.join(f'{r:.3f}' for r in cg_ratio)}. Host-wide /proc/stat sys+softirq per GB, "
              f"with / without: {mean_text(host_ratio)} (every process of the machine counts there)")
    return Row("1a. CPU per GB moved, attached / not attached (cgroup of iperf3, kernel work included)",
               mean_text(cg_ratio), "<= 1.01 (<= 1% more CPU per GB)", judge(cg_ratio, at_most=1.01), detail)


def bench_throughput(pairs: int, seconds: float) -> Row:
    """Secondary: an unpaced loopback iperf3 with and without the daemon, interleaved."""
    ratios, without = [], []
    with netns("tp") as ns, iperf3_server(ns, 5402):
        for i in range(pairs):
            rate = {}
            for attached in ((True, False) if i % 2 == 0 else (False, True)):
                with daemon() if attached else contextlib.nullcontext():
                    rate[attached] = iperf3(ns, 5402, seconds)["end"]["sum_received"]["bits_per_second"]
            ratios.append(rate[True] / rate[False])
            without.append(rate[False])
    return Row("1b. unpaced loopback iperf3 throughput, attached / not attached", mean_text(ratios), ">= 0.99",
               judge(ratios, at_least=0.99),
               f"{pairs} interleaved pairs of {seconds:g} s; without {mean_text(without, 1, 1e-9, ' Gbit/s')}; "
               f"per-pair ratios {', '.join(f'{r:.3f}' for r in ratios)}. CPU-bound on both sides, so it swings "
               "with other load: 1a is the measure of cost")


# --- 2. BPF cost per event --------------------------------------------------------------------------------------------


EMPTY_PROBE = b"""
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
char LICENSE[] SEC("license") = "Dual BSD/GPL";
SEC("tp_btf/tcp_probe") int empty_probe(void *ctx) { return 0; }
"""

# Reads the socket's fields that ccscope's two tcp_probe programs read (bpf/ccscope.bpf.c, bpf/ccstate.bpf.c), so
# that, attached first, it takes the cache misses that otherwise fall on whichever of them runs first: the kernel
# takes most of those a moment later anyway (it reads these fields for the same segment). Measured 2026-11-28:
# with it first, tcp_probe's own work 49 ns against 55, the state program's 64 against 83, the reader itself 39.
FIRST_READER_PROBE = b"""
#include <linux/types.h>
#include <linux/bpf.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_tracing.h>
#include <bpf/bpf_core_read.h>
#include "core_min.h"
char LICENSE[] SEC("license") = "Dual BSD/GPL";
extern void *bpf_rdonly_cast(const void *obj, __u32 btf_id) __ksym __weak;
volatile __u64 sink;
SEC("tp_btf/tcp_probe")
int BPF_PROG(first_reader, struct sock *sk, const struct sk_buff *skb)
{
	struct tcp_sock *tp = bpf_rdonly_cast(sk, bpf_core_type_id_kernel(struct tcp_sock));
	__u64 *priv = tp->inet_conn.icsk_ca_priv;

	sink = sk->__sk_common.skc_cookie.counter + tp->tcp_mstamp + tp->packets_out +
		(tp->inet_conn.icsk_ca_ops != 0) + priv[0] + priv[4] + priv[8] + priv[12] + tp->snd_cwnd +
		tp->srtt_us + tp->bytes_acked + tp->delivered;
	return 0;
}
"""


@contextlib.contextmanager
def bench_probe(source: bytes, name: str) -> Iterator[dict[int, str]]:
    """`source`'s program `name` attached to tcp_probe, built with clang against bpf/'s headers: {prog id: name}.
    Yields {} where clang is missing or the kernel refuses the program."""
    import shutil

    from ccscope.libbpf import Libbpf

    if not shutil.which("clang"):
        yield {}
        return
    with tempfile.TemporaryDirectory() as tmp:
        src, obj = Path(tmp) / f"{name}.bpf.c", Path(tmp) / f"{name}.bpf.o"
        src.write_bytes(source)
        multiarch = sh("clang", "-print-multiarch", check=False).strip() or f"{platform.machine()}-linux-gnu"
        arch = {"x86_64": "x86", "aarch64": "arm64"}.get(platform.machine(), platform.machine())
        sh("clang", "-g", "-O2", "-target", "bpf", f"-D__TARGET_ARCH_{arch}", f"-I/usr/include/{multiarch}",
           f"-I{ROOT / 'bpf'}", "-c", str(src), "-o", str(obj))
        lib = Libbpf().lib
        handle = lib.bpf_object__open_file(str(obj).encode(), None)
        link = None
        try:
            if not handle or lib.bpf_object__load(handle) != 0:
                yield {}
                return
            link = lib.bpf_program__attach(lib.bpf_object__find_program_by_name(handle, name.encode()))
            yield {pid: n for pid, n in prog_ids(os.getpid()).items() if n == name} if link else {}
        finally:
            if link:
                lib.bpf_link__destroy(link)
            if handle:
                lib.bpf_object__close(handle)


def empty_probe() -> contextlib.AbstractContextManager[dict[int, str]]:
    """An empty program on tcp_probe: what the kernel's accounting reports for doing nothing (its own clock reads
    and bookkeeping), to read the ccscope number against."""
    return bench_probe(EMPTY_PROBE, "empty_probe")


def _bpf_rounds(seconds: float, rounds: int, daemon_args: tuple[str, ...] = (),
                first_reader: bool = False) -> list[dict[str, tuple[float, int]]]:
    """Per round, each program's (ns per event, events): the daemon's, the empty program attached after them and,
    with `first_reader`, FIRST_READER_PROBE attached before them. Rounds a bpftool listing missed are left out."""
    per_round: list[dict[str, tuple[float, int]]] = []
    with netns("ns") as ns, iperf3_server(ns, 5403), bpf_stats_enabled(), contextlib.ExitStack() as stack:
        first = stack.enter_context(bench_probe(FIRST_READER_PROBE, "first_reader")) if first_reader else {}
        running = stack.enter_context(daemon(*daemon_args))
        empty = stack.enter_context(empty_probe())
        ids = {**first, **prog_ids(running.proc.pid), **empty}
        for _ in range(rounds):
            before = prog_stats(ids)
            iperf3(ns, 5403, seconds, "-P", "4")
            after = prog_stats(ids)
            per = {}
            for name, (ns_after, cnt_after) in after.items():
                ns_before, cnt_before = before.get(name, (0, 0))
                if cnt_after > cnt_before:
                    per[name] = ((ns_after - ns_before) / (cnt_after - cnt_before), cnt_after - cnt_before)
            per_round.append(per)
    return [r for r in per_round if "tcp_probe" in r]


def bench_bpf_ns(seconds: float, rounds: int, daemon_args: tuple[str, ...] = ()) -> list[Row]:
    """ccscope's tcp_probe and an empty program see the same events in each round. The kernel's accounting adds its
    own clock reads to every run (the empty program shows how much), so the target is judged on ccscope's own work,
    tcp_probe minus the empty program, in every round."""
    per_round = _bpf_rounds(seconds, rounds, daemon_args)
    if not per_round:
        return [Row("2. BPF ns per tcp_probe event", "no data", "<= 100 ns in every round", None,
                    "bpftool showed no tcp_probe runs in any round")]
    total = [r["tcp_probe"][0] for r in per_round]
    detail = f"{rounds} rounds of {seconds:g} s, iperf3 -P 4 on loopback; per round: " + " | ".join(
        "; ".join(f"{name} {v:.0f} ns x {c}" for name, (v, c) in sorted(r.items())) for r in per_round)
    what = "2. BPF ns per tcp_probe event (run_time_ns / run_cnt), own work in every round" + \
        (f", with {' '.join(daemon_args)}" if daemon_args else "")
    if not all("empty_probe" in r for r in per_round):
        return [Row(what, median_text(total, unit=" ns"), "<= 100 ns", max(total) <= 100,
                    detail + ". No empty program to compare with (clang missing): the total is judged")]
    empty_ns = [r["empty_probe"][0] for r in per_round]
    own = [t - e for t, e in zip(total, empty_ns, strict=True)]
    detail += (f". Own work per round: {', '.join(f'{v:.0f}' for v in own)} ns, mean {mean_text(own, 0)} ns; "
               f"total {median_text(total, unit=' ns')}; the empty program {median_text(empty_ns, unit=' ns')}: the "
               "accounting's own overhead on this machine. Events are host-wide (other processes' flows count too)")
    return [Row(what, f"{median_text(own, unit=' ns')}, worst round {max(own):.0f} ns", "<= 100 ns in every round",
                max(own) <= 100, detail), *_state_row(per_round, empty_ns)]


def _state_row(per_round: list[dict[str, tuple[float, int]]], empty_ns: list[float]) -> list[Row]:
    """What the algorithm-state program (ccstate_probe, a second program on tcp_probe) adds per event, its own
    work beside the empty program's in the same rounds: the gate, the key compare, and the copies it makes."""
    rounds = [(r[name][0], e) for r, e in zip(per_round, empty_ns, strict=True)
              for name in ("ccstate_probe", "ccstate_probe_skc") if name in r]
    if not rounds:
        return []
    own = [total - empty for total, empty in rounds]
    return [Row("2s. BPF ns per tcp_probe event of the algorithm-state program (BBR's and CUBIC's state), own work",
                f"{median_text(own, unit=' ns')}, worst round {max(own):.0f} ns", "<= 50 ns median",
                sorted(own)[len(own) // 2] <= 50,
                f"per round: {', '.join(f'{v:.0f}' for v in own)} ns, the flows iperf3 -P 4's (the host default)")]


WARM_MEASURED = ("tcp_probe", "ccstate_probe")  # the daemon's two programs on tcp_probe, judged by 2w


def bench_bpf_ns_warm(seconds: float, rounds: int) -> list[Row]:
    """Measures 2 and 2s again with FIRST_READER_PROBE attached before the daemon: each program's own work with the
    socket's cache lines warm, and what taking the misses first costs (the first reader's own work)."""
    what = "2w. own work per tcp_probe event with the socket's lines warm: tcp_probe, state program"
    target = "<= 50 ns median each"
    per_round = [r for r in _bpf_rounds(seconds, rounds, first_reader=True)
                 if "empty_probe" in r and "first_reader" in r]
    if not per_round:
        return [Row(what, "no data", target, None,
                    "no round had the first reader and the empty program (clang missing, or a kernel before 6.2)")]
    own = {name: [r[name][0] - r["empty_probe"][0] for r in per_round if name in r]
           for name in (*WARM_MEASURED, "first_reader")}
    detail = (f"{len(per_round)} rounds of {seconds:g} s, iperf3 -P 4 on loopback, a program reading the socket's "
              "fields that both read attached before the daemon; own work per round (ns): " + "; ".join(
                  f"{name} {', '.join(f'{v:.0f}' for v in values)}" for name, values in own.items()))
    value = (f"{', '.join(median_text(own[n], unit=' ns') for n in WARM_MEASURED if own[n])}; the misses (first "
             f"reader) {median_text(own['first_reader'], unit=' ns')}")
    met = all(own[n] and sorted(own[n])[len(own[n]) // 2] <= 50 for n in WARM_MEASURED)
    return [Row(what, value, target, met, detail)]


@contextlib.contextmanager
def bpf_object(path: Path | None) -> Iterator[None]:
    """The daemons started inside load `path` (CCSCOPE_BPF_OBJECT); None: the object this checkout built."""
    old = os.environ.get("CCSCOPE_BPF_OBJECT")
    if path is not None:
        os.environ["CCSCOPE_BPF_OBJECT"] = str(path)
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CCSCOPE_BPF_OBJECT", None)
        else:
            os.environ["CCSCOPE_BPF_OBJECT"] = old


def bench_bpf_ns_against(seconds: float, rounds: int, other: Path, together: bool = False) -> Row:
    """Measure 2 for this checkout's BPF object and `other` (another build of it, e.g. the last commit's), in
    interleaved rounds: in each round a daemon with either object in turn, its tcp_probe alone on the tracepoint; or
    with `together`, both daemons attached at once, so both programs run on the very same events and the machine's
    noise hits them alike (the one attached second finds the socket's cache lines that the first one read warm).
    The order alternates per round. As in 2 the empty program is attached after the daemons (the first program on
    the tracepoint also pays for its colder path), and each one's own work is tcp_probe minus the empty program over
    the same events; per round the difference, this minus other."""
    per_round: list[tuple[float, float, int, int, float]] = []  # own ns this, other; events this, other; load
    with netns("ab") as ns, iperf3_server(ns, 5407), bpf_stats_enabled():
        for i in range(rounds):
            order = ("this", "other") if i % 2 == 0 else ("other", "this")
            cost: dict[str, tuple[float, int]] = {}
            for group in ((order,) if together else ((order[0],), (order[1],))):
                with contextlib.ExitStack() as stack:
                    ids = {}
                    for which in group:
                        with bpf_object(other if which == "other" else None):
                            running = stack.enter_context(daemon())
                        # the daemon loads one of the builds of tcp_probe (tcp_probe, tcp_probe_skc): whichever it is
                        ids.update({pid: which for pid, name in prog_ids(running.proc.pid).items()
                                    if name.startswith("tcp_probe")})
                    empty = stack.enter_context(empty_probe())
                    if not empty:
                        return Row("2ab. BPF ns per tcp_probe event, this object against another", "no data",
                                   "<= 100 ns in every round", None, "no empty program to compare with (no clang)")
                    ids.update(empty)
                    before = prog_stats(ids)
                    iperf3(ns, 5407, seconds, "-P", "4")
                    after = prog_stats(ids)
                per = {name: ((after[name][0] - before[name][0]) / max(1, after[name][1] - before[name][1]),
                              after[name][1] - before[name][1]) for name in after}
                cost.update({which: (per[which][0] - per["empty_probe"][0], per[which][1]) for which in group})
            per_round.append((cost["this"][0], cost["other"][0], cost["this"][1], cost["other"][1],
                              os.getloadavg()[0]))
    this, that = [r[0] for r in per_round], [r[1] for r in per_round]
    diff = [a - b for a, b in zip(this, that, strict=True)]
    how = "both attached at once, the attach order" if together else "one daemon at a time, the order"
    return Row(f"2ab. BPF ns per tcp_probe event, own work: this object against {other.name}",
               f"{median_text(this, unit=' ns')} vs {median_text(that, unit=' ns')}; this - other "
               f"{median_text(diff, unit=' ns')}", "<= 100 ns in every round (this object)", max(this) <= 100,
               f"{rounds} interleaved rounds of {seconds:g} s, iperf3 -P 4 on loopback, {how} alternating, the empty "
               "program attached after them; per round (own ns this, other, this - other; events this, other; "
               "1-min load average): "
               + "; ".join(f"{a:.0f}, {b:.0f}, {a - b:+.0f}; {m}, {n}; {load:.2f}" for a, b, m, n, load in per_round)
               + f". The other object: {other}")


def bench_bpf_ns_labels(seconds: float, rounds: int, daemon_args: tuple[str, ...]) -> Row:
    """Two daemons attached at once, one with `daemon_args`: their tcp_probe programs run on the very same
    events, one after the other, so machine noise hits both alike; the difference is what the labels cost.
    The attach order alternates per round (the second program runs on warmer caches)."""
    per_round: list[tuple[float, float, int]] = []
    with netns("nl") as ns, iperf3_server(ns, 5406), bpf_stats_enabled():
        for i in range(rounds):
            with contextlib.ExitStack() as stack:
                order = [(), daemon_args] if i % 2 == 0 else [daemon_args, ()]
                started = {args: stack.enter_context(daemon(*args)) for args in order}
                ids = {pid: "on" if args else "off" for args, running in started.items()
                       for pid, name in prog_ids(running.proc.pid).items() if name == "tcp_probe"}
                before = prog_stats(ids)
                iperf3(ns, 5406, seconds, "-P", "4")
                after = prog_stats(ids)
            cost = {name: (after[name][0] - before[name][0]) / max(1, after[name][1] - before[name][1])
                    for name in ("off", "on")}
            per_round.append((cost["off"], cost["on"], after["on"][1] - before["on"][1]))
    off = statistics.median(r[0] for r in per_round)
    on = statistics.median(r[1] for r in per_round)
    extra = statistics.median(r[1] - r[0] for r in per_round)
    return Row(f"2c. tcp_probe ns per event, {' '.join(daemon_args)} against none (both attached)",
               f"{extra:+.0f} ns ({on:.0f} vs {off:.0f} ns total)", "within target 2 (<= 100 ns own)",
               None, f"median of {rounds} rounds of {seconds:g} s, iperf3 -P 4 on loopback, the two programs on the "
               "same events, attach order alternating; per round (off, on, events): "
               + "; ".join(f"{a:.0f}, {b:.0f}, {n}" for a, b, n in per_round)
               + ". The labels add work only when a sample is due (per-cgroup histogram) and when a flow "
               "is created (owner and cgroup id); between samples the path is the same")


# --- 3. daemon CPU at ~100k events/s --------------------------------------------------------------------------------


def bench_daemon_cpu(windows: int, window_s: float) -> Row:
    """Daemon CPU in consecutive windows while iperf3 drives ~100k tcp_probe events/s and we scrape every 2 s."""
    # 4 streams of 1448-byte writes without Nagle: ~90-100k segments/s on this 2-core VM; a single rate-limited
    # stream could not get past ~35k/s here.
    load = ("-P", "4", "-l", "1448", "-N")
    fractions, rates = [], []
    with netns("cpu") as ns, iperf3_server(ns, 5404), daemon() as running:
        proc = subprocess.Popen(["ip", "netns", "exec", ns, "iperf3", "-c", "127.0.0.1", "-p", "5404", "-t",
                                 str(windows * window_s + 2), *load], stdout=subprocess.DEVNULL)
        try:
            time.sleep(0.5)
            for _ in range(windows):
                events0, cpu0, t0 = (running.metric("ccscope_bpf_probe_events_total"),
                                     cpu_seconds(running.proc.pid), time.monotonic())
                while time.monotonic() - t0 < window_s:
                    time.sleep(min(2.0, window_s - (time.monotonic() - t0)))
                    events1 = running.metric("ccscope_bpf_probe_events_total")
                cpu1, t1 = cpu_seconds(running.proc.pid), time.monotonic()
                fractions.append((cpu1 - cpu0) / (t1 - t0))
                rates.append((events1 - events0) / (t1 - t0))
        finally:
            proc.kill()
            proc.wait()
    return Row("3. daemon CPU at ~100k tcp_probe events/s (10 ms sampling)", mean_text(fractions, 2, 100, " %"),
               "<= 2 % of a core", judge(fractions, at_most=0.02),
               f"{windows} windows of {window_s:g} s, {mean_text(rates, 0, 1e-3, 'k')} events/s (iperf3 "
               f"{' '.join(load)} on loopback), scraped every 2 s; CPU = utime+stime of the daemon from /proc "
               f"(1/{CLK_TCK} s ticks)")


# --- 4. scrape time and RSS at 10k and 100k flows ---------------------------------------------------------------------


HOLDER = """
import os, resource, selectors, socket, sys
pairs, port, cgroups = int(sys.argv[1]), int(sys.argv[2]), [int(fd) for fd in sys.argv[3:]]
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 2 * pairs + 64 + len(cgroups)), hard))
listener = socket.socket()
listener.bind(("127.0.0.1", port))
listener.listen(4096)
socks = []
for i in range(pairs):
    if cgroups:
        os.write(cgroups[i % len(cgroups)], str(os.getpid()).encode())
    client = socket.socket()
    client.connect(("127.0.0.1", port))
    socks += [client, listener.accept()[0]]
listener.close()
for sock in socks:  # every socket receives a segment while established, so tcp_probe tracks it
    sock.send(b"p")
sel = selectors.DefaultSelector()
for sock in socks:
    sel.register(sock, selectors.EVENT_READ)
left = len(socks)
while left:
    for key, _ in sel.select(timeout=30):
        key.fileobj.recv(16)
        sel.unregister(key.fileobj)
        left -= 1
print("ready", flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def held_connections(ns: str, flows: int, cgroups: Sequence[Path] = ()) -> Iterator[int]:
    """flows / 2 loopback connections (both ends tracked) held by as many processes as the open-file limit needs;
    with `cgroups`, the clients are spread over them (a socket's cgroup is its creator's when it is created) and
    the accepted sides stay in their listener's."""
    per_process = (OPEN_FILES - 200) // 2
    pairs = flows // 2
    counts = [per_process] * (pairs // per_process) + ([pairs % per_process] if pairs % per_process else [])
    # the cgroups' cgroup.procs files, opened here and inherited: `ip netns exec` mounts its own /sys, without them
    procs = [os.open(c / "cgroup.procs", os.O_WRONLY) for c in cgroups]
    try:
        holders = [subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, "-c", HOLDER, str(n), str(5500 + k),
                                     *map(str, procs)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                    pass_fds=procs)
                   for k, n in enumerate(counts)]
    finally:
        for fd in procs:
            os.close(fd)
    try:
        for holder in holders:
            if holder.stdout.readline().strip() != "ready":
                raise RuntimeError("a connection holder failed")
        yield len(holders)
    finally:
        for holder in holders:
            with contextlib.suppress(OSError):
                holder.stdin.close()
        for holder in holders:
            stop_process(holder, None, timeout=30)  # it exits when its stdin closes


def bench_scrape(flows: int, target_ms: float, labels: tuple[str, str], scrapes: int = 11) -> list[Row]:
    with netns(f"scr{flows}") as ns, daemon("--max-flows", str(max(16384, 1 << (2 * flows - 1).bit_length()))) \
            as running:
        rss_idle = rss_mb(running.proc.pid)
        with held_connections(ns, flows) as processes:
            running.scrape_text()  # the first scrape after the flows appear: the map is read cold
            times, internal = [], []
            cpu0 = cpu_seconds(running.proc.pid)
            for _ in range(scrapes):
                started = time.perf_counter()
                text = running.scrape_text()
                times.append(time.perf_counter() - started)
                internal.append(running.metric("ccscope_scrape_duration_seconds", text))
            cpu = (cpu_seconds(running.proc.pid) - cpu0) / scrapes
            tracked = running.metric("ccscope_tracked_flows", text)
            rss = rss_mb(running.proc.pid)
    median = median_interval(times)[0]
    return [
        Row(f"{labels[0]}. scrape time with {tracked:.0f} tracked flows (HTTP GET)", median_text(times, 1e3, " ms"),
            f"<= {target_ms:g} ms", median <= target_ms / 1e3 and tracked >= flows,
            f"{flows // 2} loopback connections held by {processes} processes; map read + collect "
            f"(ccscope_scrape_duration_seconds) {median_text(internal, 1e3, ' ms')}; the daemon's CPU (utime+stime) "
            f"per scrape {cpu * 1e3:.0f} ms, the wall time on a machine with a core to spare; default --flows top:50"),
        Row(f"{labels[1]}. daemon RSS with {tracked:.0f} tracked flows", f"{rss:.0f} MB", "<= 150 MB", rss <= 150,
            f"{rss_idle:.0f} MB before the flows existed; VmRSS from /proc after {scrapes + 1} scrapes"),
    ]


def bench_scrape_labels(flows: int, cgroups: int, daemon_args: tuple[str, ...], scrapes: int = 7) -> list[Row]:
    """Two daemons on the same 10k flows, one with `daemon_args`, scraped alternately (the machine's noise hits
    both alike); the clients are spread over `cgroups` cgroups named like pods' containers, with a pod log
    directory naming the pods."""
    max_flows = str(max(16384, 1 << (2 * flows - 1).bit_length()))
    pods = [(str(uuid.uuid4()), uuid.uuid4().hex * 2) for _ in range(cgroups)]
    with cgroup_tree() as tree, tempfile.TemporaryDirectory() as tmp, netns("scl") as ns:
        dirs = [tree.cgroup(kubepods_systemd(uid, container)) for uid, container in pods]
        logs = pod_logs(Path(tmp), "bench", "pod-0", pods[0][0])
        for i, (uid, _) in enumerate(pods[1:], 1):
            (logs / f"bench_pod-{i}_{uid}").mkdir()
        with daemon("--max-flows", max_flows) as plain, \
                daemon("--max-flows", max_flows, *daemon_args, "--pod-logs", str(logs)) as labelled, \
                held_connections(ns, flows, dirs):
            times: dict[str, list[float]] = {"off": [], "on": []}
            for running in (plain, labelled):
                running.scrape_text()  # the first scrape after the flows appear: the map is read cold
            for _ in range(scrapes):
                for name, running in (("off", plain), ("on", labelled)):
                    started = time.perf_counter()
                    text = running.scrape_text()
                    times[name].append(time.perf_counter() - started)
            tracked = running.metric("ccscope_tracked_flows", text)
            groups = sum(1 for line in text.splitlines() if line.startswith("ccscope_cgroup_flows{"))
            rss = {"off": rss_mb(plain.proc.pid), "on": rss_mb(labelled.proc.pid)}
    on = median_interval(times["on"])[0]
    setup = f"{tracked:.0f} tracked flows in {cgroups} pod cgroups, {' '.join(daemon_args)}"
    return [
        Row(f"4c. scrape time, {setup}, against none",
            f"{median_text(times['on'], 1e3, ' ms')} vs {median_text(times['off'], 1e3, ' ms')}",
            "<= 100 ms (4a)", on <= 0.1 and tracked >= flows,
            f"HTTP GET, {scrapes} alternating scrapes of the two daemons; default --flows top:50; {groups} "
            f"by-cgroup groups exported; per scrape off/on ms: "
            + ", ".join(f"{a * 1e3:.0f}/{b * 1e3:.0f}" for a, b in zip(times["off"], times["on"], strict=True))),
        Row(f"4d. daemon RSS, {setup}, against none", f"{rss['on']:.0f} MB vs {rss['off']:.0f} MB", "<= 150 MB (4b)",
            rss["on"] <= 150, f"VmRSS from /proc after {scrapes + 1} scrapes"),
    ]


# --- 5. ss -ti polling against ccscope trace -------------------------------------------------------------------------


def _ss_window(ns: str, seconds: float) -> tuple[float, float, float]:
    """(CPU fraction of all the ss processes, polls/s, lines per poll): `ss -tin` forked every 10 ms, its output
    read and discarded like a collector that parses it would at least have to."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    polls, lines = 0, 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        tick = time.monotonic()
        lines += subprocess.run(["ss", "-N", ns, "-tinH"], capture_output=True, text=True).stdout.count("\n")
        polls += 1
        time.sleep(max(0.0, 0.01 - (time.monotonic() - tick)))
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.monotonic() - started
    return ((after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)) / wall, polls / wall, \
        lines / max(polls, 1)


def _trace_window(ns: str, seconds: float) -> tuple[float, float, float]:
    """(CPU fraction of `ccscope trace` plus its BPF programs' run time, the BPF part alone, samples/s)."""
    trace = subprocess.Popen([*CCSCOPE, "trace", "--sample-interval", "10ms", "--json", "--state", "--netns",
                              str(netns_inode(ns))], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=ROOT)
    try:
        time.sleep(1.5)  # loaded and attached
        ids = prog_ids(trace.pid)
        bpf0 = sum(v[0] for v in prog_stats(ids).values())
        cpu0, t0 = cpu_ns(trace.pid), time.monotonic()
        samples = 0
        while time.monotonic() - t0 < seconds:
            samples += os.read(trace.stdout.fileno(), 1 << 20).count(b"\n")
        cpu1, t1 = cpu_ns(trace.pid), time.monotonic()
        bpf1 = sum(v[0] for v in prog_stats(ids).values())
    finally:
        trace.send_signal(signal.SIGINT)
        with contextlib.suppress(subprocess.TimeoutExpired):
            trace.communicate(timeout=10)
        if trace.poll() is None:
            trace.kill()
            trace.wait()
    bpf = (bpf1 - bpf0) / 1e9 / (t1 - t0)
    return (cpu1 - cpu0) / 1e9 / (t1 - t0) + bpf, bpf, samples / (t1 - t0)


def bench_vs_ss(pairs: int, seconds: float, streams: int) -> Row:
    """Same flows, same 10 ms resolution: `ss -tin` every 10 ms against `ccscope trace`, in interleaved pairs."""
    ratios, ss_cpu, trace_cpu, bpf_cpu, rates, us_per_sample, polls = [], [], [], [], [], [], []
    with netns("ss") as ns, iperf3_server(ns, 5405), bpf_stats_enabled():
        load = subprocess.Popen(["ip", "netns", "exec", ns, "iperf3", "-c", "127.0.0.1", "-p", "5405", "-t",
                                 str(pairs * (2 * seconds + 5) + 10), "-P", str(streams), "-b", "20M"],
                                stdout=subprocess.DEVNULL)
        try:
            time.sleep(1.0)
            for i in range(pairs):
                for which in (("ss", "trace") if i % 2 == 0 else ("trace", "ss")):
                    if which == "ss":
                        ss, poll_rate, lines = _ss_window(ns, seconds)
                    else:
                        cc, bpf, rate = _trace_window(ns, seconds)
                ratios.append(ss / cc)
                ss_cpu.append(ss)
                trace_cpu.append(cc)
                bpf_cpu.append(bpf)
                rates.append(rate)
                us_per_sample.append((cc - bpf) / rate * 1e6 if rate else float("nan"))
                polls.append(poll_rate)
        finally:
            load.kill()
            load.wait()
    return Row("5. CPU of `ss -tin` every 10 ms / `ccscope trace` at 10 ms", mean_text(ratios, 1, unit="x"), ">= 50x",
               judge(ratios, at_least=50),
               f"{pairs} interleaved pairs of {seconds:g} s windows; {streams} iperf3 streams (x2 sockets) at "
               f"20 Mbit/s each; ss: {mean_text(ss_cpu, 1, 100, ' %')} of a core "
               f"({statistics.mean(polls):.0f} polls/s, {lines:.0f} lines/poll); ccscope trace: "
               f"{mean_text(trace_cpu, 2, 100, ' %')} of a core, of which BPF programs "
               f"{mean_text(bpf_cpu, 2, 100, ' %')} ({statistics.mean(rates):.0f} JSON lines/s, samples and state "
               f"changes, {mean_text(us_per_sample, 1, unit=' us')} of process CPU per line); per-pair ratios "
               f"{', '.join(f'{r:.1f}' for r in ratios)}")


# --- report -----------------------------------------------------------------------------------------------------------


def render(rows: list[Row], note: str) -> str:
    lines = ["# ccscope telemetry core: benchmark", "", f"Conditions: {note}", "",
             "Each value carries its interval over the repetitions of the run (mean ± 95% CI, Student t; or a "
             "median with its order-statistic 95% CI). A mean is judged by its interval: met when all of it meets "
             "the target, MISSED when none of it does, undecided when it straddles the target.", "",
             "| measure | result | target | status |", "|---|---|---|---|"]
    lines += [f"| {r.what} | {r.value} | {r.target} | {STATUS[r.ok]} |" for r in rows]
    lines += ["", "## Details", ""]
    lines += [f"- **{r.what}**: {r.detail}" for r in rows]
    return "\n".join(lines) + "\n"


def steps(quick: bool, rounds: int | None = None) -> dict[str, Callable[[], list[Row]]]:
    rounds = rounds or (3 if quick else 7)
    return {
        "1": lambda: [bench_cpu_per_gb(pairs=4 if quick else 10, seconds=2 if quick else 5, rate="2G"),
                      bench_throughput(pairs=3 if quick else 6, seconds=2 if quick else 3)],
        "2": lambda: bench_bpf_ns(seconds=2 if quick else 5, rounds=rounds),
        "2w": lambda: bench_bpf_ns_warm(seconds=2 if quick else 5, rounds=rounds),
        "3": lambda: [bench_daemon_cpu(windows=3 if quick else 5, window_s=4 if quick else 6)],
        "4": lambda: [*bench_scrape(10_000, 100, ("4a", "4b")), *bench_scrape(100_000, 150, ("4c", "4d"))],
        "5": lambda: [bench_vs_ss(pairs=2 if quick else 4, seconds=4 if quick else 10, streams=20)],
    }


def attribution_steps(quick: bool, rounds: int | None = None) -> dict[str, Callable[[], list[Row]]]:
    """--attribution: measures 2 and 4 with labels on, each against labels off."""
    rounds = rounds or (3 if quick else 7)
    return {
        "2": lambda: bench_bpf_ns(seconds=2 if quick else 5, rounds=rounds, daemon_args=ALL_LABELS),
        "2c": lambda: [bench_bpf_ns_labels(seconds=2 if quick else 5, rounds=rounds, daemon_args=ALL_LABELS)],
        "4": lambda: bench_scrape_labels(flows=10_000, cgroups=100, daemon_args=ALL_LABELS),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="shorter runs (for trying the script out)")
    parser.add_argument("--only", help="comma-separated measures to run, e.g. 1,4 (default: all)")
    parser.add_argument("--no-write", action="store_true", help="print only, do not write the results file")
    parser.add_argument("--note", default="", help="extra words about the conditions, for the results file")
    parser.add_argument("--against", type=Path, metavar="OBJECT",
                        help="measure 2 only: this checkout's BPF object against OBJECT (another build, e.g. the last "
                             "commit's), in interleaved rounds; prints only")
    parser.add_argument("--together", action="store_true",
                        help="with --against: both objects attached at once, on the same events")
    parser.add_argument("--rounds", type=int, help="rounds of measure 2 (default: 7, with --quick 3)")
    parser.add_argument("--attribution", action="store_true",
                        help="measures 2 and 4 with labels off and on (--labels comm,cgroup,container,pod), in one "
                             f"run; writes {RESULTS_ATTRIBUTION.relative_to(ROOT)}")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/telemetry.py: needs root (BPF, namespaces, cgroups)", file=sys.stderr)
        return 3
    chosen = attribution_steps(args.quick, args.rounds) if args.attribution else steps(args.quick, args.rounds)
    if args.against and (args.only or args.attribution):
        print("bench/telemetry.py: --against is a measure of its own: not with --only or --attribution",
              file=sys.stderr)
        return 2
    if args.against and not args.against.is_file():
        print(f"bench/telemetry.py: --against {args.against}: no such file", file=sys.stderr)
        return 2
    if args.against:
        chosen = {"2ab": lambda: [bench_bpf_ns_against(seconds=2 if args.quick else 5,
                                                       rounds=args.rounds or (3 if args.quick else 7),
                                                       other=args.against.resolve(), together=args.together)]}
    if args.only:
        unknown = set(args.only.split(",")) - set(chosen)
        if unknown:
            print(f"bench/telemetry.py: --only {args.only}: no measure {', '.join(sorted(unknown))} "
                  f"(known: {', '.join(chosen)})", file=sys.stderr)
            return 2
        chosen = {k: v for k, v in chosen.items() if k in args.only.split(",")}
    rows: list[Row] = []
    for step in chosen.values():
        for row in step():
            rows.append(row)
            print(f"{row.what:<72} {row.value:>28}  target {row.target:<26} {STATUS[row.ok]}", flush=True)
    note = conditions() + (f"; {args.note}" if args.note else "")
    report = render(rows, note)
    print("\n" + report)
    if not args.no_write and not args.only and not args.against:
        results = RESULTS_ATTRIBUTION if args.attribution else RESULTS
        results.parent.mkdir(parents=True, exist_ok=True)
        results.write_text(report)
        print(f"wrote {results.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
