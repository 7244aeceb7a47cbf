"""`ccscope daemon --otlp`: the series pushed over OTLP/HTTP into a real Prometheus 3.x (its native OTLP
receiver), with names, attributes and resource attributes as docs/monitoring.md maps them and values equal to
`ss -ti`; and a collector that is down or hangs costs bounded memory, a counter and one line, never the
/metrics scrape."""

from __future__ import annotations

import contextlib
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ccscope import __version__
from ccscope.otlp import ExportStats, OtlpOptions, OtlpPush, instruments
from ccscope_testkit import prometheus3
from ccscope_testkit.net import daemon, free_port, values
from ccscope_testkit.prereqs import ROOT, require_bpf_object, require_root, require_tools
from prometheus_client.core import CounterMetricFamily

PUSHED = [f"system_network_tcp_{n}" for n in (
    "congestion_window", "rtt_seconds", "rtt_min_seconds", "rtt_variation_seconds", "queueing_delay_seconds",
    "packets_in_flight", "delivery_rate_bytes_per_second", "congestion_state", "mss_bytes", "io_bytes_total",
    "acked_bytes_total", "retransmits_total")] + ["ccscope_tcp_flows", "ccscope_tcp_flows_started_total"]
CONFIG = """
global: {{scrape_interval: 1s, evaluation_interval: 1s}}
otlp: {{promote_resource_attributes: [host.name]}}
scrape_configs:
  - job_name: ccscope-scrape
    static_configs: [{{targets: ["127.0.0.1:{daemon}"]}}]
"""


@pytest.fixture(autouse=True)
def _prerequisites() -> None:
    require_root()
    require_tools("ss")
    require_bpf_object()


@pytest.fixture(scope="module")
def exe() -> Path:
    return prometheus3.binary()


def wait(what: str, check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        found = check()
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


class IdleFlow:
    """A loopback connection that sent `size` bytes and went idle. poke() sends one byte back: its arrival
    fires tcp_probe after the last ACK, so the daemon's map holds the sender's final state (the probe runs
    before the kernel processes a segment; test_telemetry.py)."""

    def __init__(self, size: int = 200_000) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.sender = socket.create_connection(self.listener.getsockname())
        self.receiver, _ = self.listener.accept()
        self.sender.sendall(b"x" * size)
        got = 0
        while got < size:
            got += len(self.receiver.recv(1 << 16))
        self.port = self.sender.getsockname()[1]

    def poke(self) -> None:
        self.receiver.sendall(b"!")
        self.sender.recv(1)

    def ss(self) -> dict[str, str]:
        """ss -ti's view of the sending socket: its algorithm and key:value fields."""
        out = subprocess.run(["ss", "-tinH", "state", "established", f"( sport = :{self.port} )"],
                             capture_output=True, text=True, check=True).stdout
        info = out.splitlines()[1]
        fields = dict(re.findall(r"\b([a-z_]+):([0-9.]+)", info))
        fields["cc"] = re.search(r"^\s*(\w+) wscale:", info).group(1)
        return fields

    def close(self) -> None:
        for sock in (self.sender, self.receiver, self.listener):
            sock.close()


@pytest.fixture
def idle_flow() -> Iterator[IdleFlow]:
    flow = IdleFlow()
    try:
        yield flow
    finally:
        flow.close()


def test_pushed_series_reach_prometheus_3_as_ss_sees_them(exe: Path, idle_flow: IdleFlow) -> None:
    port = free_port()
    with prometheus3.running(exe, CONFIG.format(daemon=port), "--web.enable-otlp-receiver") as prom, \
            daemon("--otlp", f"{prom.url}/api/v1/otlp/v1/metrics", "--otlp-interval", "1s", "--otlp-timeout",
                   "0.8s", port=port) as running:
        me = f'network_local_port="{idle_flow.port}"'

        def pushes() -> float:
            return sum(values(running.scrape(), "ccscope_otlp_exports_total", result="success"))

        def pushed_after_poke() -> list:
            idle_flow.poke()  # until the daemon, attached after the flow went idle, has seen it
            return prom.query(f"system_network_tcp_acked_bytes_total{{{me}}}")

        wait("the flow's pushed series", pushed_after_poke)
        pushed_so_far = pushes()  # two more, by the daemon's own count: any value the first one raced is overwritten
        wait("two more pushes", lambda: pushes() >= pushed_so_far + 2)
        acked = prom.query(f"system_network_tcp_acked_bytes_total{{{me}}}")
        ss = idle_flow.ss()
        names = set(prom.api("label/__name__/values"))
        assert set(PUSHED) <= names, sorted(set(PUSHED) - names)
        labels = acked[0]["metric"]
        assert labels["job"] == "ccscope" and labels["instance"] == labels["host_name"] == socket.gethostname()
        assert labels["network_local_address"] == labels["network_peer_address"] == "127.0.0.1"
        assert labels["network_peer_port"] == str(idle_flow.listener.getsockname()[1])
        assert labels["network_tcp_congestion_control"] == ss["cc"]
        pushed = {name: float(prom.query(f"{name}{{{me}}}")[0]["value"][1]) for name in (
            "system_network_tcp_acked_bytes_total", "system_network_tcp_congestion_window",
            "system_network_tcp_mss_bytes", "system_network_tcp_rtt_seconds")}
        assert pushed["system_network_tcp_acked_bytes_total"] == int(ss["bytes_acked"])
        assert pushed["system_network_tcp_congestion_window"] == int(ss["cwnd"])
        assert pushed["system_network_tcp_mss_bytes"] == int(ss["mss"])
        # ss prints srtt in ms with 3 decimals; on loopback a few tens of microseconds
        assert pushed["system_network_tcp_rtt_seconds"] * 1e3 == pytest.approx(float(ss["rtt"]), abs=0.0015)
        sent = prom.query(f'system_network_tcp_io_bytes_total{{{me},network_io_direction="transmit"}}')
        assert float(sent[0]["value"][1]) == int(ss["bytes_sent"])
        # the resource: service and host, as target_info
        (info,) = prom.query('target_info{job="ccscope"}')
        assert info["metric"]["service_version"] == __version__ and info["metric"]["os_type"] == "linux"
        # the same values scraped from /metrics
        mine = f'ccscope_flow_cwnd_segments{{sport="{idle_flow.port}"}}'
        scraped = wait("the scraped series", lambda: prom.query(mine))
        assert float(scraped[0]["value"][1]) == pushed["system_network_tcp_congestion_window"]


# (collector, scrapes 0.3 s apart, RSS read at these two): the hanging one holds every push for the whole
# --otlp-timeout, the case that would queue if anything did.
DEAD = {"refusing": (20, None), "hanging": (60, (30, 59))}


@pytest.mark.parametrize("collector", DEAD)
def test_a_dead_collector_costs_a_counter_and_one_line_never_the_scrape(collector: str) -> None:
    scrapes, rss_at = DEAD[collector]
    with dead_collector(collector) as url, daemon("--otlp", url, "--otlp-interval", "0.3s", "--otlp-timeout",
                                                  "0.2s") as d:
        rss = []
        for i in range(scrapes):  # every scrape answers while the push thread is stuck
            status, _, body = d.get("/metrics", timeout=5)
            assert status == 200 and b"ccscope_tcp_flows" in body
            if rss_at and i in rss_at:
                rss.append(resident_kib(d.proc.pid))
            time.sleep(0.3)
        assert d.metric('ccscope_otlp_exports_total{result="failure"}') >= scrapes // 4
        assert d.metric('ccscope_otlp_exports_total{result="success"}') == 0 and d.metric("ccscope_otlp_failing") == 1
        # A coarse guard; the bound itself is by construction (no queue; test_push_keeps_only_present_series).
        # RSS warms up for ~7 s, then wanders: 57.1-59.1 MB over 125 hanging pushes in 70 s with a scrape every
        # 0.25 s (refusing: 56.3-56.9 MB over 200); the exporter alone stays within 35.0-35.8 MB over 180.
        if rss:
            assert rss[1] - rss[0] < 4096, rss
        code, err = d.stop()
    lines = [line for line in err.splitlines() if "OTLP" in line]
    assert code == 0 and len(lines) == 1 and lines[0].startswith("ccscope: warning: OTLP export to"), err
    assert "Traceback" not in err


def test_push_keeps_only_present_series() -> None:
    """The only state between pushes: the start of each cumulative series still present. Flows that come and
    go (here 50 pushes of 20 new connections each) leave nothing behind; a series that stays keeps its start."""
    def collection(ports: range) -> dict:
        family = CounterMetricFamily("ccscope_flow_bytes_acked", "", labels=("sport", "cc"))
        for port in [*ports, 443]:
            family.add_metric([str(port), "bbr"], port)
        return {family.name: family}

    push = OtlpPush(OtlpOptions("http://127.0.0.1:1/v1/metrics", interval_s=3600, timeout_s=1), lambda: [])
    try:
        first = push.batch(collection(range(20)), 1_000)
        for i in range(1, 50):
            batch = push.batch(collection(range(20 * i, 20 * i + 20)), 1_000 + i)
        assert len(push._starts) == 21
        (metric,) = batch.resource_metrics[0].scope_metrics[0].metrics
        assert metric.name == "system.network.tcp.acked" and metric.data.is_monotonic
        kept = next(p for p in metric.data.data_points if p.attributes["network.local.port"] == 443)
        assert kept.start_time_unix_nano == 1_000 and kept.time_unix_nano == 1_049 and kept.value == 443
        assert {p.start_time_unix_nano for p in metric.data.data_points} == {1_000, 1_049}
        assert len(first.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points) == 21
    finally:
        push.close()


def test_warning_lines_when_exports_fail_and_recover() -> None:
    said: list[str] = []
    stats = ExportStats("http://x/v1/metrics", said.append)
    stats.record(True, 10)
    stats.record(False, 7)
    stats.record(False, 7)
    assert len(said) == 1 and "14" not in said[0] and "7 data points" in said[0]
    stats.record(True, 10)
    assert len(said) == 2 and "works again" in said[1]
    assert (stats.succeeded, stats.failed, stats.dropped_points) == (2, 2, 14)


@pytest.mark.parametrize(("args", "expect"), [
    (["--otlp", "collector:4318"], "give the collector's OTLP/HTTP metrics URL"),
    (["--otlp", "http://127.0.0.1:1/v1/metrics", "--otlp-header", "novalue"], "use NAME=VALUE"),
    (["--otlp", "http://127.0.0.1:1/v1/metrics", "--otlp-timeout", "20s"], "below --otlp-interval"),
    (["--listen", "off"], "--listen off leaves nothing to export"),
])
def test_bad_otlp_flags_are_one_line(args: list[str], expect: str) -> None:
    ran = subprocess.run([sys.executable, "-m", "ccscope.cli", "daemon", *args], capture_output=True, text=True,
                         timeout=30, cwd=ROOT)
    assert ran.returncode == 2 and expect in ran.stderr and len(ran.stderr.splitlines()) == 1, ran.stderr


def test_without_the_extra_it_says_which(tmp_path: Path) -> None:
    blocker = "import sys; sys.modules['opentelemetry'] = None; from ccscope.cli import main; sys.exit(main())"
    ran = subprocess.run([sys.executable, "-c", blocker, "daemon", "--otlp", "http://127.0.0.1:1/v1/metrics"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert ran.returncode == 3 and "pip install 'ccscope[otlp]'" in ran.stderr, ran.stderr
    assert len(ran.stderr.strip().splitlines()) == 1


def test_the_mapping_table_in_the_docs_is_the_code() -> None:
    text = (ROOT / "docs" / "monitoring.md").read_text()
    rows = re.findall(r"^\| `([a-z_.]+)` \| `([^`]*)` \| (\w+) \| ([^|]+) \|", text, re.MULTILINE)
    documented = {name: (unit, kind, set(re.findall(r"`(ccscope_[a-z_]+)`", sources))) for name, unit, kind, sources
                  in rows}
    assert documented == {i.name: (i.unit, i.kind, {family for family, _ in i.sources}) for i in instruments()}


# --- helpers -----------------------------------------------------------------------------------------------------


def resident_kib(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE).group(1))


class _Hang:
    """Accepts connections and never answers (a collector that hangs)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
        for conn in self.conns:
            conn.close()


@contextlib.contextmanager
def dead_collector(kind: str) -> Iterator[str]:
    """The URL of a collector that refuses connections (nothing listens) or hangs (accepts, never answers)."""
    if kind == "refusing":
        yield f"http://127.0.0.1:{free_port()}/v1/metrics"
        return
    hang = _Hang()
    try:
        yield f"http://127.0.0.1:{hang.sock.getsockname()[1]}/v1/metrics"
    finally:
        hang.close()
