"""serve's BPF telemetry of its tests: the samples of the flows on each test's port to the address that asked
for the test, and nobody else's.

Memory is bounded per test: at most MAX_SAMPLES_PER_TEST samples (the first ones; beyond, a test's series
is cut, and its reply says how many were left out), each kept as its JSON row (orjson, about 130 bytes), so
a test holds at most about 13 MB and serve's --max-tests of them at most 4 x 13 MB (measured in
tests/test_serve_hostile.py).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from dataclasses import dataclass, field

import orjson

from ccscope.errors import CcscopeError

MAX_SAMPLES_PER_TEST = 100_000  # 10 ms samples of one flow for 1000 s; --max-seconds is at most 3600
POLL_MS = 50
DRAIN_S = 0.2  # what the session's poll (every POLL_MS) still finds in the ring when a test ends


@dataclass
class _Flow:
    src: str
    sport: int
    dst: str
    dport: int
    cc: str = "unknown"
    rows: list[bytes] = field(default_factory=list)


@dataclass
class _Watch:
    requester: str
    flows: dict[int, _Flow] = field(default_factory=dict)  # cookie -> flow
    samples: int = 0
    left_out: int = 0


class Telemetry:
    """The BPF probe's samples of the flows on watched local ports (this namespace only)."""

    def __init__(self, sample_interval_s: float) -> None:
        from ccscope.flows import decode
        from ccscope.loader import ProbeOptions, preflight
        from ccscope.sample import ROW_FIELDS, Sample
        from ccscope.telemetry.session import Session

        preflight()
        self._decode, self._sample, self._fields = decode, Sample, list(ROW_FIELDS)
        self._netns = os.stat("/proc/self/ns/net").st_ino
        self._lock = threading.Lock()
        self._watched: dict[int, _Watch] = {}  # local port -> the test's flows
        self._session = Session(ProbeOptions(emit_samples=True, sample_interval_ns=int(sample_interval_s * 1e9)),
                                state=False)
        try:
            self._session.on_samples(self._on_samples)
        except CcscopeError:
            self._session.close()
            raise
        self._session.start(POLL_MS)

    def _on_samples(self, raws: list) -> None:
        for raw in raws:
            if raw.netns != self._netns or raw.sport not in self._watched:
                continue
            f = self._decode(raw)
            with self._lock:
                watch = self._watched.get(f.sport)
                if watch is None or f.dst.removeprefix("::ffff:") != watch.requester:
                    continue
                if watch.samples >= MAX_SAMPLES_PER_TEST:
                    watch.left_out += 1
                    continue
                flow = watch.flows.setdefault(f.cookie, _Flow(f.src, f.sport, f.dst, f.dport))
                sample = self._sample.of(f)
                if sample.cc and sample.cc != "unknown":
                    flow.cc = sample.cc
                flow.rows.append(orjson.dumps(dataclasses.astuple(sample)))
                watch.samples += 1

    def watch(self, port: int, requester: str) -> None:
        with self._lock:
            self._watched[port] = _Watch(requester.removeprefix("::ffff:"))

    def reply(self, port: int) -> bytes:
        """The `done` answer for the test on `port` (one JSON line); stops watching it."""
        time.sleep(DRAIN_S)
        with self._lock:
            watch = self._watched.pop(port, None) or _Watch("")
        flows = [orjson.dumps({"src": f.src, "sport": f.sport, "dst": f.dst, "dport": f.dport, "cc": f.cc})[:-1]
                 + b',"samples":[' + b",".join(f.rows) + b"]}" for f in watch.flows.values()]
        head = orjson.dumps({"ok": True, "now": time.clock_gettime(time.CLOCK_MONOTONIC),
                             "samples_left_out": watch.left_out, "fields": self._fields})[:-1]
        return head + b',"flows":[' + b",".join(flows) + b"]}\n"

    def forget(self, port: int) -> None:
        with self._lock:
            self._watched.pop(port, None)

    def close(self) -> None:
        self._session.close()


def empty_reply() -> bytes:
    """The `done` answer of a serve without telemetry."""
    return orjson.dumps({"ok": True, "now": time.clock_gettime(time.CLOCK_MONOTONIC), "flows": []}) + b"\n"
