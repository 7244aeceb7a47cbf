#!/usr/bin/env python3
"""Benchmark of the daemon's metrics endpoint: scrape latency with 50 concurrent scrapers, over HTTP and TLS.

    sudo .venv/bin/python bench/endpoint.py [--quick] [--no-write] [--note TEXT]

A real `ccscope daemon` (default flags: --flows top:50), scraped by 50 scrapers at once (curl --parallel)
in bursts, each scrape on a fresh connection (for TLS: a full handshake each time, the worst case; Prometheus keeps its
connections alive). The baseline is one scraper alone, measured in the same run. A third case keeps
20 idle and 10 slowloris connections open during the bursts. Writes bench/results/endpoint.md.

curl gives up on a scrape after 10 s (Prometheus's default scrape_timeout); that counts as a failure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from nethelpers import ROOT, daemon
from telemetry import Row, conditions

RESULTS = ROOT / "bench" / "results" / "endpoint.md"
SCRAPERS = 50
TARGET_P99_S = 0.100
BURST_EVERY_S = 1.0


def self_signed(workdir: Path) -> tuple[Path, Path]:
    cert, key = workdir / "cert.pem", workdir / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
                    "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True)
    return cert, key


def burst(port: int, cafile: str | None, scrapers: int) -> tuple[list[float], list[str]]:
    """`scrapers` GETs at once, each on its own new connection: one curl process with --parallel, so the
    client side costs little next to the server (Python scraper threads would measure their own GIL)."""
    scheme = "https" if cafile else "http"
    cmd = ["curl", "-sS", "--no-progress-meter", "--parallel", "--parallel-immediate", "--parallel-max",
           str(scrapers), "--compressed", "--max-time", "10", "-w", "%{http_code} %{time_total}\n",
           *(("--cacert", cafile) if cafile else ())]
    for _ in range(scrapers):
        cmd += ["-o", "/dev/null", f"{scheme}://127.0.0.1:{port}/metrics"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    latencies, errors = [], []
    for line in out.stdout.splitlines():
        code, seconds = line.split()
        if code == "200":
            latencies.append(float(seconds))
        else:
            errors.append(f"HTTP {code}")
    missing = scrapers - len(latencies) - len(errors)  # curl itself failed before reporting these
    errors += [out.stderr.strip().splitlines()[0] if out.stderr.strip() else "curl failed"] * max(0, missing)
    return latencies, errors


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


def measure(tls: bool, bursts: int, hostile: bool, workdir: Path) -> Row:
    cafile, args = None, []
    if tls:
        cert, key = self_signed(workdir)
        cafile, args = str(cert), ["--tls-cert", str(cert), "--tls-key", str(key)]
    latencies: list[float] = []
    errors: list[str] = []
    with daemon(*args) as running:
        baseline = [x for _ in range(max(10, bursts)) for x in burst(running.port, cafile, 1)[0]]
        with hostile_clients(running.port) if hostile else contextlib.nullcontext():
            for _ in range(bursts):
                started = time.monotonic()
                got, failed = burst(running.port, cafile, SCRAPERS)
                latencies += got
                errors += failed
                time.sleep(max(0.0, BURST_EVERY_S - (time.monotonic() - started)))
    p99 = percentile(latencies, 0.99) if latencies else float("inf")
    base = percentile(baseline, 0.5)
    what = (f"p99 scrape latency, {SCRAPERS} concurrent scrapers, {'TLS' if tls else 'HTTP'}"
            + (", with 20 idle + 10 slowloris connections" if hostile else ""))
    detail = (f"{len(latencies)} scrapes in {bursts} bursts, {len(errors)} failed"
              + (f" ({errors[0]})" if errors else "")
              + f"; p50 {percentile(latencies, 0.5) * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms;"
              f" one scraper alone: p50 {base * 1000:.0f} ms, p99 {percentile(baseline, 0.99) * 1000:.0f} ms"
              f" (p99 under load / p50 alone = {p99 / base:.1f}x)")
    return Row(what, f"{p99 * 1000:.0f} ms", f"<= {TARGET_P99_S * 1000:.0f} ms, no failures",
               p99 <= TARGET_P99_S and not errors, detail)


def render(rows: list[Row], note: str) -> str:
    lines = ["# ccscope metrics endpoint: benchmark", "", f"Conditions: {note}", "",
             "| measure | result | target | status |", "|---|---|---|---|"]
    lines += [f"| {r.what} | {r.value} | {r.target} | {'met' if r.ok else 'MISSED'} |" for r in rows]
    lines += ["", "## Details", "", *(f"- **{r.what}**: {r.detail}" for r in rows)]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="5 bursts instead of 20")
    parser.add_argument("--no-write", action="store_true", help="print only, do not write the results file")
    parser.add_argument("--note", default="", help="extra words about the conditions, for the results file")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench/endpoint.py: needs root (the daemon loads BPF programs)", file=sys.stderr)
        return 3
    bursts = 5 if args.quick else 20
    rows = []
    with tempfile.TemporaryDirectory(prefix="ccscope-bench-") as tmp:
        for tls, hostile in ((False, False), (True, False), (False, True), (True, True)):
            row = measure(tls, bursts, hostile, Path(tmp))
            rows.append(row)
            print(f"{row.what:<90} {row.value:>8}  {'met' if row.ok else 'MISSED'}", flush=True)
    note = conditions() + (f"; {args.note}" if args.note else "")
    report = render(rows, note)
    print("\n" + report)
    if not args.no_write:
        RESULTS.write_text(report)
        print(f"wrote {RESULTS.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
