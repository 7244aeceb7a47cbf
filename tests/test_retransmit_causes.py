"""Why each segment was retransmitted (ccscope_flow_retransmits_by_cause), against the kernel's own counters of
the sender's namespace, where the flow is alone: TcpExt TCPFastRetrans (segments retransmitted in recovery),
TCPTimeouts (each RTO's retransmit of the head) plus TCPSlowStartRetrans (the slow start after it), and
TCPLossProbes (tail-loss probes); and their sum against Tcp RetransSegs."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ccscope.bpf_types import RetransCause
from ccscope.loader import ProbeOptions, TelemetryProbe
from ccscope_testkit.net import Link, wait_for
from ccscope_testkit.prereqs import require_bpf_object, require_root, require_tools

PEER = str(Path(__file__).with_name("ccstate_peer.py"))
PORT = 5303


def _counters(link: Link) -> dict[str, int]:
    """TcpExt and Tcp counters of the sender's namespace."""
    found: dict[str, int] = {}
    for path in ("/proc/net/netstat", "/proc/net/snmp"):
        lines = link.ns(link.a, "cat", path).stdout.splitlines()
        for names, values in zip(lines[::2], lines[1::2], strict=True):
            prefix = names.split(":")[0]
            found.update({f"{prefix}.{n}": int(v) for n, v in zip(names.split()[1:], values.split()[1:], strict=True)})
    return found


@pytest.fixture(scope="module")
def link() -> Iterator[Link]:
    require_root()
    require_tools("ip", "tc", "iptables")
    require_bpf_object()
    made = Link.create("203.0.113")
    try:
        made.shape("20mbit", burst="16kb", limit="60kb")
        yield made
    finally:
        made.close()


def _run(link: Link, mode: str, seconds: float, during=None) -> tuple[dict[RetransCause, int], dict[str, int]]:
    """One flow, alone in its namespace: its causes, and how the namespace's counters moved meanwhile, both read
    once the socket is gone (a closed socket may still retransmit its last data)."""
    server = link.popen(link.b, sys.executable, PEER, "serve", str(PORT), str(1 << 62))
    before = _counters(link)
    try:
        with TelemetryProbe(ProbeOptions()) as probe:
            client = link.popen(link.a, sys.executable, PEER, mode, link.addr_b, str(PORT), "cubic", str(seconds),
                                stdout=subprocess.PIPE, text=True)
            try:
                cookie = int(client.stdout.readline())
                if during:
                    during()
                client.wait(timeout=seconds + 30)
            finally:
                client.kill()
                client.wait()
            # TIME-WAIT sends nothing; every other state of the closing socket still may
            assert wait_for(lambda: not link.ns(link.a, "ss", "-tanH", "exclude", "time-wait", "dport", "=",
                                                f":{PORT}").stdout.strip(), 30), "the sender's socket did not close"
            causes = probe.retransmit_causes([cookie]).get(cookie, dict.fromkeys(RetransCause, 0))
            after = _counters(link)
    finally:
        server.kill()
        server.wait()
    return causes, {name: after[name] - before.get(name, 0) for name in after}


def _assert_sum(causes: dict[RetransCause, int], moved: dict[str, int]) -> None:
    """Every retransmitted segment has its one cause, none of them "other" on these paths; RTO is the timeouts'
    head retransmits and the slow start after them."""
    assert sum(causes.values()) == moved["Tcp.RetransSegs"], (causes, moved["Tcp.RetransSegs"])
    assert causes[RetransCause.OTHER] == 0, causes
    assert causes[RetransCause.RTO] == moved["TcpExt.TCPTimeouts"] + moved["TcpExt.TCPSlowStartRetrans"], causes


def test_random_loss_is_fast_retransmit(link: Link) -> None:
    link.drop_randomly(PORT, 0.01)
    try:
        causes, moved = _run(link, "bulk", 3)
    finally:
        link.ns(link.b, "iptables", "-F", "INPUT")
    _assert_sum(causes, moved)
    assert causes[RetransCause.FAST] == moved["TcpExt.TCPFastRetrans"] > 20, (causes, moved)


def test_a_blackhole_is_rto(link: Link) -> None:
    def blackhole() -> None:
        time.sleep(1)
        link.ns(link.b, "iptables", "-I", "INPUT", "-p", "tcp", "--dport", str(PORT), "-j", "DROP")
        time.sleep(1.5)
        link.ns(link.b, "iptables", "-F", "INPUT")

    causes, moved = _run(link, "bulk", 5, blackhole)
    _assert_sum(causes, moved)
    # 1.5 s of silence: the 200 ms RTO, doubled, several times
    # (the queue's own drops before and after it are fast retransmits: 40 of them once, beside 37 for RTO)
    assert causes[RetransCause.RTO] >= moved["TcpExt.TCPTimeouts"] >= 2, causes
    assert causes[RetransCause.FAST] == moved["TcpExt.TCPFastRetrans"], causes


def test_a_lost_last_message_is_a_tail_loss_probe(link: Link) -> None:
    """A 7-segment message each 50 ms, 10 % of segments lost. A lost tail has nothing after it to be SACKed, so
    the loss probe retransmits it (2 RTT and 2 jiffies after it was sent, where the RTO waits 200 ms; for one
    segment alone in flight the probe would wait the 200 ms too, and the next message's SACK came first); a loss
    before the tail is SACKed and fast-retransmitted."""
    link.drop_randomly(PORT, 0.1)
    try:
        causes, moved = _run(link, "messages", 4)
    finally:
        link.ns(link.b, "iptables", "-F", "INPUT")
    _assert_sum(causes, moved)
    assert causes[RetransCause.FAST] == moved["TcpExt.TCPFastRetrans"], causes
    # TCPLossProbes counts probes, also those that sent new data instead (3 retransmits of 4 probes, once)
    assert 1 <= causes[RetransCause.TLP] <= moved["TcpExt.TCPLossProbes"], (causes, moved["TcpExt.TCPLossProbes"])
