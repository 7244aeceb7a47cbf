"""`ccscope trace`'s lines of state changes (changes.py), beside its samples: only for the flows the trace
shows (it has met them in its samples), each named as its samples name it.

JSON: {"time", "cookie", "flow", "event": "state_change", "state": the decoder's as_dict()}; text: the time,
the flow and the decoder's `ss`-like summary."""

from __future__ import annotations

import time
from collections import OrderedDict

import orjson

from .changes import ChangeReader, StateChange

MAX_FLOWS = 16384  # flows the trace remembers the names of; the oldest is forgotten first
MAX_WAITING = 4096  # changes of flows not met yet, kept for the next poll (its first sample may come after)


class TracedFlows:
    """The flows a trace has shown, and their state changes as lines."""

    def __init__(self) -> None:
        self._names: OrderedDict[int, str] = OrderedDict()
        self._reader = ChangeReader()
        self._waiting: list[StateChange] = []

    def knows(self, cookie: int) -> bool:
        """Whether the trace has shown a sample of this flow."""
        return cookie in self._names

    def saw(self, cookie: int, name: str) -> None:
        """A sample this trace shows, of the flow named `name` (FlowRecord.name)."""
        if cookie not in self._names:
            self._names[cookie] = name
            if len(self._names) > MAX_FLOWS:
                self._names.popitem(last=False)

    def state_lines(self, records: list[bytes], wall_offset: float, as_json: bool) -> list[bytes]:
        """The lines of the changes in `records` and of those waiting from the poll before; a change of a flow
        still not met after one more poll is of a flow the trace does not show (or that sent no sample)."""
        waited, self._waiting = self._waiting, []
        lines = [_line(change, self._names[change.cookie], wall_offset, as_json)
                 for change in waited if change.cookie in self._names]
        for change in self._reader.read(records):
            if change.cookie in self._names:
                lines.append(_line(change, self._names[change.cookie], wall_offset, as_json))
            elif len(self._waiting) < MAX_WAITING:
                self._waiting.append(change)
        return lines


def _line(change: StateChange, name: str, wall_offset: float, as_json: bool) -> bytes:
    wall = change.time_ns / 1e9 + wall_offset
    if as_json:
        return orjson.dumps({"time": round(wall, 6), "cookie": change.cookie, "flow": name, "event": "state_change",
                             "state": change.state.as_dict()})
    return (f"{time.strftime('%H:%M:%S', time.localtime(wall))}.{int(wall % 1 * 1e3):03d} {name} "
            f"{change.state.summary()}").encode()
