"""Traffic of one run inside a Testbed: iperf3 bulk flows, ping under load, short downloads.

Data always flows sender_ns -> receiver_ns (the `up` direction): iperf3 clients and the download server
sit in the sender namespace, whose netns inode the BPF recorder watches. Every process has a deadline;
the Testbed kills whatever is left when it closes.

Every child writes its stdout and stderr to files in the run's log directory, never to a pipe: a pipe
holds 64 KiB, and iperf3's -J -i 0.2 report of a 20 s flow is larger, so a child whose pipe is read only
after it exits blocks on its last write until the deadline kills it, and its report is lost. The files
stay in the results directory as the tools' own raw output.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ccscope
from ccscope.cc import catalog
from ccscope.emulation.profile import SHORT_FLOW_PORT
from ccscope.emulation.testbed import terminate

from .document import PING_STREAMS
from .spec import Scenario, Traffic

IPERF_BASE_PORT = 5201
FETCH_PORT = SHORT_FLOW_PORT  # a profile's `isolate` puts this port in the interactive queue
START_SLACK_S = 15.0  # connect + JSON output beyond the flow's own duration
POLL_S = 0.1


@dataclass
class BulkFlow:
    index: int
    algorithm: str
    port: int  # iperf3 server port
    start_offset_s: float
    local_port: int | None = None  # iperf3 data connection, as the sender sees it
    ect1_packets: int | None = None  # an L4S sender's: its packets the sender's egress sent as ECT(1)
    start_mono: float | None = None
    iperf: dict = field(default_factory=dict)  # summary of iperf3 -J
    error: str | None = None


@dataclass
class PingSeries:
    """One ping stream's replies and how many echo requests it sent."""
    replies: list[tuple[float, float]] = field(default_factory=list)  # (monotonic s, rtt s)
    sent: int = 0


def ping_streams(traffic: Traffic) -> dict[str, tuple[str, ...]]:
    """The run's ping streams, by their key in results.json's run (document.PING_STREAMS): their ping options.
    ECT(1) is L4S's identifier (RFC 9331), which a DualPI2 queues in its L queue whatever its ecn_mask: ping -Q
    sets it, since IP_TOS keeps the ECN bits a socket other than TCP's asks for."""
    if traffic.ping_interval_s is None:
        return {}
    return {"ping": (), **({"ping_l4s": ("-Q", "0x01")} if traffic.ping_l4s else {})}


@dataclass
class TrafficResult:
    start_mono: float = 0.0  # first bulk flow (or first download) started
    end_mono: float = 0.0  # last process finished
    bulk: list[BulkFlow] = field(default_factory=list)
    pings: dict[str, PingSeries] = field(default_factory=dict)  # by stream (ping_streams)
    downloads: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@dataclass
class Child:
    """A process of the traffic phase, its output going to <log_dir>/<name>.out and .err."""

    name: str
    proc: subprocess.Popen
    stdout_path: Path
    stderr_path: Path

    def output(self) -> tuple[str, str]:
        return _read_text(self.stdout_path), _read_text(self.stderr_path)


def _read_text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


def planned_seconds(scenario: Scenario) -> float:
    """How long one run's traffic is expected to take (progress bars and timeouts)."""
    t = scenario.traffic
    bulk = scenario.duration_s + t.stagger_s * max(0, t.flows - 1) if t.flows else 0.0
    dl = 0.0
    if t.downloads is not None:
        d = t.downloads
        dl = scenario.duration_s if d.every_s is not None else d.start_s + len(d.sizes) * d.timeout_s
    return max(bulk, dl, 1.0)


def bulk_plan(scenario: Scenario, mix: tuple[str, ...]) -> list[BulkFlow]:
    flows = []
    for _ in range(scenario.traffic.flows):
        for alg in mix:
            i = len(flows)
            flows.append(BulkFlow(index=i, algorithm=alg, port=IPERF_BASE_PORT + i,
                                  start_offset_s=i * scenario.traffic.stagger_s))
    return flows


def _python_env() -> dict[str, str]:
    env = dict(os.environ)
    pkg_root = str(Path(ccscope.__file__).resolve().parents[1])
    env["PYTHONPATH"] = pkg_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


def spawn(tb, ns: str, name: str, argv: list[str], log_dir: Path, **kw) -> Child:
    """Starts argv in `ns` with stdout and stderr going to files in log_dir (never a pipe)."""
    stdout_path, stderr_path = log_dir / f"{name}.out", log_dir / f"{name}.err"
    with stdout_path.open("wb") as out, stderr_path.open("wb") as err:
        proc = tb.popen(ns, argv, stdout=out, stderr=err, **kw)
    return Child(name, proc, stdout_path, stderr_path)


def run_traffic(tb, scenario: Scenario, mix: tuple[str, ...], progress: Callable[[float], None],
                log_dir: Path) -> TrafficResult:
    """Servers up, then the timed phase (bulk flows at their offsets, ping, downloads), then parsing."""
    log_dir.mkdir(parents=True, exist_ok=True)
    result = TrafficResult(bulk=bulk_plan(scenario, mix))
    l4s = [flow for flow in result.bulk if catalog.sends_ect1(flow.algorithm)]
    for flow in l4s:
        tb.send_ect1(flow.port)
    if scenario.traffic.downloads is not None and catalog.sends_ect1(mix[0]):
        tb.send_ect1(FETCH_PORT, source=True)  # the download server runs the mix's first algorithm
    servers = start_servers(tb, scenario, result.bulk, mix, log_dir)
    try:
        # ARP and the path are warm before anything is timed
        tb.run(tb.sender_ns, ["ping", "-n", "-c", "1", "-W", "2", tb.receiver_addr], timeout=5)
        clients = run_timed_phase(tb, scenario, result, log_dir, progress)
    finally:
        for server in servers:
            terminate(server.proc, grace_s=5.0)
    result.end_mono = time.clock_gettime(time.CLOCK_MONOTONIC)
    collect(result, clients, servers)
    for flow in l4s:
        flow.ect1_packets = tb.ect1_packets(flow.port)
    return result


def start_servers(tb, scenario: Scenario, flows: list[BulkFlow], mix: tuple[str, ...],
                  log_dir: Path) -> list[Child]:
    servers = [spawn(tb, tb.receiver_ns, f"iperf3-server{flow.index}",
                     ["iperf3", "-s", "-1", "-p", str(flow.port)], log_dir) for flow in flows]
    if scenario.traffic.downloads is not None:
        servers.append(spawn(tb, tb.sender_ns, "download-server",
                             [sys.executable, "-m", "ccscope.scenario.fetch", "serve", "--port", str(FETCH_PORT),
                              "--cc", mix[0]], log_dir, env=_python_env()))
    for flow in flows:
        tb.wait_listening(tb.receiver_ns, flow.port)
    if scenario.traffic.downloads is not None:
        tb.wait_listening(tb.sender_ns, FETCH_PORT)
    return servers


def run_timed_phase(tb, scenario: Scenario, result: TrafficResult, log_dir: Path,
                    progress: Callable[[float], None]) -> list[Child]:
    """Starts ping and downloads at t0 and each bulk flow at its offset; waits for all, up to a deadline."""
    t = scenario.traffic
    planned = planned_seconds(scenario)
    t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
    result.start_mono = t0
    clients = [*_start_ping(tb, scenario, result, log_dir), *_start_downloads(tb, scenario, log_dir)]
    pending = sorted(result.bulk, key=lambda f: f.start_offset_s)
    deadline = t0 + planned + START_SLACK_S + (t.downloads.timeout_s if t.downloads else 0.0)
    while True:
        now = time.clock_gettime(time.CLOCK_MONOTONIC)
        while pending and now - t0 >= pending[0].start_offset_s:
            flow = pending.pop(0)
            flow.start_mono = now
            clients.append(spawn(tb, tb.sender_ns, f"iperf3-client{flow.index}", _iperf_argv(tb, scenario, flow),
                                 log_dir))
        progress(min(now - t0, planned))
        if not pending and all(c.proc.poll() is not None for c in clients):
            break
        if now > deadline:
            late = ", ".join(c.name for c in clients if c.proc.poll() is None)
            result.errors.append(f"traffic did not finish within {deadline - t0:.0f} s; stopped {late}")
            break
        time.sleep(POLL_S)
    for child in clients:  # SIGINT: iperf3 and ping still write their report, cut short
        terminate(child.proc, signal.SIGINT, grace_s=5.0)
    return clients


def _start_ping(tb, scenario: Scenario, result: TrafficResult, log_dir: Path) -> list[Child]:
    t = scenario.traffic
    bulk_end = scenario.duration_s + t.stagger_s * max(0, len(result.bulk) - 1)
    ping_for = bulk_end if result.bulk else planned_seconds(scenario)
    return [spawn(tb, tb.sender_ns, name, ["ping", "-n", "-D", *options, "-i", f"{t.ping_interval_s:g}",
                                           "-w", f"{max(1, round(ping_for))}", tb.receiver_addr], log_dir)
            for name, options in ping_streams(t).items()]


def _start_downloads(tb, scenario: Scenario, log_dir: Path) -> list[Child]:
    d = scenario.traffic.downloads
    if d is None:
        return []
    argv = [sys.executable, "-m", "ccscope.scenario.fetch", "get", "--server", f"{tb.sender_addr}:{FETCH_PORT}",
            "--sizes", ",".join(map(str, d.sizes)), "--timeout", f"{d.timeout_s:g}", "--start", f"{d.start_s:g}"]
    if d.every_s is not None:
        argv += ["--every", f"{d.every_s:g}", "--until", f"{scenario.duration_s:g}"]
    return [spawn(tb, tb.receiver_ns, "downloads", argv, log_dir, env=_python_env())]


def collect(result: TrafficResult, clients: list[Child], servers: list[Child]) -> None:
    """Parses what every child wrote, also of a child that was stopped at the deadline."""
    wall_offset = time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)
    by_name = {c.name: c for c in clients}
    for flow in result.bulk:
        child = by_name.get(f"iperf3-client{flow.index}")
        if child is None:
            flow.error = "iperf3 did not start"
        else:
            _parse_iperf(flow, *child.output(), log=child.stdout_path.name)
        if flow.error:
            result.errors.append(f"bulk flow {flow.index} ({flow.algorithm}): {flow.error}")
    result.pings = {name: PingSeries(*parse_ping(child.output()[0], wall_offset))
                    for name, child in by_name.items() if name in PING_STREAMS}
    if "downloads" in by_name:
        out, err = by_name["downloads"].output()
        result.downloads = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if err.strip():
            result.errors.append(f"downloads: {err.strip().splitlines()[-1]}")
    for server in servers:
        err = server.output()[1].strip()
        if err and server.name == "download-server":
            result.errors.append(f"download server: {err.splitlines()[-1]}")


def _iperf_argv(tb, scenario: Scenario, flow: BulkFlow) -> list[str]:
    return ["iperf3", "-c", tb.receiver_addr, "-p", str(flow.port), "-t", str(int(scenario.duration_s)),
            "-O", str(int(scenario.warmup_s)), "-C", flow.algorithm, "-J", "-i", "0.2",
            "--connect-timeout", "5000"]


def _parse_iperf(flow: BulkFlow, out: str, err: str, log: str) -> None:
    try:
        data = json.loads(out)
    except json.JSONDecodeError:
        last = ((err or out).strip().splitlines() or ["no output"])[-1]
        flow.error = f"iperf3 gave no JSON (raw output in {log}): {last}"
        return
    if data.get("error"):
        flow.error = f"iperf3: {data['error']}"
    connected = data.get("start", {}).get("connected") or []
    if connected:
        flow.local_port = connected[0].get("local_port")
    end = data.get("end", {})
    received = end.get("sum_received") or {}
    sent = end.get("sum_sent") or {}
    streams = end.get("streams") or [{}]
    sender = streams[0].get("sender", {}) if streams else {}
    flow.iperf = {
        # on a real path the far end's iperf3 says these: a name, or nothing
        "sender_tcp_congestion": _algorithm_name(end.get("sender_tcp_congestion")),
        "receiver_tcp_congestion": _algorithm_name(end.get("receiver_tcp_congestion")),
        "received_bytes": received.get("bytes"),
        "received_seconds": received.get("seconds"),
        "goodput_bps": received.get("bits_per_second"),
        "sent_bytes": sent.get("bytes"),
        "retransmits": sent.get("retransmits"),
        "mean_rtt_s": sender.get("mean_rtt") / 1e6 if sender.get("mean_rtt") else None,
        "max_snd_cwnd_bytes": sender.get("max_snd_cwnd"),
    }


_ALGORITHM = re.compile(r"[a-z][a-z0-9_]{0,15}")


def _algorithm_name(value: object) -> str | None:
    return value if isinstance(value, str) and _ALGORITHM.fullmatch(value) else None


_PING = re.compile(r"^\[(\d+\.\d+)\].*icmp_seq=(\d+).*time=([0-9.]+) ms")


def parse_ping(text: str, wall_offset: float) -> tuple[list[tuple[float, float]], int]:
    """ping -D lines -> [(monotonic seconds, rtt seconds)], and the number of echo requests sent."""
    samples = []
    for line in text.splitlines():
        m = _PING.match(line)
        if m:
            samples.append((float(m.group(1)) - wall_offset, float(m.group(3)) / 1e3))
    sent = re.search(r"(\d+) packets transmitted", text)
    return samples, int(sent.group(1)) if sent else len(samples)
