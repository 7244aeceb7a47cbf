"""The bottleneck's own byte counter during a run: what left the router towards the receiver, read from
the router namespace's /proc net/dev every INTERVAL_S, so goodput can be checked against the link over
the same window (a payload byte count above the wire's is a measurement fault, never a fast algorithm)."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Sequence

from ccscope.emulation.netns import open_in

from .analysis import interpolate

INTERVAL_S = 0.05  # a read costs ~0.1 ms; 20 per second times the window's ends within 1/20 s
MAX_SAMPLES = 20 * 3600  # an hour of samples (the longest run the spec allows is far shorter)
UP_EGRESS = "veth-rr"  # the router's interface towards the receiver (emulation/testbed.py)


def tx_bytes(text: str, dev: str) -> int | None:
    """tx_bytes of `dev` in a /proc net/dev text."""
    for line in text.splitlines():
        name, sep, counters = line.partition(":")
        if sep and name.strip() == dev:
            return int(counters.split()[8])
    return None


class LinkMeter:
    """Samples (CLOCK_MONOTONIC s, tx bytes) of the up egress in a thread until stop()."""

    def __init__(self, router_ns: str, dev: str = UP_EGRESS) -> None:
        self._fd = open_in(router_ns, "/proc/thread-self/net/dev")
        self._dev = dev
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._read()
        self._thread = threading.Thread(target=self._loop, name="linkmeter", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        value = tx_bytes(os.pread(self._fd, 1 << 16, 0).decode(errors="replace"), self._dev)
        if value is not None and len(self.samples) < MAX_SAMPLES:
            self.samples.append((time.clock_gettime(time.CLOCK_MONOTONIC), value))

    def _loop(self) -> None:
        while not self._stop.wait(INTERVAL_S):
            self._read()

    def stop(self) -> list[tuple[float, int]]:
        if not self._stop.is_set():
            self._stop.set()
            self._thread.join()
            self._read()
            os.close(self._fd)
        return self.samples


def bytes_between(samples: Sequence[tuple[float, int]], start: float, end: float) -> float | None:
    """Counter increase over [start, end], linearly interpolated; None unless the samples cover it."""
    if len(samples) < 2 or start < samples[0][0] or end > samples[-1][0]:
        return None
    times = [t for t, _ in samples]
    values = [v for _, v in samples]
    return interpolate(times, values, end) - interpolate(times, values, start)
