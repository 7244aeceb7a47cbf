"""The daemon's consumer of BPF samples for the live page.

The daemon itself needs no samples (it reads the flow map at scrape time), so the kernel emits them only
while at least one page is open: with no page the live view costs nothing.
"""

from __future__ import annotations

import threading

from .hub import Hub

POLL_MS = 100


class SampleFeed:
    def __init__(self, probe, hub: Hub, sample_interval_ns: int) -> None:
        self._probe = probe
        self._interval_ns = sample_interval_ns
        self._lock = threading.Lock()
        self._ring = probe.ring_buffer(hub.on_records, raw=True)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, name="ccscope-live-feed", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            self._ring.poll(POLL_MS)

    def clients_changed(self, count: int) -> None:
        with self._lock:
            self._probe.set_config(self._interval_ns, emit_samples=count > 0)

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._ring.close()
