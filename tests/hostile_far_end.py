"""A far end that speaks `ccscope serve`'s protocol with bad values (after the serve probe's fake_serve.py and
fake_second.py), for tests/test_far_end_hostile.py.

    python tests/hostile_far_end.py PORT MODE

Greeting modes (answered to the HELLO): bad-ports, ports-int, bad-maxsec, old-version, silent, http.
Test-reply modes (answered to {"op": "test"}): no-port, port-string, port-outside.
Telemetry modes (answered to {"op": "done"}, after a real `iperf3 -s -1` ran the test on PORT + 1):
bad-now, str-samples, nan-srtt, huge-srtt, huge-reply, second-huge (run 1 good, the rest 1e308).
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time

HELLO_SIZE = 37
OPEN = {"ccscope_serve": 2, "auth": "open", "nonce": "0" * 32}  # serve --open's, as far as it goes
GREETINGS = {
    "bad-ports": {**OPEN, "ports": "ab", "max_seconds": 120, "telemetry": True},
    "ports-int": {**OPEN, "ports": 5, "max_seconds": 120, "telemetry": True},
    "bad-maxsec": {**OPEN, "ports": [5201, 5216], "max_seconds": "x", "telemetry": True},
    "old-version": {**OPEN, "ccscope_serve": 0, "ports": [5201, 5216], "max_seconds": 120, "telemetry": True},
}
TEST_REPLIES = {"no-port": {"ok": True}, "port-string": {"ok": True, "port": "http"},
                "port-outside": {"ok": True, "port": 22}}


def line(message: dict) -> bytes:
    return json.dumps(message).encode() + b"\n"


def read_line(conn: socket.socket) -> bytes:
    buf = b""
    while b"\n" not in buf:
        part = conn.recv(4096)
        if not part:
            raise ConnectionError("closed")
        buf += part
    return buf


def rows(now: float, srtt: float | str, count: int = 100) -> list[list]:
    """A second of 10 ms samples that ended half a second before the answer: inside the run."""
    return [[now - 1.5 + k * 0.01, 10 + k % 7, srtt, 0, 1448 * k, 1448 * k, None, 0.001, 5, 1e6, "open", "cubic", 1,
             1448, k, 0] for k in range(count)]


class FarEnd:
    def __init__(self, port: int, mode: str) -> None:
        self.port, self.mode = port, mode
        self.tests = 0
        self.lock = threading.Lock()

    def handle(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(60)
            hello = b""
            while len(hello) < HELLO_SIZE:
                part = conn.recv(HELLO_SIZE - len(hello))
                if not part:
                    return
                hello += part
            if self.mode == "silent":
                time.sleep(30)
                return
            if self.mode == "http":
                conn.sendall(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n")
                return
            if self.mode in GREETINGS:
                conn.sendall(line(GREETINGS[self.mode]))
                time.sleep(5)
                return
            conn.sendall(line({**OPEN, "ports": [self.port, self.port + 15], "max_seconds": 120, "telemetry": True}))
            read_line(conn)
            if self.mode in TEST_REPLIES:
                conn.sendall(line(TEST_REPLIES[self.mode]))
                time.sleep(10)
                return
            self.test(conn)

    def test(self, conn: socket.socket) -> None:
        server = subprocess.Popen(["iperf3", "-s", "-1", "-J", "-p", str(self.port + 1)], stdout=subprocess.PIPE,
                                  stderr=subprocess.DEVNULL, text=True)
        deadline = time.monotonic() + 5
        while f":{self.port + 1} " not in subprocess.run(["ss", "-Hltn"], capture_output=True, text=True).stdout:
            assert time.monotonic() < deadline, "iperf3 did not start"
            time.sleep(0.02)
        conn.sendall(line({"ok": True, "port": self.port + 1}))
        read_line(conn)
        report = server.communicate(timeout=60)[0]
        remote_ports = [s["remote_port"] for s in json.loads(report)["start"]["connected"]]
        with self.lock:
            self.tests += 1
            first = self.tests == 1
        conn.sendall(self.telemetry(remote_ports, first))

    def telemetry(self, remote_ports: list[int], first: bool) -> bytes:
        now = time.clock_gettime(time.CLOCK_MONOTONIC)
        if self.mode == "huge-reply":
            return b'{"ok":true,"now":1.0,"flows":[' + b'{"samples":[]},' * (5 << 20) + b"{}]}\n"
        srtt: float | str = {"nan-srtt": float("nan"), "huge-srtt": 1e308, "str-samples": "t",
                             "second-huge": 0.001 if first else 1e308}.get(self.mode, 0.001)
        flows = [{"src": "127.0.0.1", "sport": self.port + 1, "dst": "127.0.0.1", "dport": p, "cc": "cubic",
                  "samples": rows(now, srtt)} for p in remote_ports]
        return line({"ok": True, "now": "x" if self.mode == "bad-now" else now, "flows": flows})


def main() -> None:
    port, mode = int(sys.argv[1]), sys.argv[2]
    far_end = FarEnd(port, mode)
    listener = socket.create_server(("127.0.0.1", port))
    while True:
        conn, _ = listener.accept()
        threading.Thread(target=far_end.handle, args=(conn,), daemon=True).start()


if __name__ == "__main__":
    main()
