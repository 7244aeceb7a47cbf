"""The change events of bpf/ccstate.bpf.c's ring: each a flow's whole state just after its algorithm's key
changed (BBR's mode; CUBIC's W_max, or its epoch starting or ending), decoded, with repeats dropped.

The kernel side also sends a flow's first copy, and a copy from a CPU whose gate had not met the flow yet
(its gates are per CPU); such a copy repeats the key before it and is no event."""

from __future__ import annotations

import ctypes
from collections import OrderedDict
from dataclasses import dataclass

from .decoders import AlgorithmState, decode
from .record import CcState

RECORD_BYTES = ctypes.sizeof(CcState)
MAX_FLOWS = 16384  # flows whose last key is remembered: the state map's size; the oldest is forgotten first


@dataclass(frozen=True)
class StateChange:
    cookie: int
    time_ns: int  # bpf_ktime_get_ns() of the copy (CLOCK_MONOTONIC)
    state: AlgorithmState
    periodic: bool = False  # a reading of the state between changes (the recorder's), not a change


class ChangeReader:
    """Ring records to StateChange events, each flow's repeats dropped."""

    def __init__(self, max_flows: int = MAX_FLOWS) -> None:
        self.max_flows = max_flows
        self._last: OrderedDict[int, object] = OrderedDict()

    def read(self, records: list[bytes]) -> list[StateChange]:
        events = []
        for record in records:
            if len(record) != RECORD_BYTES:  # not this ccscope's object
                continue
            raw = CcState.from_buffer_copy(record)
            state = decode(raw)
            if state is None:
                continue
            key = (type(state), state.change)
            if self._last.get(raw.cookie) == key:
                continue
            self._remember(raw.cookie, key)
            events.append(StateChange(raw.cookie, raw.updated_ns, state))
        return events

    def _remember(self, cookie: int, key: object) -> None:
        self._last[cookie] = key
        self._last.move_to_end(cookie)
        if len(self._last) > self.max_flows:
            self._last.popitem(last=False)
