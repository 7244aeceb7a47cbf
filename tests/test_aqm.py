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
from ccscope.emulation import Testbed, aqm, sojourn
from ccscope.emulation.profile import LinkProfile, PathProfile
from ccscope.errors import PrerequisiteError, UsageError
from ccscope_testkit.prereqs import require_root, require_tools
from emulation_helpers import iperf3


@pytest.mark.parametrize(("raw", "expected"), [
    ("codel", aqm.Aqm("codel", 0.005, 0.100)),
    ({"name": "codel", "target": "2ms", "interval": "50ms"}, aqm.Aqm("codel", 0.002, 0.050)),
    ("fifo", aqm.Aqm("fifo")),
    ("fq_codel", aqm.Aqm("fq_codel", 0.005, 0.100, ecn=True)),  # marks by default, as the kernel's
    ({"name": "fq_codel", "ecn": False}, aqm.Aqm("fq_codel", 0.005, 0.100)),
])
def test_an_aqm_is_named_with_its_parameters(raw, expected) -> None:
    link = LinkProfile.from_dict({"rate": "10mbit", "queue": "100p", "aqm": raw}, "profiles.x.up")
    assert link.aqm == expected
    assert link.in_delayline is expected.manages  # CoDel's link: rate and queue in the delay line


@pytest.mark.parametrize(("data", "line"), [
    ({"rate": "10mbit", "aqm": "codle"},
     "profiles.x.up.aqm: 'codle' is not an AQM (known: fifo, codel, fq_codel, pie, fq_pie, cake, dualpi2)"),
    ({"rate": "10mbit", "aqm": "pie"},
     "profiles.x.up.aqm: pie is not in ccscope's delay line yet; it runs fifo, codel, fq_codel"),
    ({"rate": "10mbit", "aqm": {"name": "codel", "tagret": "5ms"}},
     "profiles.x.up.aqm.tagret: unknown key for codel (known: name, target, interval, ecn)"),
    ({"rate": "10mbit", "aqm": {"name": "codel", "target": "200ms"}},
     "profiles.x.up.aqm.target: 200ms is not below the interval 100ms (RFC 8289: 5 % to 10 % of it)"),
    ({"rate": "10mbit", "aqm": {"target": "5ms"}},
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
    got = sojourn.summary({f"sojourn_bucket_{i}": n for i, n in buckets.items()})
    assert got["count"] == 100
    assert got["median_ms"] == pytest.approx(2 ** (52.5 / 4) / 1e3)
    assert got["p95_ms"] == pytest.approx(2 ** (60.5 / 4) / 1e3)
    assert sojourn.summary({}) is None


def test_a_path_profile_with_codel_both_ways() -> None:
    profile = PathProfile.from_dict("p", {"rate": "10mbit", "delay": "5ms", "aqm": "codel"}, "profiles.p")
    assert profile.up.aqm == profile.down.aqm == aqm.Aqm("codel", 0.005, 0.1)
    assert json.dumps(profile.up.aqm.as_dict("ccscope"))


def test_the_delay_line_refuses_codel_without_a_rate() -> None:
    from ccscope.emulation.backends import DELAYLINE

    ran = subprocess.run([str(DELAYLINE), "--queue", "9", "--aqm", "codel"], capture_output=True, text=True,
                         timeout=10, check=False)
    assert ran.returncode == 2 and textwrap.dedent(ran.stderr).startswith("usage: ccscope-delayline")


def test_codel_with_ecn_marks_instead_of_dropping() -> None:
    """CoDel with ecn on, ECN (RFC 3168) at both ends: the delay line marks where it would drop, and the
    receiver's kernel counts the same number of CE packets arriving (an iptables ecn match in its namespace:
    after the IP header checksum check, so a bad rewrite would show as too few). The flow retransmits only
    what the hard limit dropped in slow start, and the sender's kernel saw the echoes (TcpExtTCPDeliveredCE).
    The host's tcp_ecn is left alone."""
    require_root()
    require_tools("iperf3", "nstat", "sysctl", "iptables")
    host_ecn = Path("/proc/sys/net/ipv4/tcp_ecn").read_text()
    profile = PathProfile.from_dict("marks", {"rate": "20mbit", "delay": "10ms", "queue": "200p", "ecn": "on",
                                              "up": {"aqm": {"name": "codel", "ecn": True}}}, "profiles.marks")
    with Testbed(profile) as tb:
        for ns in (tb.sender_ns, tb.receiver_ns):
            assert tb.run(ns, ["sysctl", "-n", "net.ipv4.tcp_ecn"], timeout=5).stdout.strip() == "1"
        tb.run(tb.receiver_ns, ["iptables", "-A", "INPUT", "-m", "ecn", "--ecn-ip-ect", "3"], timeout=5)
        before = tb.link_stats()["up"]
        sent = iperf3(tb, "-C", "cubic", seconds=5, omit=0)["end"]["sum_sent"]
        tb.wait_drained()
        up = {k: v - before.get(k, 0) for k, v in tb.link_stats()["up"].items() if isinstance(v, int)}
        rule = tb.run(tb.receiver_ns, ["iptables", "-L", "INPUT", "-v", "-x", "-n"], timeout=5).stdout
        counters = tb.run(tb.sender_ns, ["nstat", "-asz", "TcpExtTCPDeliveredCE"], timeout=5).stdout.split()
    ce_arrived = int(next(line for line in rule.splitlines() if "ECN match" in line).split()[0])
    assert up["aqm_marks"] > 0 and up["aqm_drops"] == 0, up
    assert ce_arrived == up["aqm_marks"], (ce_arrived, up)
    assert int(counters[counters.index("TcpExtTCPDeliveredCE") + 1]) > 0, counters
    assert sent["retransmits"] <= up["queue_drops"] + 2, (sent["retransmits"], up)
    assert sent["bits_per_second"] > 0.9 * 20e6 * 1448 / 1514
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


def test_fq_codel_serves_a_ping_beside_a_bulk_flow_at_once() -> None:
    """fq_codel hashes the ping into a flow queue of its own, which is new whenever a ping comes, so it goes
    before the bulk flow's queue: 20.3 ms median against the base 20 ms (CoDel alone on the same path: 22.95,
    the bulk flow's standing queue), while the bulk flow keeps 19.1 of the 19.1 Mbit/s the link carries of
    TCP. Every drop was the flow's (10 drops, 10 retransmits: the ping lost none)."""
    require_root()
    require_tools("iperf3", "ping")
    profile = PathProfile.from_dict("fq", {"rate": "20mbit", "delay": "10ms", "queue": "200p",
                                           "up": {"aqm": "fq_codel"}}, "profiles.fq")
    with Testbed(profile) as tb:
        before = tb.link_stats()["up"]
        result: dict = {}
        flow = threading.Thread(target=lambda: result.update(iperf3(tb, "-C", "cubic", seconds=6, omit=0)))
        flow.start()
        try:
            _wait_for_a_queue(tb, deadline_s=3.0)
            rtts = tb.ping_rtts(count=60, interval=0.05)
        finally:
            flow.join()
        tb.wait_drained()
        up = {k: v - before.get(k, 0) for k, v in tb.link_stats()["up"].items() if isinstance(v, int)}
    sent = result["end"]["sum_sent"]
    assert len(rtts) == 60
    assert statistics.median(rtts) < profile.base_rtt_s + 0.0015, sorted(rtts)
    assert sent["bits_per_second"] > 0.9 * 20e6 * 1448 / 1514
    assert up["aqm_drops"] > 0 and abs(sent["retransmits"] - up["aqm_drops"]) <= 2, (sent, up)


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
