"""The kernel's DCTCP (tcp_dctcp.c): alpha, its estimate of the fraction of packets marked CE (the EWMA, g = 1/16,
of each window's fraction, in 1/1024: DCTCP_MAX_ALPHA), by which it cuts cwnd by alpha/2 once per window with a
mark; and the window it had before the last cut (undo)."""

from __future__ import annotations

from dataclasses import dataclass

from .record import DctcpStateC, StateMetric

MAX_ALPHA = 1024  # DCTCP_MAX_ALPHA


@dataclass(frozen=True)
class DctcpState:
    alpha: float
    loss_cwnd_segments: int
    receiving_ce: bool  # the receiver's ce_state: the last data it got was CE-marked
    cwnd_segments: int
    ssthresh_segments: int

    @property
    def change(self) -> None:
        """DCTCP has no mode: only its first copy is an event (changes.py)."""
        return None

    def summary(self) -> str:
        return f"dctcp:alpha {self.alpha:.3f} cwnd:{self.cwnd_segments}{' ce' if self.receiving_ce else ''}"

    def as_dict(self) -> dict:
        return {"algorithm": "dctcp", "alpha": self.alpha, "loss_cwnd_segments": self.loss_cwnd_segments,
                "receiving_ce": self.receiving_ce, "cwnd_segments": self.cwnd_segments,
                "ssthresh_segments": self.ssthresh_segments}


def decode(raw: DctcpStateC) -> DctcpState | None:
    """None for an alpha past DCTCP_MAX_ALPHA: not a struct dctcp this ccscope knows."""
    if raw.alpha > MAX_ALPHA:
        return None
    return DctcpState(alpha=raw.alpha / MAX_ALPHA, loss_cwnd_segments=raw.loss_cwnd,
                      receiving_ce=bool(raw.ce_state), cwnd_segments=raw.snd_cwnd,
                      ssthresh_segments=raw.snd_ssthresh)


METRICS = (
    StateMetric("ccscope_flow_dctcp_alpha", "DCTCP's alpha: its moving estimate (g = 1/16 per window) of the "
                "fraction of its packets marked CE; it cuts cwnd by alpha/2 once per window with a mark.",
                "gauge", "ccscope.tcp.dctcp.alpha", "1", lambda s: s.alpha),
)
