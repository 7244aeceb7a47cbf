"""The one helper module of the tests, the benches and the kernel-lab guest checks: namespaces, veth links,
TCP_INFO, free ports, a real `ccscope daemon` to scrape. Standard library only, no dependency on
ccscope.emulation (it is what some of them test).

Everything made here is named with the process id (netns_name()), so parallel runs and other engineers'
namespaces never collide, and `Link.close()` / `netns()` remove it all (call them from a finally or a
fixture). A run killed outright (SIGKILL) runs no finally: remove_stale_namespaces() removes what a dead
test process left, at the start of the next session (tests/conftest.py).
"""

from __future__ import annotations

import base64
import contextlib
import ctypes
import os
import re
import signal
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout: testkit/ccscope_testkit/
CCSCOPE = [sys.executable, "-m", "ccscope.cli"]
CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
_counter = iter(range(1_000_000))
NETNS_PREFIX = "ccst"  # then the creating process's id, a "-", and the test's own tag
_OWNED_NETNS = re.compile(rf"{NETNS_PREFIX}(\d+)-")

# struct tcp_info (include/uapi/linux/tcp.h): 8 u8 fields, then u32 fields from byte 8, u64 ones from 104.
TCPI_CA_STATE = 1
TCPI_U32 = {"unacked": 24, "rtt_us": 68, "rttvar_us": 72, "snd_ssthresh": 76, "snd_cwnd": 80, "total_retrans": 100,
            "min_rtt_us": 148}
TCPI_U64 = {"pacing_rate": 104, "bytes_acked": 120, "bytes_received": 128, "bytes_sent": 200}
TCPI_SNAPLEN = 232


def run(*cmd: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True, timeout=timeout)


def tcp_info(sock: socket.socket) -> dict[str, int]:
    """The struct tcp_info fields the tests compare with the telemetry (rtt_us is srtt >> 3, in us)."""
    raw = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, TCPI_SNAPLEN)
    info = {"ca_state": raw[TCPI_CA_STATE]}
    info.update({name: struct.unpack_from("I", raw, off)[0] for name, off in TCPI_U32.items()})
    info.update({name: struct.unpack_from("Q", raw, off)[0] for name, off in TCPI_U64.items()})
    return info


@contextlib.contextmanager
def in_netns(name: str | None) -> Iterator[None]:
    """Switch this thread into a named namespace (None: stay); sockets created inside stay in it after we leave."""
    if name is None:
        yield
        return
    own = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(f"/run/netns/{name}", os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            raise OSError(ctypes.get_errno(), f"setns {name}")
        yield
    finally:
        _libc.setns(own, CLONE_NEWNET)
        os.close(target)
        os.close(own)


def netns_inode(name: str) -> int:
    return os.stat(f"/run/netns/{name}").st_ino


@dataclass
class Link:
    """a -- r -- b: two end namespaces joined through a router namespace `r`.

    The bottleneck (tbf) sits on r's egress towards b: on a's own egress TCP small queues would hold the sender
    back before a queue ever overflowed, so there would be no losses to measure.
    IPv4: a=NET.1/25 (gateway NET.126), b=NET.130/25 (gateway NET.129); IPv6: NET6:1::1/64 and NET6:2::2/64.
    """

    a: str
    r: str
    b: str
    addr_a: str
    addr_b: str
    addr6_a: str | None = None
    addr6_b: str | None = None
    dev_r: str = "rb"  # r's device towards b, where the bottleneck goes
    cleanups: list = field(default_factory=list)

    @classmethod
    def create(cls, net: str = "192.0.2", net6: str | None = None) -> Link:
        """`net6` is a /48 prefix without the trailing '::', e.g. 'fd00:cc5:0'."""
        tag = netns_name(f"x{next(_counter)}")
        link = cls(a=f"{tag}a", r=f"{tag}r", b=f"{tag}b", addr_a=f"{net}.1", addr_b=f"{net}.130",
                   addr6_a=f"{net6}:1::1" if net6 else None, addr6_b=f"{net6}:2::2" if net6 else None)
        try:
            link._setup(net, net6)
        except BaseException:
            link.close()
            raise
        return link

    def _setup(self, net: str, net6: str | None) -> None:
        for ns in (self.a, self.r, self.b):
            run("ip", "netns", "add", ns)
            self.cleanups.append(("ip", "netns", "del", ns))
            run("ip", "-n", ns, "link", "set", "lo", "up")
            # no duplicate address detection: link-local addresses would stay tentative (and routes dead) ~2 s
            run("ip", "netns", "exec", ns, "sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0",
                "net.ipv6.conf.default.accept_dad=0")
        run("ip", "netns", "exec", self.r, "sysctl", "-qw", "net.ipv4.ip_forward=1")
        run("ip", "-n", self.a, "link", "add", "ra", "type", "veth", "peer", "name", "ar", "netns", self.r)
        run("ip", "-n", self.b, "link", "add", "rb_peer", "type", "veth", "peer", "name", self.dev_r,
            "netns", self.r)
        ends = ((self.a, "ra", f"{net}.1/25", f"{net}.126", f"{net6}:1::1", f"{net6}:1::fe"),
                (self.b, "rb_peer", f"{net}.130/25", f"{net}.129", f"{net6}:2::2", f"{net6}:2::fe"))
        router = ((self.r, "ar", f"{net}.126/25", f"{net6}:1::fe"), (self.r, self.dev_r, f"{net}.129/25",
                                                                        f"{net6}:2::fe"))
        if net6:
            run("ip", "netns", "exec", self.r, "sysctl", "-qw", "net.ipv6.conf.all.forwarding=1")
        for ns, dev, addr, addr6 in router:
            run("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            if net6:
                run("ip", "-n", ns, "addr", "add", f"{addr6}/64", "dev", dev, "nodad")
            run("ip", "-n", ns, "link", "set", dev, "up")
        for ns, dev, addr, gateway, addr6, gateway6 in ends:
            run("ip", "-n", ns, "addr", "add", addr, "dev", dev)
            if net6:
                run("ip", "-n", ns, "addr", "add", f"{addr6}/64", "dev", dev, "nodad")
            run("ip", "-n", ns, "link", "set", dev, "up")
            run("ip", "-n", ns, "route", "add", "default", "via", gateway)
            if net6:
                run("ip", "-n", ns, "-6", "route", "add", "default", "via", gateway6)

    def ns(self, name: str, *cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
        return run("ip", "netns", "exec", name, *cmd, check=check, timeout=timeout)

    def popen(self, name: str, *cmd: str, **kwargs) -> subprocess.Popen:
        return subprocess.Popen(["ip", "netns", "exec", name, *cmd], **kwargs)

    def shape(self, rate: str = "30mbit", burst: str = "16kb", limit: str = "24kb") -> None:
        """tbf on the router's egress to b: a bottleneck with a small queue, so a bulk flow overflows it."""
        run("ip", "netns", "exec", self.r, "tc", "qdisc", "replace", "dev", self.dev_r, "root", "tbf",
            "rate", rate, "burst", burst, "limit", limit)

    def drop_randomly(self, port: int, probability: float) -> None:
        """iptables xt_statistic on b's INPUT: random loss for one port (rule dies with the namespace)."""
        run("ip", "netns", "exec", self.b, "iptables", "-A", "INPUT", "-p", "tcp", "--dport", str(port),
            "-m", "statistic", "--mode", "random", "--probability", str(probability), "-j", "DROP")

    @property
    def inode_a(self) -> int:
        return netns_inode(self.a)

    @property
    def inode_b(self) -> int:
        return netns_inode(self.b)

    def close(self) -> None:
        for name in (self.a, self.r, self.b):
            kill_netns_processes(name)
        while self.cleanups:
            run(*self.cleanups.pop(), check=False)


def kill_netns_processes(name: str) -> None:
    """`ip netns pids` then SIGKILL: leftovers of a failed test must not keep the namespace alive."""
    pids = run("ip", "netns", "pids", name, check=False).stdout.split()
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), 9)


def wait_port(port: int, netns: str | None = None, timeout: float = 10.0) -> None:
    """Until something listens on TCP `port` (in `netns`)."""
    deadline = time.monotonic() + timeout
    cmd = ["ss", "-Htln", f"sport = :{port}"]
    if netns:
        cmd = ["ip", "netns", "exec", netns, *cmd]
    while time.monotonic() < deadline:
        if run(*cmd, check=False).stdout.strip():
            return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listens on port {port}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def netns_name(tag: str) -> str:
    """A name for a test's namespace: this process's, so remove_stale_namespaces() knows when it is left over."""
    return f"{NETNS_PREFIX}{os.getpid()}-{tag}"


def remove_stale_namespaces() -> list[str]:
    """Removes the namespaces (and what still runs in them) of test processes that no longer exist; their
    names, sorted. Other live processes' namespaces, and everything not named by netns_name(), stay."""
    stale = []
    for name in sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else []:
        owner = _OWNED_NETNS.match(name)
        if owner and int(owner[1]) != os.getpid() and not Path(f"/proc/{owner[1]}").exists():
            kill_netns_processes(name)
            run("ip", "netns", "del", name, check=False)
            stale.append(name)
    return stale


@contextlib.contextmanager
def netns(tag: str) -> Iterator[str]:
    """A scratch namespace with loopback up, removed with everything running in it."""
    name = netns_name(tag)
    run("ip", "netns", "add", name)
    try:
        run("ip", "-n", name, "link", "set", "lo", "up")
        yield name
    finally:
        kill_netns_processes(name)
        run("ip", "netns", "del", name, check=False)


def shape_loopback(name: str, rate: str = "20mbit") -> None:
    """Loopback in namespace `name` as a bounded path: a 1500-byte MTU and a tbf at `rate`, so tests that
    talk over 127.0.0.0/8 there send bounded traffic, as on a real link."""
    for argv in (["ip", "link", "set", "lo", "mtu", "1500"],
                 ["tc", "qdisc", "add", "dev", "lo", "root", "tbf", "rate", rate, "burst", "32kb", "latency", "50ms"]):
        run("ip", "netns", "exec", name, *argv)


def held_prog_ids(pid: int) -> set[int]:
    """Ids of the BPF programs a process holds, from its fdinfo."""
    ids = set()
    for fd in Path(f"/proc/{pid}/fdinfo").iterdir():
        with contextlib.suppress(OSError):
            for line in fd.read_text().splitlines():
                if line.startswith("prog_id:"):
                    ids.add(int(line.split()[1]))
    return ids


def held_link_count(pid: int) -> int:
    """How many BPF links (attachments) a process holds, from its fdinfo: ccscope has attached its tracepoints
    once it holds three."""
    count = 0
    for fd in Path(f"/proc/{pid}/fdinfo").iterdir():
        with contextlib.suppress(OSError):
            count += any(line.startswith("link_id:") for line in fd.read_text().splitlines())
    return count


def process_states() -> Iterator[tuple[int, int, str]]:
    """(pid, parent pid, state letter) of every process, from /proc/PID/stat."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (fields := _stat_fields(int(entry))):
            yield int(entry), int(fields[1]), fields[0]


def parent_pid(pid: int) -> int | None:
    """The parent of `pid`, None once it is gone."""
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def _stat_fields(pid: int) -> list[str]:
    """/proc/PID/stat after the command name (state, ppid, ...); [] once the process is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def stop_process(proc: subprocess.Popen, sig: int | None = signal.SIGTERM, timeout: float = 10.0) -> int:
    """Send `sig` (None: it was told to exit some other way), wait, SIGKILL after `timeout`; the exit status."""
    if sig is not None and proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


class Daemon:
    """A real `ccscope daemon` subprocess on a free port, scraped over HTTP(S) as Prometheus would.

    `tls` is the client side (trusting the daemon's certificate) when the daemon serves HTTPS. Warning lines the
    daemon prints before it serves are kept in `warnings`."""

    def __init__(self, *args: str, tls: ssl.SSLContext | None = None, port: int | None = None) -> None:
        self.port = port or free_port()
        self.tls = tls
        self.proc = subprocess.Popen([*CCSCOPE, "daemon", "--listen", f"127.0.0.1:{self.port}", *args],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        self.warnings: list[str] = []
        line = self.proc.stderr.readline()  # "serving ..." once attached, or the one-line error
        while line.startswith("ccscope: warning:"):
            self.warnings.append(line)
            line = self.proc.stderr.readline()
        if "serving" not in line:
            self.stop()
            raise RuntimeError(f"daemon did not start: {''.join(self.warnings)}{line}{self.proc.stderr.read()}")

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def get(self, path: str = "/metrics", user: str | None = None, password: str | None = None,
            timeout: float = 30) -> tuple[int, dict[str, str], bytes]:
        """(status, headers, body) of one GET, with basic auth when `user` is given; HTTP errors are returned."""
        request = urllib.request.Request(self.url + path)
        if user is not None:
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(request, timeout=timeout, context=self.tls) as resp:
                return resp.status, dict(resp.headers), resp.read()
        except urllib.error.HTTPError as exc:
            return exc.code, dict(exc.headers), exc.read()

    def scrape_text(self) -> str:
        status, _, body = self.get("/metrics")
        if status != 200:
            raise RuntimeError(f"scrape: HTTP {status}: {body[:200]!r}")
        return body.decode()

    def scrape(self) -> list[tuple[str, dict[str, str], float]]:
        return parse_metrics(self.scrape_text())

    def metric(self, name: str, text: str | None = None) -> float:
        """The first sample of `name` (a scrape of its own unless `text` is given)."""
        for line in (text or self.scrape_text()).splitlines():
            if line.startswith(name + " ") or line.startswith(name + "{"):
                return float(line.rsplit(" ", 1)[1])
        raise KeyError(name)

    def stop(self, sig: int = signal.SIGTERM) -> tuple[int, str]:
        return stop_process(self.proc, sig, timeout=20), self.proc.stderr.read()


@contextlib.contextmanager
def daemon(*args: str, tls: ssl.SSLContext | None = None, port: int | None = None) -> Iterator[Daemon]:
    running = Daemon(*args, tls=tls, port=port)
    try:
        yield running
    finally:
        running.stop()


class Sink:
    """A TCP server that reads and discards everything, in a background thread."""

    def __init__(self, family: int, addr: str, port: int, netns: str | None = None) -> None:
        ctx = in_netns(netns) if netns else contextlib.nullcontext()
        with ctx:
            self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((addr, port))
        self.sock.listen(1024)
        self.conns: list[socket.socket] = []
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(conn)
            threading.Thread(target=self._drain, args=(conn,), daemon=True).start()

    @staticmethod
    def _drain(conn: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while conn.recv(1 << 16):
                pass
        conn.close()

    def close(self) -> None:
        self._stop = True
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        for conn in self.conns:
            with contextlib.suppress(OSError):
                conn.close()


def connect(family: int, addr: str, port: int, netns: str | None = None, cc: str | None = None) -> socket.socket:
    ctx = in_netns(netns) if netns else contextlib.nullcontext()
    with ctx:
        sock = socket.socket(family, socket.SOCK_STREAM)
    if cc:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
    sock.connect((addr, port))
    return sock


def parse_metrics(text: str) -> list[tuple[str, dict[str, str], float]]:
    """Prometheus text format -> (name, labels, value); enough for our own exposition."""
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = re.match(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$', line)
        if not match:
            raise ValueError(f"unparsable metrics line: {line!r}")
        labels = dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', match.group(2) or ""))
        samples.append((match.group(1), labels, float(match.group(3))))
    return samples


def cli(*args: str) -> list[str]:
    return [*CCSCOPE, *args]


def values(samples, name: str, **labels: str) -> list[float]:
    return [v for n, lab, v in samples if n == name and all(lab.get(k) == x for k, x in labels.items())]


def wait_for(predicate, timeout: float = 10.0, step: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        result = predicate()
        if result or time.monotonic() > deadline:
            return result
        time.sleep(step)
