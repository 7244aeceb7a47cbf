"""ctypes mirrors of bpf/ccscope.h. tests/test_layout.py checks them against the object's BTF."""

from __future__ import annotations

import ctypes
import enum
import struct
from collections import namedtuple

CA_NAME_LEN = 16
HIST_SLOTS = 32
COMM_LEN = 16
CGROUP_OTHER = 0

u8, u16, u32, u64 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64


class Event(enum.IntEnum):
    PROBE = 1
    CLOSE = 3


EVENT_NAMES = {e.value: e.name.lower() for e in Event}


class HistKind(enum.IntEnum):
    SRTT = 0
    QUEUE_DELAY = 1


class Counter(enum.IntEnum):
    PROBE_EVENTS = 0
    SAMPLES = 1
    SAMPLES_LOST = 2
    FLOWS_CREATED = 3
    FLOWS_CLOSED = 4
    RETRANSMIT_EVENTS = 5
    FLOW_MAP_FULL = 6


COUNTER_SLOTS = 8


class RetransCause(enum.IntEnum):
    """enum ccscope_retrans_cause: why a segment was retransmitted (bpf/ccscope.bpf.c, retransmit_cause())."""

    RTO = 0
    FAST = 1
    TLP = 2
    OTHER = 3


RETRANS_CAUSES = 4


class Flow(ctypes.Structure):
    _fields_ = [
        ("cookie", u64),
        ("first_ns", u64),
        ("last_ns", u64),
        ("closed_ns", u64),
        ("bytes_acked", u64),
        ("bytes_sent", u64),
        ("bytes_received", u64),
        ("pacing_rate", u64),
        ("netns", u32),
        ("family", u16),
        ("sport", u16),
        ("dport", u16),
        ("ca_state", u8),
        ("sk_state", u8),
        ("event", u8),
        ("__pad0", u8 * 3),
        ("saddr", u8 * 16),
        ("daddr", u8 * 16),
        ("snd_cwnd", u32),
        ("snd_ssthresh", u32),
        ("srtt_us", u32),
        ("rttvar_us", u32),
        ("min_rtt_us", u32),
        ("mss_cache", u32),
        ("packets_out", u32),
        ("retrans_out", u32),
        ("lost_out", u32),
        ("sacked_out", u32),
        ("total_retrans", u32),
        ("lost", u32),
        ("delivered", u32),
        ("rate_delivered", u32),
        ("rate_interval_us", u32),
        ("retransmit_events", u32),
        ("ca_name", ctypes.c_char * CA_NAME_LEN),
        ("cgroup_id", u64),
        ("tgid", u32),
        ("cgroup_slot", u32),
        ("comm", ctypes.c_char * COMM_LEN),
        ("delivered_ce", u32),
        ("ecn_flags", u8),
        ("ecn_codepoint", u8),
        ("__pad1", u8 * 2),
        ("dsack_dups", u32),
        ("__pad2", u32),
    ]


class Owner(ctypes.Structure):
    _fields_ = [("tgid", u32), ("__pad0", u32), ("comm", ctypes.c_char * COMM_LEN)]


class ListenerKey(ctypes.Structure):
    _fields_ = [("netns", u32), ("port", u16), ("__pad0", u16)]


class CcKey(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * CA_NAME_LEN)]


class CcStats(ctypes.Structure):
    _fields_ = [("flows", u64), ("retransmits", u64)]


class RetransCauses(ctypes.Structure):
    _fields_ = [("segments", u32 * RETRANS_CAUSES)]


class HistKey(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * CA_NAME_LEN), ("kind", u32), ("__pad0", u32)]


class Hist(ctypes.Structure):
    _fields_ = [("slots", u64 * HIST_SLOTS), ("sum_us", u64)]


class CgroupStats(ctypes.Structure):
    _fields_ = [("flows", u64), ("retransmits", u64), ("queue_delay", Hist)]


class Config(ctypes.Structure):
    _fields_ = [("sample_interval_ns", u64), ("emit_samples", u32), ("cgroup_stats", u32)]


def _struct_format(cls: type[ctypes.Structure]) -> str:
    """A struct-module format equal to the ctypes layout (explicit padding, so no alignment: '=')."""
    codes = {u8: "B", u16: "H", u32: "I", u64: "Q"}
    parts = []
    for _, ctype in cls._fields_:
        if ctype in codes:
            parts.append(codes[ctype])
        else:  # arrays of bytes or chars
            parts.append(f"{ctypes.sizeof(ctype)}s")
    return "=" + "".join(parts)


# Ring-buffer samples are unpacked in one call into a namedtuple with Flow's field names: several times
# cheaper per sample than ctypes attribute access. Array fields (addresses, ca_name) come out as raw bytes.
FLOW_STRUCT = struct.Struct(_struct_format(Flow))
FlowTuple = namedtuple("FlowTuple", [name.lstrip("_") for name, _ in Flow._fields_])


def unpack_flow(data: bytes) -> FlowTuple:
    return FlowTuple._make(FLOW_STRUCT.unpack_from(data))


def unpack_flows(records: list[bytes]) -> list[FlowTuple]:
    """Many records in one call (every ring-buffer record is a struct flow)."""
    return list(map(FlowTuple._make, FLOW_STRUCT.iter_unpack(b"".join(records))))


# Map in ccscope.bpf.c -> ctypes mirrors of its key and value (per-CPU maps: one CPU's value). The loader
# refuses an object whose sizes differ, as ebpf_exporter does: a stale ccscope.bpf.o next to a newer daemon
# would otherwise be read as garbage.
MAP_LAYOUTS: dict[str, tuple[type, type]] = {
    "flows": (u64, Flow),
    "cc_stats": (CcKey, CcStats),
    "hists": (HistKey, Hist),
    "counters": (u32, u64),
    "config": (u32, Config),
    "cgroup_stats": (u32, CgroupStats),  # per-CPU array of slots
    "cgroup_slots": (u64, u32),          # cgroup id -> slot
    "owners": (u64, Owner),
    "listeners": (ListenerKey, Owner),
    "retrans_causes": (u64, RetransCauses),
}
# Not read by key here: samples is a ring buffer of Flow records, first_seen and retrans_counted socket-local
# storage, free_slots a queue of cgroup_stats slots.
KERNEL_ONLY_MAPS = ("gates", "samples", "first_seen", "retrans_counted", "free_slots")

# Name in ccscope.h -> ctypes mirror, for the layout test.
SHARED_STRUCTS: dict[str, type[ctypes.Structure]] = {
    "flow": Flow,
    "cc_key": CcKey,
    "cc_stats": CcStats,
    "retrans_causes": RetransCauses,
    "hist_key": HistKey,
    "hist": Hist,
    "owner": Owner,
    "listener_key": ListenerKey,
    "cgroup_stats": CgroupStats,
    "config": Config,
}
