"""Real-path scenarios, run as on a real host: the runner inside a "laptop" namespace with two interfaces,
`eth` and `wlan`, towards a "server" namespace, each through a router namespace that the existing emulation
shapes (eth: 40 Mbit/s, 2 ms each way; wlan: 10 Mbit/s, 10 ms each way, 0.2% loss towards the laptop).

    laptop  eth  192.0.2.2 ---- rtr-eth ----  198.51.100.2  \\
            wlan 192.0.2.6 ---- rtr-wlan ---  198.51.100.6  -- server, target 198.51.100.100 (on lo)

The server namespace runs `ccscope serve` (5201-5216), a plain `iperf3 -s` (5301), and a server for foreign
traffic (6001). Oracles: iperf3's own JSON (goodput), `ss -ti` sampled on the sender (cwnd, srtt and the
algorithm the kernel runs), and the laptop namespace's sysctls, qdiscs and routes before and after.
"""

from __future__ import annotations

import json
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from ccscope.bpf_types import Event
from ccscope.emulation import backends
from ccscope.emulation.netns import iproute_in
from ccscope.emulation.profile import LinkProfile
from ccscope_testkit.net import kill_netns_processes, netns_name
from ccscope_testkit.prereqs import ROOT, require_bpf_object, require_root, require_tools

TARGET = "198.51.100.100"
SERVE_PORTS = (5201, 5216)
PLAIN_PORT = 5301
FOREIGN_PORT = 6001
PATHS = {  # name: (laptop address, router's laptop side, router's server side, server side, link)
    "eth": ("192.0.2.2", "192.0.2.1", "198.51.100.1", "198.51.100.2", LinkProfile(rate_bps=40e6, delay_s=0.002)),
    "wlan": ("192.0.2.6", "192.0.2.5", "198.51.100.5", "198.51.100.6", LinkProfile(rate_bps=10e6, delay_s=0.010)),
}
WLAN_TO_LAPTOP_LOSS = 0.002
# the laptop namespace's TCP and interface settings; the two lists of algorithms are host-wide (other runs
# on this machine register BPF ones and allow them meanwhile)
SNAPSHOT_SYSCTLS = r"^net\.ipv4\.(tcp_|ip_forward|conf\.(eth|wlan|all|default)\.)"
HOST_WIDE = ("net.ipv4.tcp_allowed_congestion_control", "net.ipv4.tcp_available_congestion_control")


def sh(*argv: str, ns: str | None = None, check: bool = True, timeout: float = 30) -> str:
    cmd = ["ip", "netns", "exec", ns, *argv] if ns else list(argv)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode:
        raise AssertionError(f"{' '.join(cmd)}: {done.stderr.strip()}")
    return done.stdout


class Net:
    """The namespaces, the shaping, the far-end servers; close() removes everything."""

    def __init__(self, tmp: Path) -> None:
        self.laptop, self.server = netns_name("lap"), netns_name("srv")
        self.routers = {name: netns_name(f"r{name}") for name in PATHS}
        self.tmp = tmp
        self.procs: list[subprocess.Popen] = []
        self.serve_log = tmp / "serve.log"
        self.token_file = tmp / "serve-token"  # serve makes it at its first start (auth is on by default)

    @property
    def namespaces(self) -> list[str]:
        return [self.laptop, self.server, *self.routers.values()]

    def popen(self, ns: str, argv: list[str], **kw) -> subprocess.Popen:
        kw.setdefault("start_new_session", True)
        proc = subprocess.Popen(["ip", "netns", "exec", ns, *argv], **kw)
        self.procs.append(proc)
        return proc

    def build(self) -> None:
        for ns in self.namespaces:
            sh("ip", "netns", "add", ns)
        sh("ip", "addr", "add", f"{TARGET}/32", "dev", "lo", ns=self.server)
        sh("ip", "link", "set", "lo", "up", ns=self.server)
        sh("ip", "link", "set", "lo", "up", ns=self.laptop)
        for i, (name, (lap, rlap, rsrv, srv, link)) in enumerate(PATHS.items()):
            r = self.routers[name]
            sh("ip", "link", "add", name, "netns", self.laptop, "type", "veth", "peer", "name", "tolap", "netns", r)
            sh("ip", "link", "add", "tosrv", "netns", r, "type", "veth", "peer", "name", f"s{name}",
               "netns", self.server)
            for ns, dev, addr in ((self.laptop, name, f"{lap}/30"), (r, "tolap", f"{rlap}/30"),
                                  (r, "tosrv", f"{rsrv}/30"), (self.server, f"s{name}", f"{srv}/30")):
                sh("ip", "addr", "add", addr, "dev", dev, ns=ns)
                sh("ip", "link", "set", "dev", dev, "up", ns=ns)
                sh("ethtool", "-K", dev, "tso", "off", "gso", "off", "gro", "off", ns=ns)
            sh("ip", "link", "set", "lo", "up", ns=r)
            sh("sysctl", "-qw", "net.ipv4.ip_forward=1", ns=r)
            sh("ip", "route", "add", f"{TARGET}/32", "via", srv, ns=r)
            sh("ip", "route", "add", f"{TARGET}/32", "via", rlap, "dev", name, "metric", str(100 * (i + 1)),
               ns=self.laptop)
            sh("ip", "route", "add", f"{lap}/32", "via", rsrv, ns=self.server)
            self._shape(r, link, i)

    def _shape(self, router: str, link: LinkProfile, index: int) -> None:
        rtt = 2 * link.delay_s
        towards_laptop = LinkProfile(rate_bps=link.rate_bps, delay_s=link.delay_s,
                                     loss=WLAN_TO_LAPTOP_LOSS if index else 0.0)
        for queue, (dev, into, lk) in enumerate((("tosrv", "tolap", link), ("tolap", "tosrv", towards_laptop))):
            iproute_in(router, lambda ipr, dev=dev, lk=lk: backends.apply_link(
                ipr, ipr.link_lookup(ifname=dev)[0], lk, "userspace", rtt))
            line = backends.DelayLine(router, queue, lk, rtt, self.tmp / f"{router}-{queue}.stats", seed=index)
            line.start(self.popen)
            sh("iptables", "-t", "mangle", "-A", "FORWARD", "-i", into, "-o", dev, "-j", "NFQUEUE",
               "--queue-num", str(queue), ns=router)

    def start_servers(self) -> None:
        with self.serve_log.open("wb") as log:
            self.serve = self.popen(self.server, [sys.executable, "-m", "ccscope.cli", "serve", "--ports",
                                                  f"{SERVE_PORTS[0]}-{SERVE_PORTS[1]}", "--max-seconds", "30s",
                                                  "--token-file", str(self.token_file)],
                                    stdout=log, stderr=subprocess.STDOUT)
        for port in (PLAIN_PORT, FOREIGN_PORT):
            self.popen(self.server, ["iperf3", "-s", "-p", str(port)], stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while not all(self.listening(p) for p in (SERVE_PORTS[0], PLAIN_PORT, FOREIGN_PORT)):
            assert self.serve.poll() is None, self.serve_log.read_text()
            assert time.monotonic() < deadline, "the servers did not start"
            time.sleep(0.05)

    def listening(self, port: int) -> bool:
        return bool(sh("ss", "-Hltn", f"sport = :{port}", ns=self.server).strip())

    def state(self) -> dict:
        """What a real-path run must leave alone in the laptop namespace."""
        sysctls = [ln for ln in sh("sysctl", "-a", "-r", SNAPSHOT_SYSCTLS, ns=self.laptop, check=False).splitlines()
                   if not ln.startswith(HOST_WIDE)]
        assert any(ln.startswith("net.ipv4.tcp_congestion_control") for ln in sysctls)
        return {"sysctls": sysctls,
                "qdiscs": sh("tc", "qdisc", "show", ns=self.laptop),
                "routes": sh("ip", "-4", "route", "show", "table", "all", ns=self.laptop),  # v6 link-local comes late
                "rules": sh("ip", "rule", "show", ns=self.laptop)}

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGINT if proc is getattr(self, "serve", None) else signal.SIGTERM)
                try:
                    proc.wait(timeout=5)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        for ns in self.namespaces:
            kill_netns_processes(ns)
            sh("ip", "netns", "del", ns, check=False)


@pytest.fixture(scope="module")
def net(tmp_path_factory):
    require_root()
    require_tools("iperf3", "ping", "ip", "tc", "ethtool", "ss", "iptables")
    require_bpf_object()
    n = Net(tmp_path_factory.mktemp("realpath"))
    try:
        n.build()
        n.start_servers()
        yield n
    finally:
        n.close()


class SsSampler:
    """`ss -tin` in a namespace every 0.1 s: (local port, peer port) -> [(cc, cwnd, rtt_ms)] of sending
    connections."""

    LINE = re.compile(r"^(?:[A-Z-]+\s+)?\d+\s+\d+\s+\S+:(\d+)\s+\S+:(\d+)")  # `state established` drops State

    def __init__(self, ns: str) -> None:
        self.ns = ns
        self.seen: dict[tuple[int, int], list[tuple[str, int, float]]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            out = sh("ss", "-tinH", "state", "established", ns=self.ns, check=False)
            key = None
            for line in out.splitlines():
                m = self.LINE.match(line)
                if m:
                    key = (int(m.group(1)), int(m.group(2)))
                    continue
                cwnd, rtt = re.search(r"\bcwnd:(\d+)", line), re.search(r"\brtt:([0-9.]+)/", line)
                cc = re.search(r"(\w+) wscale:", line)  # the algorithm comes right before wscale
                # Only once data has left: for a download, iperf3's server sets -C on the data socket
                # after accept(), so in the accept queue ss shows the listener's (host default) algorithm.
                # Sampled every ~2 ms on loopback, 2 of 12 `iperf3 -R -C reno` data sockets showed one bbr
                # sample with no bytes_sent, then only reno; at 0.1 s this test caught one once.
                sent = re.search(r"\bbytes_sent:\d+", line)
                if key and cwnd and rtt and cc and sent:
                    self.seen.setdefault(key, []).append((cc.group(1), int(cwnd.group(1)), float(rtt.group(1))))
                key = None
            self._stop.wait(0.1)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def write_scenario(path: Path, profiles: dict, algorithms: list[str], duration: int = 3, warmup: int = 1,
                   **extra) -> Path:
    doc = {"name": path.stem, "algorithms": algorithms, "duration": duration, "warmup": warmup,
           "traffic": {"bulk": {"flows": 1}, "ping": {"interval": "100ms"}, **extra.pop("traffic", {})},
           "profiles": profiles, **extra}
    path.write_text(json.dumps(doc))  # JSON is YAML
    return path


def scenario(net: Net, file: Path, out: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "CCSCOPE_SERVE_TOKEN": net.token_file.read_text().strip()}
    return net.popen(net.laptop, [sys.executable, "-m", "ccscope.cli", "scenario", "run", str(file), "--out",
                                  str(out), "--listen", "off", *extra],
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str, str]:
    out, err = proc.communicate(timeout=timeout)
    return proc.returncode, out, err


def csv_medians(out: Path, flow: dict, skip_s: float) -> tuple[float, float]:
    rows = (out / flow["csv"]).read_text().splitlines()
    head = rows[0].split(",")
    data = [dict(zip(head, r.split(","), strict=True)) for r in rows[1:]]
    start = float(data[0]["time_s"]) + skip_s
    data = [d for d in data if float(d["time_s"]) >= start]
    return statistics.median(int(d["cwnd_segments"]) for d in data), statistics.median(float(d["srtt_ms"])
                                                                                       for d in data)


def csv_goodput_until_close(out: Path, flow: dict) -> float:
    """bit/s of the flow's bytes_acked over its goodput window, up to the last sample before its close."""
    rows = (out / flow["csv"]).read_text().splitlines()
    head = rows[0].split(",")
    start, end = flow["window_s"]
    data = [d for d in (dict(zip(head, r.split(","), strict=True)) for r in rows[1:])
            if start - 1e-4 <= float(d["time_s"]) <= end + 1e-4]
    if data[-1]["event"] == str(int(Event.CLOSE)):
        data.pop()
    return (int(data[-1]["bytes_acked"]) - int(data[0]["bytes_acked"])) * 8 / (float(data[-1]["time_s"])
                                                                                - float(data[0]["time_s"]))


def test_serve_both_directions_two_interfaces(net, tmp_path, machine_share):
    """Against `ccscope serve`, eth and wlan, up and down, bbr and reno: sender series for every run."""
    net_state = net.state()
    profiles = {f"{via}-{d}": {"target": TARGET, "via": via, "direction": d} for d in ("up", "down")
                for via in ("eth", "wlan")}
    file = write_scenario(tmp_path / "real.yaml", profiles, ["bbr", "reno"])
    samplers = {"laptop": SsSampler(net.laptop), "server": SsSampler(net.server)}
    # traffic of someone else on the same host and path, to the same target: never in the results
    foreign = net.popen(net.laptop, ["iperf3", "-c", TARGET, "-p", str(FOREIGN_PORT), "-t", "60", "-b", "2M",
                                     "--bind-dev", "eth", "-J"], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    try:
        rc, out, err = finish(scenario(net, file, tmp_path / "out"))
    finally:
        os.killpg(foreign.pid, signal.SIGINT)
        foreign_report = json.loads(foreign.communicate(timeout=10)[0])
        for s in samplers.values():
            s.stop()
    assert rc == 0, err[-3000:]
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert doc["errors"] == [] and len(doc["runs"]) == 8
    foreign_port = foreign_report["start"]["connected"][0]["local_port"]
    for run in doc["runs"]:
        down = run["profile"].endswith("down")
        real = run["real"]
        assert real["far_end"] == "ccscope serve" and real["sender_telemetry"] and not real["failed"]
        assert real["idle_rtt_ms"] > 0
        (flow,) = run["flows"]
        assert flow["view"] == "sender" and flow["algorithm"] == run["algorithms"]
        assert FOREIGN_PORT not in (flow["sport"], flow["dport"]) and foreign_port not in (flow["sport"], flow["dport"])
        # goodput: the kernel's bytes_acked over the measured window against iperf3's own report.
        # The window ends at the flow's last sample, which is its close: iperf3 closes a socket with data still
        # queued, and the kernel's tcp_probe fires only in ESTABLISHED, so the drain after close() has no
        # sample but that one. iperf3's timer leaves the drain out. It took 36-45 ms on eth-down and 128-286
        # ms on wlan-down, where a loss in it waits for a retransmit: there our goodput read 0.948-0.977 of
        # iperf3's. So the oracle is held against the samples before the close: in 24 flows of 3 runs, 0.990
        # (wlan-down reno) to 1.005; the lossy direction (0.2 %) keeps room for reno's recoveries, which move
        # bytes between the two reports' differently placed windows.
        lossy = run["profile"] == "wlan-down"
        assert csv_goodput_until_close(tmp_path / "out", flow) == pytest.approx(
            flow["iperf3"]["goodput_bps"], rel=0.05 if lossy else 0.02), run["label"]
        assert flow["iperf3"]["goodput_bps"] * 0.9 < flow["goodput_bps"] < flow["iperf3"]["goodput_bps"] * 1.05, \
            run["label"]  # with the drain: 0.948-1.011 in those 24 flows
        # the sender's kernel: ss -ti in the namespace that sent, for this connection
        local, peer = (flow["sport"], flow["dport"])
        seen = samplers["server" if down else "laptop"].seen.get((local, peer))
        assert seen and len(seen) >= 10, f"{run['label']}: ss never saw {local}->{peer}"
        assert {cc for cc, _, _ in seen} == {flow["algorithm"]}
        assert flow["algorithm_kernel"] == flow["algorithm"]
        cwnd, srtt = csv_medians(tmp_path / "out", flow, skip_s=1.0)
        ss_cwnd = statistics.median(c for _, c, _ in seen[len(seen) // 4:])
        ss_rtt = statistics.median(r for _, _, r in seen[len(seen) // 4:])
        # Medians over the run of two samplings taken at different moments (ours, ss every ~0.1 s) of reno's
        # sawtooth and BBR's cycle: cwnd 0.80-1.16 of ss's (a few segments on eth), srtt within 1.02 ms on eth
        # and 1.57 ms on wlan (wlan-down reno: 29.18 against 30.75), in 24 runs of this test; the telemetry
        # itself equals TCP_INFO (test_telemetry).
        assert cwnd == pytest.approx(ss_cwnd, rel=0.25, abs=1), run["label"]
        assert srtt == pytest.approx(ss_rtt, rel=0.1, abs=1.5), run["label"]
    # Each profile's flow took its own interface: wlan's flows no faster than wlan's link (eth's path gives at
    # least 0.85 of its payload rate, below), and their RTT wlan's. Comparing each eth flow's goodput instead
    # failed at random: bbr on eth-up fell to 10.2 and 15.0 Mbit/s in 2 of 14 runs here, when the
    # userspace delay line, on two cores shared with everything else, held packets (srtt 15 ms on a 4 ms path)
    # and BBR's bandwidth estimate fell with its delivery rate samples. Reno read 29-36 Mbit/s in all 14.
    rows = {(r["profile"], r["algorithm"]): r for r in doc["summary"]}
    wlan_payload_bps = PATHS["wlan"][4].rate_bps * 1448 / 1514
    for d in ("up", "down"):
        for alg in ("bbr", "reno"):
            eth, wlan = rows[(f"eth-{d}", alg)], rows[(f"wlan-{d}", alg)]
            assert wlan["goodput_bps"]["mean"] <= 1.03 * wlan_payload_bps, (d, alg)
            assert wlan["srtt_median_ms"]["mean"] > eth["srtt_median_ms"]["mean"] + 10, (d, alg)
    paths = doc["real_paths"]
    assert set(paths) == set(profiles)
    for name, p in paths.items():
        link = PATHS[name.split("-")[0]][4]
        # the capacity estimate is the best run's goodput; against the shaped link's TCP payload rate it read
        # 0.92-1.00 in 16 runs (eth-up 35.2-35.4 of 38.3 Mbit/s, the others 0.99-1.00) and once 1.010 (wlan-up,
        # a CI run): the token bucket's burst and a window's edges let a window exceed the rate a little, as
        # test_scenario_run allows (1.03)
        assert p["capacity_estimate_bps"] == max(p["goodput_bps"].values())
        payload_bps = link.rate_bps * 1448 / 1514
        assert 0.85 * payload_bps * machine_share(this_test=True) <= p["capacity_estimate_bps"] <= 1.03 * payload_bps, \
            (name, payload_bps)
        # The first run's idle RTT is the median of its 5 pings. On eth, this test's own foreign flow and the
        # host's two busy cores lift a ping by 1-7 ms at times: in 24 eth runs two medians read 5.11 and 5.21
        # ms (the others 4.08-4.49). Their lowest ping is the path's: 3.92-4.13 ms on eth, 20.0-20.1 on wlan,
        # against the topology's 2 x (2 ms) and 2 x (10 ms).
        pings = min((r for r in doc["runs"] if r["profile"] == name), key=lambda r: r["position"])["real"][
            "idle_rtt_samples_ms"]
        assert p["idle_rtt_first_ms"] == pytest.approx(statistics.median(pings), abs=1e-3), name
        assert min(pings) == pytest.approx(2 * link.delay_s * 1e3, abs=0.5), name
    assert doc["profiles"]["eth-up"]["real"]["via"] == "eth"
    report = (tmp_path / "out" / "report.html").read_text()
    assert "Real paths" in report and "ccscope serve" in report
    assert net.state() == net_state
    print(f"\n{out}")


def test_plain_iperf3_busy_then_bulk_and_receiver_view(net, tmp_path):
    """A plain `iperf3 -s`: busy with another test (retried), bulk up with sender series, down with this
    host's receiver view and the report saying sender telemetry is absent."""
    net_state = net.state()
    profiles = {"eth-up": {"target": f"{TARGET}:{PLAIN_PORT}", "via": "eth"},
                "wlan-down": {"target": f"{TARGET}:{PLAIN_PORT}", "via": "192.0.2.6", "direction": "down"}}
    file = write_scenario(tmp_path / "plain.yaml", profiles, ["bbr"], duration=2)
    other = net.popen(net.laptop, ["iperf3", "-c", TARGET, "-p", str(PLAIN_PORT), "-t", "60", "-b", "1M"],
                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc = scenario(net, file, tmp_path / "out")
    err_lines = []
    try:
        deadline = time.monotonic() + 60
        for line in proc.stderr:  # the server is busy: the runner says it retries
            err_lines.append(line)
            if "busy with another test; retrying" in line or time.monotonic() > deadline:
                break
    finally:
        os.killpg(other.pid, signal.SIGTERM)
        other.wait(timeout=10)
    rc, out, err = finish(proc)
    err = "".join(err_lines) + err
    assert "busy with another test; retrying" in err
    assert rc == 0, err[-3000:]
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    runs = {r["profile"]: r for r in doc["runs"]}
    up, down = runs["eth-up"], runs["wlan-down"]
    assert up["real"]["far_end"] == "iperf3" and up["flows"][0]["view"] == "sender"
    assert up["flows"][0]["algorithm_kernel"] == "bbr"
    # 1.0001-1.0002 of iperf3's in three runs, as the loss-free serve runs (0.993-1.001)
    assert up["flows"][0]["goodput_bps"] == pytest.approx(up["flows"][0]["iperf3"]["goodput_bps"], rel=0.02)
    f = down["flows"][0]
    assert f["view"] == "receiver" and not down["real"]["sender_telemetry"] and "csv" not in f
    assert f["goodput_bps"] == f["iperf3"]["goodput_bps"] and f["algorithm_iperf3"] == "bbr"
    assert (tmp_path / "out" / f["receiver_csv"]).is_file()
    # Pings from wlan's address leave by the route (eth, 2 ms) and come back over wlan (10 ms) behind the down
    # flow's queue; the up run's cross eth both ways (4 ms). A bound on the queue failed once beside busy
    # loops: median 19.5 ms (min 17.2) against "> 20", with BBR's queue at ~7 ms. The paths are the claim.
    assert down["ping"]["rtt_ms"]["min"] >= 2 + 10 > up["ping"]["rtt_ms"]["median"]
    assert "sender telemetry absent" in out
    assert net.state() == net_state


def _one_line_error(net: Net, tmp_path: Path, profiles: dict, code: int, text: str, **extra) -> None:
    file = write_scenario(tmp_path / "bad.yaml", profiles, ["bbr"], **extra)
    rc, _out, err = finish(scenario(net, file, tmp_path / "out"), timeout=60)
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == code and len(lines) == 1 and lines[0].startswith("ccscope: error: ") and text in lines[0], err
    assert not (tmp_path / "out").exists()


def test_bad_paths_are_one_line(net, tmp_path):
    _one_line_error(net, tmp_path, {"x": {"target": TARGET, "via": "nosuch0"}}, 2, "no interface 'nosuch0'")
    _one_line_error(net, tmp_path, {"x": {"target": "198.51.100.222", "via": "eth"}}, 3, "198.51.100.222")
    _one_line_error(net, tmp_path, {"x": {"target": TARGET, "via": "eth", "rate": "10mbit"}}, 2,
                    "takes no emulated link keys: rate")
    _one_line_error(net, tmp_path, {"x": {"target": f"{TARGET}:{PLAIN_PORT}"}}, 2, "`ccscope serve`",
                    traffic={"downloads": {"sizes": ["10KB"], "timeout": "5s"}})


def test_far_end_refusing_the_algorithm(net, tmp_path):
    """A far end that does not offer the algorithm (ccscope serve --algorithms reno): the run fails, one line."""
    first = SERVE_PORTS[1] + 10
    with (tmp_path / "serve.log").open("wb") as log:
        serve = net.popen(net.server, [sys.executable, "-m", "ccscope.cli", "serve", "--ports", f"{first}-{first + 2}",
                                       "--algorithms", "reno", "--no-telemetry", "--token-file", str(net.token_file)],
                          stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 20
    while not net.listening(first):
        assert time.monotonic() < deadline and serve.poll() is None, (tmp_path / "serve.log").read_text()
        time.sleep(0.05)
    file = write_scenario(tmp_path / "refuse.yaml", {"eth": {"target": f"{TARGET}:{first}", "via": "eth"}},
                          ["bbr"], duration=2)
    rc, _out, err = finish(scenario(net, file, tmp_path / "out"))
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    assert rc == 1 and doc["runs"][0]["real"]["failed"], err
    assert any("the far end refused bbr" in e for e in doc["errors"]), doc["errors"]
    assert "ccscope: error in results: eth/bbr#1: bulk flow 0 (bbr):" in err


def test_path_failing_mid_run_and_ctrl_c(net, tmp_path):
    """The wlan path dies during the first run: that run fails, the next one runs. Then Ctrl-C mid-run."""
    file = write_scenario(tmp_path / "fail.yaml", {"wlan": {"target": TARGET, "via": "wlan"}}, ["bbr", "reno"],
                          duration=3, seed=3)
    proc = scenario(net, file, tmp_path / "out")
    router = net.routers["wlan"]
    err_lines = []
    try:
        deadline = time.monotonic() + 60
        while not sh("ss", "-HtnO", "state", "established", f"dport >= :{SERVE_PORTS[0] + 1}", f"dport <= :"
                     f"{SERVE_PORTS[1]}", ns=net.laptop).strip():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        time.sleep(0.5)
        # The path dies in the router, silently: a blackhole route drops what the laptop sends the far end.
        # Taking the router's link down instead raced the second run's idle ping (5 pings in 0.8 s, -W 1):
        # the laptop loses its ARP entry with the carrier and retries only after 1 s, so a link back up
        # 0.8 s late failed that run. A route is back at once and leaves the neighbours alone.
        sh("ip", "route", "replace", "blackhole", f"{TARGET}/32", ns=router)
        for line in proc.stderr:
            err_lines.append(line)
            if line.startswith("[1/") and ": done in" in line:
                break
    finally:
        sh("ip", "route", "replace", f"{TARGET}/32", "via", PATHS["wlan"][3], ns=router)
    rc, _out, err = finish(proc)
    doc = json.loads((tmp_path / "out" / "results.json").read_text())
    first, second = sorted(doc["runs"], key=lambda r: r["position"])
    assert rc == 1 and first["real"]["failed"] and first["errors"], "".join(err_lines) + err
    assert not second["real"]["failed"] and second["flows"][0]["goodput_bps"] > 1e6, second["errors"]

    proc = scenario(net, file, tmp_path / "out2")
    deadline = time.monotonic() + 60
    while "running" not in (line := proc.stderr.readline()):
        assert line and time.monotonic() < deadline
    time.sleep(1.0)
    os.killpg(proc.pid, signal.SIGINT)
    rc, _out, err = finish(proc, timeout=30)
    assert rc == 130 and "interrupted" in err.splitlines()[-1], err
    assert "Traceback" not in err
    assert not sh("pgrep", "-f", f"iperf3 -c {TARGET}", ns=net.laptop, check=False).strip()
    doc = json.loads((tmp_path / "out2" / "results.json").read_text())
    assert doc["interrupted"] == "SIGINT"


def test_seed_001_template_runs_from_the_command_line(net, tmp_path):
    """Seed 001 as one command: the template's far end and interfaces come from --target and --via, no YAML edit."""
    template = ROOT / "scenarios" / "templates" / "real-wired-vs-wireless.yaml"
    out = tmp_path / "out"
    rc, _out, err = finish(scenario(net, template, out, "--target", TARGET, "--via", "wired=eth", "--via",
                                    "wireless=wlan", "--quick", "--algorithms", "cubic", "--duration", "3s"))
    assert rc == 0, err
    doc = json.loads((out / "results.json").read_text())
    assert {name: p["real"]["via"] for name, p in doc["profiles"].items()} == {"wired": "eth", "wireless": "wlan"}
    goodput = {r["profile"]: r["goodput_bps"]["mean"] for r in doc["summary"]}
    assert goodput["wireless"] < 0.6 * goodput["wired"], goodput  # the test topology's wlan is the slow one
