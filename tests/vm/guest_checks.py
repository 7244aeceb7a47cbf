"""Checks run INSIDE the kernel-lab guest (stock Debian kernel under qemu), as root, with the host venv.

Usage (from the host): tools/kernel-lab run --share DIR -- .venv/bin/python tests/vm/guest_checks.py
DIR/results.json [CHECK...]

Each check returns a dict of observations; the host-side tests (test_stock_kernel.py) assert on them.
A check that raises is recorded as {"error": ...} and the others still run: one boot serves them all.
The results file is rewritten after every check so a timeout still leaves what was measured.
Nothing here asserts exact figures: TCG timing is noisy.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable

from ccscope_testkit.net import in_netns, tcp_info  # the tests' helpers (standard library only)

# --- small helpers -------------------------------------------------------------------------------------------

def sh(*cmd: str, check: bool = True, timeout: float = 60) -> str:
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: {result.stderr.strip() or result.stdout.strip()}")
    return result.stdout


def read(path: str) -> str:
    with open(path) as handle:
        return handle.read().strip()


def write(path: str, value: str) -> None:
    with open(path, "w") as handle:
        handle.write(value)


def congestion(sock: socket.socket) -> str:
    return sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, 16).split(b"\0")[0].decode()


def netns_inode(name: str | None) -> int:
    return os.stat(f"/run/netns/{name}" if name else "/proc/self/ns/net").st_ino


def netns(name: str) -> None:
    sh("ip", "netns", "add", name)
    sh("ip", "-n", name, "link", "set", "lo", "up")


def veth_pair(left: str, right: str, net: str = "192.0.2") -> tuple[str, str]:
    """Two namespaces joined by veth: left has .1 on dev `vl`, right .2 on `vr`."""
    netns(left)
    netns(right)
    sh("ip", "-n", left, "link", "add", "vl", "type", "veth", "peer", "name", "vr", "netns", right)
    for ns, dev, host in ((left, "vl", 1), (right, "vr", 2)):
        sh("ip", "-n", ns, "addr", "add", f"{net}.{host}/24", "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
    return f"{net}.1", f"{net}.2"


def drop_netns(*names: str) -> None:
    for name in names:
        sh("ip", "netns", "del", name, check=False)


def set_cc(ns: str, algorithm: str) -> None:
    sh("ip", "netns", "exec", ns, "sysctl", "-qw", f"net.ipv4.tcp_congestion_control={algorithm}")


class BulkFlow:
    """One TCP connection sending `nbytes` from client_ns to a sink in server_ns; stays open after."""

    def __init__(self, server_ns: str | None, server_addr: str, client_ns: str | None, nbytes: int,
                 timeout: float = 60, midway: Callable[[], None] | None = None) -> None:
        with in_netns(server_ns):
            self.listener = socket.socket()
        self.listener.bind((server_addr, 0))
        self.listener.listen(1)
        self.received = 0
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sink, args=(nbytes,), daemon=True)
        self.thread.start()
        with in_netns(client_ns):
            self.client = socket.socket()
        self.client.settimeout(timeout)
        self.client.connect(self.listener.getsockname())
        self.ca = congestion(self.client)
        if midway is not None:  # once the receiver has acknowledged half
            threading.Thread(target=self._at_half, args=(nbytes // 2, midway, timeout), daemon=True).start()
        chunk = b"\0" * 65536
        started = time.monotonic()
        sent = 0
        while sent < nbytes:
            self.client.sendall(chunk[: min(len(chunk), nbytes - sent)])
            sent += min(len(chunk), nbytes - sent)
        if not self.done.wait(timeout):
            raise TimeoutError(f"sink got {self.received} of {nbytes} bytes")
        self.seconds = time.monotonic() - started
        self.timeout = timeout
        self.sport = self.client.getsockname()[1]
        self.dport = self.listener.getsockname()[1]
        self.info = self._acknowledged()

    def _at_half(self, nbytes: int, then: Callable[[], None], timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while tcp_info(self.client)["bytes_acked"] < nbytes and time.monotonic() < deadline:
            time.sleep(0.01)
        then()

    def _acknowledged(self) -> dict[str, int]:
        """TCP_INFO once the receiver has acknowledged everything (the last ACKs are on their way back)."""
        deadline = time.monotonic() + self.timeout
        while (info := tcp_info(self.client))["unacked"]:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{info['unacked']} segments still unacknowledged")
            time.sleep(0.01)
        return info

    def quiescent(self, read_map: Callable[[], dict | None]) -> dict | None:
        """The sender's map entry as tcp_probe sampled it at a segment that came after everything was
        acknowledged, and TCP_INFO then: one-byte nudges from the receiver, 5 ms apart (the guest samples at
        most once a millisecond per flow), until the entry shows a nudge received. tcp_probe runs before a
        segment's own bytes count, so that sample was taken at a later nudge, with nothing left to change."""
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            self.server.send(b"n")
            self.client.recv(1)
            seen = read_map()
            if seen and seen.get("bytes_received", 0) >= 1:
                self.info = tcp_info(self.client)
                return seen
            time.sleep(0.005)
        raise TimeoutError("tcp_probe never sampled the quiescent sender")

    def _sink(self, nbytes: int) -> None:
        conn, _ = self.listener.accept()
        self.server = conn
        while True:
            data = conn.recv(1 << 16)
            if not data:
                break
            self.received += len(data)
            if self.received >= nbytes:
                self.done.set()

    def close(self) -> None:
        for sock in (self.client, getattr(self, "server", None), self.listener):
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.close()


# --- the probe (ccscope's BPF object, built on the host) -----------------------------------------------

class Probe:
    """ccscope's loader, or the exact reason it could not load on this kernel."""

    def __init__(self) -> None:
        self.probe = None
        self.error: str | None = None
        self.verifier: dict[str, str] = {}
        try:
            from ccscope.loader import ProbeOptions, TelemetryProbe

            probe = TelemetryProbe(ProbeOptions(sample_interval_ns=1_000_000))
            probe.__enter__()
            self.probe = probe
        except Exception as err:
            self.error = f"{type(err).__name__}: {err}"
            self.verifier = verifier_errors()

    def flow(self, sport: int, dport: int, netns_inum: int) -> dict | None:
        if self.probe is None:
            return None
        for f in self.probe.read_flows():
            if f.sport == sport and f.dport == dport and f.netns == netns_inum:
                return {"ca_name": f.ca_name.decode(), "snd_cwnd": f.snd_cwnd, "snd_ssthresh": f.snd_ssthresh,
                        "srtt_us": f.srtt_us, "rttvar_us": f.rttvar_us, "min_rtt_us": f.min_rtt_us,
                        "total_retrans": f.total_retrans, "retransmit_events": f.retransmit_events,
                        "bytes_acked": f.bytes_acked, "bytes_sent": f.bytes_sent,
                        "bytes_received": f.bytes_received, "pacing_rate": f.pacing_rate}
        return {"missing": True}

    def close(self) -> None:
        if self.probe is not None:
            self.probe.__exit__(None, None, None)


def verifier_errors() -> dict[str, str]:
    """Per failing program, the verifier's last complaint (libbpf's log callback truncates it)."""
    from ccscope.loader import object_path

    pin = tempfile.mkdtemp(dir="/sys/fs/bpf")
    try:
        out = subprocess.run(["bpftool", "-d", "prog", "loadall", str(object_path()), pin],
                             capture_output=True, text=True, timeout=120, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        return {"bpftool": str(err)}
    finally:
        sh("rm", "-rf", pin, check=False)
    found: dict[str, str] = {}
    prog, last = None, ""
    for line in (out.stderr + out.stdout).splitlines():
        begin = re.search(r"prog '(\w+)': -- BEGIN PROG LOAD LOG --", line)
        if begin:
            prog, last = begin.group(1), ""
        elif prog and "-- END PROG LOAD LOG --" in line:
            found[prog] = last
            prog = None
        elif prog and line.strip() and not re.match(r"(verification time|stack depth|processed \d+)", line):
            last = line.strip()
    return found


# --- the checks -------------------------------------------------------------------------------------

def check_kernel(probe: Probe) -> dict:
    return {
        "release": os.uname().release,
        "btf": os.path.exists("/sys/kernel/btf/vmlinux"),
        "available_cc": read("/proc/sys/net/ipv4/tcp_available_congestion_control").split(),
        "allowed_cc": read("/proc/sys/net/ipv4/tcp_allowed_congestion_control").split(),
        "modules": sorted(line.split()[0] for line in read("/proc/modules").splitlines()),
        "probe_loaded": probe.probe is not None,
        "probe_error": probe.error,
        "verifier": probe.verifier,
    }


CORE_NETEM = ["rate", "1mbit", "delay", "5ms", "loss", "1%", "limit", "30"]
CORE_NETEM_LATER = ["rate", "1mbit", "delay", "5ms", "limit", "1000"]


def check_core(probe: Probe) -> dict:
    """A shaped, lossy flow (the router's egress: netem 1 Mbit/s, 5 ms, 1 % loss, a 30-packet queue that slow
    start overflows), its telemetry against TCP_INFO of the same socket once quiescent. Its second half runs
    loss-free behind a deep queue, so that cwnd grows past ssthresh (they were equal, 7 and 7, where the flow
    ended in its last recovery). The queue holds srtt far above min_rtt, the losses part bytes_sent from
    bytes_acked: a field read for another shows."""
    def calm() -> None:
        sh("ip", "netns", "exec", "klnet", "tc", "qdisc", "change", "dev", "vo", "root", "netem", *CORE_NETEM_LATER)

    try:
        receiver = routed_path()
        sh("ip", "netns", "exec", "klnet", "tc", "qdisc", "replace", "dev", "vo", "root", "netem", *CORE_NETEM)
        flow = BulkFlow("klner", receiver, "klnes", 768 << 10, timeout=120, midway=calm)
        try:
            telemetry = flow.quiescent(lambda: probe.flow(flow.sport, flow.dport, netns_inode("klnes")))
            return {"ca": flow.ca, "tcp_info": flow.info, "bytes": flow.received, "telemetry": telemetry}
        finally:
            flow.close()
    finally:
        drop_netns("klnes", "klnet", "klner")


def _unload_tcp_bbr(deadline_s: float = 10.0) -> bool:
    """tcp_bbr unloaded (the lab's init loads it; a netns or socket that used it may hold it a moment)."""
    deadline = time.monotonic() + deadline_s
    while "tcp_bbr " in read("/proc/modules") + "\n":
        if subprocess.run(["rmmod", "tcp_bbr"], capture_output=True, check=False).returncode == 0:
            break
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True


def check_ccstate(probe: Probe) -> dict:
    """Each algorithm's own state on this kernel. First with tcp_bbr unloaded: what `ccscope check` says of it,
    and a lossy CUBIC flow's state (W_max, K, ssthresh) through the object's other build (bpf_skc_to_tcp_sock:
    6.1 lacks bpf_rdonly_cast), read once the flow rests; then, the module loaded after the state program, a
    BBR flow, which must carry no state and raise nothing. Then with the module: the check again, and a BBR
    flow's state through its module BTF, by a state program loaded after it."""
    from ccscope.ccstate.probe import StateProbe
    from ccscope.check import check_algorithm_state

    out: dict = {"unloaded": _unload_tcp_bbr()}
    said = check_algorithm_state()
    out.update({"check_without": [said.status, said.detail], "modules": read("/proc/modules").split("\n")})
    try:
        state_probe = StateProbe(interval_ns=1_000_000)
        state_probe.open()
    except Exception as err:
        return {**out, "error": f"{type(err).__name__}: {err}"}
    try:
        receiver = routed_path()
        sh("ip", "netns", "exec", "klnet", "tc", "qdisc", "replace", "dev", "vo", "root", "netem", *CORE_NETEM)
        flow = BulkFlow("klner", receiver, "klnes", 256 << 10, timeout=120)
        try:
            cookie = int.from_bytes(flow.client.getsockopt(socket.SOL_SOCKET, 57, 8), "little")  # SO_COOKIE
            for _ in range(2):  # a segment after the last ACK: the state the flow rests in is copied on it
                flow.server.send(b"n")
                flow.client.recv(1)
                time.sleep(0.05)
            raw = state_probe.raw(cookie)
            timeouts = sh("ip", "netns", "exec", "klnes", "nstat", "-az", "TcpExtTCPTimeouts")
            cubic = raw.cubic if raw is not None else None
            out.update({"ca": flow.ca, "kind": raw.kind if raw is not None else None, "tcp_info": flow.info,
                        "timeouts": int(timeouts.split()[-2]) if "TcpExtTCPTimeouts" in timeouts else None,
                        "state": None if cubic is None else {
                            "wmax": cubic.last_max_cwnd, "bic_K": cubic.bic_K, "epoch_start": cubic.epoch_start,
                            "snd_ssthresh": cubic.snd_ssthresh, "snd_cwnd": cubic.snd_cwnd}})
        finally:
            flow.close()
        sh("modprobe", "tcp_bbr")
        set_cc("klnes", "bbr")
        out["bbr_unknown"] = _bbr_flow(state_probe, receiver)  # the program met no struct bbr at its load
        said = check_algorithm_state()
        out["check"] = [said.status, said.detail]
        with StateProbe(interval_ns=1_000_000) as knowing:  # loaded with tcp_bbr's module BTF there
            out["bbr"] = _bbr_flow(knowing, receiver)
        return out
    finally:
        drop_netns("klnes", "klnet", "klner")
        state_probe.close()


def _bbr_flow(state_probe, receiver: str) -> dict:
    """A short BBR flow on the ccstate path, and its state as `state_probe` copied it at rest (None: none)."""
    from ccscope.ccstate.decoders import decode

    flow = BulkFlow("klner", receiver, "klnes", 128 << 10, timeout=120)
    try:
        cookie = int.from_bytes(flow.client.getsockopt(socket.SOL_SOCKET, 57, 8), "little")
        flow.server.send(b"n")
        flow.client.recv(1)
        time.sleep(0.05)
        raw = state_probe.raw(cookie)
        state = decode(raw) if raw is not None else None
        return {"ca": flow.ca, "state": state.as_dict() if state else None}
    finally:
        flow.close()


def check_attribution(probe: Probe) -> dict:
    """The socket cgroup id (CO-RE through sock_cgroup_data) and the connecting process, on this kernel."""
    if probe.probe is None:
        return {"loaded": False}
    mounts = [line.split() for line in read("/proc/mounts").splitlines()]
    root = next((m[1] for m in mounts if m[2] == "cgroup2"), None)
    if root is None:
        root = "/tmp/klab-cgroup2"
        os.makedirs(root, exist_ok=True)
        sh("mount", "-t", "cgroup2", "none", root)
    cgroup = os.path.join(root, "klab-attribution")
    os.mkdir(cgroup)
    try:
        write(os.path.join(cgroup, "cgroup.procs"), str(os.getpid()))
        flow = BulkFlow(None, "127.0.0.1", None, 1 << 20)
        write(os.path.join(root, "cgroup.procs"), str(os.getpid()))
        try:
            mine = [f for f in probe.probe.read_flows() if f.sport == flow.sport and f.dport == flow.dport]
            return {"loaded": True, "seeded": probe.probe.seeded, "cgroup_ino": os.stat(cgroup).st_ino,
                    "pid": os.getpid(), "comm": read("/proc/self/comm").strip(),
                    "flow": [{"cgroup_id": f.cgroup_id, "tgid": f.tgid, "comm": f.comm.decode()} for f in mine]}
        finally:
            flow.close()
    finally:
        write(os.path.join(root, "cgroup.procs"), str(os.getpid()))
        os.rmdir(cgroup)


def check_netns_cc(probe: Probe) -> dict:
    """vegas and westwood as a namespace's default, once the init namespace allows them."""
    allowed_path = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
    before = read(allowed_path)
    out: dict[str, dict] = {}
    try:
        netns("klcc0")
        out["refused_before_allowed"] = {}
        for algorithm in ("vegas", "westwood"):
            try:
                set_cc("klcc0", algorithm)
                out["refused_before_allowed"][algorithm] = False
            except RuntimeError:
                out["refused_before_allowed"][algorithm] = True
        write(allowed_path, f"{before} vegas westwood")
        for i, algorithm in enumerate(("vegas", "westwood")):
            ns = f"klcc{i + 1}"
            netns(ns)
            set_cc(ns, algorithm)
            flow = BulkFlow(ns, "127.0.0.1", ns, 2 << 20)
            try:
                out[algorithm] = {"socket_ca": flow.ca, "tcp_info": flow.info,
                                  "sysctl": sh("ip", "netns", "exec", ns, "sysctl", "-n",
                                               "net.ipv4.tcp_congestion_control").strip(),
                                  "telemetry": probe.flow(flow.sport, flow.dport, netns_inode(ns))}
            finally:
                flow.close()
        out["init_ns_default"] = read("/proc/sys/net/ipv4/tcp_congestion_control")
    finally:
        write(allowed_path, before)
        drop_netns("klcc0", "klcc1", "klcc2")
    return out


def qdisc_stats(ns: str, dev: str) -> list[dict]:
    text = sh("ip", "netns", "exec", ns, "tc", "-s", "-j", "qdisc", "show", "dev", dev)
    return [{"kind": q.get("kind"), "bytes": q.get("bytes", 0), "packets": q.get("packets", 0),
             "drops": q.get("drops", 0)} for q in json.loads(text or "[]")]


def check_fq_bbr(probe: Probe) -> dict:
    """BBR over fq on the sender's veth: fq carries the packets, the socket paces."""
    allowed_path = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"
    before = read(allowed_path)
    try:
        write(allowed_path, f"{before} bbr")
        _, right = veth_pair("klfqs", "klfqr")
        sh("ip", "netns", "exec", "klfqs", "tc", "qdisc", "replace", "dev", "vl", "root", "fq")
        set_cc("klfqs", "bbr")
        flow = BulkFlow("klfqr", right, "klfqs", 8 << 20)
        try:
            return {"socket_ca": flow.ca, "tcp_info": flow.info, "bytes": flow.received,
                    "qdisc": qdisc_stats("klfqs", "vl"),
                    "telemetry": probe.flow(flow.sport, flow.dport, netns_inode("klfqs"))}
        finally:
            flow.close()
    finally:
        write(allowed_path, before)
        drop_netns("klfqs", "klfqr")


def routed_path() -> str:
    """sender klnes -- router klnet -- receiver klner; returns the receiver's address. The router's
    egress to the receiver (`vo`) is where impairments go: netem there sees single packets, because
    the sender's veth has tso/gso off (TCP always builds GSO skbs; they are split when leaving it).
    netem on the sender's own interface would see the GSO skbs and drop whole bursts."""
    for ns in ("klnes", "klnet", "klner"):
        netns(ns)
    sh("ip", "-n", "klnes", "link", "add", "vs", "type", "veth", "peer", "name", "vi", "netns", "klnet")
    sh("ip", "-n", "klnet", "link", "add", "vo", "type", "veth", "peer", "name", "vr", "netns", "klner")
    for ns, dev, addr in (("klnes", "vs", "192.0.2.1/24"), ("klnet", "vi", "192.0.2.2/24"),
                          ("klnet", "vo", "198.51.100.1/24"), ("klner", "vr", "198.51.100.2/24")):
        sh("ip", "-n", ns, "addr", "add", addr, "dev", dev)
        sh("ip", "-n", ns, "link", "set", dev, "up")
    sh("ip", "netns", "exec", "klnes", "ethtool", "-K", "vs", "tso", "off", "gso", "off")
    sh("ip", "netns", "exec", "klnet", "ethtool", "-K", "vi", "gro", "off")
    sh("ip", "netns", "exec", "klnet", "sysctl", "-qw", "net.ipv4.ip_forward=1")
    sh("ip", "-n", "klnes", "route", "add", "default", "via", "192.0.2.2")
    sh("ip", "-n", "klner", "route", "add", "default", "via", "198.51.100.1")
    return "198.51.100.2"


def _flow_over(qdisc: list[str], nbytes: int, probe: Probe) -> dict:
    """One flow over a fresh routed path whose router egress has `qdisc` (netem args) at root."""
    try:
        receiver = routed_path()
        if qdisc:
            sh("ip", "netns", "exec", "klnet", "tc", "qdisc", "replace", "dev", "vo", "root", "netem", *qdisc)
        flow = BulkFlow("klner", receiver, "klnes", nbytes, timeout=120)
        try:
            return {"qdisc": qdisc, "socket_ca": flow.ca, "tcp_info": flow.info, "seconds": flow.seconds,
                    "netem": qdisc_stats("klnet", "vo"),
                    "telemetry": probe.flow(flow.sport, flow.dport, netns_inode("klnes"))}
        finally:
            flow.close()
    finally:
        drop_netns("klnes", "klnet", "klner")


def check_netem(probe: Probe) -> dict:
    return {
        "plain": _flow_over([], 1 << 20, probe),
        "delay50": _flow_over(["delay", "50ms"], 1 << 20, probe),
        "loss2": _flow_over(["loss", "2%"], 4 << 20, probe),
    }


def check_engine(probe: Probe) -> dict:
    """ccscope's own emulation on this kernel: it should pick netem, and take vegas and westwood."""
    from ccscope.emulation.backends import probe_backends
    from ccscope.emulation.profile import PathProfile
    from ccscope.emulation.testbed import Testbed

    caps = probe_backends()
    profile = PathProfile.from_dict("lab", {"rate": "20mbit", "delay": "10ms", "up": {"loss": "1%"}}, "lab")
    out: dict = {"qdiscs": sorted(caps.qdiscs), "nfqueue": caps.nfqueue}
    with Testbed(profile) as tb:
        out["backend"] = tb.backend
        out["installed"] = json.loads(json.dumps(tb.installed, default=str))
        out["algorithms"] = {}
        for algorithm in ("vegas", "westwood"):
            tb.set_algorithm(algorithm)
            out["algorithms"][algorithm] = sh("ip", "netns", "exec", tb.sender_ns, "sysctl", "-n",
                                              "net.ipv4.tcp_congestion_control").strip()
        out["ping_rtts_s"] = tb.ping_rtts(count=5)
        out["link_stats"] = tb.link_stats()
    return out


def check_pathcheck(probe: Probe) -> dict:
    """The pre-run path check over netem at 1 Mbit/s and 400 ms RTT (the built-in fast-vs-slow's slow path,
    where it once read 0.27 Mbit/s on a correct emulator): it must trust netem here as it trusts the delay line."""
    from dataclasses import asdict

    from ccscope.emulation.profile import PathProfile
    from ccscope.emulation.testbed import Testbed

    profile = PathProfile.from_dict("slow", {"rate": "1mbit", "delay": "200ms"}, "slow")
    with Testbed(profile) as tb:
        right = asdict(tb.verify())
        # and one that must fail: the same 1 Mbit/s link checked against a profile that asks 1.25
        tb.profile = PathProfile.from_dict("slow", {"rate": "1.25mbit", "delay": "200ms"}, "slow")
        wrong = asdict(tb.verify())
    return {"backend": tb.backend, "base_rtt_s": profile.base_rtt_s, **right, "wrong_rate": wrong}


CHECKS: dict[str, Callable[[Probe], dict]] = {
    "kernel": check_kernel,
    "core": check_core,
    "ccstate": check_ccstate,
    "attribution": check_attribution,
    "netns_cc": check_netns_cc,
    "fq_bbr": check_fq_bbr,
    "netem": check_netem,
    "engine": check_engine,
    "pathcheck": check_pathcheck,
}


def main(argv: list[str]) -> int:
    out_path, wanted = argv[1], argv[2:] or list(CHECKS)
    results: dict[str, dict] = {}
    probe = Probe()
    try:
        for name in wanted:
            started = time.monotonic()
            try:
                results[name] = CHECKS[name](probe)
            except Exception as err:
                results[name] = {"error": f"{type(err).__name__}: {err}",
                                 "trace": traceback.format_exc(limit=4)}
            results[name]["check_seconds"] = round(time.monotonic() - started, 2)
            with open(out_path + ".tmp", "w") as handle:
                json.dump(results, handle, indent=1)
            os.replace(out_path + ".tmp", out_path)
            print(f"guest_checks: {name} done in {results[name]['check_seconds']} s", flush=True)
    finally:
        probe.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
