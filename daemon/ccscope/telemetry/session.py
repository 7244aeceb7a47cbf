"""One open telemetry: the BPF probe, each algorithm's state beside it where this kernel loads it, the flow
table, and one poll of the probe's sample ring (and of the state's change ring) for every consumer.

The daemon, `ccscope flows`, `ccscope trace`, a scenario's runs and `ccscope serve` each open one Session. Their
consumers (the live page's feed, the scenario's recorder, serve's per-test series, trace's lines) subscribe to
it; none opens or polls a ring of its own.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from ccscope import bpf_types as bt
from ccscope.ccstate.probe import StateProbe, optional_state
from ccscope.flows import FlowTable
from ccscope.loader import ProbeOptions, TelemetryProbe

SampleHandler = Callable[[list], None]


class Session:
    """Open while the block runs: `probe`, `state` (None where the kernel has no state program, after one line
    that says why, or when not asked for) and `table`; samples and state changes reach the subscribers once per
    poll, from the caller's poll() or from the session's own thread (start())."""

    def __init__(self, options: ProbeOptions, *, grace_s: float = 5.0, state: bool = True,
                 state_where: str = "") -> None:
        """`state_where`: what goes without the state if it cannot load, for its warning (" in the results")."""
        self._open = contextlib.ExitStack()
        try:
            self.probe: TelemetryProbe = self._open.enter_context(TelemetryProbe(options))
            self.state: StateProbe | None = self._open.enter_context(
                optional_state(options.max_flows, options.sample_interval_ns, self.probe.libbpf, state_where)
            ) if state else None
        except BaseException:
            self._open.close()
            raise
        self.table = FlowTable(self.probe, grace_s=grace_s)
        self._unpacked: tuple[SampleHandler, ...] = ()  # replaced, never changed in place: the poll reads it bare
        self._raw: tuple[SampleHandler, ...] = ()
        self._changed: tuple[Callable[[list[bytes]], None], ...] = ()
        self._samples = self._changes = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def on_samples(self, handler: SampleHandler, raw: bool = False) -> None:
        """`handler` gets each poll's samples as bt.FlowTuple's (unpacked once for all such handlers), or with
        raw=True as the records' bytes (for consumers that skip most samples before unpacking them)."""
        if raw:
            self._raw = (*self._raw, handler)
        else:
            self._unpacked = (*self._unpacked, handler)
        if self._samples is None:
            self._samples = self.probe.ring_buffer(self._deliver, raw=True)

    def on_changes(self, handler: Callable[[list[bytes]], None]) -> None:
        """`handler` gets each poll's records of changed algorithm state (ccstate/changes.py reads them); none
        come without the state program."""
        if self.state is None:
            return
        self._changed = (*self._changed, handler)
        if self._changes is None:
            self._changes = self.state.changes(self._deliver_changes)

    def poll(self, timeout_ms: int) -> None:
        """Waits up to timeout_ms for samples and hands them out, then the changes already there (a change may
        wait one poll for its flow's first sample, never the other way round)."""
        if self._samples is not None:
            self._samples.poll(timeout_ms)
        else:
            self._stop.wait(timeout_ms / 1000)
        if self._changes is not None:
            self._changes.poll(0)

    def start(self, poll_ms: int = 50) -> None:
        """Polls from now until close() in a thread of its own; the handlers run in that thread."""
        def run() -> None:
            while not self._stop.is_set():
                self.poll(poll_ms)

        self._thread = threading.Thread(target=run, name="ccscope-telemetry", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        for ring in (self._samples, self._changes):
            if ring is not None:
                ring.close()
        self._samples = self._changes = None
        self._open.close()

    def _deliver(self, records: list[bytes]) -> None:
        for handler in self._raw:
            handler(records)
        if self._unpacked:
            flows = bt.unpack_flows(records)
            for handler in self._unpacked:
                handler(flows)

    def _deliver_changes(self, records: list[bytes]) -> None:
        for handler in self._changed:
            handler(records)
