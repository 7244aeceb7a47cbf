"""CUBIC (tcp_cubic.c): W_max (last_max_cwnd), K, the epoch's start and origin point, the Reno-friendly
window and which of the two governs growth, whether HyStart ended slow start, and how often W_max was set
(each loss, and each RTO, which resets it to 0)."""

from __future__ import annotations

from dataclasses import dataclass

from .record import CubicStateC, StateMetric

BICTCP_HZ = 10              # bic_K counts 1 / 2^BICTCP_HZ s


@dataclass(frozen=True)
class CubicState:
    wmax_segments: int          # W_max: the window at the last loss (reduced by fast convergence)
    k_s: float                  # K: seconds from the epoch's start until the cubic reaches W_max again
    origin_segments: int        # the cubic's plateau: W_max, or the window at the epoch's start if above it
    in_epoch: bool              # epoch_start set: an ACK came since the last loss or idle
    reno_segments: int          # tcp_cwnd, the Reno-friendly estimate
    cwnd_segments: int
    ssthresh_segments: int
    hystart_done: bool          # HyStart ended slow start (`found`: which signal, only before Linux 5.7)
    wmax_updates: int

    @property
    def reno_governs(self) -> bool:
        """The TCP-friendly region: Reno's estimate is above the window, so it sets the growth."""
        return self.in_epoch and self.reno_segments > self.cwnd_segments

    @property
    def change(self) -> tuple[int, bool]:
        """What a change event (changes.py) is a change of: W_max, and whether an epoch runs."""
        return self.wmax_segments, self.in_epoch

    def summary(self) -> str:
        region = "reno" if self.reno_governs else "cubic"
        return (f"cubic:wmax:{self.wmax_segments} K:{self.k_s:.3f}s origin:{self.origin_segments} "
                f"reno_cwnd:{self.reno_segments} {region}")

    def as_dict(self) -> dict:
        return {"algorithm": "cubic", "wmax_segments": self.wmax_segments, "k_s": self.k_s,
                "origin_segments": self.origin_segments, "in_epoch": self.in_epoch,
                "reno_segments": self.reno_segments, "reno_governs": self.reno_governs,
                "hystart_done": self.hystart_done, "wmax_updates": self.wmax_updates}


def decode(raw: CubicStateC) -> CubicState:
    return CubicState(
        wmax_segments=raw.last_max_cwnd,
        k_s=raw.bic_K / (1 << BICTCP_HZ),
        origin_segments=raw.bic_origin_point,
        in_epoch=raw.epoch_start != 0,
        reno_segments=raw.tcp_cwnd,
        cwnd_segments=raw.snd_cwnd,
        ssthresh_segments=raw.snd_ssthresh,
        hystart_done=raw.found != 0,
        wmax_updates=raw.wmax_updates,
    )


METRICS = (
    StateMetric("ccscope_flow_cubic_wmax_segments", "CUBIC's W_max: the window at the last loss; absent before it.",
                "gauge", "ccscope.tcp.cubic.wmax", "{segment}", lambda s: s.wmax_segments or None, live=True),
    StateMetric("ccscope_flow_cubic_k_seconds", "CUBIC's K: time from the epoch's start to regain W_max.",
                "gauge", "ccscope.tcp.cubic.k", "s", lambda s: s.k_s if s.in_epoch else None),
    StateMetric("ccscope_flow_cubic_origin_segments", "CUBIC's origin point (the cubic's plateau).",
                "gauge", "ccscope.tcp.cubic.origin", "{segment}",
                lambda s: s.origin_segments if s.in_epoch else None),
    StateMetric("ccscope_flow_cubic_reno_segments", "CUBIC's Reno-friendly window estimate (tcp_cwnd).",
                "gauge", "ccscope.tcp.cubic.reno", "{segment}", lambda s: s.reno_segments if s.in_epoch else None),
    StateMetric("ccscope_flow_cubic_reno_governs", "1 while the Reno-friendly estimate sets CUBIC's growth.",
                "gauge", "ccscope.tcp.cubic.reno_governs", "1",
                lambda s: int(s.reno_governs) if s.in_epoch else None),
    StateMetric("ccscope_flow_cubic_wmax_updates", "Times CUBIC set W_max: each loss, and each RTO (which resets "
                "it to 0), as its state shows them.", "counter", "ccscope.tcp.cubic.wmax_updates", "1",
                lambda s: s.wmax_updates),
)
