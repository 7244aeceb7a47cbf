"""Why each segment was retransmitted (ccscope_flow_retransmits_by_cause), against the kernel's own counters of
the sender's namespace, where the flow is alone: TcpExt TCPFastRetrans (segments retransmitted in recovery),
TCPTimeouts (each RTO's retransmit of the head) plus TCPSlowStartRetrans (the slow start after it), and
TCPLossProbes (tail-loss probes); and their sum against Tcp RetransSegs."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from ccscope.bpf_types import RetransCause
from ccscope.flows import decode
from ccscope.loader import ProbeOptions, TelemetryProbe
from ccscope_testkit.net import CCSCOPE, Link, wait_for
from ccscope_testkit.prereqs import require_bpf_object, require_root, require_tools

PEER = str(Path(__file__).with_name("ccstate_peer.py"))
PORT = 5303


def _counters(link: Link, namespace: str) -> dict[str, int]:
    """TcpExt and Tcp counters of one end's namespace."""
    found: dict[str, int] = {}
    for path in ("/proc/net/netstat", "/proc/net/snmp"):
        lines = link.ns(namespace, "cat", path).stdout.splitlines()
        for names, values in zip(lines[::2], lines[1::2], strict=True):
            prefix = names.split(":")[0]
            found.update({f"{prefix}.{n}": int(v) for n, v in zip(names.split()[1:], values.split()[1:], strict=True)})
    return found


@dataclass(frozen=True)
class End:
    """One end of the flow: its causes, and how its namespace's counters moved meanwhile."""

    causes: dict[RetransCause, int]
    moved: dict[str, int]
    spurious: int  # the flow's spurious_retransmits (tcpi_dsack_dups) as ccscope last read it

    def __repr__(self) -> str:
        """Short enough that pytest prints it whole in a failure: the causes and the TCP counters that moved."""
        causes = {cause.name: count for cause, count in self.causes.items()}
        moved = {name: count for name, count in self.moved.items() if count and name.startswith(("Tcp.", "TcpExt."))}
        return f"End(causes={causes}, spurious={self.spurious}, moved={moved})"


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


def _run(link: Link, mode: str, seconds: float, during=None, connections: int = 1) -> tuple[End, End]:
    """One flow, alone in its namespaces: the sender's end and the receiver's (its first connection's), each read
    once both sockets are gone (a closed socket may still retransmit its last data). The drops a test set up in
    either end's INPUT chain end with it."""
    try:
        return _run_flow(link, mode, seconds, during, connections)
    finally:
        for ns in (link.a, link.b):
            link.ns(ns, "iptables", "-F", "INPUT")


def _run_flow(link: Link, mode: str, seconds: float, during, connections: int) -> tuple[End, End]:
    server = link.popen(link.b, sys.executable, PEER, "serve", str(PORT), str(1 << 62), str(connections),
                        stdout=subprocess.PIPE, text=True)
    before = {ns: _counters(link, ns) for ns in (link.a, link.b)}
    try:
        with TelemetryProbe(ProbeOptions()) as probe:
            client = link.popen(link.a, sys.executable, PEER, mode, link.addr_b, str(PORT), "cubic", str(seconds),
                                stdout=subprocess.PIPE, text=True)
            try:
                cookies = {link.a: int(client.stdout.readline()), link.b: int(server.stdout.readline())}
                if during:
                    during()
                client.wait(timeout=seconds + 30)
            finally:
                client.kill()
                client.wait()
            # TIME-WAIT sends nothing; every other state of a closing socket still may
            assert wait_for(lambda: not any(link.ns(ns, "ss", "-tanH", "exclude", "time-wait", f"( sport = :{PORT} or "
                                                    f"dport = :{PORT} )").stdout.strip() for ns in cookies), 30), \
                "a socket of the flow did not close"
            found = probe.retransmit_causes(cookies.values())
            last = {record.cookie: decode(record) for record in probe.read_flows()}  # closed, still in the map
            after = {ns: _counters(link, ns) for ns in cookies}
    finally:
        server.kill()
        server.wait()
    sender, receiver = (End(found.get(cookies[ns], dict.fromkeys(RetransCause, 0)),
                            {name: after[ns][name] - before[ns].get(name, 0) for name in after[ns]},
                            last[cookies[ns]].spurious_retransmits)
                        for ns in (link.a, link.b))
    return sender, receiver


def _dropping(link: Link, ns: str, after_s: float, for_s: float, *match: str):
    """A `during` for _run: after after_s, ns drops the flow's TCP segments that match, for for_s."""
    def drop() -> None:
        time.sleep(after_s)
        link.ns(ns, "iptables", "-I", "INPUT", "-p", "tcp", *match, "-j", "DROP")
        time.sleep(for_s)
        link.ns(ns, "iptables", "-F", "INPUT")
    return drop


def _assert_sum(end: End) -> None:
    """Every retransmitted segment has its one cause, none of them "other" on these paths; RTO is the timeouts'
    head retransmits and the slow start after them, FAST the segments retransmitted in recovery.

    The kernel counts a retransmission that failed once begun (a qdisc that refused it: TCPRetransFail) in
    total_retrans and RetransSegs, and so in its cause here, but in neither TCPSlowStartRetrans nor
    TCPFastRetrans, which count what was sent: each cause may exceed the kernel's counter by the failures, and
    only together. (The blackhole's RTOs once came to one more than TCPTimeouts + TCPSlowStartRetrans, in 1 of
    about 50 runs beside a busy qemu; TCPRetransFail was not read then, and 0 in the 20 runs after.)"""
    causes, moved = end.causes, end.moved
    assert sum(causes.values()) == moved["Tcp.RetransSegs"], (causes, moved["Tcp.RetransSegs"])
    assert causes[RetransCause.OTHER] == 0, causes
    sent = {RetransCause.RTO: moved["TcpExt.TCPTimeouts"] + moved["TcpExt.TCPSlowStartRetrans"],
            RetransCause.FAST: moved["TcpExt.TCPFastRetrans"]}
    unsent = {cause: causes[cause] - count for cause, count in sent.items()}
    assert all(n >= 0 for n in unsent.values()) and sum(unsent.values()) <= moved["TcpExt.TCPRetransFail"], \
        (causes, sent, moved["TcpExt.TCPRetransFail"])


def _assert_only_acked(end: End) -> None:
    """The receiver's end sent nothing to retransmit (its handshake got through)."""
    assert sum(end.causes.values()) == end.moved["Tcp.RetransSegs"] == 0, (end.causes, end.moved["Tcp.RetransSegs"])


def test_random_loss_is_fast_retransmit(link: Link) -> None:
    """Also `ccscope flows --json` while the flow runs: its own probe met the flow late, so it counts part of
    the flow's fast retransmits, never more than the flow's total so far, and nothing else."""
    link.drop_randomly(PORT, 0.01)
    shown: list[dict] = []

    def flows_meanwhile() -> None:
        out = subprocess.run([*CCSCOPE, "flows", "--once", "--json", "--interval", "1s", "--netns",
                              str(link.inode_a), "--port", str(PORT)], capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, out.stderr
        shown.extend(json.loads(out.stdout))

    # 7 s: the CLI starts (about 1.5 s here), loads its BPF and waits its 1 s interval within the flow's life; one
    # the flow outlived would show it closed, that is nothing. With a 4 s flow the first run after a bootstrap
    # failed, once (its cause not kept), and 16 runs after it passed.
    sender, receiver = _run(link, "bulk", 7, flows_meanwhile)
    _assert_sum(sender)
    _assert_only_acked(receiver)
    assert sender.causes[RetransCause.FAST] >= sender.moved["TcpExt.TCPFastRetrans"] > 20, sender
    assert len(shown) == 1, shown
    [flow] = shown
    causes = flow["retransmits_by_cause"]
    assert 0 < causes["fast"] == sum(causes.values()) <= flow["retransmits"], flow


def test_a_blackhole_is_rto(link: Link) -> None:
    sender, receiver = _run(link, "bulk", 5, _dropping(link, link.b, 1, 1.5, "--dport", str(PORT)))
    _assert_sum(sender)
    _assert_only_acked(receiver)
    # 1.5 s of silence: the 200 ms RTO, doubled, several times
    # (the queue's own drops before and after it are fast retransmits: 40 of them once, beside 37 for RTO)
    assert sender.causes[RetransCause.RTO] >= sender.moved["TcpExt.TCPTimeouts"] >= 2, sender


def test_what_a_socket_retransmits_before_it_is_a_flow_is_the_flows(link: Link) -> None:
    """A socket becomes a flow at its first tcp_probe, an ACK received once established; every data segment is
    dropped for the first 0.5 s, so its first RTO (200 ms: the handshake's RTT sample set it) retransmits before
    any ACK came back, and the one after it (400 ms later) gets through. Those retransmits count under their
    cause once it is a flow. (They were lost once: a loss probe sent before the first ACK, 1 run in 10 of the
    test below under a busy CPU, left the causes one short of RetransSegs.)"""
    link.ns(link.b, "iptables", "-A", "INPUT", "-p", "tcp", "--dport", str(PORT), "-m", "length", "--length",
            "100:65535", "-j", "DROP")  # data only: the handshake (SYN 60 bytes, ACK 52) gets through

    def heal() -> None:
        time.sleep(0.5)
        link.ns(link.b, "iptables", "-F", "INPUT")

    sender, receiver = _run(link, "bulk", 2, heal)
    _assert_sum(sender)
    _assert_only_acked(receiver)
    assert sender.causes[RetransCause.RTO] >= sender.moved["TcpExt.TCPTimeouts"] >= 1, sender


def test_a_lost_last_message_is_a_tail_loss_probe(link: Link) -> None:
    """A 7-segment message each 50 ms, 10 % of segments lost. A lost tail has nothing after it to be SACKed, so
    the loss probe retransmits it (2 RTT and 2 jiffies after it was sent, where the RTO waits 200 ms; for one
    segment alone in flight the probe would wait the 200 ms too, and the next message's SACK came first); a loss
    before the tail is SACKed and fast-retransmitted. A lost SYN (one run in ten) is the sender's one RTO.

    10 s, because the probes come by chance: 15 runs of 4 s retransmitted 2 to 8 by TLP (mean 4.3), so about one
    run in 75 had none (e^-4.3, as for a Poisson count), as a CI run once did (RTO 4, FAST 63, TLP 0). Six runs of
    10 s gave 7 to 13 (mean 9.7): none then once in about 16,000 runs."""
    link.drop_randomly(PORT, 0.1)
    sender, _ = _run(link, "messages", 10)
    _assert_sum(sender)
    # TCPLossProbes counts probes, also those that sent new data instead (3 retransmits of 4 probes, once)
    assert 1 <= sender.causes[RetransCause.TLP] <= sender.moved["TcpExt.TCPLossProbes"], sender


def test_a_lost_handshake_is_rto_at_both_ends(link: Link) -> None:
    """The first SYN and the first SYN-ACK dropped: the SYN's retransmit comes before tcp_probe ever meets the
    sender's socket, the SYN-ACK's before the receiver's socket exists (its request's timer sends it); each is
    still its end's RTO, as the kernel's TCPSynRetrans counts them. Nothing else is lost."""
    first_only = ("-m", "limit", "--limit", "1/hour", "--limit-burst", "1", "-j", "DROP")  # the first, then none
    link.ns(link.b, "iptables", "-A", "INPUT", "-p", "tcp", "--dport", str(PORT), "--syn", *first_only)
    link.ns(link.a, "iptables", "-A", "INPUT", "-p", "tcp", "--sport", str(PORT), "--tcp-flags", "SYN,ACK",
            "SYN,ACK", *first_only)
    sender, receiver = _run(link, "bulk", 0.5)
    for end in (sender, receiver):
        assert end.moved["TcpExt.TCPSynRetrans"] >= 1, end
        assert end.causes[RetransCause.RTO] >= end.moved["TcpExt.TCPSynRetrans"], end
        assert sum(end.causes.values()) == end.moved["Tcp.RetransSegs"], end
        assert end.causes[RetransCause.OTHER] == 0, end


def test_acks_lost_for_a_while_make_the_timeouts_retransmits_spurious(link: Link) -> None:
    """Every ACK to the sender dropped for 0.6 s: its RTOs (200 ms, then 400) retransmit what the receiver already
    has, and the receiver says so with a DSACK once ACKs get through; ccscope's spurious_retransmits is the
    kernel's tcpi_dsack_dups, as the sender's namespace counts it (TcpExt TCPDSACKRecvSegs). In 5 runs: 2 RTOs,
    1 spurious (the first one's DSACK was dropped with the ACKs), equal to the kernel's each time."""
    sender, receiver = _run(link, "bulk", 2, _dropping(link, link.a, 0.5, 0.6, "--sport", str(PORT)))
    _assert_sum(sender)
    assert sender.causes[RetransCause.RTO] >= sender.moved["TcpExt.TCPTimeouts"] >= 1, sender
    assert 1 <= sender.spurious == sender.moved["TcpExt.TCPDSACKRecvSegs"], sender
    assert sender.spurious <= sum(sender.causes.values()), sender
    assert receiver.spurious == 0 and receiver.moved["TcpExt.TCPDSACKOldSent"] >= 1, receiver


def test_a_socket_that_connects_again_counts_from_zero(link: Link) -> None:
    """A socket that disconnects (connect(AF_UNSPEC): tcp_disconnect() zeroes its total_retrans) and connects
    again keeps its cookie and its storage: its second connection's retransmits are counted from 0, not as a
    wrapped difference from the first's last total (bpf restart_retrans_mark at SYN_SENT). Both halves lose 1 %
    of their data, so each retransmits."""
    link.drop_randomly(PORT, 0.01)
    sender, _ = _run(link, "reconnect", 4, connections=2)
    _assert_sum(sender)
    assert sender.causes[RetransCause.FAST] > 20, sender
