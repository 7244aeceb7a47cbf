"""`aqm:` on a link profile and `ecn:` on a profile: CoDel in ccscope's delay line, dropping and marking.

What CoDel does to a whole scenario (pings, downloads, goodput, drops against retransmits, marks) is claimed
on the bufferbloat built-in's codel profiles at full length (tests/test_scenario_full.py); here: the keys, the
delay line's marks against the receiver's kernel, and the sojourn histogram. The parse tests need no root."""

from __future__ import annotations

import json
import statistics
import subprocess
import textwrap
import threading
import time
from pathlib import Path

import pytest
from ccscope.emulation import Testbed, aqm, kernel_aqm, sojourn
from ccscope.emulation.profile import LinkProfile, PathProfile
from ccscope.errors import PrerequisiteError, UsageError
from ccscope.flows import decode
from ccscope.loader import ProbeOptions, TelemetryProbe
from ccscope.scenario.emulated import late_share
from ccscope_testkit.prereqs import require_bpf_object, require_root, require_tools
from emulation_helpers import iperf3, tcp_ext


@pytest.mark.parametrize(("raw", "expected"), [
    ("codel", aqm.Aqm("codel", 0.005, 0.100)),
    ({"name": "codel", "target": "2ms", "interval": "50ms"}, aqm.Aqm("codel", 0.002, 0.050)),
    ("fifo", aqm.Aqm("fifo")),
    ("fq_codel", aqm.Aqm("fq_codel", 0.005, 0.100, ecn=True)),  # marks by default, as the kernel's
    ({"name": "fq_codel", "ecn": False}, aqm.Aqm("fq_codel", 0.005, 0.100)),
    ("pie", aqm.Aqm("pie", 0.015, tupdate_s=0.015)),  # drops by default, as the kernel's
    ({"name": "pie", "target": "5ms", "ecn": True}, aqm.Aqm("pie", 0.005, ecn=True, tupdate_s=0.015)),
    ("dualpi2", aqm.Aqm("dualpi2", 0.015, ecn=True, tupdate_s=0.016, step_s=0.001, coupling=2.0, ecn_mask="l4s_ect")),
    ({"name": "dualpi2", "step": "2ms", "coupling": 1.5, "ecn_mask": "any_ect"},
     aqm.Aqm("dualpi2", 0.015, ecn=True, tupdate_s=0.016, step_s=0.002, coupling=1.5, ecn_mask="any_ect")),
])
def test_an_aqm_is_named_with_its_parameters(raw, expected) -> None:
    link = LinkProfile.from_dict({"rate": "10mbit", "queue": "100p", "aqm": raw}, "profiles.x.up")
    assert link.aqm == expected
    assert link.in_delayline is expected.manages  # CoDel's link: rate and queue in the delay line


@pytest.mark.parametrize(("data", "line"), [
    ({"rate": "10mbit", "aqm": "codle"},
     "profiles.x.up.aqm: 'codle' is not an AQM (known: fifo, codel, fq_codel, pie, fq_pie, cake, dualpi2)"),
    ({"rate": "10mbit", "aqm": {"name": "cake", "implementation": "ccscope"}},
     "profiles.x.up.aqm.implementation: ccscope's delay line has no cake (cake: the kernel's sch_cake alone "
     "(Linux 4.19 and later; Debian's and Ubuntu's stock kernels have it), under the netem backend); it runs fifo, "
     "codel, fq_codel, pie, fq_pie, dualpi2"),
    ({"rate": "10mbit", "aqm": {"name": "fifo", "implementation": "kernel"}},
     "profiles.x.up.aqm.implementation: unknown key for fifo (known: name)"),
    ({"rate": "10mbit", "aqm": {"name": "codel", "implementation": "tc"}},
     "profiles.x.up.aqm.implementation: 'tc' is not an implementation (known: auto, kernel, ccscope)"),
    ({"rate": "10mbit", "aqm": {"name": "cake", "target": "5ms"}},
     "profiles.x.up.aqm.target: unknown key for cake (known: name, implementation)"),
    ({"rate": "10mbit", "aqm": {"name": "dualpi2", "ecn": False}},
     "profiles.x.up.aqm.ecn: unknown key for dualpi2 (known: name, target, tupdate, step, coupling, ecn_mask, "
     "implementation)"),
    ({"rate": "10mbit", "aqm": {"name": "dualpi2", "ecn_mask": "ect1"}},
     "profiles.x.up.aqm.ecn_mask: 'ect1' is not a DualPI2 classifier (known: l4s_ect, cla_ect, any_ect)"),
    ({"rate": "10mbit", "aqm": {"name": "dualpi2", "coupling": 0.5}},
     "profiles.x.up.aqm.coupling: expected a number from 1 to 16 (RFC 9332: 2), got 0.5"),
    ({"rate": "10mbit", "aqm": {"name": "pie", "interval": "100ms"}},
     "profiles.x.up.aqm.interval: unknown key for pie (known: name, target, tupdate, ecn, implementation)"),
    ({"rate": "10mbit", "aqm": {"name": "codel", "tagret": "5ms"}},
     "profiles.x.up.aqm.tagret: unknown key for codel (known: name, target, interval, ecn, implementation)"),
    ({"rate": "10mbit", "aqm": {"name": "codel", "target": "200ms"}},
     "profiles.x.up.aqm.target: 200ms is not below the interval 100ms (RFC 8289: 5 % to 10 % of it)"),
    ({"rate": "10mbit", "aqm": {"target": "5ms"}},
     "profiles.x.up.aqm: the mapping needs `name`, the AQM (fifo, codel, fq_codel, pie, fq_pie, cake, dualpi2)"),
    ({"rate": "10mbit", "aqm": {"name": None}},
     "profiles.x.up.aqm: None is not an AQM (known: fifo, codel, fq_codel, pie, fq_pie, cake, dualpi2)"),
    ({"rate": "10mbit", "aqm": ["codel"]},
     "profiles.x.up.aqm: expected an AQM's name (fifo, codel, fq_codel, pie, fq_pie, cake, dualpi2) or a mapping "
     "with `name`, got ['codel']"),
    ({"aqm": "codel"}, "profiles.x.up.aqm: an AQM manages a bottleneck queue; give a rate"),
    ({"rate": "10mbit", "aqm": "codel", "isolate": "short"},
     "profiles.x.up.aqm: give either aqm or isolate (isolate's two drop-tail queues are a cure of their own)"),
])
def test_a_bad_aqm_is_one_line(data, line) -> None:
    with pytest.raises(UsageError) as info:
        LinkProfile.from_dict(data, "profiles.x.up")
    assert info.value.line() == line


def test_a_trace_link_with_codel_is_refused_in_one_line(tmp_path: Path) -> None:
    trace = tmp_path / "t.trace"
    trace.write_text("1\n2\n")
    with pytest.raises(UsageError) as info:
        LinkProfile.from_dict({"trace": str(trace), "aqm": "codel"}, "profiles.x.up")
    assert info.value.line() == "profiles.x.up.aqm: ccscope's delay line runs an AQM at a rate, not on a trace"


def test_sojourn_percentiles_from_the_delay_lines_buckets() -> None:
    """Bucket i holds [2^(i/4), 2^((i+1)/4)) us (delayline.c); a percentile is its bucket's geometric middle."""
    buckets = {52: 90, 60: 10}  # 8.2-9.8 ms, and 32.8-39.0 ms
    got = sojourn.summaries({f"sojourn_bucket_{i}": n for i, n in buckets.items()})
    assert list(got) == ["sojourn"] and got["sojourn"]["count"] == 100
    assert got["sojourn"]["median_ms"] == pytest.approx(2 ** (52.5 / 4) / 1e3)
    assert got["sojourn"]["p95_ms"] == pytest.approx(2 ** (60.5 / 4) / 1e3)
    assert sojourn.summaries({}) == {}


def test_dualpi2s_queues_apart() -> None:
    """The L queue's packets are counted twice: in every packet's buckets and in their own; C's are the rest."""
    stats = {"sojourn_bucket_4": 80, "sojourn_bucket_60": 20, "sojourn_l_bucket_4": 80}  # 2 us and 33-39 ms
    got = sojourn.summaries(stats)
    assert got["sojourn_l"]["count"] == 80 and got["sojourn_l"]["p99_ms"] == pytest.approx(2 ** (4.5 / 4) / 1e3)
    assert got["sojourn_c"]["count"] == 20 and got["sojourn_c"]["median_ms"] == pytest.approx(2 ** (60.5 / 4) / 1e3)


def test_a_path_profile_with_codel_both_ways() -> None:
    profile = PathProfile.from_dict("p", {"rate": "10mbit", "delay": "5ms", "aqm": "codel"}, "profiles.p")
    assert profile.up.aqm == profile.down.aqm == aqm.Aqm("codel", 0.005, 0.1)
    assert json.dumps(profile.up.aqm.as_dict())


@pytest.mark.parametrize(("raw", "backend", "qdiscs", "implementation"), [
    ("codel", "netem", {"netem", "tbf", "codel"}, "kernel"),  # auto: the kernel's where it runs
    ("codel", "netem", {"netem", "tbf"}, "ccscope"),  # no sch_codel
    ("codel", "userspace", {"tbf", "codel"}, "ccscope"),  # no netem: the delay line owns the link
    ({"name": "codel", "implementation": "ccscope"}, "netem", {"netem", "tbf", "codel"}, "ccscope"),
    ("dualpi2", "netem", {"netem", "tbf", "dualpi2"}, "kernel"),
    ({"name": "dualpi2", "coupling": 1.5}, "netem", {"netem", "tbf", "dualpi2"}, "ccscope"),  # the kernel's: a u8
    ("cake", "netem", {"netem", "tbf", "cake"}, "kernel"),
])
def test_an_aqm_runs_in_the_kernel_where_netem_and_its_qdisc_are(raw, backend, qdiscs, implementation) -> None:
    profile = PathProfile.from_dict("p", {"rate": "10mbit", "aqm": raw}, "profiles.p")
    resolved = kernel_aqm.resolve(profile, backend, frozenset(qdiscs))
    assert resolved.up.aqm.implementation == resolved.down.aqm.implementation == implementation
    assert resolved.up.in_delayline is (implementation == "ccscope")
    assert kernel_aqm.resolve(resolved, backend, frozenset(qdiscs)) == resolved  # a second resolve keeps it


@pytest.mark.parametrize(("raw", "backend", "qdiscs", "line"), [
    ({"name": "codel", "implementation": "kernel"}, "userspace", {"tbf", "codel"},
     "profiles.p.up.aqm: the kernel's codel runs under the netem backend only (this run: userspace)"),
    ({"name": "pie", "implementation": "kernel"}, "netem", {"netem", "tbf"},
     "profiles.p.up.aqm: the kernel's pie is not in this kernel (sch_pie; Debian's and Ubuntu's stock kernels "
     "have it, and tools/kernel-lab --kernel 7.2 boots one)"),
    ({"name": "dualpi2", "coupling": 1.5, "implementation": "kernel"}, "netem", {"netem", "tbf", "dualpi2"},
     "profiles.p.up.aqm: the kernel's dualpi2 takes a whole coupling only, not 1.5"),
    ("cake", "userspace", {"tbf"}, "profiles.p.up.aqm: the kernel's cake is not in this kernel (sch_cake; Debian's "
     "and Ubuntu's stock kernels have it, and tools/kernel-lab --kernel 7.2 boots one)"),
])
def test_a_kernel_aqm_that_cannot_run_is_one_line(raw, backend, qdiscs, line) -> None:
    profile = PathProfile.from_dict("p", {"rate": "10mbit", "aqm": raw}, "profiles.p")
    with pytest.raises(PrerequisiteError) as info:
        kernel_aqm.resolve(profile, backend, frozenset(qdiscs))
    assert str(info.value) == line


def test_the_kernels_codel_on_this_vm_is_refused_and_leaves_nothing() -> None:
    """This VM has no sch_codel and no netem: `implementation: kernel` is one line from the testbed, before any
    namespace is made."""
    require_root()
    profile = PathProfile.from_dict("k", {"rate": "10mbit", "aqm": {"name": "codel", "implementation": "kernel"}},
                                    "profiles.k")
    before = set(Path("/run/netns").iterdir()) if Path("/run/netns").exists() else set()
    with pytest.raises(PrerequisiteError) as info, Testbed(profile):
        pass
    assert str(info.value).startswith("profiles.k.up.aqm: the kernel's codel ")
    assert (set(Path("/run/netns").iterdir()) if Path("/run/netns").exists() else set()) == before


def test_the_delay_line_refuses_codel_without_a_rate() -> None:
    from ccscope.emulation.backends import DELAYLINE

    ran = subprocess.run([str(DELAYLINE), "--queue", "9", "--aqm", "codel"], capture_output=True, text=True,
                         timeout=10, check=False)
    assert ran.returncode == 2 and textwrap.dedent(ran.stderr).startswith("usage: ccscope-delayline")


def test_codel_with_ecn_marks_instead_of_dropping(machine_share) -> None:
    """CoDel with ecn on, ECN (RFC 3168) at both ends: the delay line marks where it would drop, and the
    receiver's kernel counts the same number of CE packets arriving (an iptables ecn match in its namespace:
    after the IP header checksum check, so a bad rewrite would show as too few). The flow retransmits only
    what the hard limit dropped in slow start. ccscope's per-flow counters: the bulk flow negotiated classic
    ECN, and the flows' delivered_ce_packets add up to the sender namespace's TcpExtTCPDeliveredCE, which the
    kernel counts at the same place (tcp_count_delivered), so exactly; each packet an ECE-flagged ACK covers
    counts, so at least the marks. The host's tcp_ecn is left alone."""
    require_root()
    require_tools("iperf3", "nstat", "sysctl", "iptables")
    require_bpf_object()
    host_ecn = Path("/proc/sys/net/ipv4/tcp_ecn").read_text()
    profile = PathProfile.from_dict("marks", {"rate": "20mbit", "delay": "10ms", "queue": "200p", "ecn": "on",
                                              "up": {"aqm": {"name": "codel", "ecn": True}}}, "profiles.marks")
    with Testbed(profile) as tb, TelemetryProbe(ProbeOptions()) as probe:
        for ns in (tb.sender_ns, tb.receiver_ns):
            assert tb.run(ns, ["sysctl", "-n", "net.ipv4.tcp_ecn"], timeout=5).stdout.strip() == "1"
        tb.run(tb.receiver_ns, ["iptables", "-A", "INPUT", "-m", "ecn", "--ecn-ip-ect", "3"], timeout=5)
        before = tb.link_stats()["up"]
        sent = iperf3(tb, "-C", "cubic", seconds=5, omit=0)["end"]["sum_sent"]
        tb.wait_drained()
        duplicates = _duplicates_received(tb)
        up = {k: v - before.get(k, 0) for k, v in tb.link_stats()["up"].items() if isinstance(v, int)}
        rule = tb.run(tb.receiver_ns, ["iptables", "-L", "INPUT", "-v", "-x", "-n"], timeout=5).stdout
        delivered_ce = tcp_ext(tb, tb.sender_ns, "TcpExtTCPDeliveredCE")["TcpExtTCPDeliveredCE"]
        sender_netns = tb.netns_inode(tb.sender_ns)
        flows = [f for f in map(decode, probe.read_flows()) if f.netns == sender_netns]
    ce_arrived = int(next(line for line in rule.splitlines() if "ECN match" in line).split()[0])
    assert up["aqm_marks"] > 0 and up["aqm_drops"] == 0, up
    assert ce_arrived == up["aqm_marks"], (ce_arrived, up)
    assert sum(f.delivered_ce_packets for f in flows) == delivered_ce >= up["aqm_marks"], (flows, delivered_ce)
    bulk = max(flows, key=lambda f: f.bytes_acked)
    assert bulk.ecn == "ecn" and bulk.delivered_packets > bulk.delivered_ce_packets > 0, bulk
    assert sent["retransmits"] - duplicates <= up["queue_drops"] + 2, (sent["retransmits"], duplicates, up)
    assert sent["bits_per_second"] > 0.9 * 20e6 * 1448 / 1514 * machine_share(this_test=True)
    assert Path("/proc/sys/net/ipv4/tcp_ecn").read_text() == host_ecn


def test_accecn_is_set_or_refused_in_one_line() -> None:
    """`ecn: accecn` sets tcp_ecn=3 in both namespaces where the kernel takes it in a fresh namespace (checked
    apart, with sysctl); where it does not (this VM's 6.18 allows 0-2 there) it is one line, and no testbed is
    left behind."""
    require_root()
    profile = PathProfile.from_dict("acc", {"rate": "10mbit", "ecn": "accecn"}, "profiles.acc")
    before = set(Path("/run/netns").iterdir()) if Path("/run/netns").exists() else set()
    if _takes_accecn():
        with Testbed(profile) as tb:
            for ns in (tb.sender_ns, tb.receiver_ns):
                assert tb.run(ns, ["sysctl", "-n", "net.ipv4.tcp_ecn"], timeout=5).stdout.strip() == "3"
    else:
        with pytest.raises(PrerequisiteError) as info, Testbed(profile):
            pass
        assert info.value.line() == ("ecn: accecn: this kernel refuses net.ipv4.tcp_ecn=3 (it does not "
                                     "negotiate Accurate ECN)")
    assert (set(Path("/run/netns").iterdir()) if Path("/run/netns").exists() else set()) == before


def _takes_accecn() -> bool:
    name = "ccscope-test-accecn"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        return subprocess.run(["ip", "netns", "exec", name, "sysctl", "-q", "-w", "net.ipv4.tcp_ecn=3"],
                              capture_output=True, check=False).returncode == 0
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)


def test_fq_codel_serves_a_ping_beside_a_bulk_flow_at_once(machine_share) -> None:
    """fq_codel hashes the ping into a flow queue of its own, which is new whenever a ping comes, so it goes
    before the bulk flow's queue: 20.3 ms median against the base 20 ms (CoDel alone on the same path: 22.95,
    the bulk flow's standing queue), while the bulk flow keeps 19.1 of the 19.1 Mbit/s the link carries of
    TCP. Every drop was the flow's (10 drops, 10 retransmits: the ping lost none)."""
    profile, sent, rtts, up = _ping_beside_a_bulk_flow("fq_codel", seconds=6)
    assert len(rtts) == 60
    assert statistics.median(rtts) < profile.base_rtt_s + 0.0015 + up["ping_late_s"], sorted(rtts)
    assert sent["bits_per_second"] > 0.9 * 20e6 * 1448 / 1514 * machine_share(this_test=True)
    assert up["aqm_drops"] > 0 and abs(sent["retransmits"] - up["duplicates"] - up["aqm_drops"]) <= 2, (sent, up)


# The flow queues' hash puts two flows into one bucket of 1024 once in 1024, as the kernel's does. One
# suite's fq_pie ping met that and waited in the bulk flow's queue: 36 ms median on the 20 ms path, PIE's
# target over it. Client port 6971 does it every time with this seed (fq_pie 37.3 ms, fq_codel 23.8 ms).
# A fixed seed and fixed ports put the ping and the flow into the same two buckets in every run (511 and
# 778), which are not one.
FQ_SEED, FQ_SERVER_PORT, FQ_CLIENT_PORT = 20261128, 5301, 5302


def _ping_beside_a_bulk_flow(name: str, seconds: float) -> tuple[PathProfile, dict, list[float], dict]:
    """60 pings, 50 ms apart, once a cubic flow of `seconds` queues at a 20 Mbit/s, 20 ms, 200-packet bottleneck
    under the AQM `name`: the profile, the flow's iperf3 sum_sent, the RTTs, and how the up link's counters
    moved (with the sojourn summaries, the sender's `duplicates` (_duplicates_received), and `ping_late_s`: how
    late both directions' delay lines released a packet on average, which a ping's round trip carries), once the
    bottleneck has drained."""
    require_root()
    require_tools("iperf3", "ping", "nstat")
    profile = PathProfile.from_dict("fq", {"rate": "20mbit", "delay": "10ms", "queue": "200p",
                                           "up": {"aqm": name}}, "profiles.fq")
    with Testbed(profile, seed=FQ_SEED) as tb:
        before_both = tb.link_stats()
        before = before_both["up"]
        result: dict = {}
        bulk = ("-C", "cubic", "--cport", str(FQ_CLIENT_PORT))
        flow = threading.Thread(target=lambda: result.update(iperf3(tb, *bulk, seconds=seconds, omit=0,
                                                                    port=FQ_SERVER_PORT)))
        flow.start()
        try:
            _wait_for_a_queue(tb, deadline_s=3.0)
            rtts = tb.ping_rtts(count=60, interval=0.05)
        finally:
            flow.join()
        tb.wait_drained()
        after = tb.link_stats()
        moved = {k: v - before.get(k, 0) for k, v in after["up"].items() if isinstance(v, int)}
        duplicates = _duplicates_received(tb)
        late_s = sum(_mean_late_s({k: after[d].get(k, 0) - before_both[d].get(k, 0) for k in ("late_us", "packets")})
                     for d in ("up", "down"))
    return profile, result["end"]["sum_sent"], rtts, moved | sojourn.summaries(moved) | {"ping_late_s": late_s,
                                                                                 "duplicates": duplicates}


def _mean_late_s(link: dict) -> float:
    """How late a delay line released its link's packets, on average: the machine's stalls, which a ping beside
    the bulk flow meets as much as any packet. Up: 1.4 ms at 41 % steal."""
    return link["late_us"] / link["packets"] / 1e6 if link["packets"] else 0.0


def _duplicates_received(tb: Testbed) -> int:
    """Segments the sender sent again that had arrived already: the receiver reports each with a D-SACK (RFC 2883)
    and the sender's kernel counts them (TcpExtTCPDSACKRecvSegs, since Linux 5.10).
    A machine stall that holds the ACKs past the sender's timers makes the sender send again what was never lost: a
    tail-loss probe near 2 srtt, an RTO. PIE at 35.7 % steal retransmitted 9 segments for its 5 drops. So a flow's
    retransmits, less these, are what the bottleneck dropped."""
    return tcp_ext(tb, tb.sender_ns, "TcpExtTCPDSACKRecvSegs")["TcpExtTCPDSACKRecvSegs"]


def _l_percentile_less_the_late_ms(up: dict, q: float) -> float:
    """The L queue's sojourn at quantile q less the share f of the link's packets the delay line released over
    2 ms late (late_releases): a stall holds every packet queued in it, and the packets it held are about f of the
    L queue's too (a stall holds both queues alike; the link's share stands for L's), so the quantile q - f of
    what was measured is about the quantile q of a machine without stalls. At
    28.5 % steal (this machine under load, 2026-11-29) f was 0.16-0.22 and the p95 1.58-2.23 ms; quiet, f is
    under 0.001 and this is the p95 itself."""
    return sojourn.percentile_ms(sojourn.buckets(up, sojourn.L_PREFIX), q - late_share(up))  # L's own as likely


def _wait_for_a_queue(tb: Testbed, deadline_s: float) -> None:
    """Until the bulk flow holds packets in the bottleneck (the delay line says how many it holds)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if tb.queued() > 20:
            return
        time.sleep(0.01)
    raise AssertionError("the bulk flow never queued at the bottleneck")


@pytest.mark.parametrize(("raw", "mode"), [("accecn", "accecn"), ("on", "on"), ("off", "off"), (True, "on"),
                                          (False, "off"), (None, None)])
def test_the_endpoints_ecn_mode(raw, mode) -> None:
    data = {"rate": "10mbit"} | ({} if raw is None else {"ecn": raw})
    assert PathProfile.from_dict("p", data, "profiles.p").ecn == mode


@pytest.mark.parametrize(("data", "line"), [
    ({"ecn": "l4s"}, "profiles.p.ecn: 'l4s' is not an ECN mode (known: off, on, accecn)"),
    ({"up": {"ecn": "on"}},
     "profiles.p.up.ecn: unknown key (known: rate, delay, jitter, loss, queue, trace, isolate, aqm)"),
    ({"rate": "10mbit", "aqm": {"name": "codel", "ecn": "yes"}},
     "profiles.p.aqm.ecn: expected true or false, got 'yes'"),
])
def test_a_bad_ecn_is_one_line(data, line) -> None:
    with pytest.raises(UsageError) as info:
        PathProfile.from_dict("p", data, "profiles.p")
    assert info.value.line() == line


# Measured in 4 runs each (8 s of cubic at 20 Mbit/s, 20 ms): PIE's median sojourn 15.0 ms every time (the
# histogram's bucket around its 15 ms target; p95 30-36 ms); DualPI2's L queue p95 0.94 ms in 11 runs (p99 1.12,
# its 1 ms step) and its C queue's median 12.6 ms (target 15). The bounds allow two buckets (19 % each) either
# side. The L queue is judged at p95, not p99: the UDP sender sends what a stall of it kept back as one burst, and
# 1 % of the 8 s is 80 ms. Stopping it for 100 ms (SIGSTOP) gave p99 8.9 ms and p95 0.94; for 200 ms, 30 ms and
# 1.12. A CI run met such a stall (p99 2.23 ms, and 1.3 % fewer packets through the link).
PIE_MEDIAN_MS = (10.0, 22.0)
DUALPI2_L_P95_MS = 1.4
DUALPI2_C_MEDIAN_MS = (8.0, 20.0)


def _pi_holds_near_target(median_ms: float, bounds: tuple[float, float], share: float) -> bool:
    """Whether a PI controller's queue (PIE's, DualPI2's C) sits at a median within `bounds`. The controller reads
    the delay line's own lateness as queue and drops or marks for it, so on a busy machine the queue sits lower, and
    the lower bound scales with the machine's share: DualPI2's C median 7.5 ms at 31 % steal (share 0.69), PIE's
    8.9 ms at 40.5 % steal (share 0.6)."""
    return bounds[0] * share <= median_ms <= bounds[1]


def _run_beside(tb: Testbed, seconds: float, *others: tuple[str, ...]) -> tuple[dict, list[dict], dict]:
    """A cubic iperf3 flow of `seconds` with other iperf3 runs beside it (their arguments): the flow's and the
    others' -J documents, and how the up link's counters moved, once the bottleneck has drained."""
    before = tb.link_stats()["up"]
    found: list[dict] = [{} for _ in others]
    side = [threading.Thread(target=lambda i=i, a=a: found[i].update(iperf3(tb, *a, seconds=seconds, omit=0,
                                                                                 port_offset=i + 1)))
            for i, a in enumerate(others)]
    for thread in side:
        thread.start()
    try:
        main = iperf3(tb, "-C", "cubic", seconds=seconds, omit=0)
    finally:
        for thread in side:
            thread.join()
    tb.wait_drained()
    after = tb.link_stats()["up"]
    moved = {k: v - before.get(k, 0) for k, v in after.items() if isinstance(v, int)}
    return main, found, moved | sojourn.summaries(moved) | {"duplicates": _duplicates_received(tb)}


def test_pie_holds_the_queue_near_its_target(machine_share) -> None:
    """PIE with RFC 8033's defaults (15 ms target) on 20 Mbit/s, 20 ms RTT, a 200-packet limit: one cubic flow's
    packets wait 15 ms at the median (PIE_MEDIAN_MS), where drop-tail holds the 200 packets (121 ms); every drop
    (7 to 14 in 8 s) is one of the flow's retransmits (less those the receiver had already: _duplicates_received),
    and the link stays busy (19.3-19.5 Mbit/s)."""
    require_root()
    require_tools("iperf3", "nstat")
    profile = PathProfile.from_dict("pie", {"rate": "20mbit", "delay": "10ms", "queue": "200p",
                                            "up": {"aqm": "pie"}}, "profiles.pie")
    with Testbed(profile) as tb:
        flow, _, up = _run_beside(tb, 8)
    sent = flow["end"]["sum_sent"]
    assert up["aqm_drops"] > 0 and up["queue_drops"] == 0, up
    assert abs(sent["retransmits"] - up["duplicates"] - up["aqm_drops"]) <= 2, (sent["retransmits"], up)
    assert _pi_holds_near_target(up["sojourn"]["median_ms"], PIE_MEDIAN_MS, machine_share(this_test=True)), up
    assert sent["bits_per_second"] > 0.9 * 20e6 * 1448 / 1514 * machine_share(this_test=True), sent


def test_fq_pie_serves_a_ping_at_once_and_holds_the_flow_near_its_target(machine_share) -> None:
    """fq_pie (sch_fq_pie.c: fq_codel's flow queues, a PIE with RFC 8033's 15 ms target for each) on 20 Mbit/s,
    20 ms RTT, a 200-packet limit: the ping's own queue goes before the bulk flow's, as under fq_codel, while the
    flow's PIE holds its packets near 15 ms (PIE_MEDIAN_MS, as PIE's alone); every drop is one of its
    retransmits (less the duplicates), and the link stays busy. Measured in 4 runs: ping median 20.1-20.2 ms on
    the 20 ms path, the sojourn median 15.0 ms every time (p95 30 ms), 7-8 drops and as many retransmits, 19.4
    Mbit/s."""
    profile, sent, rtts, up = _ping_beside_a_bulk_flow("fq_pie", seconds=8)
    assert len(rtts) == 60 and statistics.median(rtts) < profile.base_rtt_s + 0.0015 + up["ping_late_s"], sorted(rtts)
    assert up["aqm_drops"] > 0 and up["queue_drops"] == 0, up
    assert abs(sent["retransmits"] - up["duplicates"] - up["aqm_drops"]) <= 2, (sent["retransmits"], up)
    assert _pi_holds_near_target(up["sojourn"]["median_ms"], PIE_MEDIAN_MS, machine_share(this_test=True)), up
    assert sent["bits_per_second"] > 0.9 * 20e6 * 1448 / 1514 * machine_share(this_test=True), sent


def test_dualpi2_keeps_the_l_queue_short_beside_a_classic_flow(machine_share) -> None:
    """DualPI2 (RFC 9332 defaults) on 20 Mbit/s, 20 ms RTT: an ECT(1) UDP stream of 4 Mbit/s (iperf3 --tos 1)
    goes to the L queue, one cubic flow with classic ECN (ECT(0)) to the C queue. The L queue is served first
    and marked past 1 ms, so its packets wait 0.94 ms at p95, while the C queue's sit near the 15 ms target
    (median 12.6 ms); cubic is marked at p^2, never dropped (0 retransmits); the receiver counts as many CE
    packets arriving as the delay line marked (204 to 276, 96 to 123 of them the step's; iptables' ecn
    match)."""
    require_root()
    require_tools("iperf3", "iptables", "nstat")
    profile = PathProfile.from_dict("l4s", {"rate": "20mbit", "delay": "10ms", "ecn": "on",
                                            "up": {"aqm": "dualpi2"}}, "profiles.l4s")
    with Testbed(profile) as tb:
        tb.run(tb.receiver_ns, ["iptables", "-A", "INPUT", "-m", "ecn", "--ecn-ip-ect", "3"], timeout=5)
        flow, (udp,), up = _run_beside(tb, 8, ("-u", "-b", "4M", "--tos", "1"))
        rule = tb.run(tb.receiver_ns, ["iptables", "-L", "INPUT", "-v", "-x", "-n"], timeout=5).stdout
    ce_arrived = int(next(line for line in rule.splitlines() if "ECN match" in line).split()[0])
    sent = flow["end"]["sum_sent"]
    assert 0 < up["aqm_step_marks"] < up["aqm_marks"] == ce_arrived, (ce_arrived, up)
    # nothing dropped, so nothing sent again but what had arrived (a tail-loss probe a stall fired), and a margin of 2
    assert up["aqm_drops"] == up["queue_drops"] == 0 and sent["retransmits"] - up["duplicates"] <= 2, (sent, up)
    assert _l_percentile_less_the_late_ms(up, 0.95) <= DUALPI2_L_P95_MS, up
    assert _pi_holds_near_target(up["sojourn_c"]["median_ms"], DUALPI2_C_MEDIAN_MS, machine_share(this_test=True)), up
    assert udp["end"]["sum"]["lost_percent"] < 1, udp["end"]["sum"]
    assert sent["bits_per_second"] + 4e6 > 0.9 * 20e6 * 1448 / 1514 * machine_share(this_test=True), sent
