"""Short downloads with a time limit: a tiny server (sender namespace) and client (receiver namespace).

The server sends the number of bytes the client asks for on a fresh TCP connection with the requested
congestion control, then closes. The client measures completion time from connect() to the last byte
(handshake and request included, like a page fetch) and gives up at the time limit, reporting the
transfer as incomplete with the bytes it got. One JSON object per download on stdout; times are
CLOCK_MONOTONIC seconds, the clock of the BPF samples.

    python -m ccscope.scenario.fetch serve --port 5300 --cc cubic
    python -m ccscope.scenario.fetch get --server 192.0.2.2:5300 --sizes 1000,100000 --timeout 10 \
        [--every 2 --start 3 --until 20]
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
import threading
import time
from dataclasses import dataclass

CHUNK = b"\xa5" * 65536


def _now() -> float:
    return time.clock_gettime(time.CLOCK_MONOTONIC)


@dataclass(frozen=True)
class Limits:
    """What one server gives: bytes per download, downloads at once, and how long it lives (None: no bound,
    as in an emulated run, where the testbed owns it; `ccscope serve` sets all three)."""

    max_bytes: int | None = None
    max_connections: int | None = None
    lifetime_s: float | None = None


def serve(port: int, cc: str, bind: str = "0.0.0.0", limits: Limits | None = None) -> None:
    limits = limits or Limits()
    family = socket.AF_INET6 if ":" in bind else socket.AF_INET
    listener = socket.create_server((bind, port), family=family, backlog=64, reuse_port=False)
    slots = threading.BoundedSemaphore(limits.max_connections) if limits.max_connections else None
    end = None if limits.lifetime_s is None else _now() + limits.lifetime_s
    while end is None or _now() < end:
        listener.settimeout(None if end is None else max(0.01, end - _now()))
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            break
        if slots is not None and not slots.acquire(blocking=False):
            conn.close()  # the limit: shed, never queue
            continue
        threading.Thread(target=_send, args=(conn, cc, limits.max_bytes, slots), daemon=True).start()


def _send(conn: socket.socket, cc: str, max_bytes: int | None = None,
          slots: threading.BoundedSemaphore | None = None) -> None:
    with conn:
        try:
            conn.settimeout(30)
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, cc.encode())
            request = b""
            while not request.endswith(b"\n") and len(request) < 64:
                part = conn.recv(64)
                if not part:
                    return
                request += part
            size = int(request.strip())
            if size < 0 or (max_bytes is not None and size > max_bytes):
                return
            remaining = size
            while remaining > 0:
                sent = conn.send(CHUNK[: min(len(CHUNK), remaining)])
                remaining -= sent
            conn.shutdown(socket.SHUT_WR)
            conn.recv(1)  # wait for the client's close so the flow ends cleanly
        except (OSError, ValueError):
            return
        finally:
            if slots is not None:
                slots.release()


def fetch(server: tuple[str, int], size: int, timeout: float) -> dict:
    started = _now()
    deadline = started + timeout
    record = {"size_bytes": size, "start": started, "end": None, "received_bytes": 0, "complete": False,
              "completion_time_s": None, "local_port": None, "error": None}
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(server)
        record["local_port"] = sock.getsockname()[1]
        sock.sendall(f"{size}\n".encode())
        while record["received_bytes"] < size:
            left = deadline - _now()
            if left <= 0:
                raise TimeoutError
            sock.settimeout(left)
            data = sock.recv(1 << 18)
            if not data:
                break
            record["received_bytes"] += len(data)
        if record["received_bytes"] >= size:
            record["complete"] = True
            record["end"] = _now()
            record["completion_time_s"] = record["end"] - started
        else:
            record["error"] = "connection closed early"
    except TimeoutError:
        record["error"] = f"time limit {timeout:g} s reached"
    except OSError as exc:
        record["error"] = exc.strerror or str(exc)
    finally:
        sock.close()
    if record["end"] is None:
        record["end"] = _now()
    return record


def get(server: tuple[str, int], sizes: list[int], timeout: float, every: float | None, start: float,
        until: float | None) -> None:
    t0 = _now()
    lock = threading.Lock()

    def one(size: int) -> None:
        record = fetch(server, size, timeout)
        with lock:
            print(json.dumps(record), flush=True)

    if every is None:
        time.sleep(start)
        for size in sizes:
            one(size)
        return
    threads = []
    k = 0
    while True:
        at = t0 + start + k * every
        if until is not None and at - t0 >= until:
            break
        time.sleep(max(0.0, at - _now()))
        thread = threading.Thread(target=one, args=(sizes[k % len(sizes)],))
        thread.start()
        threads.append(thread)
        k += 1
    for thread in threads:
        thread.join()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ccscope-fetch")
    sub = parser.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--cc", required=True)
    s.add_argument("--bind", default="0.0.0.0")
    s.add_argument("--max-bytes", type=int)
    s.add_argument("--max-connections", type=int)
    s.add_argument("--lifetime", type=float)
    g = sub.add_parser("get")
    g.add_argument("--server", required=True)
    g.add_argument("--sizes", required=True)
    g.add_argument("--timeout", type=float, required=True)
    g.add_argument("--every", type=float)
    g.add_argument("--start", type=float, default=0.0)
    g.add_argument("--until", type=float)
    args = parser.parse_args(argv)
    if args.cmd == "serve":
        serve(args.port, args.cc, args.bind, Limits(args.max_bytes, args.max_connections, args.lifetime))
        return 0
    host, _, port = args.server.rpartition(":")
    get((host, int(port)), [int(s) for s in args.sizes.split(",")], args.timeout, args.every, args.start,
        args.until)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
