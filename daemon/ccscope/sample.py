"""One sample of a flow, as the scenario recorder and `ccscope serve` keep it: FlowRecord's quantities under
FlowRecord's names and its time; and the same from another host (serve's telemetry reply), checked field by
field before it is believed. Below both the scenario stack and serve, which share it."""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass

from ccscope.flows import FlowRecord


@dataclass(frozen=True, slots=True)
class Sample:
    """One sample of a flow: FlowRecord's quantities under FlowRecord's names, and its time."""

    t: float  # CLOCK_MONOTONIC seconds (FlowRecord.last_ns)
    cwnd_segments: int
    srtt_s: float
    retransmits: int
    bytes_acked: int
    bytes_sent: int
    ssthresh_segments: int | None
    min_rtt_s: float | None
    packets_in_flight: int
    delivery_rate_Bps: float
    ca_state: str
    cc: str
    event: int
    mss_bytes: int

    @classmethod
    def of(cls, f: FlowRecord) -> Sample:
        return cls(f.last_ns / 1e9, *_record_values(f))

    @classmethod
    def from_row(cls, row: object, shift_s: float = 0.0) -> Sample:
        """A sample another host sent (ccscope serve), every field typed and within what the kernel can
        hold, its time shifted onto this host's clock; ValueError naming the first field that is not."""
        if not isinstance(row, list) or len(row) != len(_ROW_CHECKS):
            raise ValueError(f"a sample of {len(row) if isinstance(row, list) else type(row).__name__} "
                             f"fields, not {len(_ROW_CHECKS)}")
        for (name, ok), value in zip(_ROW_CHECKS, row, strict=True):
            if not ok(value):
                text = repr(value)
                raise ValueError(f"{name} {text if len(text) <= 30 else text[:27] + '...'} is out of range")
        return cls(row[0] + shift_s, *row[1:])


_record_values = operator.attrgetter(*tuple(Sample.__dataclass_fields__)[1:])


def _int_below(limit: int, optional: bool = False) -> Callable[[object], bool]:
    def ok(v: object) -> bool:
        return (optional and v is None) or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < limit)
    return ok


def _seconds(optional: bool = False) -> Callable[[object], bool]:
    # the kernel keeps RTTs in u32 microseconds: at most 4295 s
    def ok(v: object) -> bool:
        return (optional and v is None) or (_number(v) and 0 <= v < 4295.0)
    return ok


def _number(v: object) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _word(v: object) -> bool:
    return isinstance(v, str) and 0 < len(v) <= 16 and v.isascii() and v.replace("_", "").isalnum()


_ROW_CHECKS: tuple[tuple[str, Callable[[object], bool]], ...] = (
    ("t", lambda v: _number(v) and abs(v) < 1e12),
    ("cwnd_segments", _int_below(1 << 32)), ("srtt_s", _seconds()), ("retransmits", _int_below(1 << 32)),
    ("bytes_acked", _int_below(1 << 63)), ("bytes_sent", _int_below(1 << 63)),  # int64: export's columns
    ("ssthresh_segments", _int_below(1 << 32, optional=True)), ("min_rtt_s", _seconds(optional=True)),
    ("packets_in_flight", _int_below(1 << 32)),
    ("delivery_rate_Bps", lambda v: _number(v) and 0 <= v < 2.0 ** 64),
    ("ca_state", _word), ("cc", _word), ("event", _int_below(256)), ("mss_bytes", _int_below(1 << 16)),
)
