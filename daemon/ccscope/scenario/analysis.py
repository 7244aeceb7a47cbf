"""Metrics over the recorded time series. Definitions (also in docs/scenarios.md):

- goodput: bytes the receiver acknowledged over the flow's active window after the warm-up, in bit/s.
  The window runs from the first sample at or after (flow start + warm-up) to the last sample at which
  bytes_acked grew (Pantheon: bits delivered over the flow's own active window).
- goodput of an algorithm, and of the run: bytes all its bulk flows had acknowledged over the run's common
  window × 8 / window length. The common window is where every flow's own window overlaps (all flows
  active, past their warm-up), or, if they do not overlap, from the earliest window start to the latest
  window end. One window for all: per-flow rates over windows that differ (flows start up to a second
  apart) do not add up, and summed to above the link's rate. Jain's index uses the same per-flow rates.
- RTT: mean, median and p95 of the kernel's smoothed RTT (srtt) samples in the same window; samples are
  spaced by the sample interval, so these are time-weighted. p95 uses linear interpolation between
  order statistics (numpy's default, "type 7").
- ping under load: mean, median, p95 of ping RTTs sent after the warm-up and before the bulk flows end.
- retransmit ratio: retransmitted segments / segments sent (bytes_sent / MSS) over the whole flow.
- Jain's index of n flows' goodputs: (Σx)² / (n·Σx²); 1 is a fair share, 1/n is one flow taking all.
- over runs: mean and a 95% confidence interval, mean ± t(0.975, n-1)·s/√n (Student t, s the sample
  standard deviation); no interval with one run.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Sequence

from . import harm, realpath, results
from .record import CommonWindow

# t(0.975, df) for df = 1..30; beyond 30 the normal 1.96 is within 2%.
_T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
         2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
         2.045, 2.042)


def percentile(values: Sequence[float], q: float) -> float | None:
    """q in 0..100, linear interpolation between closest ranks (numpy's default)."""
    if not values:
        return None
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)


def mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def summary(values: Sequence[float]) -> dict[str, float | None]:
    """mean, median, p95, min, max (None when empty)."""
    return {"mean": mean(values), "median": percentile(values, 50), "p95": percentile(values, 95),
            "min": min(values) if values else None, "max": max(values) if values else None,
            "count": len(values)}


def goodput(times_s: Sequence[float], acked: Sequence[int], window_start_s: float) -> tuple[float | None, float, float]:
    """(bit/s, window start, window end) of cumulative bytes_acked samples; None if under two samples."""
    first = next((i for i, t in enumerate(times_s) if t >= window_start_s), None)
    if first is None:
        return None, window_start_s, window_start_s
    last = first
    for i in range(first + 1, len(times_s)):
        if acked[i] > acked[i - 1]:
            last = i
    span = times_s[last] - times_s[first]
    if span <= 0:
        return None, times_s[first], times_s[last]
    return (acked[last] - acked[first]) * 8 / span, times_s[first], times_s[last]


def interpolate(times: Sequence[float], values: Sequence[float], t: float) -> float:
    """A cumulative counter at time t, linear between samples; before the first sample its first value,
    after the last its last."""
    if t <= times[0]:
        return float(values[0])
    if t >= times[-1]:
        return float(values[-1])
    hi = bisect.bisect_left(times, t)
    lo = hi - 1
    span = times[hi] - times[lo]
    if span <= 0:
        return float(values[hi])
    return values[lo] + (values[hi] - values[lo]) * (t - times[lo]) / span


def common_window(windows: Sequence[tuple[float, float]]) -> tuple[float, float] | None:
    """Where all (start, end) windows overlap; if they do not, their hull; None without a positive span."""
    if not windows:
        return None
    start, end = max(w[0] for w in windows), min(w[1] for w in windows)
    if end <= start:
        start, end = min(w[0] for w in windows), max(w[1] for w in windows)
    return (start, end) if end > start else None


def window_goodput(times_s: Sequence[float], acked: Sequence[int], window: tuple[float, float]) -> float:
    """bit/s a flow's cumulative bytes_acked grew by over `window` (0 outside the flow's own samples)."""
    start, end = window
    return (interpolate(times_s, acked, end) - interpolate(times_s, acked, start)) * 8 / (end - start)


def apply_common_window(t0: float, flows: list[tuple[dict, object | None]],
                        keep_own: bool = False) -> tuple[CommonWindow, tuple[float, float] | None]:
    """Each bulk flow's goodput over the run's one common window (`goodput_common_bps` of its entry), from
    (flow entry, its FlowSeries or None) pairs; the run's window with the goodput summed over it and Jain's
    index, and the window in monotonic time. keep_own: a flow without a series keeps its own goodput (a real
    path's receiver view, from iperf3's report); otherwise it has none."""
    window = common_window([(f["window_s"][0] + t0, f["window_s"][1] + t0) for f, s in flows
                            if s is not None and f.get("window_s") and f["goodput_bps"] is not None])
    for f, s in flows:
        if s is None or window is None:
            f["goodput_common_bps"] = f["goodput_bps"] if keep_own else None
        else:
            f["goodput_common_bps"] = window_goodput([x.t for x in s.samples], [x.bytes_acked for x in s.samples],
                                                     window)
    rates = [f["goodput_common_bps"] for f, _ in flows if f["goodput_common_bps"] is not None]
    relative = None if window is None else [round(window[0] - t0, 4), round(window[1] - t0, 4)]
    return CommonWindow(window_s=relative, goodput_bps=sum(rates) if rates else None, jain=jain(rates),
                        convergence_s=share_convergence(flows, window)), window


CONVERGENCE_BIN_S = 1.0  # shares are taken over 1 s bins: several RTTs, and CUBIC's sawtooth averages out


def share_convergence(flows: list[tuple[dict, object | None]], window: tuple[float, float] | None,
                      bin_s: float = CONVERGENCE_BIN_S) -> float | None:
    """A competing set's convergence time (harm.convergence_time) over the run's common window: each
    algorithm's share of the bytes acknowledged in every bin_s bin; None for one algorithm or too short a window."""
    by_alg: dict[str, list] = {}
    for f, s in flows:
        if s is not None and window is not None:
            by_alg.setdefault(f["algorithm"], []).append(s)
    bins = int((window[1] - window[0]) // bin_s) if window else 0
    if len(by_alg) < 2 or bins < 5:
        return None
    edges = [window[0] + i * bin_s for i in range(bins + 1)]
    acked = {alg: [sum(interpolate([x.t for x in s.samples], [x.bytes_acked for x in s.samples], e) for s in series)
                   for e in edges] for alg, series in by_alg.items()}
    per_bin = {alg: [b - a for a, b in itertools.pairwise(values)] for alg, values in acked.items()}
    totals = [sum(col) for col in zip(*per_bin.values(), strict=True)]
    if any(t <= 0 for t in totals):  # a bin in which nothing was acknowledged: no share to speak of
        return None
    shares = {alg: [x / t for x, t in zip(values, totals, strict=True)] for alg, values in per_bin.items()}
    return harm.convergence_time([e - window[0] for e in edges[:-1]], shares)


def jain(values: Sequence[float]) -> float | None:
    """Jain's fairness index (Σx)²/(n·Σx²); None for fewer than two flows or all zero."""
    if len(values) < 2:
        return None
    squares = sum(v * v for v in values)
    if squares == 0:
        return None
    return sum(values) ** 2 / (len(values) * squares)


def t975(df: int) -> float:
    if df < 1:
        raise ValueError("needs at least two samples")
    return _T975[df - 1] if df <= len(_T975) else 1.96


def mean_ci95(values: Sequence[float | None]) -> dict[str, float | int | None]:
    """{"mean", "ci95" (half width, None for one value), "n", "stdev"} of the non-None values."""
    xs = [v for v in values if v is not None]
    if not xs:
        return {"mean": None, "ci95": None, "n": 0, "stdev": None}
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return {"mean": m, "ci95": None, "n": 1, "stdev": None}
    s = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))
    return {"mean": m, "ci95": t975(len(xs) - 1) * s / math.sqrt(len(xs)), "n": len(xs), "stdev": s}


def retransmit_ratio(retransmits: int, bytes_sent: int, mss: int) -> float | None:
    if bytes_sent <= 0 or mss <= 0:
        return None
    return retransmits / (bytes_sent / mss)


def windowed_throughput(times_s: Sequence[float], acked: Sequence[int], window_s: float = 0.2) -> list[float | None]:
    """bit/s at each sample over the preceding `window_s` (against the latest sample at or before t - window);
    None until a full window has passed since the first sample."""
    out: list[float | None] = []
    j = 0
    for i, t in enumerate(times_s):
        while j + 1 < i and times_s[j + 1] <= t - window_s:
            j += 1
        if i == 0 or times_s[j] > t - window_s or t - times_s[j] <= 0:
            out.append(None)
            continue
        out.append((acked[i] - acked[j]) * 8 / (t - times_s[j]))
    return out


# --- per flow and per run ---------------------------------------------------------------------------


def empty_flow() -> dict:
    return {"algorithm_kernel": None, "cookie": None, "sport": None, "dport": None, "samples": 0,
            "goodput_bps": None, "goodput_common_bps": None, "window_s": None, "srtt_ms": summary([]),
            "retransmits": None, "spurious_retransmits": None, "retransmits_by_cause": None,
            "bytes_acked": None, "bytes_sent": None, "segments_sent": None, "retransmit_ratio": None,
            "ecn": None, "delivered_ce_packets": None, "ce_fraction": None}


def flow_metrics(series, warmup_s: float, t0: float) -> tuple[dict, list[float]]:
    """Metrics of one recorded flow (recorder.FlowSeries), times relative to the run start t0; and its srtt
    samples in ms within the measured window (pooled per algorithm by the caller)."""
    samples = series.samples
    times = [s.t for s in samples]
    acked = [s.bytes_acked for s in samples]
    rate, start, end = goodput(times, acked, times[0] + warmup_s)
    srtts = [s.srtt_s * 1e3 for s in samples if start <= s.t <= end and s.srtt_s > 0]
    last = samples[-1]
    return {"algorithm_kernel": series.cc, "cookie": series.cookie, "sport": series.sport, "dport": series.dport,
            "samples": len(samples), "goodput_bps": rate, "window_s": [round(start - t0, 4), round(end - t0, 4)],
            "srtt_ms": summary(srtts), "retransmits": last.retransmits,
            "spurious_retransmits": series.spurious_retransmits, "retransmits_by_cause": series.retransmits_by_cause,
            "bytes_acked": last.bytes_acked,
            "bytes_sent": last.bytes_sent,
            "segments_sent": last.bytes_sent / last.mss_bytes if last.mss_bytes else None,
            "retransmit_ratio": retransmit_ratio(last.retransmits, last.bytes_sent, last.mss_bytes),
            "ecn": series.ecn, "delivered_ce_packets": series.delivered_ce_packets,
            "ce_fraction": ce_fraction(series.delivered_ce_packets, series.delivered_packets)}, srtts


def ce_fraction(delivered_ce: int | None, delivered: int | None) -> float | None:
    """The share of delivered packets the peer fed back as CE-marked."""
    return delivered_ce / delivered if delivered_ce is not None and delivered else None


def _sojourn(run: dict, key: str) -> float | None:
    """The queueing delay at the data direction's bottleneck, where the delay line measured it (an AQM link)."""
    return ((run.get("link") or {}).get("up") or {}).get("sojourn", {}).get(key)


def link_drop_ratio(link: dict | None) -> float | None:
    """Drops at the emulated bottleneck of the data direction (its queue's limit, an AQM's, random loss) /
    packets offered to it. An AQM's marks are not drops."""
    if not link or "up" not in link:
        return None
    up = link["up"]
    drops = up.get("queue_drops", 0) + up.get("random_drops", 0) + up.get("aqm_drops", 0)
    offered = up.get("packets", 0) + drops
    return drops / offered if offered else None


def derive(doc: dict) -> None:
    """Everything a results document derives from its runs: the plan's bookkeeping (results.account), the
    summary rows in the document's order of profiles and algorithm sets, and what real paths measured.
    Called by whoever changes the runs (the runner after each run, merge, a rebuild from the journal);
    saving never calls it."""
    results.account(doc)
    doc["summary"] = summarize(doc["runs"], list(doc["profiles"]), list(doc["algorithms"]))
    if any(r.get("real") for r in doc["runs"]):
        doc["real_paths"] = realpath.summary(doc["runs"])


def summarize(runs: list[dict], profile_order: list[str], mix_order: list[str]) -> list[dict]:
    """One row per (profile, algorithm set, algorithm): means and 95% CIs over the runs, in the order of
    the profiles and of the algorithm sets ("cubic+bbr")."""
    groups: dict[tuple[str, str, str], list[tuple[dict, dict]]] = {}
    for run in runs:
        for alg, per in run["per_algorithm"].items():
            groups.setdefault((run["profile"], run["algorithms"], alg), []).append((run, per))
    rows = []
    for (profile, mix, alg), items in sorted(groups.items(), key=lambda kv: (
            profile_order.index(kv[0][0]) if kv[0][0] in profile_order else 99,
            mix_order.index(kv[0][1]) if kv[0][1] in mix_order else 99, kv[0][2])):
        def over(get, items=items) -> dict:
            return mean_ci95([get(run, per) for run, per in items])

        rows.append({
            "profile": profile, "algorithms": mix, "algorithm": alg, "runs": len(items),
            "goodput_bps": over(lambda r, p: p["goodput_bps"]),
            "srtt_mean_ms": over(lambda r, p: p["srtt_ms"]["mean"]),
            "srtt_median_ms": over(lambda r, p: p["srtt_ms"]["median"]),
            "srtt_p95_ms": over(lambda r, p: p["srtt_ms"]["p95"]),
            "ping_median_ms": over(lambda r, p: (r["ping"] or {}).get("rtt_ms", {}).get("median")),
            "ping_p95_ms": over(lambda r, p: (r["ping"] or {}).get("rtt_ms", {}).get("p95")),
            "queue_delay_median_ms": over(lambda r, p: _sojourn(r, "median_ms")),
            "queue_delay_p95_ms": over(lambda r, p: _sojourn(r, "p95_ms")),
            "retransmit_ratio": over(lambda r, p: p["retransmit_ratio"]),
            "link_drop_ratio": over(lambda r, p: link_drop_ratio(r.get("link"))),
            "jain": over(lambda r, p: r["jain"]),
            "downloads": _download_summary([d for run, _ in items for d in run["downloads"]
                                            if d["algorithm"] == alg]),
            "algorithm_ok": all(p["algorithm_ok"] for _, p in items),
        })
        _add_ecn(rows[-1], [f for run, _ in items for f in run["flows"] if f["algorithm"] == alg])
        _add_l4s_ping(rows[-1], [run for run, _ in items])
        _add_dualpi2_queues(rows[-1], [run for run, _ in items])
    _add_harm(rows, groups)
    return rows


def _add_l4s_ping(row: dict, runs: list[dict]) -> None:
    """The ECT(1) ping's RTT over the runs (traffic.ping.l4s), where they had one."""
    if any(run.get("ping_l4s") for run in runs):
        for stat in ("median", "p95"):
            row[f"ping_l4s_{stat}_ms"] = mean_ci95([(run.get("ping_l4s") or {}).get("rtt_ms", {}).get(stat)
                                                    for run in runs])


def _add_dualpi2_queues(row: dict, runs: list[dict]) -> None:
    """Where the data direction's bottleneck was a DualPI2 (its L queue counted apart): the L queue's p99 sojourn
    and the C queue's median, over the runs, each from the packets that queue served (a queue that served none in
    a run, as C beside prague alone, counts no value there)."""
    ups = [((run.get("link") or {}).get("up") or {}) for run in runs]
    if any("sojourn_l" in up for up in ups):
        row["l_queue_p99_ms"] = mean_ci95([(up.get("sojourn_l") or {}).get("p99_ms") for up in ups])
        row["c_queue_median_ms"] = mean_ci95([(up.get("sojourn_c") or {}).get("median_ms") for up in ups])


def ect1_share(flow: dict) -> float | None:
    """How much of an L4S sender's data reached the bottleneck as ECT(1): Testbed.send_ect1's count at the router
    over the flow's segments' worth of bytes sent (TCP_INFO's bytes_sent / MSS). Near 1, not exactly: iperf3's
    control connection to the port adds a few packets, a write's last short segment is a packet of its own, and
    retransmissions leave without ECN. None for a flow that was not rewritten."""
    if "ect1_packets" not in flow or not flow.get("segments_sent"):
        return None
    return flow["ect1_packets"] / flow["segments_sent"]


def _add_ecn(row: dict, flows: list[dict]) -> None:
    """What the algorithm's flows negotiated (`ecn`: "ecn", or "off/ecn" where runs differed) and, where any
    negotiated ECN, the fraction of their delivered packets fed back as CE, over the runs."""
    modes = sorted({f["ecn"] for f in flows if f.get("ecn")})
    if modes:
        row["ecn"] = "/".join(modes)
    if any(mode != "off" for mode in modes):
        row["ce_fraction"] = mean_ci95([f.get("ce_fraction") for f in flows])
    if any("ect1_packets" in f for f in flows):
        row["ect1_share"] = mean_ci95([ect1_share(f) for f in flows])


def _add_harm(rows: list[dict], groups: dict[tuple[str, str, str], list[tuple[dict, dict]]]) -> None:
    """Rows of a competing set get the algorithm's share and, where the scenario also ran the algorithm alone
    on the same profile, its harm against that solo baseline (harm.py), each with a 95 % CI over the runs."""
    solo = {(r["profile"], r["algorithm"]): r for r in rows if r["algorithms"] == r["algorithm"]}
    for row in rows:
        if "+" not in row["algorithms"]:
            continue
        items = groups[(row["profile"], row["algorithms"], row["algorithm"])]
        row["share"] = mean_ci95([per.get("share") for _, per in items])
        row["convergence_s"] = mean_ci95([run.get("convergence_s") for run, _ in items])
        base = solo.get((row["profile"], row["algorithm"]))
        if base is None:
            continue
        row["harm"] = {
            "throughput": mean_ci95([harm.harm_more_is_better(base["goodput_bps"]["mean"], per["goodput_bps"])
                                     for _, per in items]),
            "srtt_p95": mean_ci95([harm.harm_less_is_better(base["srtt_p95_ms"]["mean"], per["srtt_ms"]["p95"])
                                   for _, per in items]),
            "retransmit_ratio": mean_ci95([harm.harm_less_is_better(base["retransmit_ratio"]["mean"],
                                                                    per["retransmit_ratio"]) for _, per in items]),
            "solo_runs": base["runs"]}


def _download_summary(downloads: list[dict]) -> dict:
    by_size: dict[str, dict] = {}
    for size in sorted({d["size_bytes"] for d in downloads}):
        ds = [d for d in downloads if d["size_bytes"] == size]
        done = [d["completion_time_s"] for d in ds if d["complete"]]
        by_size[str(size)] = {"total": len(ds), "complete": len(done), "completion_time_s": mean_ci95(done),
                              "completion_time_median_s": percentile(done, 50)}
    return {"total": len(downloads), "complete": sum(d["complete"] for d in downloads), "by_size": by_size}


def per_algorithm(flows: list[dict], srtt_samples: dict[str, list[float]], mix: tuple[str, ...],
                  downloads: list[dict] | None = None) -> dict:
    """Per algorithm of one run: summed goodput of its bulk flows over the run's common window, RTT over
    the union of their srtt samples, retransmit ratio over all their segments."""
    out = {}
    for alg in dict.fromkeys(mix):
        mine = [f for f in flows if f["algorithm"] == alg]
        goodputs = [f["goodput_common_bps"] for f in mine if f.get("goodput_common_bps") is not None]
        retrans = sum(f["retransmits"] or 0 for f in mine)
        segments = sum(f["segments_sent"] or 0 for f in mine)
        dls = [d for d in downloads or [] if d["algorithm"] == alg]
        out[alg] = {
            "flows": len(mine),
            "goodput_bps": sum(goodputs) if goodputs else None,
            "srtt_ms": summary(srtt_samples.get(alg, [])),
            "retransmit_ratio": retrans / segments if segments else None,
            "algorithm_ok": all(f.get("algorithm_ok", False) for f in mine)
            and all(d["algorithm_kernel"] in (None, alg) for d in dls),
        }
    if len(out) > 1:  # a competing set: each algorithm's share of the run's goodput (harm.py)
        goodputs = {alg: entry["goodput_bps"] for alg, entry in out.items()}
        split = harm.shares(goodputs) if None not in goodputs.values() else None
        for alg, entry in out.items():
            entry["share"] = None if split is None else split[alg]
    return out
