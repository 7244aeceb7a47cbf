"""ccscope's BPF Vegas (bpf/cc/vegas.bpf.c): baseRTT, the RTT and the "diff" its last adjustment took (the packets
it estimates it keeps queued in the network, which it holds between alpha = 2 and beta = 4), and how many RTTs it
adjusted. struct_ops cannot implement get_info, so nothing but ccscope shows these."""

from __future__ import annotations

from dataclasses import dataclass

from .record import StateMetric, VegasStateC

NO_RTT = 0x7FFFFFFF  # VEGAS_NO_RTT: no sample yet
ALPHA, BETA = 2, 4


@dataclass(frozen=True)
class VegasState:
    base_rtt_s: float | None      # the connection's minimum RTT
    last_rtt_s: float | None      # the minimum RTT of the last adjusted RTT
    diff_packets: int | None      # cwnd * (rtt - baseRTT) / baseRTT at the last adjustment
    adjustments: int
    cwnd_segments: int
    enabled: bool                 # False outside TCP_CA_Open: Reno's rules then

    @property
    def change(self) -> bool:
        """What a change event (changes.py) is a change of: whether Vegas's rules run."""
        return self.enabled

    def summary(self) -> str:
        base = f"{self.base_rtt_s * 1e3:.3f}ms" if self.base_rtt_s is not None else "-"
        diff = "-" if self.diff_packets is None else str(self.diff_packets)
        return f"vegas:base_rtt:{base} diff:{diff} (alpha {ALPHA}, beta {BETA}){'' if self.enabled else ' reno'}"

    def as_dict(self) -> dict:
        return {"algorithm": "vegas", "base_rtt_s": self.base_rtt_s, "last_rtt_s": self.last_rtt_s,
                "diff_packets": self.diff_packets, "adjustments": self.adjustments,
                "cwnd_segments": self.cwnd_segments, "enabled": self.enabled}


def decode(raw: VegasStateC) -> VegasState:
    adjusted = raw.adjustments > 0
    return VegasState(
        base_rtt_s=None if raw.base_rtt_us in (0, NO_RTT) else raw.base_rtt_us / 1e6,
        last_rtt_s=raw.last_rtt_us / 1e6 if adjusted else None,
        diff_packets=raw.last_diff if adjusted else None,
        adjustments=raw.adjustments,
        cwnd_segments=raw.snd_cwnd,
        enabled=bool(raw.enabled),
    )


METRICS = (
    StateMetric("ccscope_flow_vegas_base_rtt_seconds", "Vegas's baseRTT: the connection's minimum RTT.",
                "gauge", "ccscope.tcp.vegas.base_rtt", "s", lambda s: s.base_rtt_s),
    StateMetric("ccscope_flow_vegas_diff_packets", "Vegas's diff at its last adjustment: packets it estimates it "
                "keeps queued (it holds them between alpha 2 and beta 4).", "gauge", "ccscope.tcp.vegas.diff",
                "{packet}", lambda s: s.diff_packets),
    StateMetric("ccscope_flow_vegas_adjustments", "RTTs Vegas adjusted its window in (with enough RTT samples, "
                "in the Open state).", "counter", "ccscope.tcp.vegas.adjustments", "1", lambda s: s.adjustments),
)
