"""BBR (tcp_bbr.c): mode, bandwidth estimate, min_rtt, gains, cycle index, whether the pipe was found full,
and how often the mode changed and PROBE_RTT was entered (each change counted by the kernel side)."""

from __future__ import annotations

from dataclasses import dataclass

from .record import BbrStateC, StateMetric

MODES = ("startup", "drain", "probe_bw", "probe_rtt")  # enum bbr_mode
BW_SCALE = 24   # bw is packets per us << BW_SCALE
BBR_UNIT = 256  # gains are << 8


@dataclass(frozen=True)
class BbrState:
    mode: str
    bandwidth_Bps: float      # bbr_bw() in bytes per second, as bbr_get_info() reports it (× 8 in `ss`)
    min_rtt_s: float | None   # None while no RTT was measured (~0U)
    pacing_gain: float
    cwnd_gain: float
    cycle_index: int
    full_bw_reached: bool
    long_term_bw: bool        # the policer detector's lt_bw in use
    mode_changes: int
    probe_rtt_entries: int

    @property
    def mode_number(self) -> int:
        return MODES.index(self.mode)

    @property
    def change(self) -> str:
        """What a change event (changes.py) is a change of: the mode."""
        return self.mode

    def summary(self) -> str:
        rtt = f" mrtt:{self.min_rtt_s * 1e3:.3f}ms" if self.min_rtt_s is not None else ""
        return (f"bbr:{self.mode} bw:{self.bandwidth_Bps * 8 / 1e6:.2f}Mbps{rtt} "
                f"pacing_gain:{self.pacing_gain:g} cwnd_gain:{self.cwnd_gain:g}")

    def as_dict(self) -> dict:
        return {"algorithm": "bbr", "mode": self.mode, "bandwidth_Bps": self.bandwidth_Bps,
                "min_rtt_s": self.min_rtt_s, "pacing_gain": self.pacing_gain, "cwnd_gain": self.cwnd_gain,
                "cycle_index": self.cycle_index, "full_bw_reached": self.full_bw_reached,
                "long_term_bw": self.long_term_bw, "mode_changes": self.mode_changes,
                "probe_rtt_entries": self.probe_rtt_entries}


def decode(raw: BbrStateC) -> BbrState | None:
    """None for a mode this ccscope does not know (a BBR with more modes than tcp_bbr.c's four)."""
    if raw.mode >= len(MODES):
        return None
    return BbrState(
        mode=MODES[raw.mode],
        bandwidth_Bps=raw.bw * raw.mss * 1e6 / (1 << BW_SCALE),
        min_rtt_s=None if raw.min_rtt_us == 0xFFFFFFFF else raw.min_rtt_us / 1e6,
        pacing_gain=raw.pacing_gain / BBR_UNIT,
        cwnd_gain=raw.cwnd_gain / BBR_UNIT,
        cycle_index=raw.cycle_idx,
        full_bw_reached=bool(raw.full_bw_reached),
        long_term_bw=bool(raw.lt_use_bw),
        mode_changes=raw.mode_changes,
        probe_rtt_entries=raw.probe_rtt_entries,
    )


METRICS = (
    StateMetric("ccscope_flow_bbr_mode", "BBR's mode: 0 startup, 1 drain, 2 probe_bw, 3 probe_rtt.",
                "gauge", "ccscope.tcp.bbr.mode", "1", lambda s: s.mode_number, live=True),
    StateMetric("ccscope_flow_bbr_bandwidth_bytes_per_second",
                "BBR's bottleneck bandwidth estimate (its windowed max of delivery rate).",
                "gauge", "ccscope.tcp.bbr.bandwidth", "By/s", lambda s: s.bandwidth_Bps),
    StateMetric("ccscope_flow_bbr_min_rtt_seconds", "BBR's own min RTT estimate (10 s window).",
                "gauge", "ccscope.tcp.bbr.min_rtt", "s", lambda s: s.min_rtt_s),
    StateMetric("ccscope_flow_bbr_pacing_gain", "BBR's pacing gain (2.885 startup, 1.25/0.75/1 probe_bw).",
                "gauge", "ccscope.tcp.bbr.pacing_gain", "1", lambda s: s.pacing_gain),
    StateMetric("ccscope_flow_bbr_cwnd_gain", "BBR's cwnd gain.",
                "gauge", "ccscope.tcp.bbr.cwnd_gain", "1", lambda s: s.cwnd_gain),
    StateMetric("ccscope_flow_bbr_cycle_index", "BBR's phase in the 8-phase probe_bw gain cycle.",
                "gauge", "ccscope.tcp.bbr.cycle_index", "1", lambda s: s.cycle_index),
    StateMetric("ccscope_flow_bbr_full_bandwidth_reached", "1 once BBR's startup found the pipe full.",
                "gauge", "ccscope.tcp.bbr.full_bandwidth_reached", "1", lambda s: int(s.full_bw_reached)),
    StateMetric("ccscope_flow_bbr_mode_changes", "Changes of BBR's mode, each one seen.",
                "counter", "ccscope.tcp.bbr.mode_changes", "1", lambda s: s.mode_changes),
    StateMetric("ccscope_flow_bbr_probe_rtt", "Entries into PROBE_RTT, each one seen.",
                "counter", "ccscope.tcp.bbr.probe_rtt", "1", lambda s: s.probe_rtt_entries),
)
