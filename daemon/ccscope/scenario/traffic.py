"""Traffic of one run inside a Testbed: iperf3 bulk flows, ping under load, short downloads.

Data always flows sender_ns -> receiver_ns (the `up` direction): iperf3 clients and the download server
sit in the sender namespace, whose netns inode the BPF recorder watches. Every process has a deadline;
the Testbed kills whatever is left when it closes.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import ccscope
from ccscope.emulation.profile import SHORT_FLOW_PORT
from ccscope.errors import CcscopeError

from .spec import Scenario

IPERF_BASE_PORT = 5201
FETCH_PORT = SHORT_FLOW_PORT  # a profile's `isolate` puts this port in the interactive queue
START_SLACK_S = 15.0  # connect + JSON output beyond the flow's own duration


@dataclass
class BulkFlow:
    index: int
    algorithm: str
    port: int  # iperf3 server port
    start_offset_s: float
    local_port: int | None = None  # iperf3 data connection, as the sender sees it
    start_mono: float | None = None
    iperf: dict = field(default_factory=dict)  # summary of iperf3 -J
    error: str | None = None


@dataclass
class TrafficResult:
    start_mono: float = 0.0  # first bulk flow (or first download) started
    end_mono: float = 0.0  # last process finished
    bulk: list[BulkFlow] = field(default_factory=list)
    ping: list[tuple[float, float]] = field(default_factory=list)  # (monotonic s, rtt s)
    ping_sent: int = 0
    downloads: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


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


def _wait_listening(tb, ns: str, port: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        out = tb.run(ns, ["ss", "-Hltn", f"sport = :{port}"], timeout=5).stdout
        if out.strip():
            return
        time.sleep(0.02)
    raise CcscopeError(f"nothing listens on port {port} in {ns} after {timeout:g} s")


def run_traffic(tb, scenario: Scenario, mix: tuple[str, ...], progress: Callable[[float], None]) -> TrafficResult:
    result = TrafficResult()
    t = scenario.traffic
    flows = bulk_plan(scenario, mix)
    result.bulk = flows
    servers = []
    for flow in flows:
        servers.append(tb.popen(tb.receiver_ns, ["iperf3", "-s", "-1", "-p", str(flow.port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    fetch_server = None
    if t.downloads is not None:
        fetch_server = tb.popen(tb.sender_ns, [sys.executable, "-m", "ccscope.scenario.fetch", "serve",
                                               "--port", str(FETCH_PORT), "--cc", mix[0]],
                                env=_python_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    for flow in flows:
        _wait_listening(tb, tb.receiver_ns, flow.port)
    if fetch_server is not None:
        _wait_listening(tb, tb.sender_ns, FETCH_PORT)
    # ARP and the path are warm before anything is timed
    tb.run(tb.sender_ns, ["ping", "-n", "-c", "1", "-W", "2", tb.receiver_addr], timeout=5)

    planned = planned_seconds(scenario)
    bulk_end = scenario.duration_s + t.stagger_s * max(0, len(flows) - 1) if flows else 0.0
    t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
    result.start_mono = t0
    wall_offset = time.time() - t0
    procs: dict[str, subprocess.Popen] = {}
    if t.ping_interval_s is not None:
        ping_for = bulk_end if flows else planned
        procs["ping"] = tb.popen(tb.sender_ns, ["ping", "-n", "-D", "-i", f"{t.ping_interval_s:g}",
                                                "-w", f"{max(1, round(ping_for))}", tb.receiver_addr],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    if t.downloads is not None:
        d = t.downloads
        argv = [sys.executable, "-m", "ccscope.scenario.fetch", "get", "--server",
                f"{tb.sender_addr}:{FETCH_PORT}", "--sizes", ",".join(map(str, d.sizes)),
                "--timeout", f"{d.timeout_s:g}", "--start", f"{d.start_s:g}"]
        if d.every_s is not None:
            argv += ["--every", f"{d.every_s:g}", "--until", f"{scenario.duration_s:g}"]
        procs["downloads"] = tb.popen(tb.receiver_ns, argv, env=_python_env(), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True)
    pending = sorted(flows, key=lambda f: f.start_offset_s)
    deadline = t0 + planned + START_SLACK_S + (t.downloads.timeout_s if t.downloads else 0.0)
    while True:
        now = time.clock_gettime(time.CLOCK_MONOTONIC)
        while pending and now - t0 >= pending[0].start_offset_s:
            flow = pending.pop(0)
            flow.start_mono = now
            procs[f"iperf{flow.index}"] = tb.popen(tb.sender_ns, _iperf_argv(tb, scenario, flow),
                                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        progress(min(now - t0, planned))
        running = [p for p in procs.values() if p.poll() is None]
        if not pending and not running:
            break
        if now > deadline:
            result.errors.append(f"traffic did not finish within {deadline - t0:.0f} s; stopped it")
            break
        time.sleep(0.1)
    outputs = {name: _finish(proc) for name, proc in procs.items()}
    result.end_mono = time.clock_gettime(time.CLOCK_MONOTONIC)
    for flow in flows:
        out, err = outputs.get(f"iperf{flow.index}", ("", ""))
        _parse_iperf(flow, out, err)
        if flow.error:
            result.errors.append(f"bulk flow {flow.index} ({flow.algorithm}): {flow.error}")
    if "ping" in outputs:
        result.ping, result.ping_sent = parse_ping(outputs["ping"][0], wall_offset)
    if "downloads" in outputs:
        out, err = outputs["downloads"]
        result.downloads = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
        if err.strip():
            result.errors.append(f"downloads: {err.strip().splitlines()[-1]}")
    for proc in [*servers, fetch_server]:
        if proc is not None:
            _finish(proc)
    return result


def _iperf_argv(tb, scenario: Scenario, flow: BulkFlow) -> list[str]:
    return ["iperf3", "-c", tb.receiver_addr, "-p", str(flow.port), "-t", str(int(scenario.duration_s)),
            "-O", str(int(scenario.warmup_s)), "-C", flow.algorithm, "-J", "-i", "0.2",
            "--connect-timeout", "5000"]


def _finish(proc: subprocess.Popen) -> tuple[str, str]:
    """Collect output; anything still running is terminated first (deadline passed or a server)."""
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
    try:
        out, err = proc.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 9)
        out, err = proc.communicate(timeout=5)
    return out or "", err or ""


def _parse_iperf(flow: BulkFlow, out: str, err: str) -> None:
    try:
        data = json.loads(out)
    except json.JSONDecodeError:
        flow.error = "iperf3 gave no JSON: " + ((err or out).strip().splitlines() or ["no output"])[-1]
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
        "sender_tcp_congestion": end.get("sender_tcp_congestion"),
        "receiver_tcp_congestion": end.get("receiver_tcp_congestion"),
        "received_bytes": received.get("bytes"),
        "received_seconds": received.get("seconds"),
        "goodput_bps": received.get("bits_per_second"),
        "sent_bytes": sent.get("bytes"),
        "retransmits": sent.get("retransmits"),
        "mean_rtt_s": sender.get("mean_rtt") / 1e6 if sender.get("mean_rtt") else None,
        "max_snd_cwnd_bytes": sender.get("max_snd_cwnd"),
    }


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
