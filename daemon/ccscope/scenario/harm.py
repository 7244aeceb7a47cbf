"""Who wins and who gets hurt when algorithms share a link: throughput share, harm against a solo baseline,
and the time the shares take to settle. Definitions (also in docs/scenarios.md):

- share: one algorithm's (or flow's) goodput over the sum of all goodputs over the same window.
- harm (Ware, Mukerjee, Seshan and Sherry, "Beyond Jain's Fairness Index: Setting the Bar for the Deployment
  of Congestion Control Algorithms", HotNets 2019): how much worse an algorithm does sharing the link than
  alone on the same path. For a metric where more is better (throughput): (solo - shared) / solo; where
  less is better (p95 RTT, retransmit ratio): (shared - solo) / shared. 0 is no harm, 1 the most; a
  negative value means it did better than alone. RFC 9743 asks new congestion controls to be judged so.
- convergence time: from the start of the run's common window (every flow past its warm-up), the first
  time after which every share, over 1 s bins, stays within +-0.10 (10 points of the link) of its final
  value; the final value is the share over the last FINAL_FRACTION of the window. None when the shares
  never settle (they still move in the final stretch). The band is absolute, not relative: BBR's 0.03-0.08
  share against CUBIC in a 16-BDP buffer moved by more than 10 % of itself from one second to the next
  all run long, so a relative band never settled where the split plainly had. The 1 s shares are first
  put through a running median of three bins (clamped at the ends), so one bin's excursion is not taken for
  a split still moving: BBR's PROBE_RTT (cwnd 4 for 200 ms every 10 s) took its 1 s share from 0.92 to 0.79
  against CUBIC in a 1-BDP buffer, and with that bin in the final fifth, a pair that had settled in its first
  second was once reported settling at 8 s of a 10 s window.

Jain's index and the 95 % intervals over runs are analysis.jain and analysis.mean_ci95.
"""

from __future__ import annotations

from collections.abc import Sequence

SETTLED = 0.10          # band around the final share, in share points (0.10 = 10 % of the link)
FINAL_FRACTION = 0.2    # the last fifth of the series defines the final shares


def shares(values: dict[str, float]) -> dict[str, float] | None:
    """{name: goodput} -> {name: fraction of the total}; None when the total is not positive."""
    total = sum(values.values())
    if total <= 0:
        return None
    return {name: value / total for name, value in values.items()}


def harm_more_is_better(solo: float | None, shared: float | None) -> float | None:
    """Throughput: (solo - shared) / solo."""
    if solo is None or shared is None or solo <= 0:
        return None
    return (solo - shared) / solo


def harm_less_is_better(solo: float | None, shared: float | None) -> float | None:
    """Delay, loss: (shared - solo) / shared."""
    if solo is None or shared is None or shared <= 0:
        return None
    return (shared - solo) / shared


def running_median3(values: Sequence[float]) -> list[float]:
    """Each value replaced by the median of itself and its two neighbours; at either end, of the three
    values nearest it."""
    n = len(values)
    if n < 3:
        return list(values)
    return [sorted(values[start:start + 3])[1] for start in (min(max(i - 1, 0), n - 3) for i in range(n))]


def convergence_time(times_s: Sequence[float], share_series: dict[str, Sequence[float]]) -> float | None:
    """The first time from which every name's share stays within SETTLED of its final share (see above)."""
    n = len(times_s)
    if n < 5 or any(len(s) != n for s in share_series.values()):
        return None
    share_series = {name: running_median3(s) for name, s in share_series.items()}
    tail = max(1, int(n * FINAL_FRACTION))
    final = {name: sum(s[-tail:]) / tail for name, s in share_series.items()}
    settled_from = 0
    for i in range(n):
        if any(abs(s[i] - final[name]) > SETTLED for name, s in share_series.items()):
            settled_from = i + 1
    if settled_from > n - tail:  # still moving inside the stretch that defines the final value
        return None
    return times_s[settled_from] - times_s[0]
