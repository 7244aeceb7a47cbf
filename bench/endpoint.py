#!/usr/bin/env python3
"""Benchmark of the daemon's metrics endpoint: scrape latency with 50 concurrent scrapers, over HTTP and TLS.

    sudo .venv/bin/python bench/endpoint.py [--quick] [--no-write] [--note TEXT]

A real `ccscope daemon` (default flags: --flows top:50), scraped by 50 scrapers at once, in bursts one
second apart. Two kinds of scraper:
- new connection per scrape: one curl process with --parallel. For TLS that is a full handshake per scrape,
  the worst case, and curl does all 50 client handshakes on one thread of the same 2 cores: its own CPU per
  burst is reported beside the latency.
- keep-alive: 50 connections opened once and reused for every scrape, as Prometheus does (one asyncio
  client, so no client threads fight for the GIL).
The baseline is one scraper alone, of the same kind, measured in the same run. The hostile cases keep 20
idle and 10 slowloris connections open during the bursts. Last, the hostile probe's attack (issue 17): 150
connections from 127.0.0.1 that each send `GET /metrics` a byte a second, reopened as soon as they are closed,
against the default 128 slots, while one well-behaved scraper scrapes 50 times in a row on new connections (the
attacker and the scraper share 127.0.0.1: the hard case). And `ccscope serve` (issue 29): a runner's tests from
127.0.0.1 while 127.0.0.2 holds every idle control connection and granted test serve lets it have, reopening
them as they are closed. Writes bench/results/endpoint.md.

A scrape that takes longer than 10 s (Prometheus's default scrape_timeout) counts as a failure.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from ccscope_testkit.bench import Row, conditions
from ccscope_testkit.hostile import DripFlood, serial_scrapes
from ccscope_testkit.net import ROOT, daemon

RESULTS = ROOT / "bench" / "results" / "endpoint.md"
SCRAPERS = 50
TARGET_P99_S = 0.100
BURST_EVERY_S = 1.0
SCRAPE_TIMEOUT_S = 10.0
FLOOD_CONNECTIONS = 150   # the probe's: more than the default --max-connections 128
FLOOD_SCRAPES = 50
FLOOD_SCRAPE_EVERY_S = 0.25  # 50 scrapes over 12.5 s: past two 5 s request deadlines of the flood's connections
REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept-Encoding: gzip\r\nUser-Agent: ccscope-bench\r\n\r\n"


@dataclass(frozen=True)
class Case:
    tls: bool
    keepalive: bool
    hostile: bool

    @property
    def what(self) -> str:
        return (f"p99 scrape latency, {SCRAPERS} concurrent scrapers, {'TLS' if self.tls else 'HTTP'}, "
                + ("keep-alive connections" if self.keepalive else "new connection per scrape")
                + (", with 20 idle + 10 slowloris connections" if self.hostile else ""))


CASES = [Case(tls=False, keepalive=False, hostile=False), Case(tls=False, keepalive=False, hostile=True),
         Case(tls=True, keepalive=True, hostile=False), Case(tls=True, keepalive=True, hostile=True),
         Case(tls=True, keepalive=False, hostile=False), Case(tls=True, keepalive=False, hostile=True)]


def self_signed(workdir: Path) -> tuple[Path, Path]:
    cert, key = workdir / "cert.pem", workdir / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


def burst(port: int, cafile: str | None, scrapers: int) -> tuple[list[float], list[str], float]:
    """`scrapers` GETs at once, each on its own new connection: one curl process with --parallel. Returns the
    latencies, the failures, and curl's own CPU seconds."""
    scheme = "https" if cafile else "http"
    cmd = ["curl", "-sS", "--no-progress-meter", "--parallel", "--parallel-immediate", "--parallel-max",
           str(scrapers), "--compressed", "--max-time", str(SCRAPE_TIMEOUT_S), "-w", "%{http_code} %{time_total}\n",
           *(("--cacert", cafile) if cafile else ())]
    for _ in range(scrapers):
        cmd += ["-o", "/dev/null", f"{scheme}://127.0.0.1:{port}/metrics"]
    before = _children_cpu_s()
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    cpu_s = _children_cpu_s() - before
    latencies, errors = [], []
    for line in out.stdout.splitlines():
        code, seconds = line.split()
        if code == "200":
            latencies.append(float(seconds))
        else:
            errors.append(f"HTTP {code}")
    missing = scrapers - len(latencies) - len(errors)  # curl itself failed before reporting these
    errors += [out.stderr.strip().splitlines()[0] if out.stderr.strip() else "curl failed"] * max(0, missing)
    return latencies, errors, cpu_s


def _children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class KeepAliveScrapers:
    """`count` connections opened once (handshakes untimed) and reused: each burst sends one GET on each."""

    def __init__(self, port: int, cafile: str | None, count: int) -> None:
        self.port, self.count = port, count
        self.tls = ssl.create_default_context(cafile=cafile) if cafile else None
        self.loop = asyncio.new_event_loop()
        self.connections: list[tuple[asyncio.StreamReader, asyncio.StreamWriter] | None] = [None] * count

    def burst(self) -> tuple[list[float], list[str]]:
        outcomes = self.loop.run_until_complete(_all(self._scrape(i) for i in range(self.count)))
        latencies = [seconds for error, seconds in outcomes if error is None]
        return latencies, [error for error, _ in outcomes if error is not None]

    def close(self) -> None:
        for connection in self.connections:
            if connection:
                connection[1].close()
        self.loop.close()

    async def _connect(self, i: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        if self.connections[i] is None:
            self.connections[i] = await asyncio.open_connection("127.0.0.1", self.port, ssl=self.tls)
        return self.connections[i]

    async def _scrape(self, i: int) -> tuple[str | None, float]:
        reader, writer = await self._connect(i)  # only the first burst, or after the server closed it
        started = time.perf_counter()
        try:
            async with asyncio.timeout(SCRAPE_TIMEOUT_S):
                writer.write(REQUEST)
                status, length = _response_head(await reader.readuntil(b"\r\n\r\n"))
                await reader.readexactly(length)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError) as exc:
            writer.close()
            self.connections[i] = None
            return f"{type(exc).__name__}", 0.0
        return (None if status == 200 else f"HTTP {status}"), time.perf_counter() - started

    def __enter__(self) -> KeepAliveScrapers:
        self.loop.run_until_complete(_all(self._connect(i) for i in range(self.count)))
        return self

    def __exit__(self, *exc) -> None:
        self.close()


async def _all(coroutines) -> list:
    return await asyncio.gather(*coroutines)


def _response_head(head: bytes) -> tuple[int, int]:
    lines = head.decode("latin-1").split("\r\n")
    fields = {name.strip().lower(): value.strip() for name, _, value in (line.partition(":") for line in lines[1:])}
    return int(lines[0].split()[1]), int(fields.get("content-length", "0"))


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


@contextlib.contextmanager
def hostile_clients(port: int, idle: int = 20, slow: int = 10):
    """Idle connections that say nothing, and slowloris ones that send a header byte every 0.2 s."""
    socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(idle + slow)]
    stop = threading.Event()

    def drip() -> None:
        head = b"GET /metrics HTTP/1.1\r\nX-Padding: " + b"a" * 100_000
        for byte in head:
            for sock in socks[idle:]:
                with contextlib.suppress(OSError):
                    sock.send(bytes([byte]))
            if stop.wait(0.2):
                return

    thread = threading.Thread(target=drip, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        for sock in socks:
            sock.close()


def measure(case: Case, bursts: int, workdir: Path) -> Row:
    cafile, args = None, []
    if case.tls:
        cert, key = self_signed(workdir)
        cafile, args = str(cert), ["--tls-cert", str(cert), "--tls-key", str(key)]
    latencies: list[float] = []
    errors: list[str] = []
    client_cpu: list[float] = []
    with daemon(*args) as running:
        with _scrapers(case, running.port, cafile, 1) as alone:
            baseline = [x for _ in range(max(10, bursts)) for x in alone()[0]]
        with hostile_clients(running.port) if case.hostile else contextlib.nullcontext(), \
                _scrapers(case, running.port, cafile, SCRAPERS) as scrape:
            for _ in range(bursts):
                started = time.monotonic()
                got, failed, *cpu = scrape()
                latencies += got
                errors += failed
                client_cpu += cpu
                time.sleep(max(0.0, BURST_EVERY_S - (time.monotonic() - started)))
    p99 = percentile(latencies, 0.99) if latencies else float("inf")
    base = percentile(baseline, 0.5)
    detail = (f"{len(latencies)} scrapes in {bursts} bursts, {len(errors)} failed"
              + (f" ({errors[0]})" if errors else "")
              + f"; p50 {percentile(latencies, 0.5) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms;"
              f" one scraper alone: p50 {base * 1000:.0f} ms, p99 {percentile(baseline, 0.99) * 1000:.0f} ms"
              f" (p99 under load / p50 alone = {p99 / base:.1f}x)"
              + (f"; curl's own CPU per burst: median {percentile(client_cpu, 0.5) * 1000:.0f} ms"
                 if client_cpu else ""))
    return Row(case.what, f"{p99 * 1000:.0f} ms", f"<= {TARGET_P99_S * 1000:.0f} ms, no failures",
               p99 <= TARGET_P99_S and not errors, detail)


def measure_flood() -> Row:
    """The probe's attack, and 50 serial scrapes during it; the baseline: the same scrapes before the attack."""
    with daemon() as running:
        alone, _ = serial_scrapes(running.port, FLOOD_SCRAPES, 0.05)
        with DripFlood(running.port, FLOOD_CONNECTIONS, interval_s=1.0) as flood:
            time.sleep(2.0)  # the table is full and the excess is being turned over before the first scrape
            latencies, errors = serial_scrapes(running.port, FLOOD_SCRAPES, FLOOD_SCRAPE_EVERY_S)
            reopened = flood.reopened
        displaced = running.metric("ccscope_http_connections_displaced_total")
    p99 = percentile(latencies, 0.99) if latencies else float("inf")
    base = percentile(alone, 0.5)
    detail = (f"{len(latencies)} of {FLOOD_SCRAPES} scrapes answered, {len(errors)} failed"
              + (f" ({', '.join(sorted(set(errors)))})" if errors else "")
              + (f"; p50 {percentile(latencies, 0.5) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms"
                 if latencies else "")
              + f"; the same scraper before the attack: p50 {base * 1000:.0f} ms,"
              f" p99 {percentile(alone, 0.99) * 1000:.0f} ms (p99 under attack / p50 alone = {p99 / base:.1f}x)"
              f"; the attacker reopened {reopened} connections, the server displaced {displaced:.0f}")
    what = (f"p99 scrape latency, 1 scraper, {FLOOD_SCRAPES} serial scrapes on new connections, during the probe's "
            f"attack ({FLOOD_CONNECTIONS} connections dripping GET /metrics at 1 byte/s, reopened as closed)")
    return Row(what, f"{p99 * 1000:.0f} ms", f"<= {TARGET_P99_S * 1000:.0f} ms, no failures",
               p99 <= TARGET_P99_S and not errors, detail)


SERVE_PORTS = (7901, 7906)
SERVE_TESTS = 10


class ServeHog:
    """One address (127.0.0.2) holding every control connection and test serve lets it have: idle control
    connections reopened as soon as serve closes or sheds them, and granted tests kept silent, re-asked for."""

    def __init__(self, token: str) -> None:
        self.token, self.held, self.sessions = token, [], []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        from ccscope.serve import protocol

        while not self._stop.wait(0.2):
            self.sessions = [s for s in self.sessions if _still_open(s.sock)]
            while len(self.sessions) < 8:  # tests first: serve lets one address have --max-tests - 1
                try:
                    sock = protocol.connect("127.0.0.1", SERVE_PORTS[0], "127.0.0.2", True, 1.0)
                    session = protocol.Session(sock, protocol.greeting(sock), self.token)
                    session.start_test("cubic", 30, True)
                    self.sessions.append(session)
                except (OSError, protocol.ServeError):
                    break
            self.held = [s for s in self.held if _still_open(s)]
            while len(self.held) < 64:  # then idle control connections, as many as it takes
                try:
                    self.held.append(protocol.connect("127.0.0.1", SERVE_PORTS[0], "127.0.0.2", True, 1.0))
                except OSError:
                    break

    def counts(self) -> tuple[int, int]:
        """(idle control connections, granted tests) serve still keeps open for the hog."""
        return sum(_still_open(s) for s in list(self.held)), sum(_still_open(s.sock) for s in list(self.sessions))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        for sock in [*self.held, *(s.sock for s in self.sessions)]:
            sock.close()


def _still_open(sock: socket.socket) -> bool:
    try:
        sock.setblocking(False)
        return sock.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False
    finally:
        with contextlib.suppress(OSError):
            sock.setblocking(True)


def serve_tests(token: str, count: int) -> tuple[list[float], list[str]]:
    """A runner's tests from 127.0.0.1, one after another: time from connect to the grant; each test then runs
    (iperf3 -R, 1 s, with the grant's user) and says done, as the runner does."""
    from ccscope.serve import protocol

    latencies, errors = [], []
    for _ in range(count):
        started = time.monotonic()
        try:
            sock = protocol.connect("127.0.0.1", SERVE_PORTS[0], "127.0.0.1", True, 5.0)
            session = protocol.Session(sock, protocol.greeting(sock), token)
            grant = session.start_test("cubic", 5, True)
        except (OSError, protocol.ServeError) as exc:
            errors.append(str(exc)[:60])
            continue
        latencies.append(time.monotonic() - started)
        with tempfile.NamedTemporaryFile("w", suffix=".pem") as key:
            key.write(grant.credentials.public_key)
            key.flush()
            subprocess.run(["iperf3", "-c", "127.0.0.1", "-p", str(grant.port), "-t", "1", "-R", "-b", "20M",
                            "--username", grant.credentials.username, "--rsa-public-key-path", key.name],
                           capture_output=True, timeout=30,
                           env={**os.environ, "IPERF3_PASSWORD": grant.credentials.password})
        with contextlib.suppress(OSError, protocol.ServeError):
            session.finish(timeout=15)
        session.close()
    return latencies, errors


def measure_serve(workdir: Path) -> Row:
    """`ccscope serve` while one address holds every idle connection and test it can; the baseline: the same
    tests before the hog."""
    token_file = workdir / "serve-token"
    log = workdir / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([sys.executable, "-m", "ccscope.cli", "serve", "--listen", "127.0.0.1", "--ports",
                                 f"{SERVE_PORTS[0]}-{SERVE_PORTS[1]}", "--token-file", str(token_file)],
                                stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 30
        while "listening on" not in log.read_text():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"ccscope serve did not start: {log.read_text()[-300:]}")
            time.sleep(0.1)
        token = token_file.read_text().strip()
        alone, _ = serve_tests(token, SERVE_TESTS)
        hog = ServeHog(token)
        try:
            time.sleep(2.0)
            latencies, errors = serve_tests(token, SERVE_TESTS)
            held, tests = hog.counts()
        finally:
            hog.close()
    finally:
        proc.terminate()
        proc.wait(timeout=15)
    p99 = percentile(latencies, 0.99) if latencies else float("inf")
    detail = (f"{len(latencies)} of {SERVE_TESTS} tests granted during the hog, {len(errors)} refused"
              + (f" ({', '.join(sorted(set(errors)))})" if errors else "")
              + f"; the hog held {held} idle control connections and {tests} granted tests from 127.0.0.2"
              f"; grant latency alone p50 {percentile(alone, 0.5) * 1000:.0f} ms, under the hog p50 "
              f"{percentile(latencies, 0.5) * 1000:.0f} ms" if latencies and alone else "")
    return Row("ccscope serve: a runner's tests granted while one address holds every idle connection and test "
               "it can", f"{len(latencies)}/{SERVE_TESTS}", f"{SERVE_TESTS}/{SERVE_TESTS}, p99 {p99 * 1000:.0f} ms",
               len(latencies) == SERVE_TESTS, detail)


@contextlib.contextmanager
def _scrapers(case: Case, port: int, cafile: str | None, count: int):
    """A callable for one burst of `count` scrapes: (latencies, failures[, client CPU seconds])."""
    if not case.keepalive:
        yield lambda: burst(port, cafile, count)
        return
    with KeepAliveScrapers(port, cafile, count) as scrapers:
        yield scrapers.burst


def render(rows: list[Row], note: str) -> str:
    lines = ["# ccscope metrics endpoint: benchmark", "", f"Conditions: {note}", "",
             "| measure | result | target | status |", "|---|---|---|---|"]
    lines += [f"| {r.what} | {r.value} | {r.target} | {'met' if r.ok else 'MISSED'} |" for r in rows]
    lines += ["", "## Details", "", *(f"- **{r.what}**: {r.detail}" for r in rows)]
    return "\n".join(lines) + "\n"


def _show(row: Row) -> None:
    print(f"{row.what:<110} {row.value:>8}  {'met' if row.ok else 'MISSED'}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 bursts instead of 20")
    parser.add_argument("--no-write", action="store_true", help="print only, do not write the results file")
    parser.add_argument("--note", default="", help="extra words about the conditions, for the results file")
    parser.add_argument("--flood-only", action="store_true",
                        help="only the hostile probe's attack (prints, does not write the results file)")
    parser.add_argument("--serve-only", action="store_true",
                        help="only `ccscope serve` under the hog (prints, does not write the results file)")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/endpoint.py: needs root (the daemon loads BPF programs)", file=sys.stderr)
        return 3
    bursts = 5 if args.quick else 20
    rows = []
    with tempfile.TemporaryDirectory(prefix="ccscope-bench-") as tmp:
        for case in [] if args.flood_only or args.serve_only else CASES:
            rows.append(measure(case, bursts, Path(tmp)))
            _show(rows[-1])
        if not args.serve_only:
            rows.append(measure_flood())
            _show(rows[-1])
        if not args.flood_only:
            rows.append(measure_serve(Path(tmp)))
            _show(rows[-1])
    note = conditions() + (f"; {args.note}" if args.note else "")
    report = render(rows, note)
    print("\n" + report)
    if not (args.no_write or args.flood_only or args.serve_only):
        RESULTS.write_text(report)
        print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
