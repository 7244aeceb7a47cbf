"""One sample of a flow, as the scenario recorder and `ccscope serve` keep it: its time, and the quantities
telemetry/quantities.py marks as sampled, under FlowRecord's names; and the same from another host (serve's
telemetry reply), checked field by field before it is believed. Below both the scenario stack and serve, which
share it.

The class is made from the table when this module is imported: a quantity added there is a field here, in
serve's rows and in the scenario's CSV with no other edit.
"""

from __future__ import annotations

import dataclasses
import operator

from ccscope.flows import FlowRecord
from ccscope.telemetry import quantities
from ccscope.telemetry.quantities import number


def _of(cls, f: FlowRecord):
    return cls(f.last_ns / 1e9, *_record_values(f))


def _from_row(cls, row: object, shift_s: float = 0.0):
    """A sample another host sent (ccscope serve), every field typed and within what the kernel can hold, its
    time shifted onto this host's clock; ValueError naming the first field that is not."""
    if not isinstance(row, list) or len(row) != len(_ROW_CHECKS):
        raise ValueError(f"a sample of {len(row) if isinstance(row, list) else type(row).__name__} "
                         f"fields, not {len(_ROW_CHECKS)}")
    for (name, ok), value in zip(_ROW_CHECKS, row, strict=True):
        if not ok(value):
            text = repr(value)
            raise ValueError(f"{name} {text if len(text) <= 30 else text[:27] + '...'} is out of range")
    return cls(row[0] + shift_s, *row[1:])


_SAMPLED = quantities.sampled()
Sample = dataclasses.make_dataclass(
    "Sample", [("t", "float"), *((q.name, q.python_type) for q in _SAMPLED)], frozen=True, slots=True,
    namespace={"__doc__": "One sample of a flow: its time (CLOCK_MONOTONIC seconds, FlowRecord.last_ns) and the "
                          "sampled quantities under FlowRecord's names.",
               "of": classmethod(_of), "from_row": classmethod(_from_row), "__module__": __name__})

_record_values = operator.attrgetter(*(q.name for q in _SAMPLED))
_ROW_CHECKS: tuple[tuple[str, quantities.Check], ...] = (
    ("t", lambda v: number(v) and abs(v) < 1e12), *((q.name, q.check) for q in _SAMPLED))
