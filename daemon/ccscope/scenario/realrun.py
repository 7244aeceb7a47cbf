"""One run of a scenario over a real path (realpath.RealPath): this host's own network, a real far end.

Nothing of the host's networking changes: iperf3 -C sets the algorithm on its sockets (TCP_CONGESTION),
--bind-dev / -B and ping -I choose the way out, and no qdisc, route or sysctl is touched. The BPF
recorder watches this host's namespace, and a run keeps only its own connections: those from the local
port iperf3 reports to the target's address and test port. Before each run the idle RTT to the target
is measured (ping) and compared with the profile's first run.

The far end is either a plain `iperf3 -s` (one test at a time; bulk flows and ping; `direction: down`
records this host's receiver view only) or `ccscope serve` (a server port per flow, and the sender's
series from its kernel when it sends). prepare() checks every real profile before anything is created.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from ccscope.emulation.testbed import terminate
from ccscope.errors import PrerequisiteError, UsageError
from ccscope.hosttools import need
from ccscope.sample import Sample, row_order
from ccscope.serve import protocol

from .document import PING_STREAMS
from .lifecycle import FlowViews, Session
from .realpath import TOKEN_ENV, RealPath, is_real, rtt_moved
from .record import RunRecord
from .recorder import FlowSeries
from .spec import Scenario
from .traffic import (
    BulkFlow,
    PingSeries,
    TrafficResult,
    _parse_iperf,
    bulk_plan,
    parse_ping,
    ping_streams,
    planned_seconds,
)

CONNECT_TIMEOUT_S = 3.0
SLACK_S = 10.0  # connect and iperf3's end-of-test exchange beyond the flow's own duration
STALL_MS = 5000  # iperf3 --snd-timeout/--rcv-timeout: a path that carries nothing this long has failed
BUSY_BACKOFF_S = (1.0, 2.0, 4.0, 8.0)  # retries when a plain iperf3 server is busy with another test
BUSY = "the server is busy"  # iperf3's error while its server runs another client's test
IDLE_PINGS = 5
POLL_S = 0.05


@dataclass
class Resolved:
    """A real profile checked before the runs: its address, its far end."""

    profile: RealPath
    address: str
    far_end: str  # "ccscope serve" or "iperf3"
    greeting: protocol.Greeting | None = None
    token: str | None = None  # the far end's serve token, when it asks for one

    @property
    def serve(self) -> bool:
        return self.greeting is not None

    @property
    def sender_telemetry(self) -> bool:
        return self.profile.direction == "up" or bool(self.greeting and self.greeting.telemetry)


@dataclass
class Context:
    paths: dict[str, Resolved]
    netns: int  # this process's network namespace: the recorder's filter
    first_rtt_ms: dict[str, float] = field(default_factory=dict)

    def path_for(self, profile: str) -> RealRunPath | None:
        """The run path of a real profile (None: the profile is emulated)."""
        return RealRunPath(self.paths[profile], self) if profile in self.paths else None


# --- before anything runs ---------------------------------------------------------------------------


def prepare(scenario: Scenario) -> Context | None:
    """Resolves and probes every real profile (one line on the first problem); None without any."""
    real = {name: p for name, p in scenario.profiles.items() if is_real(p)}
    if not real:
        return None
    need("iperf3", "ping")
    paths = {name: _resolve(scenario, name, p) for name, p in real.items()}
    return Context(paths=paths, netns=os.stat("/proc/self/ns/net").st_ino)


def _resolve(scenario: Scenario, name: str, p: RealPath) -> Resolved:
    where = f"profiles.{name}"
    if p.via is not None and not p.via_is_address:
        try:
            socket.if_nametoindex(p.via)
        except OSError:
            raise UsageError(f"{where}.via: no interface {p.via!r} on this host") from None
    try:
        infos = socket.getaddrinfo(p.host, p.port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UsageError(f"{where}.target: cannot resolve {p.host!r}: {exc.strerror}") from None
    address = infos[0][4][0]
    greeting = _probe(where, p, address)
    path = Resolved(p, address, "ccscope serve" if greeting else "iperf3", greeting)
    if greeting is not None and greeting.auth == "token":
        path.token = read_token(where, p)
        _check_token(where, path)
    _check_far_end(scenario, where, path)
    return path


MAX_TOKEN_BYTES = 1024


def read_token(where: str, p: RealPath) -> str:
    """The far end's serve token: the profile's token_file, else $CCSCOPE_SERVE_TOKEN; one line if neither."""
    if p.token_file is None:
        token = os.environ.get(TOKEN_ENV, "").strip()
        if not token:
            raise PrerequisiteError(f"{where}: the ccscope serve at {p.target} asks for its token",
                                    f"give `token_file: PATH` in the profile or set {TOKEN_ENV}; serve printed "
                                    "the token at its first start and keeps it in its --token-file")
        return token
    try:
        with open(p.token_file, "rb") as fh:
            data = fh.read(MAX_TOKEN_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"{where}.token_file: cannot read {p.token_file}: {exc.strerror}") from None
    token = data.decode("utf-8", "replace").strip()
    if not token or len(data) > MAX_TOKEN_BYTES or any(c.isspace() for c in token):
        raise UsageError(f"{where}.token_file: {p.token_file} does not hold one token (one word, at most "
                         f"{MAX_TOKEN_BYTES} bytes)")
    return token


def _check_token(where: str, path: Resolved) -> None:
    p = path.profile
    try:
        sock = protocol.connect(path.address, p.port, p.via, p.via_is_address, CONNECT_TIMEOUT_S)
        with sock:
            greeting = protocol.greeting(sock)
            if greeting is None:
                raise protocol.ServeError("it no longer answers as ccscope serve")
            protocol.Session(sock, greeting, path.token).check()
    except (OSError, protocol.ServeError) as exc:
        raise PrerequisiteError(f"{where}: {p.target}: {exc}",
                                "is the token the one this serve printed (its --token-file)?") from None


def _probe(where: str, p: RealPath, address: str) -> protocol.Greeting | None:
    via = f" via {p.via}" if p.via else ""
    try:
        sock = protocol.connect(address, p.port, p.via, p.via_is_address, CONNECT_TIMEOUT_S)
    except TimeoutError:
        raise PrerequisiteError(f"{where}: no answer from {p.target}{via} within {CONNECT_TIMEOUT_S:g} s "
                                "(unreachable, or a firewall drops it)") from None
    except OSError as exc:
        if p.via_is_address and exc.errno in (99,):  # EADDRNOTAVAIL
            raise UsageError(f"{where}.via: {p.via} is not an address of this host") from None
        raise PrerequisiteError(f"{where}: cannot connect to {p.target}{via}: {exc.strerror or exc}",
                                "start `ccscope serve` (or `iperf3 -s`) on the far host") from None
    with sock:
        try:
            return protocol.greeting(sock)
        except protocol.ServeError as exc:
            raise PrerequisiteError(f"{where}: {p.target}{via}: {exc}") from None


def _check_far_end(scenario: Scenario, where: str, path: Resolved) -> None:
    t = scenario.traffic
    if not path.serve:
        if t.downloads is not None:
            raise UsageError(f"{where}: downloads need `ccscope serve` on the far end ({path.profile.target} is a "
                             "plain iperf3 server)")
        if t.flows > 1 or any(len(mix) > 1 for mix in scenario.algorithms):
            raise UsageError(f"{where}: several flows at once need `ccscope serve` on the far end (a plain "
                             f"iperf3 server at {path.profile.target} runs one test at a time)")
        return
    assert path.greeting is not None
    longest = planned_seconds(scenario) + scenario.warmup_s
    if path.greeting.max_seconds and longest > path.greeting.max_seconds:
        raise UsageError(f"{where}: a run lasts {longest:g} s, the far end's ccscope serve allows "
                         f"{path.greeting.max_seconds:g} s (its --max-seconds)")
    if t.downloads is not None:
        raise UsageError(f"{where}: downloads over a real path are not supported yet (bulk flows and ping are)")


# --- one run ----------------------------------------------------------------------------------------


@dataclass
class RealTraffic(TrafficResult):
    remote: dict[int, protocol.RemoteTelemetry] = field(default_factory=dict)  # flow index -> serve's telemetry
    remote_failed: set[int] = field(default_factory=set)  # flows whose telemetry the far end did not give
    credentials: dict[int, protocol.Iperf3Credentials] = field(default_factory=dict)  # flow index -> its iperf3 user


@dataclass
class RealRunPath:
    """A real profile as one run's path (lifecycle.py): its idle RTT first, then the traffic from this host."""
    path: Resolved
    ctx: Context

    @contextlib.contextmanager
    def open(self, session: Session, unit, position: int, record: RunRecord) -> Iterator[OpenRealPath | None]:
        path, p = self.path, self.path.profile
        record.netns, record.backend = self.ctx.netns, "real path"
        real = record.real = {"target": p.target, "address": path.address, "via": p.via,
                                 "direction": p.direction, "far_end": path.far_end,
                                 "sender_telemetry": path.sender_telemetry, "idle_rtt_ms": None,
                                 "idle_rtt_samples_ms": [], "rtt_moved": False, "failed": False}
        session.progress.note(f"{unit.label}: idle RTT to {p.target}{' via ' + p.via if p.via else ''}")
        samples = real["idle_rtt_samples_ms"] = idle_rtt_ms(path)
        if not samples:
            record.errors.append(f"no ping reply from {p.target} before the run: the path is down; run skipped")
            real["failed"] = True
            yield None
            return
        idle = real["idle_rtt_ms"] = round(statistics.median(samples), 3)
        first = real["idle_rtt_first_ms"] = self.ctx.first_rtt_ms.setdefault(unit.profile, idle)
        if rtt_moved(first, idle):
            real["rtt_moved"] = True
            session.progress.note(f"{unit.label}: idle RTT {idle:.2f} ms moved from the first run's {first:.2f} ms")
        yield OpenRealPath(path, self.ctx.netns, real)


@dataclass
class OpenRealPath:
    path: Resolved
    netns: int
    real: dict
    link_samples: list[tuple[float, int]] | None = None  # a real path's bottleneck is not ours to read
    keep_own_goodput: bool = True  # a flow this host only received keeps iperf3's goodput

    @property
    def watched(self) -> set[int]:
        return {self.netns}

    @property
    def sender_expected(self) -> bool:
        return self.path.sender_telemetry

    @property
    def down(self) -> bool:
        return self.path.profile.direction == "down"

    def run_traffic(self, scenario: Scenario, mix: tuple[str, ...], progress, log_dir: Path) -> RealTraffic:
        log_dir.mkdir(parents=True, exist_ok=True)
        return run_traffic(self.path, scenario, mix, progress, log_dir)

    def views(self, flow: BulkFlow, series: dict[int, FlowSeries], traffic: TrafficResult,
              errors: list[str]) -> FlowViews:
        assert isinstance(traffic, RealTraffic)
        mine = own_series(flow, self.path.address, series)
        errors_before = len(errors)
        sender = _far_series(errors, flow, traffic) if self.down else mine
        refused = len(errors) > errors_before or flow.index in traffic.remote_failed
        return FlowViews(sender=sender, receiver=mine, refused=refused)

    def describe(self, views: FlowViews) -> dict:
        return {"view": "sender" if views.sender else "receiver" if views.receiver else None,
                "sender_host": "far end" if self.down else "this host"}

    def finish(self, record: RunRecord) -> None:
        self.real["failed"] = bool(record.errors)


def idle_rtt_ms(path: Resolved) -> list[float]:
    argv = ["ping", "-n", "-c", str(IDLE_PINGS), "-i", "0.2", "-W", "1", *_ping_via(path), path.address]
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=IDLE_PINGS * 0.2 + 5).stdout
    except subprocess.TimeoutExpired:
        return []
    return [float(x) for x, _ in (line.split(" ms", 1) for line in out.split("time=")[1:])]


def _ping_via(path: Resolved) -> list[str]:
    return ["-I", path.profile.via] if path.profile.via else []


@dataclass
class _Child:
    name: str
    proc: subprocess.Popen
    out: Path
    err: Path

    def text(self) -> tuple[str, str]:
        return (self.out.read_text(errors="replace") if self.out.exists() else "",
                self.err.read_text(errors="replace") if self.err.exists() else "")


def _spawn(name: str, argv: list[str], log_dir: Path, env: dict[str, str] | None = None) -> _Child:
    out, err = log_dir / f"{name}.out", log_dir / f"{name}.err"
    with out.open("wb") as o, err.open("wb") as e:  # files, never pipes: iperf3 -J of a long flow is large
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=o, stderr=e, start_new_session=True,
                                env=None if env is None else {**os.environ, **env})
    return _Child(name, proc, out, err)


def run_traffic(path: Resolved, scenario: Scenario, mix: tuple[str, ...], progress, log_dir: Path) -> RealTraffic:
    """The timed phase, retried with backoff while a plain iperf3 server answers that it is busy."""
    for attempt, backoff in enumerate((*BUSY_BACKOFF_S, None)):
        result = RealTraffic(bulk=bulk_plan(scenario, mix))
        for flow in result.bulk:
            flow.port = path.profile.port  # a plain iperf3 server's (serve hands out one per flow below)
        sessions: dict[int, protocol.Session] = {}
        children: list[_Child] = []
        try:
            if path.serve:
                _open_sessions(path, scenario, result, sessions)
            busy = _timed_phase(path, scenario, result, children, log_dir, progress, attempt)
            if busy and backoff is not None:
                print(f"ccscope: {path.profile.target} is busy with another test; retrying in {backoff:g} s",
                      file=sys.stderr)
                time.sleep(backoff)
                continue
            _collect(result, children, path)
            if busy:
                tries = len(BUSY_BACKOFF_S) + 1
                result.errors = [f"{path.profile.target}: the server is busy with another test (it turned "
                                 f"{tries} tries over {sum(BUSY_BACKOFF_S):g} s away)"]
            _remote_telemetry(result, sessions)
            return result
        finally:
            for child in children:
                terminate(child.proc, grace_s=2.0)
            for session in sessions.values():
                session.close()
    raise AssertionError("unreachable")


def _open_sessions(path: Resolved, scenario: Scenario, result: RealTraffic,
                   sessions: dict[int, protocol.Session]) -> None:
    p = path.profile
    seconds = scenario.duration_s + scenario.warmup_s + max(f.start_offset_s for f in result.bulk)
    for flow in result.bulk:
        try:
            sock = protocol.connect(path.address, p.port, p.via, p.via_is_address, CONNECT_TIMEOUT_S)
            greeting = protocol.greeting(sock)
            if greeting is None:
                sock.close()
                raise protocol.ServeError("the far end no longer answers as ccscope serve")
            session = sessions[flow.index] = protocol.Session(sock, greeting, path.token)
            grant = session.start_test(flow.algorithm, seconds, reverse=p.direction == "down")
            flow.port = grant.port
            if grant.credentials is not None:
                result.credentials[flow.index] = grant.credentials
        except (OSError, protocol.ServeError) as exc:
            flow.error = f"{p.target}: {exc}"
            if flow.index in sessions:  # no test runs there: nothing to say "done" to
                sessions.pop(flow.index).close()


def _iperf_argv(path: Resolved, scenario: Scenario, flow: BulkFlow) -> list[str]:
    p = path.profile
    argv = ["iperf3", "-c", path.address, "-p", str(flow.port), "-t", str(int(scenario.duration_s)),
            "-O", str(int(scenario.warmup_s)), "-C", flow.algorithm, "-J", "-i", "0.2",
            "--connect-timeout", str(int(CONNECT_TIMEOUT_S * 1000))]
    if p.via is not None:
        argv += ["-B", p.via] if p.via_is_address else ["--bind-dev", p.via]
    if p.direction == "down":
        argv += ["-R", "--rcv-timeout", str(STALL_MS)]
    else:
        argv += ["--snd-timeout", str(STALL_MS)]
    return argv


def _with_credentials(argv: list[str], given: protocol.Iperf3Credentials,
                      key_file: Path) -> tuple[list[str], dict[str, str]]:
    """iperf3 as the one user the far end's test server admits (its password in the environment, where
    iperf3 reads it, never on a command line)."""
    key_file.write_text(given.public_key)
    return [*argv, "--username", given.username, "--rsa-public-key-path", str(key_file)], \
        {"IPERF3_PASSWORD": given.password}


def _timed_phase(path: Resolved, scenario: Scenario, result: RealTraffic, children: list[_Child], log_dir: Path,
                 progress, attempt: int) -> bool:
    """Ping from t0 and each bulk flow at its offset, until all end or the deadline; True if the far end
    said it was busy (everything of this attempt is then stopped)."""
    t = scenario.traffic
    planned = planned_seconds(scenario)
    t0 = time.clock_gettime(time.CLOCK_MONOTONIC)
    result.start_mono = t0
    suffix = f"-try{attempt + 1}" if attempt else ""
    for name, options in ping_streams(t).items():
        children.append(_spawn(f"{name}{suffix}", ["ping", "-n", "-D", *options, "-i", f"{t.ping_interval_s:g}",
                                                   "-w", f"{max(1, round(planned))}", *_ping_via(path),
                                                   path.address], log_dir))
    pending = sorted((f for f in result.bulk if f.error is None), key=lambda f: f.start_offset_s)
    deadline = t0 + planned + SLACK_S
    bulk: dict[int, _Child] = {}
    while True:
        now = time.clock_gettime(time.CLOCK_MONOTONIC)
        while pending and now - t0 >= pending[0].start_offset_s:
            flow = pending.pop(0)
            flow.start_mono = now
            argv, env = _iperf_argv(path, scenario, flow), None
            if (given := result.credentials.get(flow.index)) is not None:
                argv, env = _with_credentials(argv, given, log_dir / f"iperf3-key{flow.index}.pem")
            bulk[flow.index] = _spawn(f"iperf3-client{flow.index}{suffix}", argv, log_dir, env)
            children.append(bulk[flow.index])
        progress(min(now - t0, planned))
        if any(child.proc.poll() is not None and _busy(child.text()[0]) for child in bulk.values()):
            for child in children:
                terminate(child.proc, grace_s=2.0)
            result.end_mono = time.clock_gettime(time.CLOCK_MONOTONIC)
            return True
        if not pending and all(c.proc.poll() is not None for c in bulk.values()):
            break
        if now > deadline:
            late = ", ".join(c.name for c in bulk.values() if c.proc.poll() is None)
            result.errors.append(f"traffic did not finish within {deadline - t0:.0f} s; stopped {late}")
            break
        time.sleep(POLL_S)
    for child in children:  # SIGINT: iperf3 and ping still write their report, cut short
        terminate(child.proc, signal.SIGINT, grace_s=3.0)
    result.end_mono = time.clock_gettime(time.CLOCK_MONOTONIC)
    return False


def _busy(report: str) -> bool:
    """iperf3 -J of a client the server turned away before the test started."""
    try:
        data = json.loads(report)
    except ValueError:
        return False
    error = data.get("error") or "" if isinstance(data, dict) else ""
    started = (data.get("start") or {}).get("connected") if isinstance(data, dict) else None
    return not started and BUSY in error


def _collect(result: RealTraffic, children: list[_Child], path: Resolved) -> None:
    wall_offset = time.time() - time.clock_gettime(time.CLOCK_MONOTONIC)
    by_name = {c.name.split("-try")[0]: c for c in children}  # the last attempt's
    for flow in result.bulk:
        child = by_name.get(f"iperf3-client{flow.index}")
        if flow.error is None and child is None:
            flow.error = "iperf3 did not start"
        elif child is not None:
            _parse_iperf(flow, *child.text(), log=child.out.name)
            if flow.error and "congestion" in flow.error.lower():
                flow.error = f"the far end refused {flow.algorithm} ({flow.error})"
        if flow.error:
            result.errors.append(f"bulk flow {flow.index} ({flow.algorithm}): {flow.error}")
    result.pings = {name: PingSeries(*parse_ping(child.text()[0], wall_offset))
                    for name, child in by_name.items() if name in PING_STREAMS}


def _remote_telemetry(result: RealTraffic, sessions: dict[int, protocol.Session]) -> None:
    for index, session in sessions.items():
        try:
            result.remote[index] = session.finish(timeout=15.0)
        except (OSError, protocol.ServeError) as exc:
            result.errors.append(f"bulk flow {index}: no telemetry from the far end: {exc}")
            result.remote_failed.add(index)


# --- the record -------------------------------------------------------------------------------------


def own_series(flow: BulkFlow, address: str, series: dict[int, FlowSeries]) -> FlowSeries | None:
    """This run's connection of `flow` on this host, and nothing else: the local port iperf3 reported,
    to the target's address and test port (the host's other traffic never matches)."""
    if flow.local_port is None:
        return None
    mine = [s for s in series.values() if s.sport == flow.local_port and s.dport == flow.port
            and _same_address(s.dst, address) and s.samples]
    return max(mine, key=lambda s: len(s.samples), default=None)


def _same_address(a: str, b: str) -> bool:
    return a == b or a.removeprefix("::ffff:") == b.removeprefix("::ffff:")


def remote_series(flow: BulkFlow, telemetry: protocol.RemoteTelemetry | None) -> FlowSeries | None:
    """The far end's series of the flow (its server port to our local port), on this host's clock: serve's
    monotonic clock shifted by the difference at its reply (off by the reply's one-way delay). ValueError
    (one line) if a sample of it is malformed or out of range: the whole series is refused, never stored."""
    if telemetry is None or flow.local_port is None:
        return None
    offset = telemetry.received_mono - telemetry.now
    flows = [f for f in telemetry.flows if f.sport == flow.port and f.dport == flow.local_port and f.rows]
    if not flows:
        return None
    f = max(flows, key=lambda f: len(f.rows))
    order = row_order(telemetry.fields) if telemetry.fields is not None else None
    samples = []
    for i, row in enumerate(f.rows):
        try:
            samples.append(Sample.from_row(row, offset, order))
        except ValueError as exc:
            raise ValueError(f"the far end's sample {i} of the flow: {exc}") from None
    samples.sort(key=lambda s: s.t)
    return FlowSeries(cookie=0, src=f.src, sport=flow.port, dst=f.dst, dport=flow.local_port, samples=samples)


def _far_series(errors: list[str], flow: BulkFlow, traffic: RealTraffic) -> FlowSeries | None:
    try:
        return remote_series(flow, traffic.remote.get(flow.index))
    except ValueError as exc:
        errors.append(f"bulk{flow.index}: {exc}; its series is not kept")
        return None
