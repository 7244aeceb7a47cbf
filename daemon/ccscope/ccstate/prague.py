"""ccscope's BPF prague (bpf/cc/prague.bpf.c): alpha, its estimate of the fraction of packets marked CE (the
EWMA, g = 1/16, of each window's fraction), the last window's fraction, how often it answered CE, and its
window, which cwnd follows."""

from __future__ import annotations

from dataclasses import dataclass

from .record import PragueStateC, StateMetric

ONE = 1 << 20  # PRAGUE_ONE: alpha and the fractions in 1/2^20


@dataclass(frozen=True)
class PragueState:
    alpha: float
    last_ce_fraction: float | None  # None until the first CE (alpha stays 1 until then)
    reductions: int
    window_segments: float
    in_loss: bool
    cwnd_segments: int
    ssthresh_segments: int

    @property
    def change(self) -> tuple[int, bool]:
        """What a change event (changes.py) is a change of: each CE response, and loss recovery."""
        return self.reductions, self.in_loss

    def summary(self) -> str:
        fraction = "-" if self.last_ce_fraction is None else f"{self.last_ce_fraction:.3f}"
        return (f"prague:alpha {self.alpha:.3f} F:{fraction} reductions:{self.reductions} "
                f"cwnd:{self.cwnd_segments}{' loss' if self.in_loss else ''}")

    def as_dict(self) -> dict:
        return {"algorithm": "prague", "alpha": self.alpha, "last_ce_fraction": self.last_ce_fraction,
                "reductions": self.reductions, "window_segments": self.window_segments, "in_loss": self.in_loss,
                "cwnd_segments": self.cwnd_segments, "ssthresh_segments": self.ssthresh_segments}


def decode(raw: PragueStateC) -> PragueState | None:
    if raw.alpha > ONE or raw.last_fraction > ONE:
        return None
    return PragueState(
        alpha=raw.alpha / ONE,
        last_ce_fraction=raw.last_fraction / ONE if raw.saw_ce else None,
        reductions=raw.reductions,
        window_segments=raw.window_1024 / 1024,
        in_loss=bool(raw.in_loss),
        cwnd_segments=raw.snd_cwnd,
        ssthresh_segments=raw.snd_ssthresh,
    )


METRICS = (
    StateMetric("ccscope_flow_prague_alpha", "Prague's alpha: its moving estimate (g = 1/16 per window) of the "
                "fraction of its packets marked CE; it cuts cwnd by alpha/2 once per window with a mark.",
                "gauge", "ccscope.tcp.prague.alpha", "1", lambda s: s.alpha),
    StateMetric("ccscope_flow_prague_ce_fraction", "The fraction of Prague's packets marked CE in its last "
                "window; absent before the first mark.", "gauge", "ccscope.tcp.prague.ce_fraction", "1",
                lambda s: s.last_ce_fraction),
    StateMetric("ccscope_flow_prague_reductions_total", "Prague's responses to CE (at most one per window).",
                "counter", "ccscope.tcp.prague.reductions", "{reduction}", lambda s: s.reductions),
)
