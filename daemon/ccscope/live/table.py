"""The live page's flows table: the kernel map's flows, re-read as often as its cost allows, with the charted
flows' rows taken from their latest sample so that they stay current even when the map is read rarely."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from ccscope import bpf_types as bt
from ccscope.flows import FlowRecord, decode

from .rings import Rings

TABLE_INTERVAL_S = 1.0      # the flows table is re-read from the kernel map once a second,
TABLE_COST_FACTOR = 100     # or less often, so that reading it costs at most 1% of a core
CLOSED_ROW_S = 5.0          # a closed flow's row stays in the table this long (as the scenario's flow table)

TableSource = Callable[[], tuple[list[FlowRecord], int]]


class FlowTable:
    """`source()` gives the kernel map's flows (the shown ones, and how many matched)."""

    def __init__(self, source: TableSource | None, rings: Rings, lock: threading.Lock) -> None:
        self.source = source  # replace it with set_source() while the hub runs
        self.rows: dict = {}  # the last table sent to the pages
        self.sent_at = 0.0
        self.read_at = 0.0
        self._every = TABLE_INTERVAL_S
        self._reading = threading.Lock()  # held while source() reads the probe
        self._rings = rings
        self._lock = lock
        self._map_flows: list[FlowRecord] = []
        self._map_total = 0

    def due(self, now: float) -> bool:
        return now - self.sent_at >= TABLE_INTERVAL_S

    def set_source(self, source: TableSource | None) -> None:
        """Replaces the source; waits for a read in progress, so that after set_source(None) nothing reads the
        old source's probe and the probe may close (as FlowCollector.close() waits for a scrape)."""
        with self._reading:
            self.source = source

    def read(self, now: float) -> tuple[list[FlowRecord], int]:
        """The kernel map's flows, with the sampled flows' rows replaced by their latest sample."""
        if now - self.read_at >= self._every:
            with self._reading:
                source = self.source  # None once the probe is closing: the table keeps the sampled flows
                self._map_flows, self._map_total = source() if source else ([], 0)
            took = time.monotonic() - now
            self.read_at = now
            # reading every flow of a busy host (10k flows: ~0.1 s) must not become the daemon's main work
            self._every = max(TABLE_INTERVAL_S, took * TABLE_COST_FACTOR)
        with self._lock:
            latest = [r.latest for r in self._rings
                      if r.latest is not None and (r.closed is None or now - r.closed < CLOSED_ROW_S)]
        fresh = {f.cookie: f for f in (decode(bt.unpack_flow(raw) if isinstance(raw, bytes) else raw)
                                       for raw in latest)}
        flows = [fresh.pop(f.cookie, f) for f in self._map_flows]
        return flows + list(fresh.values()), self._map_total + len(fresh)
