"""`ccscope serve`: the far end of a real-path scenario.

It answers the control protocol (protocol.py) on the first port of its range and, per request, starts
one `iperf3 -s -1` (or the short-download server) on a free port of the rest of the range, records that
test's flows with the BPF probe when it can (the sender's cwnd/srtt when the far end sends), and hands
the series back. It runs nothing but these fixed commands: the client chooses an algorithm name (checked
against this kernel's list), a length (bounded by --max-seconds) and the direction, nothing else.
At most --max-tests run at once; a test still running at its length plus SLACK_S is killed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from ccscope.errors import CcscopeError, UsageError

from . import protocol

SLACK_S = 15.0  # connect, iperf3's end-of-test exchange, a slow path
REQUEST_TIMEOUT_S = 10.0
MAX_SAMPLES_PER_TEST = 200_000  # 10 ms samples of a 30-minute test; beyond, the oldest stay
_ALG = re.compile(r"^[a-z][a-z0-9_]{0,14}$")
AVAILABLE = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")


def log(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} ccscope serve: {line}", file=sys.stderr, flush=True)


def parse_ports(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)-(\d+)", text.strip())
    if not m or not 1 <= int(m.group(1)) < int(m.group(2)) <= 65535:
        raise UsageError(f"--ports {text!r}: give a range FIRST-LAST such as 5201-5216 (control on FIRST)")
    return int(m.group(1)), int(m.group(2))


def listening(port: int) -> bool:
    """Something listens on TCP `port` in this namespace (/proc/net/tcp, tcp6: state 0A)."""
    for name in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 3 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                return True
    return False


class Telemetry:
    """The BPF probe's samples of the flows on watched local ports (this namespace only)."""

    def __init__(self, sample_interval_s: float) -> None:
        from ccscope.flows import decode
        from ccscope.loader import ProbeOptions, TelemetryProbe, preflight
        from ccscope.scenario.recorder import Sample

        preflight()
        self._decode, self._sample = decode, Sample
        self._netns = os.stat("/proc/self/ns/net").st_ino
        self._probe = TelemetryProbe(ProbeOptions(emit_samples=True,
                                                  sample_interval_ns=int(sample_interval_s * 1e9)))
        self._probe.__enter__()
        self._lock = threading.Lock()
        self._watched: dict[int, dict[int, dict]] = {}  # local port -> cookie -> flow
        self._stop = threading.Event()
        self._ring = self._probe.ring_buffer(self._on_samples)
        self._thread = threading.Thread(target=self._poll, name="serve-telemetry", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._ring.poll(50)

    def _on_samples(self, raws: list) -> None:
        for raw in raws:
            if raw.netns != self._netns or raw.sport not in self._watched:
                continue
            f = self._decode(raw)
            with self._lock:
                flows = self._watched.get(f.sport)
                if flows is None:
                    continue
                flow = flows.setdefault(f.cookie, {"src": f.src, "sport": f.sport, "dst": f.dst, "dport": f.dport,
                                                   "samples": []})
                if len(flow["samples"]) < MAX_SAMPLES_PER_TEST:
                    flow["samples"].append(list(dataclasses.astuple(self._sample.of(f))))

    def watch(self, port: int) -> None:
        with self._lock:
            self._watched[port] = {}

    def collect(self, port: int) -> list[dict]:
        time.sleep(0.2)  # the poll thread drains what is already in the ring (polls every 50 ms)
        with self._lock:
            flows = self._watched.pop(port, {})
        out = []
        for flow in flows.values():
            ccs = [s[11] for s in flow["samples"] if s[11] and s[11] != "unknown"]
            out.append({**flow, "cc": ccs[-1] if ccs else "unknown"})
        return out

    def forget(self, port: int) -> None:
        with self._lock:
            self._watched.pop(port, None)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._ring.close()
        self._probe.__exit__(None, None, None)


class Server:
    def __init__(self, listen: str, ports: tuple[int, int], max_tests: int, max_seconds: float,
                 telemetry: Telemetry | None, algorithms: list[str] | None = None) -> None:
        self.listen = listen
        self.algorithms = algorithms  # None: whatever this kernel offers
        self.ports = ports
        self.max_seconds = max_seconds
        self.telemetry = telemetry
        self._slots = threading.BoundedSemaphore(max_tests)
        self.max_tests = max_tests
        self._free = list(range(ports[0] + 1, ports[1] + 1))
        self._lock = threading.Lock()
        self._children: set[subprocess.Popen] = set()
        family = socket.AF_INET6 if ":" in listen else socket.AF_INET
        try:
            self.sock = socket.create_server((listen, ports[0]), family=family, backlog=64)
        except OSError as exc:
            raise CcscopeError(f"cannot listen on {listen}:{ports[0]}: {exc.strerror}",
                               "is another server (iperf3 -s, ccscope serve) there? choose --ports") from None

    def serve_forever(self) -> None:
        while True:
            conn, peer = self.sock.accept()
            threading.Thread(target=self._session, args=(conn, peer), daemon=True).start()

    def close(self) -> None:
        self.sock.close()
        with self._lock:
            children = list(self._children)
        for proc in children:
            _kill(proc)

    # --- one client --------------------------------------------------------------------------------
    def _session(self, conn: socket.socket, peer: tuple) -> None:
        who = f"{peer[0]}:{peer[1]}"
        with conn:
            try:
                if _read_exactly(conn, len(protocol.HELLO), REQUEST_TIMEOUT_S) != protocol.HELLO:
                    return  # not a ccscope client
                protocol.send(conn, {"ccscope_serve": protocol.VERSION, "ports": list(self.ports),
                                     "max_seconds": self.max_seconds, "telemetry": self.telemetry is not None})
                line = protocol.read_line(conn, protocol.MAX_LINE_BYTES, time.monotonic() + REQUEST_TIMEOUT_S)
            except (OSError, protocol.ServeError):
                return  # a probe that only wanted the greeting
            try:
                request = self._check(json.loads(line))
            except (ValueError, UsageError) as exc:
                log(f"{who}: refused: {exc}")
                with contextlib.suppress(OSError):
                    protocol.send(conn, {"ok": False, "error": str(exc)})
                return
            if not self._slots.acquire(blocking=False):
                log(f"{who}: refused: busy ({self.max_tests} tests running)")
                with contextlib.suppress(OSError):
                    protocol.send(conn, {"ok": False, "error": f"the server is busy ({self.max_tests} tests "
                                                               "running, its limit)"})
                return
            try:
                self._test(conn, who, request)
            except (OSError, protocol.ServeError) as exc:
                log(f"{who}: ended: {exc}")
            finally:
                self._slots.release()

    def _check(self, request: object) -> dict:
        if not isinstance(request, dict) or request.get("op") not in ("test", "download"):
            raise UsageError("expected {\"op\": \"test\" or \"download\", ...}")
        cc = request.get("cc")
        if not isinstance(cc, str) or not _ALG.match(cc):
            raise UsageError(f"{cc!r} is not a congestion control name")
        offered = [a for a in AVAILABLE.read_text().split() if self.algorithms is None or a in self.algorithms]
        if cc not in offered:
            raise UsageError(f"the far end refused {cc}: not offered here (offered: {' '.join(offered) or 'none'})")
        seconds = request.get("seconds")
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= self.max_seconds:
            raise UsageError(f"seconds {seconds!r}: a test here lasts at most {self.max_seconds:g} s "
                             "(ccscope serve --max-seconds)")
        return {"op": request["op"], "cc": cc, "seconds": float(seconds), "reverse": bool(request.get("reverse"))}

    def _take_port(self) -> int:
        with self._lock:
            for i, port in enumerate(self._free):
                if not listening(port):
                    return self._free.pop(i)
        raise UsageError("no free port in the range")

    def _test(self, conn: socket.socket, who: str, request: dict) -> None:
        try:
            port = self._take_port()
        except UsageError as exc:
            protocol.send(conn, {"ok": False, "error": str(exc)})
            return
        proc = None
        try:
            proc = self._spawn(request, port)
            deadline = time.monotonic() + 5.0
            while not listening(port):
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise protocol.ServeError(f"the {request['op']} server did not start on port {port}")
                time.sleep(0.02)
            if self.telemetry:
                self.telemetry.watch(port)
            log(f"{who}: {request['op']} cc={request['cc']} seconds={request['seconds']:g}"
                f"{' reverse' if request['reverse'] else ''} on port {port}")
            protocol.send(conn, {"ok": True, "port": port})
            limit = time.monotonic() + request["seconds"] + SLACK_S  # the bound on the test's length
            try:
                protocol.read_line(conn, protocol.MAX_LINE_BYTES, limit)
                done = True
            except protocol.ServeError:
                done = False
            flows = self.telemetry.collect(port) if self.telemetry else []
            if not done:
                log(f"{who}: stopped the test on port {port} at its length bound")
                return
            protocol.send(conn, {"ok": True, "now": time.clock_gettime(time.CLOCK_MONOTONIC), "flows": flows})
            log(f"{who}: done on port {port} ({sum(len(f['samples']) for f in flows)} samples)")
        finally:
            if self.telemetry:
                self.telemetry.forget(port)
            if proc is not None:
                _kill(proc)
                with self._lock:
                    self._children.discard(proc)
            with self._lock:
                self._free.append(port)

    def _spawn(self, request: dict, port: int) -> subprocess.Popen:
        if request["op"] == "test":
            argv = ["iperf3", "-s", "-1", "-p", str(port), "--idle-timeout", str(int(request["seconds"] + SLACK_S))]
            if self.listen not in ("0.0.0.0", "::"):
                argv += ["-B", self.listen]
        else:
            argv = [sys.executable, "-m", "ccscope.scenario.fetch", "serve", "--port", str(port), "--cc",
                    request["cc"]]
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
        with self._lock:
            self._children.add(proc)
        return proc


def _read_exactly(conn: socket.socket, size: int, timeout: float) -> bytes:
    conn.settimeout(timeout)
    buf = b""
    while len(buf) < size:
        part = conn.recv(size - len(buf))
        if not part:
            break
        buf += part
    return buf


def _kill(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=5)


def run(listen: str, ports: tuple[int, int], max_tests: int, max_seconds: float, telemetry: bool,
        sample_interval_s: float, algorithms: list[str] | None = None) -> int:
    probe = None
    if telemetry:
        try:
            probe = Telemetry(sample_interval_s)
        except CcscopeError as exc:
            log(f"no telemetry ({exc.line()}); tests still run, clients get no sender series from here")
    server = None

    def stop(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        server = Server(listen, ports, max_tests, max_seconds, probe, algorithms)
        log(f"listening on {listen}:{ports[0]} (tests on {ports[0] + 1}-{ports[1]}, at most {max_tests} at once, "
            f"each at most {max_seconds:g} s; telemetry {'on' if probe else 'off'}; algorithms "
            f"{','.join(algorithms) if algorithms else 'all of this kernel'})")
        server.serve_forever()
    except KeyboardInterrupt:
        log("stopped")
        return 0
    finally:
        signal.signal(signal.SIGTERM, old)
        if server is not None:
            server.close()
        if probe is not None:
            probe.close()
    return 0
