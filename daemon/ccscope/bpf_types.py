"""ctypes mirrors of bpf/ccscope.h. tests/test_layout.py checks them against the object's BTF."""

from __future__ import annotations

import ctypes
import enum

CA_NAME_LEN = 16
HIST_SLOTS = 28

u8, u16, u32, u64 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64


class Event(enum.IntEnum):
    PROBE = 1
    RETRANSMIT = 2
    CLOSE = 3


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
    ]


class CcKey(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * CA_NAME_LEN)]


class CcStats(ctypes.Structure):
    _fields_ = [("flows", u64), ("retransmits", u64)]


class HistKey(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char * CA_NAME_LEN), ("kind", u32), ("__pad0", u32)]


class Hist(ctypes.Structure):
    _fields_ = [("slots", u64 * HIST_SLOTS), ("sum_us", u64)]


class Config(ctypes.Structure):
    _fields_ = [("sample_interval_ns", u64), ("emit_samples", u32), ("__pad0", u32)]


# Name in ccscope.h -> ctypes mirror, for the layout test.
SHARED_STRUCTS: dict[str, type[ctypes.Structure]] = {
    "flow": Flow,
    "cc_key": CcKey,
    "cc_stats": CcStats,
    "hist_key": HistKey,
    "hist": Hist,
    "config": Config,
}
