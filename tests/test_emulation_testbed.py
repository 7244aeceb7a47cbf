"""The emulated network, with real namespaces and real traffic: rates, RTTs, loss, queues, algorithms,
and cleanup (also after SIGTERM and SIGKILL). Each test checks the host is left as it was found."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import statistics
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
from ccscope.emulation import PathProfile, Testbed, probe_backends, testbed
from ccscope.emulation.backends import DELAYLINE, SHAPER_HANDLE, qdisc_stats_by_handle
from ccscope.emulation.netns import iproute_in
from ccscope.emulation.profile import ETH_FRAME as FRAME
from ccscope.emulation.profile import SHORT_FLOW_PORT
from ccscope.host import state as emu_state
from ccscope.host.state import cleanup_all
from ccscope_testkit.prereqs import require, require_root, require_tools
from emulation_helpers import HostSnapshot, iperf3, tcp_ext

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def host_left_clean():
    require_root()
    require_tools("ip", "iptables", "iptables-save", "ethtool", "iperf3", "ping", "sysctl", "ss")
    require(DELAYLINE.is_file(), f"{DELAYLINE.name} not built: run make")
    before = HostSnapshot.take()
    yield
    before.assert_unchanged()


def profile(name: str = "p", **data) -> PathProfile:
    return PathProfile.from_dict(name, data, f"profiles.{name}")


def test_probe_finds_the_qdiscs_this_kernel_has():
    caps = probe_backends()
    assert "tbf" in caps.qdiscs and "htb" in caps.qdiscs
    assert caps.nfqueue and caps.delayline == DELAYLINE
    config = Path("/proc/config.gz")
    if config.exists():
        import gzip

        text = gzip.decompress(config.read_bytes()).decode()
        assert caps.netem == ("CONFIG_NET_SCH_NETEM=y" in text or "CONFIG_NET_SCH_NETEM=m" in text)


def test_cubic_flow_reaches_the_rate_and_verify_matches():
    with Testbed(profile(rate="20mbit", delay="10ms")) as tb:
        assert tb.backend == ("netem" if probe_backends().netem else "userspace")
        assert all(v == {"tso": "off", "gso": "off", "gro": "off"} for v in tb.offloads.values())
        assert len(tb.offloads) == 4
        check = tb.verify()
        assert check.ok, check.message
        assert check.rtt_measured_s == pytest.approx(check.rtt_expected_s, rel=0.02, abs=0.0005)
        assert check.rtt_expected_s == pytest.approx(0.020)  # an idle tbf's full bucket passes a ping at once
        assert check.rate_measured_bps == pytest.approx(20e6, rel=0.03)
        tb.set_algorithm("cubic")
        end = iperf3(tb, seconds=4)["end"]
        assert end["sender_tcp_congestion"] == "cubic"
        goodput = end["sum_received"]["bits_per_second"]
        # >= 90% of the link rate as goodput (the ceiling is 1448/1514 = 95.6% of the layer-2 rate)
        assert goodput >= 0.90 * 20e6, goodput
        assert goodput <= 20e6
        stats = tb.link_stats()
        assert stats["up"]["packets"] > 5000 and stats["down"]["packets"] > 1000
        assert stats["up"]["random_drops"] == 0 and stats["up"]["delay_overflows"] == 0


def test_ping_rtt_matches_an_asymmetric_profile():
    # 20 ms up + 5 ms down: the RTT is the sum of the one-way delays
    p = profile(up={"delay": "20ms"}, down={"delay": "5ms"}, rate="50mbit")
    with Testbed(p) as tb:
        before = tb.link_stats()
        rtts = tb.ping_rtts(count=10)
        assert len(rtts) == 10
        assert min(rtts) >= 0.025  # the delay line never releases early
        # Late it can be, when the machine does not run it: at 13.3 % steal the median came 0.7 ms over (a fresh
        # clone's run, 2026-11-29). What the delay lines counted as their lateness over the pings is allowed.
        late_s = sum(d["late_us"] - before[direction]["late_us"] for direction, d in tb.link_stats().items()) / 1e6
        assert statistics.median(rtts) <= 0.025 + 0.0005 + late_s / len(rtts), (rtts, late_s)
        # netns_inode is the inode a process inside the namespace sees (what BPF telemetry reports)
        sleeper = tb.popen(tb.sender_ns, ["sleep", "5"])
        deadline = time.monotonic() + 2
        while Path(f"/proc/{sleeper.pid}/comm").read_text().strip() != "sleep" and time.monotonic() < deadline:
            time.sleep(0.01)  # until `ip netns exec` has become sleep
        assert os.stat(f"/proc/{sleeper.pid}/ns/net").st_ino == tb.netns_inode(tb.sender_ns)
        assert tb.netns_inode(tb.sender_ns) != tb.netns_inode(tb.receiver_ns)


def test_one_percent_loss_causes_retransmits():
    with Testbed(profile(rate="20mbit", delay="5ms", up={"loss": "1%"})) as tb:
        tb.set_algorithm("cubic")
        end = iperf3(tb, seconds=2)["end"]
        assert end["sum_sent"]["retransmits"] > 0
        up = tb.link_stats()["up"]
        offered = up["packets"] + up["random_drops"]
        assert offered > 1000
        # binomial(n, 1%): well within 0.4%..1.8% for n > 1000
        assert 0.004 <= up["random_drops"] / offered <= 0.018, up
        assert tb.link_stats()["down"]["random_drops"] == 0


def test_set_algorithm_is_the_algorithm_that_runs():
    with Testbed(profile(rate="50mbit", delay="2ms")) as tb:
        for algorithm in ("reno", "cubic", "bbr"):
            tb.set_algorithm(algorithm)
            end = iperf3(tb, seconds=1, omit=0)["end"]
            assert end["sender_tcp_congestion"] == algorithm
            assert end["receiver_tcp_congestion"] == algorithm
            allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read_text().split()
            assert algorithm in allowed


def shaper_backlogs(tb: Testbed, stop: threading.Event, out: list[int]) -> None:
    """Appends the up bottleneck's backlog (bytes, as tbf reports it) every 10 ms until stop is set."""
    def poll(ipr) -> None:
        idx = ipr.link_lookup(ifname="veth-rr")[0]
        while not stop.wait(0.01):
            out.append(qdisc_stats_by_handle(ipr, idx)[SHAPER_HANDLE]["backlog"])
    iproute_in(tb.router_ns, poll)


def loaded_rtt(queue: str, fill_packets: int) -> tuple[list[float], list[int], dict]:
    """Ping RTTs and the bottleneck's backlog while a cubic flow fills a 10 Mbit/s, 20 ms RTT path with
    the given queue. The pings start once the shaper reports fill_packets queued (slow start and its
    losses take longer on a busy machine), polled against a deadline."""
    with Testbed(profile(rate="10mbit", delay="10ms", queue=queue)) as tb:
        tb.set_algorithm("cubic")
        result: dict = {}
        flow = threading.Thread(target=lambda: result.update(iperf3(tb, seconds=8, omit=0)))
        flow.start()
        stop, backlogs = threading.Event(), []
        sampler = threading.Thread(target=shaper_backlogs, args=(tb, stop, backlogs))
        sampler.start()
        try:
            deadline = time.monotonic() + 5
            while not (backlogs and backlogs[-1] >= fill_packets * FRAME) and time.monotonic() < deadline:
                time.sleep(0.01)
            assert backlogs and backlogs[-1] >= fill_packets * FRAME, f"queue never filled: {backlogs[-20:]}"
            during = len(backlogs)
            rtts = tb.ping_rtts(count=10, interval=0.1)
            backlogs_during = backlogs[during:]
        finally:
            stop.set()
            sampler.join()
            flow.join()
        assert result["end"]["sum_received"]["bits_per_second"] > 0.8 * 10e6
        return rtts, backlogs_during, tb.link_stats()["up"]


def test_larger_queue_gives_higher_rtt_under_load():
    small_rtts, small_q, small_stats = loaded_rtt("10p", fill_packets=5)
    large_rtts, large_q, _ = loaded_rtt("150p", fill_packets=100)
    small, large = statistics.median(small_rtts), statistics.median(large_rtts)
    # what the shaper held: never more than its 10 packets, and dropping; the large one far more
    assert max(small_q) <= 10 * FRAME and small_stats["queue_drops"] > 0
    assert statistics.median(large_q) >= 60 * FRAME, large_q
    # each queue's RTT is the base RTT plus the time to drain what the shaper held (10 Mbit/s)
    for rtt, held in ((small, small_q), (large, large_q)):
        assert rtt == pytest.approx(0.020 + statistics.median(held) * 8 / 10e6, abs=0.015), (rtt, held)
    assert small < 0.020 + 0.020, small
    assert large > small + 0.060, (small, large)


def test_a_full_slow_queue_does_not_starve_neighbour_discovery():
    """Seed 002's 10 kbit/s link with 6 full frames queued (7.3 s to drain): a new connection waits for the
    queue, as on a wire, instead of failing with "No route to host" because ARP's answer sat behind the data
    (3 probes, 1 s apart). The flush removes every neighbour entry that is not pinned."""
    with Testbed(profile(rate="10kbit", delay="10ms")) as tb:
        server = tb.popen(tb.sender_ns, [sys.executable, "-m", "ccscope.scenario.fetch", "serve", "--port",
                                         str(SHORT_FLOW_PORT), "--cc", "cubic"])
        try:
            tb.wait_listening(tb.sender_ns, SHORT_FLOW_PORT)
            tb.run(tb.sender_ns, ["ping", "-q", "-c", "6", "-i", "0.01", "-s", "1472", "-w", "1",
                                  tb.receiver_addr], timeout=10)
            stop, backlogs = threading.Event(), []
            sampler = threading.Thread(target=shaper_backlogs, args=(tb, stop, backlogs))
            sampler.start()
            try:
                deadline = time.monotonic() + 2
                while not (backlogs and backlogs[-1] >= 4 * FRAME) and time.monotonic() < deadline:
                    time.sleep(0.01)
            finally:
                stop.set()
                sampler.join()
            assert backlogs and backlogs[-1] >= 4 * FRAME, backlogs[-5:]  # >= 4.8 s still to drain
            for ns, dev in ((tb.router_ns, "veth-rr"), (tb.receiver_ns, "veth-r")):
                tb.run(ns, ["ip", "neigh", "flush", "dev", dev], timeout=5)
            got = tb.run(tb.receiver_ns, [sys.executable, "-m", "ccscope.scenario.fetch", "get", "--server",
                                          f"{tb.sender_addr}:{SHORT_FLOW_PORT}", "--sizes", "1000", "--timeout",
                                          "20"], timeout=30)
        finally:
            testbed.terminate(server)
        record = json.loads(got.stdout)
        assert record["error"] is None and record["complete"], record
        assert record["completion_time_s"] >= 4.8 - 1.5, record  # it did wait behind the queue


def test_trace_link_delivers_the_trace_rate(tmp_path):
    trace = tmp_path / "12mbit.trace"
    trace.write_text("".join(f"{i}\n" for i in range(1, 101)))  # one 1500-byte opportunity per ms
    with Testbed(profile(delay="5ms", up={"trace": str(trace), "queue": "50p"})) as tb:
        rate = tb.udp_rate(15e6, seconds=2)
        assert rate == pytest.approx(12e6 * 1514 / 1500, rel=0.04)
        assert tb.link_stats()["up"]["queue_drops"] > 0
        assert statistics.median(tb.ping_rtts(count=5)) == pytest.approx(0.010, abs=0.0025)


def test_the_rate_probe_and_its_iperf3_share_one_cpu(monkeypatch):
    """A CPU the host stops must stop the probe too (testbed._on_one_cpu): the thread that reads the counters
    and iperf3's client run on one CPU, and the caller has all its CPUs back afterwards."""
    seen: dict[str, set[int]] = {}
    sample = testbed._egress_samples

    def watched(ipr, client, *args):
        seen["probe"], seen["iperf3"] = os.sched_getaffinity(0), os.sched_getaffinity(client.pid)
        return sample(ipr, client, *args)

    monkeypatch.setattr(testbed, "_egress_samples", watched)
    before = os.sched_getaffinity(0)
    with Testbed(profile(rate="10mbit", delay="5ms")) as tb:
        assert tb.udp_rate(15e6) == pytest.approx(10e6, rel=0.03)
    assert len(seen["probe"]) == 1 and seen["iperf3"] == seen["probe"], seen
    assert os.sched_getaffinity(0) == before


REORDER_COUNTERS = ("TcpExtTCPSACKReorder", "TcpExtTCPTSReorder", "TcpExtTCPRenoReorder")
REORDER_ALLOWED = 16  # of the three counters together (test_jitter_keeps_packet_order)


def test_jitter_keeps_packet_order():
    """4 ms of jitter on 10 ms, and pings 2 ms apart: a delay line that drew each packet's delay alone would
    swap many neighbours (their delays differ by up to 16 ms over the round trip). Order is kept: ping's
    replies arrive in sequence, and the sender's kernel sees next to no reordering (what SACKs and timestamps
    reveal) against a flow that fills the link. Such a delay line made 1612 SACK reorderings in one such flow.

    Next to none, not none: a veth hands a packet to the backlog of the CPU that sends it, and a TCP sender, the
    delay line's verdicts and the shaper's timer send from both CPUs; when the host stops one CPU in between,
    the other's later packets overtake. Under 10-21 % steal, 5 of 18 such flows had 1-10 SACK and 0-3
    timestamp reorderings (none on a quiet machine). Steering each veth's flows to one CPU (RPS) removed them
    (0 of 17) but made a packet wait for a stopped CPU, which cost the suite more (reverted, see git log). So
    REORDER_ALLOWED, a hundredth of what a delay line that reorders makes."""
    with Testbed(profile(rate="20mbit", delay="10ms", jitter="4ms")) as tb:
        tb.ping_rtts(count=1)  # ARP
        out = tb.run(tb.sender_ns, ["ping", "-n", "-c", "200", "-i", "0.002", "-W", "2", tb.receiver_addr],
                     timeout=30).stdout
        seqs = [int(x) for x in re.findall(r"icmp_seq=(\d+)", out)]
        rtts = [float(x) for x in re.findall(r"time=([0-9.]+) ms", out)]
        assert len(seqs) >= 190 and max(rtts) - min(rtts) > 4, out[-500:]  # the delay varies
        assert seqs == sorted(seqs), [(a, b) for a, b in itertools.pairwise(seqs) if b < a][:10]
        tb.set_algorithm("cubic")
        before = tcp_ext(tb, tb.sender_ns, *REORDER_COUNTERS)
        end = iperf3(tb, seconds=2)["end"]
        after = tcp_ext(tb, tb.sender_ns, *REORDER_COUNTERS)
        reordered = {k: after[k] - before[k] for k in REORDER_COUNTERS}
        assert sum(reordered.values()) <= REORDER_ALLOWED, reordered
        assert end["sum_received"]["bits_per_second"] > 0.8 * 20e6


CHILD = textwrap.dedent("""
    import sys, time
    from ccscope.emulation import PathProfile, Testbed
    p = PathProfile.from_dict("k", {"rate": "10mbit", "delay": "5ms", "loss": "0.1%"}, "k")
    with Testbed(p) as tb:
        tb.set_algorithm(sys.argv[1])
        tb.popen(tb.receiver_ns, ["iperf3", "-s"])
        tb.popen(tb.sender_ns, ["ping", "-q", tb.receiver_addr])
        print(" ".join(tb.namespaces), flush=True)
        time.sleep(60)
""")


def spawn_child(algorithm: str) -> tuple[subprocess.Popen, list[str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "daemon")}
    child = subprocess.Popen([sys.executable, "-c", CHILD, algorithm], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, text=True, env=env)
    namespaces = child.stdout.readline().split()
    assert len(namespaces) == 3, "child testbed did not come up"
    assert all(Path("/run/netns", ns).exists() for ns in namespaces)
    return child, namespaces


def not_allowed_algorithm() -> str:
    allowed = Path("/proc/sys/net/ipv4/tcp_allowed_congestion_control").read_text().split()
    missing = [a for a in ("cubic", "reno", "bbr") if a not in allowed]
    return missing[0] if missing else "cubic"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_ctrl_c_remove_everything(sig):
    child, namespaces = spawn_child(not_allowed_algorithm())
    child.send_signal(sig)
    code = child.wait(timeout=15)
    # SIGTERM: our handler's SystemExit(143); SIGINT: KeyboardInterrupt, which Python ends by re-killing
    # itself with SIGINT after the with-block cleaned up
    assert code == (128 + sig if sig == signal.SIGTERM else -signal.SIGINT)
    assert not any(Path("/run/netns", ns).exists() for ns in namespaces)


def test_sigkill_then_cleanup_all_removes_everything():
    algorithm = not_allowed_algorithm()
    child, namespaces = spawn_child(algorithm)
    child.kill()
    child.wait(timeout=5)
    # the run's namespaces, delay lines, iperf3 and ping survive the kill ...
    assert all(Path("/run/netns", ns).exists() for ns in namespaces)
    assert emu_state.namespace_pids(namespaces[1])  # the delay lines
    # ... until cleanup_all(), which leaves other live runs on this machine alone
    removed = cleanup_all(include_live=False)
    assert {f"netns {ns}" for ns in namespaces} <= set(removed)
    assert any("ccscope-delayli" in r for r in removed)
    assert not any(Path("/run/netns", ns).exists() for ns in namespaces)


def test_two_runs_coexist():
    with Testbed(profile(delay="5ms")) as a, Testbed(profile(delay="15ms")) as b:
        assert not set(a.namespaces) & set(b.namespaces)
        assert statistics.median(a.ping_rtts(count=5)) == pytest.approx(0.010, abs=0.0015)
        assert statistics.median(b.ping_rtts(count=5)) == pytest.approx(0.030, abs=0.0015)
    assert not any(Path("/run/netns", ns).exists() for ns in a.namespaces + b.namespaces)


def wait_slow_start_over(tb: Testbed, timeout_s: float = 10) -> None:
    """Until the up bottleneck has dropped a packet: the bulk flow's slow start overflowed the queue, which is
    full then. Polled against a deadline: slow start and its losses take longer on a busy machine."""
    def drops(ipr) -> int:
        return sum(q["drops"] for q in qdisc_stats_by_handle(ipr, ipr.link_lookup(ifname="veth-rr")[0]).values())

    deadline = time.monotonic() + timeout_s
    while not iproute_in(tb.router_ns, drops):
        assert time.monotonic() < deadline, f"no drop at the bottleneck in {timeout_s} s"
        time.sleep(0.01)


def short_flows_under_load(isolate: str | None) -> tuple[list[float], list[dict], dict, dict]:
    """Pings and 100 KB downloads (port 5300) behind a cubic flow on 10 Mbit/s, 20 ms RTT, 100 packets."""
    p = profile(rate="10mbit", delay="10ms", queue="100p", **({"isolate": isolate} if isolate else {}))
    with Testbed(p) as tb:
        tb.set_algorithm("cubic")
        env = {**os.environ, "PYTHONPATH": str(ROOT / "daemon")}
        tb.popen(tb.sender_ns, [sys.executable, "-m", "ccscope.scenario.fetch", "serve", "--port",
                                str(SHORT_FLOW_PORT), "--cc", "cubic"], env=env, stderr=subprocess.DEVNULL)
        result: dict = {}
        flow = threading.Thread(target=lambda: result.update(iperf3(tb, seconds=6, omit=0)))
        flow.start()
        wait_slow_start_over(tb)
        fetches = tb.popen(tb.receiver_ns, [sys.executable, "-m", "ccscope.scenario.fetch", "get", "--server",
                                            f"{tb.sender_addr}:{SHORT_FLOW_PORT}", "--sizes", "100000",
                                            "--timeout", "5", "--every", "1", "--until", "3"],
                           env=env, stdout=subprocess.PIPE, text=True)
        rtts = tb.ping_rtts(count=25, interval=0.1)
        out, _ = fetches.communicate(timeout=20)
        flow.join()
        goodput = result["end"]["sum_received"]["bits_per_second"]
        return rtts, [json.loads(line) for line in out.splitlines()], tb.link_stats()["up"], \
            {"goodput": goodput, "installed": tb.installed, "lateness_s": tb.machine_lateness_s()}


def test_isolating_short_flows_keeps_their_latency_low():
    """Seed 004's fix: with a large bulk queue, ping and short downloads get their own queue (htb)."""
    shared_rtts, shared_dl, shared_link, _ = short_flows_under_load(None)
    iso_rtts, iso_dl, iso_link, iso = short_flows_under_load("short")
    quartile = lambda xs, k: statistics.quantiles(xs, n=4)[k - 1]  # noqa: E731
    # Shared, every ping waits behind the bulk flow's standing queue: cubic's sawtooth in the 100-packet
    # queue (120 ms full at 10 Mbit/s). Four runs: pings 74-139 ms, first quartile 86-104 ms.
    assert quartile(shared_rtts, 1) > 0.020 + 0.040, shared_rtts
    # Isolated, a ping waits only behind the interactive queue. Three of the 25 pings (one per second,
    # the download's start) share it with a download's first burst: 1 BDP (25 KB) at >= 90 % of
    # 10 Mbit/s, at most 22 ms more (measured 25-42 ms, with two busy loops 37-42 ms); the rest see
    # the path's 20 ms. The old check, p95 < half the shared p95, sat on those three, so one more late
    # ping (~100 ms; the VM stalls for 15-97 ms about once a minute, see pathcheck) failed CI with a
    # p95 of 83 ms. The third quartile, and the middle of the three highest, tolerate such a ping. Beside
    # two busy loops two such pings came in one train (90.7, 95.5 ms), the middle of the three highest
    # then among them; a late ping carries the delay lines' own record of the machine's stall, which the
    # bound adds (their worst release after its due time, up and down: ~0 quiet).
    assert quartile(iso_rtts, 3) < 0.020 + 0.005, iso_rtts
    interactive_drain_s = 25_000 * 8 / (0.9 * 10e6)
    assert statistics.median(sorted(iso_rtts)[-3:]) < 0.020 + interactive_drain_s + 0.010 + iso["lateness_s"], (
        iso_rtts, iso["lateness_s"])
    assert len(shared_dl) == len(iso_dl) == 3 and all(d["complete"] for d in shared_dl + iso_dl)
    shared_t = [d["completion_time_s"] for d in shared_dl]
    iso_t = [d["completion_time_s"] for d in iso_dl]
    assert max(iso_t) < 0.6 * min(shared_t), (iso_t, shared_t)
    # the bulk flow still gets the link when the short flows are idle (ceil = rate)
    assert iso["goodput"] > 0.85 * 10e6
    installed = iso["installed"]["up"]
    assert installed["isolate"]["interactive_match"] == ["icmp", f"port {SHORT_FLOW_PORT}"]
    assert any(q.startswith("htb 2:") for q in installed["qdiscs"])
    # ping and downloads went through the interactive class, the bulk flow through its own one
    assert iso_link["interactive_packets"] > 200 and iso_link["bulk_packets"] > 3000  # 3 x 70 + 25 pings
    assert iso_link["bulk_drops"] > 0
    assert iso_link["queue_drops"] == iso_link["bulk_drops"] + iso_link["interactive_drops"]
    assert "interactive_packets" not in shared_link
