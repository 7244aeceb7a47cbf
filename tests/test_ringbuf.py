"""ringbuf.MappedRing: the ring's layout read right (records that wrap, discarded ones, one still being written),
and on the kernel's own ring every record the BPF side counted arrives once, across many wraps."""

from __future__ import annotations

import contextlib
import mmap
import platform
import socket
import struct
import threading
import time
from collections.abc import Iterator

import pytest
from ccscope import bpf_types as bt
from ccscope.ringbuf import BUSY, DISCARD, HEADER_BYTES, TSO_MACHINES, MappedRing
from ccscope_testkit.net import Link, Sink, connect
from ccscope_testkit.prereqs import require_bpf_object, require_root

SIZE = 4096  # the synthetic ring's data bytes
WRAPPED_BYTES = 4 << 20  # what the kernel test reads through its 1 MiB ring: four wraps


class FakeRing:
    """The two mappings a ring's map gives, as buffers: the data area is written twice over, as the kernel maps
    it (a record that wraps reads as one)."""

    def __init__(self) -> None:
        self.consumer = bytearray(8)
        self.ring = bytearray(SIZE)
        self.producer = 0

    def write(self, payload: bytes, header_bits: int = 0) -> None:
        record = struct.pack("<II", len(payload) | header_bits, 0) + payload
        for i, byte in enumerate(record):
            self.ring[(self.producer + i) % SIZE] = byte
        self.producer += (len(payload) + HEADER_BYTES + 7) & ~7

    def data(self) -> bytes:
        return struct.pack("<Q", self.producer).ljust(mmap.PAGESIZE, b"\0") + bytes(self.ring) * 2

    def reader(self) -> MappedRing:
        return MappedRing(-1, SIZE, lambda _records: None, consumer=self.consumer, data=self.data())

    @property
    def consumed(self) -> int:
        return struct.unpack("<Q", self.consumer)[0]


def test_records_in_order_also_across_the_end() -> None:
    fake = FakeRing()
    payloads = [bytes([i]) * (100 + i) for i in range(60)]  # 2.2 rings in three batches, each under a ring
    got = []
    for start in (0, 20, 40):
        for payload in payloads[start:start + 20]:
            fake.write(payload)
        reader = fake.reader()
        got += reader.drain()
        reader.close()
    assert got == payloads
    assert fake.consumed == fake.producer


def test_discarded_records_are_skipped_and_consumed() -> None:
    fake = FakeRing()
    fake.write(b"kept-1")
    fake.write(b"dropped", DISCARD)
    fake.write(b"kept-2")
    assert fake.reader().drain() == [b"kept-1", b"kept-2"]
    assert fake.consumed == fake.producer


def test_a_record_still_being_written_stops_the_drain_before_it() -> None:
    fake = FakeRing()
    fake.write(b"first")
    busy_at = fake.producer
    fake.write(b"unfinished", BUSY)
    fake.write(b"after")
    assert fake.reader().drain() == [b"first"]
    assert fake.consumed == busy_at  # the next poll starts at the busy record


# --- the kernel's ring ---------------------------------------------------------------------------------------------


@pytest.fixture
def link() -> Iterator[Link]:
    require_root()
    require_bpf_object()
    made = Link.create("198.18.7")
    try:
        yield made
    finally:
        made.close()


@pytest.mark.skipif(platform.machine().lower() not in TSO_MACHINES, reason="libbpf's reader serves this machine")
def test_every_sample_the_kernel_counted_arrives_once_across_wraps(link: Link) -> None:
    """A 1 MiB ring (the smallest the loader makes) and samples every 100 us of a bulk flow between namespaces: the
    ring wraps several times. What the reader delivered must equal the BPF side's own count of submitted samples
    (the counters map), none lost, and every record must be a whole struct flow."""
    from ccscope.loader import ProbeOptions, TelemetryProbe

    records: list[bytes] = []
    options = ProbeOptions(sample_interval_ns=100_000, emit_samples=True, ringbuf_bytes=1 << 20)
    with TelemetryProbe(options) as probe:
        ring = probe.ring_buffer(records.extend, raw=True)
        assert isinstance(ring, MappedRing)
        sink = Sink(socket.AF_INET, link.addr_b, 5391, link.b)
        sock = connect(socket.AF_INET, link.addr_b, 5391, link.a)
        done = threading.Event()
        sent = threading.Thread(target=_send_until, args=(sock, done), daemon=True)
        try:
            sent.start()
            deadline = time.monotonic() + 30
            while len(records) * bt.FLOW_STRUCT.size < WRAPPED_BYTES and time.monotonic() < deadline:
                ring.poll(50)
            done.set()
            sent.join(timeout=5)
            sock.close()
            deadline = time.monotonic() + 5
            counted = None
            while time.monotonic() < deadline:  # the close's samples, and any the last poll left
                ring.poll(20)
                counted = probe.counters()[bt.Counter.SAMPLES]
                if len(records) == counted:
                    break
            lost = probe.counters()[bt.Counter.SAMPLES_LOST]
        finally:
            ring.close()
            with contextlib.suppress(OSError):
                sock.close()
            sink.close()
    assert lost == 0
    assert len(records) == counted
    assert len(records) * bt.FLOW_STRUCT.size >= WRAPPED_BYTES, "the ring did not wrap often enough in 30 s"
    assert {len(r) for r in records} == {bt.FLOW_STRUCT.size}
    assert all(flow.cookie for flow in bt.unpack_flows(records))


def _send_until(sock: socket.socket, done: threading.Event) -> None:
    block = b"x" * 65536
    with contextlib.suppress(OSError):
        while not done.is_set():
            sock.send(block)
