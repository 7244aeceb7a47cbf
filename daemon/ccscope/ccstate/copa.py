"""ccscope's BPF Copa (bpf/cc/copa.bpf.c): its standing RTT and minimum RTT, from which it takes the queueing
delay d_q and its target rate 1 / (delta d_q); its velocity, direction and whether it is still in slow start."""

from __future__ import annotations

from dataclasses import dataclass

from .record import CopaStateC, StateMetric

DELTA_INV = 2  # 1 / delta (COPA_DELTA_INV)
DIRECTIONS = ("none", "up", "down")


@dataclass(frozen=True)
class CopaState:
    rtt_standing_s: float | None
    rtt_min_s: float | None
    velocity: int
    direction: str
    slow_start: bool
    cwnd_segments: int

    @property
    def queueing_delay_s(self) -> float | None:
        if self.rtt_standing_s is None or self.rtt_min_s is None:
            return None
        return self.rtt_standing_s - self.rtt_min_s

    @property
    def target_segments(self) -> float | None:
        """The window of Copa's target rate over the standing RTT: rtt_standing / (delta d_q); None with no queue."""
        dq = self.queueing_delay_s
        return None if not dq or dq <= 0 else DELTA_INV * self.rtt_standing_s / dq

    @property
    def change(self) -> tuple[bool, str]:
        """What a change event (changes.py) is a change of: slow start's end, and the direction."""
        return self.slow_start, self.direction

    def summary(self) -> str:
        target = "-" if self.target_segments is None else f"{self.target_segments:.1f}"
        mode = "slow_start" if self.slow_start else self.direction
        return f"copa:{mode} v:{self.velocity} target:{target} cwnd:{self.cwnd_segments}"

    def as_dict(self) -> dict:
        return {"algorithm": "copa", "rtt_standing_s": self.rtt_standing_s, "rtt_min_s": self.rtt_min_s,
                "queueing_delay_s": self.queueing_delay_s, "target_segments": self.target_segments,
                "velocity": self.velocity, "direction": self.direction, "slow_start": self.slow_start,
                "cwnd_segments": self.cwnd_segments}


def decode(raw: CopaStateC) -> CopaState | None:
    if raw.direction >= len(DIRECTIONS):
        return None
    return CopaState(
        rtt_standing_s=raw.rtt_standing_us / 1e6 if raw.rtt_min_us else None,
        rtt_min_s=raw.rtt_min_us / 1e6 if raw.rtt_min_us else None,
        velocity=1 << min(raw.velocity_shift, 31),
        direction=DIRECTIONS[raw.direction],
        slow_start=bool(raw.slow_start),
        cwnd_segments=raw.snd_cwnd,
    )


METRICS = (
    StateMetric("ccscope_flow_copa_velocity", "Copa's velocity: how many packets per RTT its window moves by.",
                "gauge", "ccscope.tcp.copa.velocity", "1", lambda s: s.velocity),
    StateMetric("ccscope_flow_copa_queueing_delay_seconds", "Copa's d_q: standing RTT minus minimum RTT.",
                "gauge", "ccscope.tcp.copa.queueing_delay", "s", lambda s: s.queueing_delay_s),
    StateMetric("ccscope_flow_copa_target_segments", "The window of Copa's target rate 1/(delta d_q) over its "
                "standing RTT; absent without a queue.", "gauge", "ccscope.tcp.copa.target", "{segment}",
                lambda s: s.target_segments),
    StateMetric("ccscope_flow_copa_slow_start", "1 while Copa is in its slow start.", "gauge",
                "ccscope.tcp.copa.slow_start", "1", lambda s: int(s.slow_start)),
)
