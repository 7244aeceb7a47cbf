"""ctypes mirrors of bpf/ccstate.h. tests/test_layout.py checks them against the object's BTF."""

from __future__ import annotations

import ctypes
import enum
from collections.abc import Callable
from dataclasses import dataclass

u8, u16, u32, u64 = ctypes.c_uint8, ctypes.c_uint16, ctypes.c_uint32, ctypes.c_uint64
STATE_BYTES = 48


class Kind(enum.IntEnum):
    NONE = 0
    BBR = 1
    CUBIC = 2
    VEGAS = 3  # ccscope's BPF algorithms, known by the tag they set (bpf/cc/cc_state.h)
    WESTWOOD = 4
    COPA = 5
    PRAGUE = 6
    DCTCP = 7  # the kernel's, by name


class BbrStateC(ctypes.Structure):
    _fields_ = [
        ("bw", u32),
        ("min_rtt_us", u32),
        ("mss", u32),
        ("pacing_gain", u16),
        ("cwnd_gain", u16),
        ("mode", u8),
        ("cycle_idx", u8),
        ("full_bw_reached", u8),
        ("lt_use_bw", u8),
        ("mode_changes", u32),
        ("probe_rtt_entries", u32),
        ("__pad0", u32),
    ]


class CubicStateC(ctypes.Structure):
    _fields_ = [
        ("last_max_cwnd", u32),
        ("bic_K", u32),
        ("bic_origin_point", u32),
        ("epoch_start", u32),
        ("tcp_cwnd", u32),
        ("delay_min", u32),
        ("snd_cwnd", u32),
        ("snd_ssthresh", u32),
        ("wmax_updates", u32),
        ("found", u8),
        ("__pad0", u8 * 3),
    ]


class VegasStateC(ctypes.Structure):
    _fields_ = [
        ("base_rtt_us", u32),
        ("min_rtt_us", u32),
        ("last_rtt_us", u32),
        ("last_diff", u32),
        ("adjustments", u32),
        ("snd_cwnd", u32),
        ("enabled", u8),
        ("__pad0", u8 * 3),
    ]


class WestwoodStateC(ctypes.Structure):
    _fields_ = [
        ("bw_est", u32),
        ("bw_ns_est", u32),
        ("rtt_min", u32),
        ("rtt", u32),
        ("hz", u32),
        ("mss", u32),
        ("snd_cwnd", u32),
        ("snd_ssthresh", u32),
    ]


class CopaStateC(ctypes.Structure):
    _fields_ = [
        ("rtt_standing_us", u32),
        ("rtt_min_us", u32),
        ("snd_cwnd", u32),
        ("velocity_shift", u8),
        ("direction", u8),
        ("slow_start", u8),
        ("same_direction", u8),
    ]


class PragueStateC(ctypes.Structure):
    _fields_ = [
        ("alpha", u32),
        ("last_fraction", u32),
        ("reductions", u32),
        ("snd_cwnd", u32),
        ("snd_ssthresh", u32),
        ("window_1024", u32),
        ("saw_ce", u8),
        ("in_loss", u8),
        ("__pad0", u8 * 2),
    ]


class DctcpStateC(ctypes.Structure):
    _fields_ = [
        ("alpha", u32),
        ("loss_cwnd", u32),
        ("snd_cwnd", u32),
        ("snd_ssthresh", u32),
        ("ce_state", u8),
        ("__pad0", u8 * 3),
    ]


class _StateUnion(ctypes.Union):
    _fields_ = [("bbr", BbrStateC), ("cubic", CubicStateC), ("vegas", VegasStateC), ("westwood", WestwoodStateC),
                ("copa", CopaStateC), ("prague", PragueStateC), ("dctcp", DctcpStateC), ("bytes", u8 * STATE_BYTES)]


class CcState(ctypes.Structure):
    _anonymous_ = ("state",)
    _fields_ = [
        ("cookie", u64),
        ("updated_ns", u64),
        ("kind", u32),
        ("__pad0", u32),
        ("state", _StateUnion),
    ]


class CcStateConfig(ctypes.Structure):
    _fields_ = [("interval_ns", u64)]


# Name in ccstate.h -> mirror, for the layout test.
SHARED_STRUCTS: dict[str, type[ctypes.Structure]] = {
    "bbr_state": BbrStateC,
    "cubic_state": CubicStateC,
    "vegas_state": VegasStateC,
    "westwood_state": WestwoodStateC,
    "copa_state": CopaStateC,
    "prague_state": PragueStateC,
    "dctcp_state": DctcpStateC,
    "ccstate": CcState,
    "ccstate_config": CcStateConfig,
}
MAP_LAYOUTS: dict[str, tuple[type, type]] = {"ccstates": (u64, CcState), "ccstate_config": (u32, CcStateConfig)}
KERNEL_ONLY_MAPS = ("ccstate_gates",)


@dataclass(frozen=True)
class StateMetric:
    """One series of an algorithm's state, in every output: its Prometheus name, help and type, its OpenTelemetry
    name and unit (UCUM), and its value in a decoded state (None leaves the flow's sample out)."""

    name: str
    help: str
    kind: str  # "gauge" or "counter"
    otlp: str
    unit: str
    value: Callable[[object], float | None]
    live: bool = False  # also a value of the live page's points (BBR's mode bands, CUBIC's W_max line)

    @property
    def short(self) -> str:
        """The name without ccscope_flow_: the live page's."""
        return self.name.removeprefix("ccscope_flow_")
