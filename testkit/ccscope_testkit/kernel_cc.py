"""What the kernel's congestion controls do, from their source: the oracles of the algorithm-state tests."""

from __future__ import annotations

# tcp_bbr.c, bbr_update_gains(): the gains each mode sets (x 256: 739 is bbr_high_gain, 88 bbr_drain_gain; probe_bw
# cycles its pacing gain through 320, 192 and 256)
BBR_GAINS = {"startup": ({739}, {739}), "drain": ({88}, {739}), "probe_bw": ({320, 192, 256}, {512}),
             "probe_rtt": ({256}, {256})}

CUBIC_BETA = 717  # tcp_cubic.c's beta, of 1024 (0.7)


def bbr_gains_match(mode: str, pacing_gain: float, cwnd_gain: float) -> bool:
    pacing, cwnd = BBR_GAINS[mode]
    return round(pacing_gain * 256) in pacing and round(cwnd_gain * 256) in cwnd


def cubic_reduction(wmax: int, ssthresh: int) -> bool:
    """Whether one window at a loss gives both, as cubictcp_recalc_ssthresh() computes them: W_max is that window
    (or, with fast convergence below the W_max before, (1 + beta) / 2 of it) and ssthresh beta of it, at least 2."""
    return any(max(cwnd * CUBIC_BETA // 1024, 2) == ssthresh and wmax in (cwnd, cwnd * (1024 + CUBIC_BETA) // 2048)
               for cwnd in range(wmax, 2 * wmax + 2))
