"""The daemon's consumer of BPF samples for the live page: the hub subscribes to the session's raw samples.

The daemon itself needs no samples (it reads the flow map at scrape time), so the kernel emits them only
while at least one page is open: with no page the live view costs nothing.
"""

from __future__ import annotations

import threading

from ccscope.telemetry.session import Session

from .hub import Hub

POLL_MS = 100  # the session's poll while a page may be open


class SampleFeed:
    def __init__(self, session: Session, hub: Hub, sample_interval_ns: int) -> None:
        self._probe = session.probe
        self._interval_ns = sample_interval_ns
        self._lock = threading.Lock()
        session.on_samples(hub.on_records, raw=True)

    def clients_changed(self, count: int) -> None:
        with self._lock:
            self._probe.set_config(self._interval_ns, emit_samples=count > 0)
