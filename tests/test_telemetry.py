"""The telemetry core against the real kernel: real flows through namespaces, cross-checked against iperf3 -J and
TCP_INFO, and the CLI/daemon as a user runs them."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import signal
import socket
import statistics
import struct
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ccscope import bpf_types as bt
from ccscope.exporter import FlowCollector
from ccscope.flows import FlowSelection, FlowTable
from ccscope.loader import PROGRAMS
from ccscope_testkit.net import (
    Daemon,
    Link,
    Sink,
    cli,
    connect,
    daemon,
    held_link_count,
    held_prog_ids,
    parse_metrics,
    tcp_info,
    values,
    wait_for,
    wait_port,
)
from ccscope_testkit.prereqs import require_bpf_object, require_root, require_tools

SO_COOKIE = 57
CCS = ("reno", "cubic", "bbr")


@pytest.fixture(autouse=True)
def _prerequisites() -> None:
    require_root()
    require_tools("ip", "tc", "iperf3", "iptables", "ss", "bpftool")
    require_bpf_object()


@pytest.fixture
def link() -> Iterator[Link]:
    made = Link.create("192.0.2", "fd00:cc5:0")
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def link2() -> Iterator[Link]:
    made = Link.create("198.51.100")
    try:
        yield made
    finally:
        made.close()


@pytest.fixture
def probe():
    from ccscope.loader import ProbeOptions, TelemetryProbe

    # 100 us: the map then lags TCP_INFO by about one ACK, not by a 10 ms sampling step.
    with TelemetryProbe(ProbeOptions(sample_interval_ns=100_000)) as loaded:
        yield loaded


def cookie_of(sock: socket.socket) -> int:
    return struct.unpack("Q", sock.getsockopt(socket.SOL_SOCKET, SO_COOKIE, 8))[0]


class Trickle:
    """Live connections that exchange a few bytes every 20 ms, so tcp_probe keeps seeing them."""

    def __init__(self) -> None:
        self.socks: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def add(self, sock: socket.socket) -> socket.socket:
        self.socks.append(sock)
        return sock

    def start(self) -> Trickle:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            for sock in self.socks:
                with contextlib.suppress(OSError):
                    sock.send(b"x" * 100)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        for sock in self.socks:
            sock.close()


# --- a real bulk flow, cross-checked with iperf3 -J ----------------------------------------------------------------


@pytest.mark.parametrize("cc", CCS)
def test_iperf3_flow_retransmits_and_algorithm_match(link: Link, probe, cc: str) -> None:
    from ccscope.flows import decode

    port = 5311 + CCS.index(cc)
    link.shape(rate="30mbit", burst="16kb", limit="24kb")  # a small queue: a bulk flow overflows it
    server = link.popen(link.b, "iperf3", "-s", "-1", "-p", str(port), stdout=subprocess.DEVNULL)
    try:
        wait_port(port, link.b)
        out = link.ns(link.a, "iperf3", "-c", link.addr_b, "-p", str(port), "-t", "2", "-J", "-C", cc)
        result = json.loads(out.stdout)
    finally:
        server.kill()
        server.wait()

    def closed_data_flow():
        mine = [decode(f) for f in probe.read_flows() if f.netns == link.inode_a and f.dport == port]
        data = max(mine, key=lambda f: f.bytes_acked, default=None)  # the control connection carries ~500 B
        return data if data and data.closed_ns else None

    flow = wait_for(closed_data_flow)
    assert flow is not None, "the iperf3 data connection never reached a CLOSE record"
    sent = result["end"]["sum_sent"]
    assert result["end"]["sender_tcp_congestion"] == cc
    assert flow.cc == cc
    assert flow.src == link.addr_a and flow.dst == link.addr_b and flow.state == "close"
    # The CLOSE record carries tcpi_total_retrans as of TCP_CLOSE. iperf3 reads it when its timer ends, while up to a
    # send buffer of data is still queued: segments retransmitted while that drains count for us, not for iperf3
    # (measured: 0-9 more, <= 3 %). Exact equality at a quiet moment is test_close_record_retransmits_exact.
    assert sent["retransmits"] > 0  # the 24 KB queue overflows, else this check would be vacuous
    assert sent["retransmits"] <= flow.retransmits <= sent["retransmits"] * 1.10 + 10, (
        flow.retransmits, sent["retransmits"])
    # Acked bytes are at most what the client wrote (+ iperf3's 37-byte stream cookie), and close to what the server
    # read: the server closes at the end of the test with data and ACKs still in flight, so they differ either way
    # (seen: acked one segment below received, when the server's last ACK died with the reset).
    received = result["end"]["sum_received"]["bytes"]
    assert flow.bytes_acked <= sent["bytes"] + 64, (flow.bytes_acked, sent["bytes"])
    assert abs(flow.bytes_acked - received) <= 0.02 * received + 64 * 1024, (received, flow.bytes_acked)


@pytest.mark.parametrize("cc", ["cubic"])
def test_close_record_retransmits_exact(link: Link, probe, cc: str) -> None:
    """Our own sender: everything acked, then TCP_INFO, then close; the CLOSE record must hold the same count."""
    from ccscope.flows import decode

    port = 5315
    link.shape(rate="30mbit", burst="16kb", limit="24kb")
    sink = Sink(socket.AF_INET, link.addr_b, port, link.b)
    sock = connect(socket.AF_INET, link.addr_b, port, link.a, cc)
    closed_before = probe.counters()[bt.Counter.FLOWS_CLOSED]
    try:
        cookie = cookie_of(sock)
        sock.sendall(b"x" * (4 << 20))  # ~1.1 s at 30 Mbit/s
        drained = wait_for(lambda: tcp_info(sock)["unacked"] == 0 and _outq(sock) == 0, 20, 0.01)
        assert drained, "data never fully acknowledged"
        info = tcp_info(sock)
    finally:
        sock.close()
    try:
        raw = wait_for(lambda: next((f for f in probe.read_flows() if f.cookie == cookie and f.closed_ns), None))
        assert raw is not None, "no CLOSE record"
        flow = decode(raw)
        assert info["total_retrans"] > 0
        assert flow.retransmits == info["total_retrans"]
        assert flow.bytes_acked == (4 << 20) + 2  # SYN and FIN each take one sequence number
        assert flow.cc == cc and flow.state == "close"
        assert probe.counters()[bt.Counter.FLOWS_CLOSED] >= closed_before + 1  # other flows on the host may close too
    finally:
        sink.close()


def _outq(sock: socket.socket) -> int:
    import fcntl
    import termios

    return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0" * 4))[0]


# --- cwnd and srtt against TCP_INFO read at the same moment --------------------------------------------------------

# Tolerances. tcp_probe fires at the top of tcp_rcv_established(), before the incoming ACK is processed, and the
# probe refreshes a flow at most every sample interval (100 us here). So the map holds the state from just before
# the most recent ACK, while TCP_INFO already includes it:
# - reno, cubic: cwnd moves by at most one segment per ACK in congestion avoidance, so 90 % of samples must be within
#   max(1 segment, 10 %) (measured over 4x60 samples: p90 = 0, max 8 %); a sample that straddles the start of loss
#   recovery sees one multiplicative decrease (reno 1/2, cubic 0.7), hence all samples within 50 %.
# - bbr recomputes cwnd from its model on every ACK (and drops it to 4 segments in PROBE_RTT), so a one-ACK lag can
#   be many segments (measured: median 0, p80 <= 11 %, p90 <= 25 %, max 47 %): median 0-5 %, 80 % within 25 %.
# - srtt moves by 1/8 of one RTT sample per ACK; with BBR draining its queue an RTT sample can be far below srtt
#   (measured over 5x60 samples per algorithm: p90 <= 3 % typically, once 10.6 % with bbr; max 6 %):
#   90 % within 15 %, all within 40 % or within one ACK's step. One ACK moves srtt by at most 1/8 of the distance
#   to its RTT sample, and samples differ from srtt by at most the queue's delay (100 kB at 30 Mbit/s = 27 ms), so
#   a step is up to 3.4 ms. That matters once BBR has drained the queue: srtt is then 1-3 ms and one step is a
#   large fraction of it (measured over 25x60 bbr samples: 3266 vs 2229 us = 47 %, 2341 vs 3419 us = 32 %).
#   Still catches any unit slip (srtt_us is stored << 3 by the kernel).
CWND_TOL = {"reno": (0.90, 0.10, 0.50), "cubic": (0.90, 0.10, 0.50), "bbr": (0.80, 0.25, None)}
SRTT_TOL = (0.90, 0.15, 0.40)
SRTT_ACK_STEP_US = 100 * 1024 * 8 / 30e6 * 1e6 / 8  # the limit="100kb" queue at rate="30mbit", / 8
SAMPLES = 60


def _relative_miss(value: int, before: int, after: int, floor: int = 0) -> float:
    """How far `value` lies outside [before, after] (TCP_INFO read just before and after the map)."""
    low, high = min(before, after), max(before, after)
    miss = max(0, low - value, value - high)
    return 0.0 if miss <= floor else miss / max(high, 1)


@pytest.mark.parametrize("cc", CCS)
def test_cwnd_and_srtt_match_tcp_info(link: Link, probe, cc: str) -> None:
    port = 5321 + CCS.index(cc)
    link.shape(rate="30mbit", burst="16kb", limit="100kb")
    sink = Sink(socket.AF_INET, link.addr_b, port, link.b)
    sock = connect(socket.AF_INET, link.addr_b, port, link.a, cc)
    stop = threading.Event()

    def send() -> None:
        block = b"x" * 65536
        with contextlib.suppress(OSError):
            while not stop.is_set():
                sock.send(block)

    sender = threading.Thread(target=send, daemon=True)
    try:
        cookie = cookie_of(sock)
        sender.start()
        # Past slow start: its first loss on the 100 KB queue (reno, cubic and bbr all overflow it within 10 s), and
        # the recovery that follows over (cwnd moves by several segments an ACK in both, more than the one-ACK
        # slack below allows).
        assert wait_for(lambda: (info := tcp_info(sock))["total_retrans"] > 0 and info["ca_state"] == 0, 10, 0.01), \
            "no loss and recovery in 10 s"
        cwnd_miss, srtt_miss, srtt_wrong = [], [], []
        for _ in range(SAMPLES):
            before = tcp_info(sock)
            flow = next(f for f in probe.read_flows() if f.cookie == cookie)
            after = tcp_info(sock)
            assert flow.ca_name.decode() == cc
            # one segment of slack: the one-ACK lag described above
            cwnd_miss.append(_relative_miss(flow.snd_cwnd, before["snd_cwnd"], after["snd_cwnd"], floor=1))
            srtt_miss.append(_relative_miss(flow.srtt_us, before["rtt_us"], after["rtt_us"]))
            if (srtt_miss[-1] > SRTT_TOL[2]
                    and _relative_miss(flow.srtt_us, before["rtt_us"], after["rtt_us"], floor=int(SRTT_ACK_STEP_US))):
                srtt_wrong.append((flow.srtt_us, before["rtt_us"], after["rtt_us"]))
            time.sleep(0.02)
    finally:
        stop.set()
        sock.close()
        sender.join(timeout=5)
        sink.close()
    fraction, rel, worst = CWND_TOL[cc]
    cwnd_miss.sort()
    srtt_miss.sort()
    assert statistics.median(cwnd_miss) <= 0.05, cwnd_miss
    assert cwnd_miss[int(fraction * SAMPLES) - 1] <= rel, cwnd_miss
    if worst is not None:
        assert cwnd_miss[-1] <= worst, cwnd_miss
    assert srtt_miss[int(SRTT_TOL[0] * SAMPLES) - 1] <= SRTT_TOL[1], srtt_miss
    assert not srtt_wrong, f"srtt us (map, TCP_INFO before, after) beyond 40 % and one ACK's step: {srtt_wrong}"


# --- induced loss ---------------------------------------------------------------------------------------------------


def open_sockets_to(netns: str, port: int) -> list[str]:
    """The TCP sockets to `port` in `netns` that are still full sockets (any state but TIME-WAIT)."""
    out = subprocess.run(["ip", "netns", "exec", netns, "ss", "-tanH", "dport", f"= :{port}"], capture_output=True,
                         text=True, check=True).stdout
    return [line for line in out.splitlines() if not line.startswith("TIME-WAIT")]


def test_induced_loss_raises_retransmits_and_moves_ca_state(link: Link) -> None:
    port = 5331
    link.shape(rate="30mbit", burst="16kb", limit="100kb")  # a few ms of queue, so recovery lasts several ms
    link.drop_randomly(port, 0.02)
    server = link.popen(link.b, "iperf3", "-s", "-1", "-p", str(port), stdout=subprocess.DEVNULL)
    trace = None
    try:
        with daemon("--flows", "none") as running:
            before = sum(values(running.scrape(), "ccscope_tcp_retransmits_total"))
            trace = subprocess.Popen(cli("trace", "--json", "--port", str(port), "--sample-interval", "1ms",
                                         "--duration", "20s"), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True)
            assert wait_for(lambda: held_link_count(trace.pid) >= len(PROGRAMS), 10), "trace never attached"
            wait_port(port, link.b)
            out = link.ns(link.a, "iperf3", "-c", link.addr_b, "-p", str(port), "-t", "2", "-J", "-C", "reno")
            # the sender's socket closed (its CLOSE record holds its final count) before the trace's Ctrl-C
            assert wait_for(lambda: not open_sockets_to(link.a, port), 10), "the sender never closed"
            after = sum(values(running.scrape(), "ccscope_tcp_retransmits_total"))
            trace.send_signal(signal.SIGINT)
            lines, err = trace.communicate(timeout=15)
    finally:
        server.kill()
        server.wait()
        if trace and trace.poll() is None:
            trace.kill()
            trace.wait()
    report = json.loads(out.stdout)["end"]
    iperf_retrans = report["sum_sent"]["retransmits"]
    assert iperf_retrans > 0
    samples = [json.loads(line) for line in lines.splitlines()]
    sender = [s for s in samples if s["dport"] == port and s["netns"] == link.inode_a and s["cc"] == "reno"]
    assert sender, f"no trace samples of the sender: {err}"
    states = {s["ca_state"] for s in sender}
    assert states - {"open"}, f"ca_state never left open: {states}"
    # Counts are cumulative, in segments. iperf3 reads TCP_INFO's total_retrans when it stops sending; what is
    # in flight then may still be lost and sent again before the flow closes, which the trace and the host's
    # counter see (beside two busy loops: 104 against iperf3's 101). So the flow's last sample (its CLOSE
    # record), and the host's counters (nothing else retransmits here but iperf3's control connection, whose few
    # packets the 2 % may hit once), have iperf3's count and at most a window more. Counting tcp_retransmit_skb's
    # hits instead of segments gave 49 for iperf3's 141. The host's counters are summed over algorithms: a
    # retransmitted SYN counts under the algorithm the socket had then, before iperf3 set reno.
    window_packets = report["streams"][0]["sender"]["max_snd_cwnd"] // 1448
    traced = max(s["retransmits"] for s in sender)
    assert iperf_retrans <= traced <= iperf_retrans + window_packets, (traced, iperf_retrans, window_packets)
    host = after - before
    assert iperf_retrans <= host <= iperf_retrans + window_packets, (host, iperf_retrans, window_packets)


def test_host_counter_leaves_out_what_a_flow_retransmitted_before_the_daemon(link: Link) -> None:
    """A socket older than the daemon: its retransmits before the daemon attached are not the host counter's
    (they are in its tcpi_total_retrans, which the flow's own series shows); those after it are, exactly, once
    the socket is quiescent."""
    port = 5335
    link.shape(rate="30mbit", burst="16kb", limit="100kb")
    link.drop_randomly(port, 0.03)
    sink = Sink(socket.AF_INET, link.addr_b, port, link.b)
    sock = connect(socket.AF_INET, link.addr_b, port, link.a, "reno")

    def send_acknowledged(nbytes: int) -> int:
        sock.sendall(b"x" * nbytes)
        assert wait_for(lambda: tcp_info(sock)["unacked"] == 0, 20, 0.01), "data never acknowledged"
        return tcp_info(sock)["total_retrans"]

    try:
        before_daemon = send_acknowledged(1 << 20)
        assert before_daemon > 0
        with daemon("--flows", "none") as running:
            host_before = sum(values(running.scrape(), "ccscope_tcp_retransmits_total"))
            total = send_acknowledged(1 << 20)
            host = sum(values(running.scrape(), "ccscope_tcp_retransmits_total")) - host_before
        assert host == total - before_daemon > 0, (host, total, before_daemon)
    finally:
        sock.close()
        sink.close()


# --- IPv6 -----------------------------------------------------------------------------------------------------------


def test_ipv6_flow_has_correct_addresses(link: Link, probe) -> None:
    from ccscope.flows import decode

    port = 5341
    sink = Sink(socket.AF_INET6, link.addr6_b, port, link.b)
    sock = connect(socket.AF_INET6, link.addr6_b, port, link.a)
    try:
        cookie = cookie_of(sock)
        sport = sock.getsockname()[1]
        for _ in range(20):
            sock.send(b"x" * 10000)
            time.sleep(0.01)
        raw = wait_for(lambda: next((f for f in probe.read_flows() if f.cookie == cookie), None))
        assert raw is not None
        flow = decode(raw)
        assert (flow.family, flow.src, flow.sport, flow.dst, flow.dport) == (
            "ipv6", link.addr6_a, sport, link.addr6_b, port)
        assert flow.name == f"[{link.addr6_a}]:{sport}->[{link.addr6_b}]:{port}"
        assert flow.netns == link.inode_a
        peer = [decode(f) for f in probe.read_flows() if f.netns == link.inode_b and f.dport == sport]
        assert [(p.src, p.dst, p.family) for p in peer] == [(link.addr6_b, link.addr6_a, "ipv6")]
    finally:
        sock.close()
        sink.close()


# --- daemon: grace period, top-N, promtool, signals -----------------------------------------------------------------


GRACE_S = 2.0


def test_closed_flow_series_kept_for_grace_then_vanish(link: Link) -> None:
    """A closed flow's series stay for --grace, then go. The kernel stamps the close (bpf_ktime_get_ns, the
    clock of time.monotonic) after `closed_at`, and a scrape drops the flow once that stamp is older than the
    grace: the first scrape without it started at least GRACE_S after `closed_at`. Every scrape expires what is
    due, so it goes within the 0.1 s polling and a scrape's own time; 1.5 s leaves room for a busy machine."""
    port = 5351
    sink = Sink(socket.AF_INET, link.addr_b, port, link.b)
    trickle = Trickle()
    try:
        with daemon("--grace", f"{GRACE_S}s", "--flows", "all", "--netns", str(link.inode_a)) as running:
            sock = trickle.add(connect(socket.AF_INET, link.addr_b, port, link.a))
            sport = str(sock.getsockname()[1])
            trickle.start()
            seen = wait_for(lambda: values(running.scrape(), "ccscope_flow_cwnd_segments", sport=sport), 5, 0.2)
            assert len(seen) == 1
            closed_at = time.monotonic()
            trickle.close()  # closes the socket: FIN, then TIME_WAIT -> TCP_CLOSE

            def gone() -> bool:
                return not values(running.scrape(), "ccscope_flow_cwnd_segments", sport=sport)

            assert wait_for(gone, GRACE_S + 5, 0.1), f"still there {GRACE_S + 5} s after the close"
            kept_s = time.monotonic() - closed_at
            assert GRACE_S <= kept_s <= GRACE_S + 1.5, kept_s
            assert values(running.scrape(), "ccscope_flows_expired_total")[0] >= 1
    finally:
        trickle.close()
        sink.close()


def test_top_n_of_500_connections(link: Link) -> None:
    port, count = 5361, 500
    clients, servers = [], []
    listener = None
    try:
        with daemon("--flows", "top:20", "--max-flows", "8192") as running:
            from ccscope_testkit.net import in_netns

            with in_netns(link.a):
                listener = socket.socket()
            listener.bind(("127.0.0.1", port))
            listener.listen(count)
            for _ in range(count):
                with in_netns(link.a):
                    client = socket.socket()
                client.connect(("127.0.0.1", port))
                clients.append(client)
                servers.append(listener.accept()[0])
            # Data both ways: each socket receives a segment on an established connection, so tcp_probe sees it.
            for round_ in range(2):
                for client, server in zip(clients, servers, strict=True):
                    client.sendall(b"q" * (100 + round_))
                    server.sendall(b"r" * 100)
                for client, server in zip(clients, servers, strict=True):
                    server.recv(1000)
                    client.recv(1000)
            text = wait_for(lambda: (t := running.scrape_text()) and
                            values(parse_metrics(t), "ccscope_tracked_flows")[0] >= 2 * count and t, 10, 0.2)
            assert text, "the kernel flow map never held all 1000 sockets"
            samples = parse_metrics(text)
            assert len(values(samples, "ccscope_flow_cwnd_segments")) == 20
            assert len(values(samples, "ccscope_flow_srtt_seconds")) == 20
            assert values(samples, "ccscope_exported_flows") == [20.0]
            assert values(samples, "ccscope_tracked_flows")[0] >= 500
    finally:
        for sock in clients + servers:
            sock.close()
        if listener:
            listener.close()


def _tcp_opens(netns: str) -> int:
    """ActiveOpens + PassiveOpens of a namespace (/proc/net/snmp is per namespace): connections it opened."""
    snmp = subprocess.run(["ip", "netns", "exec", netns, "cat", "/proc/net/snmp"], capture_output=True, text=True,
                          check=True).stdout
    header, numbers = (line.split() for line in snmp.splitlines() if line.startswith("Tcp:"))
    return int(numbers[header.index("ActiveOpens")]) + int(numbers[header.index("PassiveOpens")])


def test_flows_started_counts_each_flow_once(link: Link) -> None:
    """Many more sockets than --max-flows: the LRU map evicts flows and re-inserts them as they come back, and
    each socket must still count once in ccscope_tcp_flows_started_total (it counted once per re-insert)."""
    from ccscope_testkit.net import connect, in_netns

    port, connections, rounds, cc = 5391, 300, 4, "reno"
    clients, servers = [], []
    listener = None
    try:
        with daemon("--flows", "none", "--max-flows", "64", "--sample-interval", "0.1ms") as running:
            with in_netns(link.a):
                listener = socket.socket()
            listener.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())  # accepted sockets inherit
            listener.bind(("127.0.0.1", port))
            listener.listen(connections)
            opens_before = _tcp_opens(link.a)
            started_before = sum(values(running.scrape(), "ccscope_tcp_flows_started_total", cc=cc))
            for _ in range(connections):
                clients.append(connect(socket.AF_INET, "127.0.0.1", port, link.a, cc))
                servers.append(listener.accept()[0])
            # Every socket receives a segment on an established connection each round, so tcp_probe sees it each
            # round; with 600 sockets and 64 slots it has been evicted in between.
            for round_ in range(rounds):
                for client, server in zip(clients, servers, strict=True):
                    client.sendall(b"q" * (10 + round_))
                    server.recv(100)
                    server.sendall(b"r" * 10)
                    client.recv(100)
            samples = running.scrape()
            started = sum(values(samples, "ccscope_tcp_flows_started_total", cc=cc)) - started_before
            opened = _tcp_opens(link.a) - opens_before
            evictions = values(samples, "ccscope_flow_evictions_total")[0]
    finally:
        for sock in clients + servers:
            sock.close()
        if listener:
            listener.close()
    assert opened == 2 * connections  # each connection: one active and one passive open, one socket each
    assert evictions >= opened, evictions  # the map really did churn: every socket went in and out (at least)
    # A host-wide counter: other reno flows of this machine in the same second count too (few: the host default is
    # another algorithm), hence a bound, not equality. The defect counted each of our sockets once per round (~4x).
    assert opened <= started <= opened * 1.5, (started, opened)


def test_metrics_pass_promtool(link: Link) -> None:
    require_tools("promtool")
    port = 5371
    sink = Sink(socket.AF_INET, link.addr_b, port, link.b)
    trickle = Trickle()
    try:
        with daemon("--flows", "all") as running:
            trickle.add(connect(socket.AF_INET, link.addr_b, port, link.a, "cubic"))
            trickle.start()
            text = wait_for(lambda: (t := running.scrape_text()) and f'dport="{port}"' in t and t, 5, 0.2)
            assert text
    finally:
        trickle.close()
        sink.close()
    check = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True)
    assert check.returncode == 0, check.stdout + check.stderr
    samples = parse_metrics(text)
    # the per-flow families, host aggregates and health metrics are all there
    for name in ("ccscope_flow_cwnd_segments", "ccscope_tcp_srtt_seconds_bucket", "ccscope_tracked_flows",
                 "ccscope_bpf_probe_events_total", "ccscope_tcp_flows_started_total", "ccscope_build_info",
                 "ccscope_bpf_flows_closed_total", "ccscope_bpf_flow_insert_failures_total"):
        assert values(samples, name), name


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_signal_detaches_programs(sig: int) -> None:
    running = Daemon()
    try:
        ids = held_prog_ids(running.proc.pid)
        progs = json.loads(subprocess.check_output(["bpftool", "prog", "show", "-j"]))
        loaded = {p["id"]: p.get("name") for p in progs}
        assert {loaded.get(i) for i in ids} >= {"tcp_probe", "tcp_retransmit_skb"}
    finally:
        code, err = running.stop(sig)
    assert code == 0, err
    assert "detached" in err and "Traceback" not in err

    def still_loaded() -> set[int]:
        return ids & {p["id"] for p in json.loads(subprocess.check_output(["bpftool", "prog", "show", "-j"]))}

    # The kernel frees the programs a moment after the process exits (RCU, deferred work): poll, don't sample once.
    assert wait_for(lambda: not still_loaded(), 10, 0.1), f"programs still loaded: {still_loaded()}"


# --- the two builds of tcp_probe -----------------------------------------------------------------------------------

TIME_FIELDS = ("first_ns", "last_ns", "closed_ns")


def test_both_builds_of_tcp_probe_take_the_same_samples(link: Link, monkeypatch) -> None:
    """tcp_probe reads the socket through the kfunc bpf_rdonly_cast (Linux >= 6.2), tcp_probe_skc through the helper
    bpf_skc_to_tcp_sock (what 6.1 loads). This kernel takes both: attached side by side, each in its own object, they
    see the same events of a flow, take the same samples and close it with the same values."""
    from ccscope import loader
    from ccscope.loader import ProbeOptions, TelemetryProbe

    options = ProbeOptions(sample_interval_ns=20_000_000, emit_samples=True)
    samples: dict[str, list] = {"tcp_probe": [], "tcp_probe_skc": []}
    with TelemetryProbe(options) as cast:
        monkeypatch.setattr(loader, "PROBE_BUILDS", {"tcp_probe_skc": None})
        with TelemetryProbe(options) as helper:
            probes = {p.programs["tcp_probe"]: p for p in (cast, helper)}
            assert set(probes) == set(samples)
            rings = [p.ring_buffer(samples[name].extend) for name, p in probes.items()]
            sink = Sink(socket.AF_INET, link.addr_b, 5331, link.b)
            try:
                sock = connect(socket.AF_INET, link.addr_b, 5331, link.a, "cubic")
                cookie = cookie_of(sock)
                for _ in range(60):  # ~300 ms: some 15 samples of each end at 20 ms
                    sock.send(b"x" * 1000)
                    time.sleep(0.005)
                sock.close()

                def closed() -> bool:
                    for ring in rings:
                        ring.poll(0)
                    return all(any(f.cookie == cookie and f.closed_ns for f in got) for got in samples.values())

                assert wait_for(closed), "no CLOSE record of the client from one of the builds"
            finally:
                sink.close()
                for ring in rings:
                    ring.close()
    ours = {name: [f for f in got if f.netns == link.inode_a] for name, got in samples.items()}
    assert len(ours["tcp_probe"]) >= 10, ours["tcp_probe"]
    # Both decide on the socket's own clock; a sample's time (bpf_ktime_get_ns) differs between the two by the run of
    # the first program, so an event within that much of a sample's due time could fall on either side of it.
    assert abs(len(ours["tcp_probe"]) - len(ours["tcp_probe_skc"])) <= 1, ours

    def without_times(flow: bt.FlowTuple) -> dict:
        return {name: value for name, value in flow._asdict().items() if name not in TIME_FIELDS}

    # the first sample (the flow's first event) and the CLOSE record are taken on the very same events by both
    first = {name: without_times(next(f for f in got if f.cookie == cookie)) for name, got in ours.items()}
    close = {name: without_times(next(f for f in got if f.cookie == cookie and f.closed_ns))
             for name, got in ours.items()}
    assert first["tcp_probe"] == first["tcp_probe_skc"]
    assert close["tcp_probe"] == close["tcp_probe_skc"]
    assert close["tcp_probe"]["bytes_acked"] >= 60_000 and close["tcp_probe"]["ca_name"].rstrip(b"\0") == b"cubic"


# --- filters and the user-facing commands ---------------------------------------------------------------------------


@pytest.fixture
def two_live_flows(link: Link, link2: Link):
    """One live flow on 192.0.2.0/24 (port 5381) and one on 198.51.100.0/24 (port 5382), each in own namespaces."""
    sinks = [Sink(socket.AF_INET, link.addr_b, 5381, link.b), Sink(socket.AF_INET, link2.addr_b, 5382, link2.b)]
    trickle = Trickle()
    try:
        first = trickle.add(connect(socket.AF_INET, link.addr_b, 5381, link.a))
        second = trickle.add(connect(socket.AF_INET, link2.addr_b, 5382, link2.a))
        trickle.start()
        yield link, link2, first.getsockname()[1], second.getsockname()[1]
    finally:
        trickle.close()
        for sink in sinks:
            sink.close()


def _flows_json(*args: str) -> list[dict]:
    out = subprocess.run(cli("flows", "--once", "--json", "--interval", "0.5s", *args),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_filters_select_the_right_flows(two_live_flows) -> None:
    link, link2, sport1, sport2 = two_live_flows
    by_port = _flows_json("--port", "5381", "--limit", "1000")
    assert all(5381 in (f["sport"], f["dport"]) for f in by_port)
    keys = {(f["netns"], f["sport"], f["dport"]) for f in by_port}
    assert {(link.inode_a, sport1, 5381), (link.inode_b, 5381, sport1)} <= keys
    assert not any(f["netns"] in (link2.inode_a, link2.inode_b) for f in by_port)

    by_cidr = _flows_json("--cidr", "198.51.100.0/24", "--limit", "1000")
    assert all(f["src"].startswith("198.51.100.") or f["dst"].startswith("198.51.100.") for f in by_cidr)
    keys = {(f["netns"], f["sport"], f["dport"]) for f in by_cidr}
    assert (link2.inode_a, sport2, 5382) in keys
    assert not any(f["netns"] in (link.inode_a, link.inode_b) for f in by_cidr)

    by_netns = _flows_json("--netns", str(link.inode_a))
    assert [(f["netns"], f["src"], f["sport"], f["dst"], f["dport"]) for f in by_netns] == [
        (link.inode_a, link.addr_a, sport1, link.addr_b, 5381)]


def test_trace_json_prints_count_lines(two_live_flows) -> None:
    _, _, sport1, _ = two_live_flows
    out = subprocess.run(cli("trace", "--json", "--count", "7", "--port", str(sport1)),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert len(lines) == 7
    for line in lines:
        sample = json.loads(line)
        assert sample["event"] in ("probe", "close")
        assert sport1 in (sample["sport"], sample["dport"])
        assert sample["cwnd_segments"] >= 1 and sample["srtt_s"] > 0 and sample["time"] > 0


@contextlib.contextmanager
def loopback_flow() -> Iterator[int]:
    """A flow on 127.0.0.1 that sends 1,000 bytes every 5 ms until the end of the block: its listening port."""
    listener = socket.create_server(("127.0.0.1", 0))
    sender = socket.create_connection(listener.getsockname())
    receiver, _ = listener.accept()
    stop = threading.Event()

    def pump() -> None:
        while not stop.wait(0.005):
            with contextlib.suppress(OSError):
                sender.send(b"x" * 1000)
                receiver.recv(65536)

    thread = threading.Thread(target=pump, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        thread.join(timeout=2)
        for sock in (sender, receiver, listener):
            sock.close()


@pytest.mark.parametrize("ending", ["--duration", "SIGTERM", "SIGINT"])
def test_trace_ends_on_time_while_its_reader_stalls(ending: str) -> None:
    """`ccscope trace --json --duration 2s | sleep 60`: the reader never reads. Before, trace sat in a pipe write
    and ignored its duration, SIGTERM and SIGINT until the reader died; now it ends, and says what it dropped."""
    with loopback_flow() as port:
        read_end, write_end = os.pipe()
        fcntl.fcntl(write_end, fcntl.F_SETPIPE_SZ, 4096)  # one page: a few samples fill it
        duration = ("--duration", "2s") if ending == "--duration" else ()
        proc = subprocess.Popen(cli("trace", "--json", "--port", str(port), *duration), stdout=write_end,
                                stderr=subprocess.PIPE, text=True)
        os.close(write_end)
        try:
            # A thread of trace waits in the kernel for room in the pipe: from here on, the reader has stalled.
            assert wait_for(lambda: _waits_in_pipe_write(proc.pid), timeout=20), \
                proc.stderr.read() if proc.poll() is not None else "trace never filled the pipe"
            if ending != "--duration":
                proc.send_signal(getattr(signal, ending))
            code = proc.wait(timeout=15)  # before the fix: never, while the pipe stayed full
            err = proc.stderr.read()
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            os.close(read_end)
    assert code == 0 and "Traceback" not in err, err
    assert re.search(r"ccscope: \d+ samples not written: the reader of the output fell", err), err


def test_trace_says_when_it_cannot_write() -> None:
    """`ccscope trace > /dev/full`: one line and exit 1 (a traceback before the output writer, silence after)."""
    with loopback_flow() as port, open("/dev/full", "wb") as full:
        out = subprocess.run(cli("trace", "--json", "--port", str(port), "--duration", "1s"), stdout=full,
                             stderr=subprocess.PIPE, text=True, timeout=30)
    assert out.returncode == 1, out.stderr
    assert out.stderr == "ccscope: error: cannot write the samples: No space left on device\n"


def _waits_in_pipe_write(pid: int) -> bool:
    """Some thread of `pid` sleeps in the kernel's pipe write (its wchan; anon_pipe_write on 6.18, pipe_write
    before): the pipe is full. Not the pipe's byte count: a full pipe of one page may hold less than 4096."""
    for wchan in Path(f"/proc/{pid}/task").glob("*/wchan"):
        with contextlib.suppress(OSError):
            if "pipe_write" in wchan.read_text():
                return True
    return False


def test_flows_once_table_shows_live_flow(two_live_flows) -> None:
    link, _, sport1, _ = two_live_flows
    out = subprocess.run(cli("flows", "--once", "--interval", "0.5s", "--netns", str(link.inode_a)),
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("1 flows, sorted by bytes")
    assert lines[1].split()[:3] == ["FLOW", "NETNS", "CC"]
    row = lines[2].split()
    assert row[0] == f"{link.addr_a}:{sport1}->{link.addr_b}:5381"
    assert row[1] == str(link.inode_a)
    assert len(lines) == 3



def test_closing_the_collector_waits_for_a_scrape_in_progress(probe) -> None:
    """A scenario closes its probe while the endpoint may be mid-scrape (seen as `KeyError: 'flows'` from the
    endpoint): close() must wait for that scrape, and later scrapes export nothing instead of reading a closed
    probe. The scrape is held inside its map read by wrapping the table's real scan."""
    table = FlowTable(probe, grace_s=1.0)
    collector = FlowCollector(table, FlowSelection("all"))
    inside, release = threading.Event(), threading.Event()
    real_scan = table.scan

    def held_scan():
        inside.set()
        release.wait(10)
        return real_scan()

    table.scan = held_scan
    scraped: list = []
    scrape = threading.Thread(target=lambda: scraped.extend(collector.collect()))
    scrape.start()
    assert inside.wait(10)
    closer = threading.Thread(target=collector.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive(), "close() returned while a scrape was reading the probe"
    release.set()
    scrape.join(10)
    closer.join(10)
    assert {m.name for m in scraped} >= {"ccscope_tcp_flows", "ccscope_tracked_flows"}
    assert list(collector.collect()) == []
