"""The live page's hub: samples in (any thread), messages out to every open page (one broadcaster thread).

The BPF ring-buffer consumer hands every sample to the flows' rings (rings.py), which decimate and keep them.
PUSH_HZ times a second the broadcaster batches the rings' new points into one message for all clients
(clients.py, bounded drop-oldest queues), and once a second it sends the flows table (table.py). A scenario's
plan, progress and finished runs (scenario_view.py) go out as they happen. A page that (re)connects gets it all
in its `hello`. Algorithm names follow naming.py.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable

from ccscope.flows import FlowFilter, FlowRecord

from .clients import Client, Clients, event
from .naming import CcNames, CcNaming
from .rings import (
    BLOAT_FOR_S,
    BLOAT_QUEUEING_DELAY_S,
    BLOAT_RTT_RATIO,
    POINT_LAYOUT,
    RING_POINTS,
    Rings,
    StateReader,
)
from .scenario_view import ScenarioView
from .table import FlowTable, TableSource

PUSH_HZ = 10                # batched pushes per second per client (>= 5 updates/s on the page)


class Hub:
    """The rings, the clients, the table, the scenario and the names, and the thread that pushes to the pages."""

    def __init__(self, *, flow_filter: FlowFilter | None = None, table_source: TableSource | None = None,
                 table_rows: Callable[[tuple[list[FlowRecord], int]], dict] | None = None,
                 on_clients: Callable[[int], None] | None = None, mode: str = "daemon",
                 cc_names: CcNames | None = None) -> None:
        """table_source() gives the kernel map's flows for the table (the shown ones, and how many matched);
        table_rows() makes the table's JSON of them; cc_names() how to name algorithms (naming.py)."""
        self.mode = mode
        self.on_clients = on_clients
        self._lock = threading.Lock()
        self.naming = CcNaming(cc_names)
        self.rings = Rings(flow_filter or FlowFilter(), self._lock, self.naming.of)
        self.clients = Clients(self._lock)
        self.table = FlowTable(table_source, self.rings, self._lock)
        self._table_rows = table_rows or (lambda flows: {})
        self.scenario = ScenarioView(self.rings, self.naming, self._lock, self.clients.send_all)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._broadcast_loop, name="ccscope-live", daemon=True)
        self._thread.start()

    # --- input: samples, the page's own listener, the scenario, names ------------------------------------

    def on_records(self, records: list[bytes]) -> None:
        """One poll's raw ring-buffer records (the daemon's feed)."""
        for data in records:
            self.rings.on_record(data)

    def on_sample(self, raw) -> None:
        """An unpacked sample (the scenario's recorder has unpacked it already)."""
        self.rings.on_sample(raw)

    def serving_on(self, port: int) -> None:
        self.rings.serving_on(port)

    def set_cc_names(self, names: dict[str, str]) -> None:
        """Kernel name -> the name the page shows; the flows, the table and the plan follow."""
        self.naming.set(names)
        self.scenario.renamed()

    def set_table_source(self, source: TableSource | None) -> None:
        self.table.set_source(source)

    def set_states(self, states: StateReader | None) -> None:
        """Where each flow's algorithm state is read for the points (the session's state probe); None: nowhere."""
        self.rings.states = states

    # --- clients ---------------------------------------------------------------------------------------

    def connect(self) -> Client:
        """A new page's client, its hello queued; TooManyClients past clients.MAX_CLIENTS."""
        self.naming.refresh(time.monotonic())  # the first page names the algorithms right from its hello
        client, count = self.clients.add(self._hello)
        if self.on_clients:
            self.on_clients(count)
        return client

    def disconnect(self, client: Client) -> None:
        count = self.clients.remove(client)
        if self.on_clients:
            self.on_clients(count)

    @property
    def client_count(self) -> int:
        return len(self.clients)

    def _hello(self) -> bytes:
        """Everything a page needs when it (re)connects: the rings, the table, the scenario so far."""
        flows = [{**r.refresh_info(self.naming.names), "points": f"[{','.join(r.points)}]"} for r in self.rings]
        body = json.dumps({"mode": self.mode, "push_hz": PUSH_HZ, "ring_points": RING_POINTS, "point": POINT_LAYOUT,
                           "flows": [{k: v for k, v in f.items() if k != "points"} for f in flows],
                           "table": self.table.rows, "scenario": self.scenario.state, "runs": list(self.scenario.runs),
                           "bloat": {"queueing_delay_s": BLOAT_QUEUEING_DELAY_S, "ratio": BLOAT_RTT_RATIO,
                                     "for_s": BLOAT_FOR_S}}, separators=(",", ":"))
        # the points are JSON text already: spliced in, not decoded and encoded again
        history = ",".join(f'"{f["id"]}":{f["points"]}' for f in flows)
        return f"event: hello\ndata: {body[:-1]},\"history\":{{{history}}}}}\n\n".encode()

    # --- broadcasting ----------------------------------------------------------------------------------

    def _broadcast_loop(self) -> None:
        period = 1.0 / PUSH_HZ
        next_at = time.monotonic()
        while not self._stop.wait(max(0.0, next_at - time.monotonic())):
            next_at += period
            if time.monotonic() > next_at + 1.0:  # fell behind (suspended, overloaded): do not catch up in a burst
                next_at = time.monotonic() + period
            if not len(self.clients):
                continue
            try:
                self.tick()
            except Exception as exc:  # e.g. a failed map read: the pages go on
                print(f"ccscope: live page: {type(exc).__name__}: {exc}", file=sys.stderr)

    def tick(self) -> None:
        now = time.monotonic()
        slow = self.table.due(now)
        if slow:
            self.naming.refresh(now)
        with self._lock:
            self.rings.expire(now)
            parts = []
            for ring in self.rings:
                new = ring.take_new()
                if new or (slow and ring.wall):
                    info = ""
                    if slow or not ring.sent_info:
                        info = f'"info":{json.dumps(ring.refresh_info(self.naming.names), separators=(",", ":"))},'
                    ring.sent_info = True
                    parts.append(f'"{ring.cookie}":{{{info}"points":[{",".join(new)}]}}')
        if parts:
            self.clients.send_all(f"event: points\ndata: {{{','.join(parts)}}}\n\n".encode())
        if slow:
            self.table.sent_at = now
            if self.table.source:
                self.table.rows = self._table_rows(self.naming.of_flows(self.table.read(now)))
                self.clients.send_all(event("table", self.table.rows))

    def close(self) -> None:
        """Stops the pushes and says `bye` to the pages (once; later calls do nothing); returns once no table read
        is in progress (also when the broadcaster is still busy after the join's timeout), so the caller may
        close the probe the table source reads. Close the hub before the HTTP server: the server lets streams
        write their last events and the bye before it shuts them down."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=2)
        self.table.set_source(None)
        self.clients.send_all(event("bye", {}))
