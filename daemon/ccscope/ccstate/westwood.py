"""ccscope's BPF Westwood+ (bpf/cc/westwood.bpf.c): its bandwidth estimate (BWE) and RTTmin, from which it sets
ssthresh = BWE x RTTmin after a loss (westwood_bw_rttmin() in tcp_westwood.c). The kernel side converts nothing;
the module's units (bytes per jiffy, jiffies) are turned into seconds here with the kernel's HZ."""

from __future__ import annotations

from dataclasses import dataclass

from .record import StateMetric, WestwoodStateC


@dataclass(frozen=True)
class WestwoodState:
    bandwidth_Bps: float          # BWE
    rtt_min_s: float
    rtt_s: float
    bw_rttmin_segments: int       # max(BWE x RTTmin / mss, 2): the ssthresh a loss sets
    cwnd_segments: int
    ssthresh_segments: int

    @property
    def change(self) -> None:
        """Westwood+ has no mode: only its first copy is an event (changes.py)."""
        return None

    def summary(self) -> str:
        return (f"westwood:bwe:{self.bandwidth_Bps * 8 / 1e6:.2f}Mbps rtt_min:{self.rtt_min_s * 1e3:.1f}ms "
                f"bw_rttmin:{self.bw_rttmin_segments}")

    def as_dict(self) -> dict:
        return {"algorithm": "westwood", "bandwidth_Bps": self.bandwidth_Bps, "rtt_min_s": self.rtt_min_s,
                "rtt_s": self.rtt_s, "bw_rttmin_segments": self.bw_rttmin_segments,
                "cwnd_segments": self.cwnd_segments, "ssthresh_segments": self.ssthresh_segments}


def decode(raw: WestwoodStateC) -> WestwoodState:
    hz = raw.hz or 1000
    return WestwoodState(
        bandwidth_Bps=raw.bw_est * hz,
        rtt_min_s=raw.rtt_min / hz,
        rtt_s=raw.rtt / hz,
        bw_rttmin_segments=max(raw.bw_est * raw.rtt_min // raw.mss, 2) if raw.mss else 0,
        cwnd_segments=raw.snd_cwnd,
        ssthresh_segments=raw.snd_ssthresh,
    )


METRICS = (
    StateMetric("ccscope_flow_westwood_bandwidth_bytes_per_second", "Westwood+'s bandwidth estimate (BWE).",
                "gauge", "ccscope.tcp.westwood.bandwidth", "By/s", lambda s: s.bandwidth_Bps),
    StateMetric("ccscope_flow_westwood_rtt_min_seconds", "Westwood+'s RTTmin (jiffy resolution).",
                "gauge", "ccscope.tcp.westwood.rtt_min", "s", lambda s: s.rtt_min_s),
)
