"""Every tracked flow's raw record in one buffer, read column by column: the scrape path at 100k flows.

Decoding a FlowRecord costs microseconds, so decoding every flow at every scrape cost ~0.5 s at 100k
flows. A scrape needs a few numbers of every flow (to expire the closed ones, count open flows per
algorithm, pick the top N by bytes) and the whole record of the few it exports. A column is a strided
memoryview over the buffer, turned into a list in C.
"""

from __future__ import annotations

import ctypes
import struct

from . import bpf_types as bt

RECORD_BYTES = ctypes.sizeof(bt.Flow)
_FORMATS = {1: "B", 2: "H", 4: "I", 8: "Q"}
_TEXT_FIELDS = {"ca_name": bt.Flow.ca_name.offset, "comm": bt.Flow.comm.offset}  # 16 bytes each, 8-aligned
assert RECORD_BYTES % 8 == 0 and all(offset % 8 == 0 for offset in _TEXT_FIELDS.values()) \
    and bt.CA_NAME_LEN == bt.COMM_LEN == 16, "struct flow layout changed"


class FlowColumns:
    """`count` struct flow records back to back in `data` (as bpf_map_lookup_batch wrote them)."""

    def __init__(self, data: bytes | bytearray, count: int) -> None:
        if len(data) != count * RECORD_BYTES:
            raise ValueError(f"{len(data)} bytes are not {count} flow records")
        self.data = data
        self.count = count
        self._columns: dict[str, list[int]] = {}

    def __len__(self) -> int:
        return self.count

    def column(self, name: str) -> list[int]:
        """One integer field of struct flow, for every flow in map order."""
        if name not in self._columns:
            field = getattr(bt.Flow, name)
            self._columns[name] = self._strided(field.offset, field.size)
        return self._columns[name]

    def ca_names(self) -> list[int] | list[tuple[int, int]]:
        """ca_name of every flow as a hashable key; name() decodes a key."""
        return self.text_keys("ca_name")

    def text_keys(self, name: str) -> list[int] | list[tuple[int, int]]:
        """A 16-byte text field (ca_name, comm) of every flow as a hashable key, cheaper than bytes: its first 8
        bytes as an integer while no value is longer (the usual case), else a pair of integers. text() decodes
        a key."""
        offset = _TEXT_FIELDS[name]
        head, tail = self._strided(offset, 8), self._strided(offset + 8, 8)
        return head if tail.count(0) == len(tail) else list(zip(head, tail, strict=True))

    @staticmethod
    def text(key: int | tuple[int, int]) -> str:
        raw = struct.pack("=QQ", *key) if isinstance(key, tuple) else struct.pack("=Q", key)
        return raw.split(b"\0", 1)[0].decode(errors="replace")

    @staticmethod
    def name(key: int | tuple[int, int]) -> str:
        """An algorithm's name from its ca_names() key."""
        return FlowColumns.text(key) or "unknown"

    def record(self, index: int) -> bt.FlowTuple:
        return bt.FlowTuple._make(bt.FLOW_STRUCT.unpack_from(self.data, index * RECORD_BYTES))

    def raw(self, index: int) -> bt.Flow:
        return bt.Flow.from_buffer_copy(self.data, index * RECORD_BYTES)

    def _strided(self, offset: int, size: int) -> list[int]:
        if offset % size:
            raise ValueError(f"a field at offset {offset} is not aligned to its {size} bytes")
        view = memoryview(self.data).cast(_FORMATS[size])
        return view[offset // size::RECORD_BYTES // size].tolist()
