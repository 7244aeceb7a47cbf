#!/usr/bin/env python3
"""Per-ACK cost of ccscope's BPF congestion controls, against the kernel's built-in Reno in the same run.

    sudo .venv/bin/python bench/cc.py [--seconds 5] [--rounds 3] [--no-write]

For each round, in a shuffled order, one bulk iperf3 flow per algorithm over an emulated 50 Mbit/s path
with 10 ms RTT (ccscope's Testbed): bpf_reno (the baseline: its cong_avoid only calls the kernel's own
tcp_reno_cong_avoid), bpf_vegas, bpf_westwood, bpf_copa, bpf_prague. The kernel's BPF accounting gives every
program's run time and call count (run_time_ns, run_cnt from `bpftool prog show`, the programs found
through the struct_ops map); the sender namespace's Tcp InSegs counts the ACKs.

  own ns per call  = run_time / run_cnt - accounting cost per call
  per-ACK ns       = sum over the algorithm's programs of own time / ACKs received by the sender
  above Reno       = per-ACK ns of the algorithm - per-ACK ns of bpf_reno     (target: <= 50 ns)

The accounting cost per call is bpf_reno's empty pkts_acked program: its whole run time is the two
clock reads of the accounting itself (70-95 ns per call on this VM, see bench/results/telemetry.md).
Statistics are switched on with BPF_ENABLE_STATS (a file descriptor, so kernel.bpf_stats_enabled is
never written and other users of it are not disturbed).
Writes bench/results/cc.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ccscope.cc import provided, registry
from ccscope.emulation import PathProfile, Testbed
from ccscope.libbpf import Libbpf
from ccscope_testkit.bench import cpu_model

ROOT = Path(__file__).resolve().parents[1]

RESULTS = ROOT / "bench" / "results" / "cc.md"
ALGORITHMS = ("bpf_reno", "bpf_vegas", "bpf_westwood", "bpf_copa", "bpf_prague")
# prague needs ECN, which only a listener whose algorithm needs it too accepts from its ECN-capable SYN: its
# receiver runs it as well, and its row counts the receiver's work (cwnd_event on every data segment, the
# exact-ECE state machine; the receiver's tcp_ack() returns before cong_control with nothing in flight).
BOTH_ENDS = ("bpf_prague",)
BASELINE = "bpf_reno"
ACCOUNTING_PROG = "reno_pkts_acked"
BPF_STATS_RUN_TIME = 0
TARGET_NS = 50.0


def sh(*cmd: str) -> str:
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def struct_ops_progs(name: str) -> dict[int, str]:
    """prog id -> callback:program of the struct_ops map registered as `name`. The map is picked by the id
    the registry recorded, not by name: the map of an earlier registration of the same name lingers
    (TOBEFREE) while sockets that used it close, and its programs do not run any more."""
    map_id = registry.registrations()[name].map_id
    dump = json.loads(sh("bpftool", "struct_ops", "dump", "name", name, "-j"))
    infos = [item["bpf_map_info"]["id"] for item in dump if "bpf_map_info" in item]
    datas = [v["data"] for item in dump for k, v in item.items() if k.startswith("bpf_struct_ops_")]
    data = next(d for map_, d in zip(infos, datas, strict=True) if map_ == map_id)
    progs = {}
    for member, text in data.items():
        m = re.search(r"(\w+)/prog_id:(\d+)", str(text))
        if m:
            progs[int(m.group(2))] = f"{member}:{m.group(1)}"
    return progs


def prog_stats(ids: dict[int, str]) -> dict[str, tuple[int, int]]:
    shown = json.loads(sh("bpftool", "prog", "show", "-j"))
    return {ids[p["id"]]: (p.get("run_time_ns", 0), p.get("run_cnt", 0)) for p in shown if p["id"] in ids}


def in_segs(tb: Testbed) -> int:
    lines = tb.run(tb.sender_ns, ["cat", "/proc/net/snmp"], timeout=10).stdout.splitlines()
    tcp = [line.split() for line in lines if line.startswith("Tcp:")]
    return int(tcp[1][tcp[0].index("InSegs")])


def one_flow(name: str, progs: dict[int, str], seconds: float) -> dict:
    profile = PathProfile.from_dict("bench", {"rate": "50mbit", "delay": "5ms"}, "bench")
    with Testbed(profile) as tb:
        tb.set_algorithm(name)
        # Only the sender runs the algorithm (its namespace default; no iperf3 -C, which the server would
        # copy): the receiver's tcp_ack() on every data segment would call it too and muddle "per ACK".
        if name not in BOTH_ENDS:
            tb.run(tb.receiver_ns, ["sysctl", "-q", "-w", "net.ipv4.tcp_congestion_control=reno"], timeout=10)
        port = "5302"
        tb.popen(tb.receiver_ns, ["iperf3", "-s", "-1", "-p", port], stdout=subprocess.DEVNULL)
        time.sleep(0.3)
        before, acks_before = prog_stats(progs), in_segs(tb)
        out = tb.run(tb.sender_ns, ["iperf3", "-c", tb.receiver_addr, "-p", port, "-J", "-t", str(seconds)],
                     timeout=seconds + 30).stdout
        after, acks = prog_stats(progs), in_segs(tb) - acks_before
    end = json.loads(out)["end"]
    if end.get("sender_tcp_congestion") != name:
        raise SystemExit(f"the flow ran {end.get('sender_tcp_congestion')}, not {name}")
    calls = {p: (after[p][0] - before[p][0], after[p][1] - before[p][1]) for p in after}
    if not any(cnt for _, cnt in calls.values()):
        raise SystemExit(f"none of {name}'s programs ran during its flow (not the struct_ops map it uses?)")
    return {"acks": acks, "calls": calls, "goodput_bps": end["sum_received"]["bits_per_second"]}


def analyse(flows: dict[str, list[dict]]) -> dict[str, dict]:
    accounting = [r["calls"][p][0] / r["calls"][p][1] for r in flows[BASELINE] for p in r["calls"]
                  if p.endswith(ACCOUNTING_PROG) and r["calls"][p][1]]
    overhead = statistics.median(accounting)
    out: dict[str, dict] = {}
    for name, rounds in flows.items():
        per_ack, per_call = [], {}
        for r in rounds:
            own = 0.0
            for prog, (ns, cnt) in r["calls"].items():
                if not cnt:
                    continue
                own += ns - cnt * overhead
                per_call.setdefault(prog, []).append((ns / cnt - overhead, cnt / r["acks"]))
            per_ack.append(own / r["acks"])
        out[name] = {"per_ack_ns": statistics.median(per_ack), "per_ack_rounds": per_ack,
                     "per_call": {p: (statistics.median(v[0] for v in vs), statistics.median(v[1] for v in vs))
                                  for p, vs in per_call.items()},
                     "goodput_mbps": statistics.median(r["goodput_bps"] for r in rounds) / 1e6}
    base = out[BASELINE]["per_ack_ns"]
    for row in out.values():
        row["above_reno_ns"] = row["per_ack_ns"] - base
    out["_accounting_ns_per_call"] = {"value": overhead}
    return out


def report(result: dict[str, dict], args: argparse.Namespace, load: tuple[float, float]) -> str:
    overhead = result.pop("_accounting_ns_per_call")["value"]
    lines = ["# Per-ACK cost of ccscope's BPF congestion controls (bench/cc.py)", "",
             f"Host: kernel {platform.release()}, {os.cpu_count()} CPUs ({cpu_model()}); load average before/after "
             f"{load[0]:.2f}/{load[1]:.2f}. Path: 50 Mbit/s, 10 ms RTT (userspace backend), one iperf3 flow of "
             f"{args.seconds:g} s per algorithm, {args.rounds} rounds in shuffled order; medians over rounds.",
             f"Accounting cost per call (bpf_reno's empty pkts_acked), subtracted from every program: "
             f"{overhead:.1f} ns.", "",
             "| algorithm | own ns per ACK | above built-in Reno (ns per ACK) | target <= 50 ns "
             "| per ACK: callback ns per call x calls per ACK | goodput Mbit/s |",
             "|---|---|---|---|---|---|"]
    for name, row in result.items():
        calls = "; ".join(f"{p.split(':')[0]} {ns:.0f} x {rate:.2f}"
                          for p, (ns, rate) in sorted(row["per_call"].items()) if rate >= 0.005)
        verdict = "baseline" if name == BASELINE else ("yes" if row["above_reno_ns"] <= TARGET_NS else "NO")
        lines.append(f"| {name} | {row['per_ack_ns']:.1f} | {row['above_reno_ns']:+.1f} | {verdict} | {calls} | "
                     f"{row['goodput_mbps']:.1f} |")
    lines += ["", "bpf_reno's cong_avoid calls the kernel's tcp_reno_cong_avoid (kfunc), so its own time is the "
              "built-in Reno's work; the other rows' difference to it is what the BPF algorithm adds per ACK. "
              "Per-round values: " + "; ".join(f"{n} " + ", ".join(f"{v:.1f}" for v in r["per_ack_rounds"])
                                              for n, r in result.items()) + " ns."]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/cc.py needs root")
    load_before = os.getloadavg()[0]
    stats_fd = Libbpf().lib.bpf_enable_stats(BPF_STATS_RUN_TIME)
    if stats_fd < 0:
        raise SystemExit(f"BPF_ENABLE_STATS failed: {os.strerror(-stats_fd)}")
    flows: dict[str, list[dict]] = {name: [] for name in ALGORITHMS}
    try:
        with provided(list(ALGORITHMS), "bench/cc.py"):
            progs = {name: struct_ops_progs(name) for name in ALGORITHMS}
            for round_no in range(args.rounds):
                order = list(ALGORITHMS)
                random.Random(round_no).shuffle(order)
                for name in order:
                    flows[name].append(one_flow(name, progs[name], args.seconds))
                    print(f"round {round_no + 1}: {name} done", file=sys.stderr)
    finally:
        os.close(stats_fd)
    text = report(analyse(flows), args, (load_before, os.getloadavg()[0]))
    print(text)
    if not args.no_write:
        RESULTS.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
