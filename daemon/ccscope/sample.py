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
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from ccscope.flows import FlowRecord
from ccscope.telemetry import quantities
from ccscope.telemetry.quantities import number


def _of(cls, f: FlowRecord):
    return cls(f.last_ns / 1e9, *_record_values(f))


def _from_row(cls, row: object, shift_s: float = 0.0, order: RowOrder | None = None):
    """A sample another host sent (ccscope serve), every field typed and within what the kernel can hold, its
    time shifted onto this host's clock; ValueError naming the first field that is not. `order`: where this
    ccscope's fields are in a row of the far end's fields (row_order()); None: they are ROW_FIELDS."""
    width = len(_ROW_CHECKS) if order is None else order.width
    if not isinstance(row, list) or len(row) != width:
        raise ValueError(f"a sample of {len(row) if isinstance(row, list) else type(row).__name__} "
                         f"fields, not {width}")
    if order is not None:
        row = order.pick(row)
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
ROW_FIELDS: tuple[str, ...] = tuple(name for name, _ in _ROW_CHECKS)  # a row's fields, in order (serve names them)


@dataclass(frozen=True)
class RowOrder:
    """Where ROW_FIELDS sit in the rows of a far end that named its fields: a newer ccscope's extra fields are
    left out, and the order may differ."""

    width: int
    pick: Callable[[list], list]


def row_order(fields: Sequence[str]) -> RowOrder:
    """The far end's field names -> RowOrder; ValueError naming the first field of ours it does not send (an
    older ccscope, or one that dropped or renamed it)."""
    missing = [name for name in ROW_FIELDS if name not in fields]
    if missing:
        raise ValueError(f"the far end sends no {missing[0]} (its ccscope is another version: run one version at "
                         "both ends)")
    indexes = [list(fields).index(name) for name in ROW_FIELDS]
    get = operator.itemgetter(*indexes)
    return RowOrder(len(fields), lambda row: list(get(row)))
