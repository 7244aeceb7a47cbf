"""Metric definitions of the scenario engine against hand-computed numbers (pure, fast)."""

from __future__ import annotations

import math

import pytest
from ccscope.bpf_types import RetransCause
from ccscope.scenario import analysis
from ccscope.scenario.document import RetransmitCauses


def test_percentile_interpolates_between_order_statistics():
    values = [4.0, 1.0, 3.0, 2.0, 5.0]  # sorted 1..5
    assert analysis.percentile(values, 50) == 3.0
    # p95: position (5-1)*0.95 = 3.8 -> 4 + 0.8*(5-4)
    assert analysis.percentile(values, 95) == pytest.approx(4.8)
    assert analysis.percentile(values, 0) == 1.0
    assert analysis.percentile(values, 100) == 5.0
    assert analysis.percentile([7.0], 95) == 7.0
    assert analysis.percentile([], 50) is None
    # even count median: position 1.5 -> 2 + 0.5*(3-2)
    assert analysis.percentile([1.0, 2.0, 3.0, 4.0], 50) == 2.5


def test_summary():
    s = analysis.summary([10.0, 20.0, 30.0, 40.0])
    assert s["mean"] == 25.0
    assert s["median"] == 25.0
    assert s["p95"] == pytest.approx(38.5)  # 3*0.95 = 2.85 -> 30 + 0.85*10
    assert (s["min"], s["max"], s["count"]) == (10.0, 40.0, 4)


def test_goodput_over_active_window_after_warmup():
    # 1 MB/s for 4 s, then nothing more acknowledged (flow idle until its close sample at t=6)
    times = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
    acked = [0, 1_000_000, 2_000_000, 3_000_000, 4_000_000, 4_000_000, 4_000_000]
    rate, start, end = analysis.goodput(times, acked, window_start_s=1.0)
    # window 1.0 .. 4.0 (last growth), 3 MB in 3 s = 8 Mbit/s; the idle tail does not dilute it
    assert (start, end) == (1.0, 4.0)
    assert rate == pytest.approx(8e6)
    # the warm-up start falls between samples: the first sample at or after it opens the window
    rate, start, _ = analysis.goodput(times, acked, window_start_s=1.5)
    assert start == 2.0
    assert rate == pytest.approx(2_000_000 * 8 / 2.0)
    assert analysis.goodput(times, acked, window_start_s=10.0)[0] is None
    assert analysis.goodput([0.0, 1.0], [5, 5], 0.0)[0] is None


def test_jain_index():
    assert analysis.jain([5.0, 5.0]) == pytest.approx(1.0)
    assert analysis.jain([10.0, 0.0]) == pytest.approx(0.5)  # one of two takes everything: 1/n
    # (1+2+3)^2 / (3 * (1+4+9)) = 36/42
    assert analysis.jain([1.0, 2.0, 3.0]) == pytest.approx(36 / 42)
    assert analysis.jain([3.0]) is None
    assert analysis.jain([0.0, 0.0]) is None


def test_mean_ci95_student_t():
    # 10, 12, 14: mean 12, s = 2, t(0.975, 2) = 4.303 -> 4.303 * 2 / sqrt(3) = 4.9687
    ci = analysis.mean_ci95([10.0, 12.0, 14.0])
    assert ci["mean"] == pytest.approx(12.0)
    assert ci["stdev"] == pytest.approx(2.0)
    assert ci["ci95"] == pytest.approx(4.303 * 2 / math.sqrt(3))
    assert ci["n"] == 3
    # two values 1, 3: mean 2, s = sqrt(2), t(0.975, 1) = 12.706 -> 12.706 * sqrt(2)/sqrt(2) = 12.706
    assert analysis.mean_ci95([1.0, 3.0])["ci95"] == pytest.approx(12.706)
    one = analysis.mean_ci95([5.0, None])
    assert (one["mean"], one["ci95"], one["n"]) == (5.0, None, 1)
    assert analysis.mean_ci95([])["mean"] is None
    assert analysis.t975(40) == 1.96


def test_retransmit_ratio_and_link_drops():
    # 10 retransmits among 1448000 bytes sent at MSS 1448 = 1000 segments -> 1 %
    assert analysis.retransmit_ratio(10, 1_448_000, 1448) == pytest.approx(0.01)
    assert analysis.retransmit_ratio(1, 0, 1448) is None
    link = {"up": {"packets": 990, "queue_drops": 6, "random_drops": 4}, "down": {}}
    assert analysis.link_drop_ratio(link) == pytest.approx(10 / 1000)


def test_windowed_throughput():
    times = [0.0, 0.1, 0.2, 0.3, 0.4]
    acked = [0, 12_500, 25_000, 37_500, 50_000]  # 125 kB/s = 1 Mbit/s
    out = analysis.windowed_throughput(times, acked, window_s=0.2)
    assert out[:2] == [None, None]
    assert out[2] == pytest.approx(1e6)
    assert out[4] == pytest.approx(1e6)


def test_goodput_over_a_common_window_adds_up_to_the_link():
    """Two flows on a link of 1000 B/s, the second starting 1 s later: alone, then halves, then alone.
    Over their own windows they get 667 B/s each (1333 summed, above the link); over the common window 500."""
    a_t = [0.0, 1.0, 3.0]
    a = [0, 1000, 2000]  # alone for 1 s, then half for 2 s, then done
    b_t = [1.0, 3.0, 4.0]
    b = [0, 1000, 2000]
    own = [analysis.goodput(a_t, a, 0.0), analysis.goodput(b_t, b, 1.0)]
    assert sum(rate for rate, _, _ in own) / 8 == pytest.approx(4000 / 3)
    window = analysis.common_window([(start, end) for _, start, end in own])
    assert window == (1.0, 3.0)
    rates = [analysis.window_goodput(a_t, a, window), analysis.window_goodput(b_t, b, window)]
    assert [r / 8 for r in rates] == [500.0, 500.0]
    # windows that do not overlap: their hull, and a flow outside part of it counts 0 there
    assert analysis.common_window([(0.0, 1.0), (2.0, 3.0)]) == (0.0, 3.0)
    assert analysis.window_goodput([2.0, 3.0], [0, 1000], (0.0, 3.0)) * 3 / 8 == pytest.approx(1000)
    assert analysis.common_window([]) is None


def test_a_reused_local_port_gives_the_data_connections_series() -> None:
    """The path check's iperf3 control connection (184 bytes, closed just before the run) and the run's data
    connection had the same local port; the run took the first series recorded, the wrong one."""
    from ccscope.sample import Sample
    from ccscope.scenario.emulated import bulk_series
    from ccscope.scenario.recorder import FlowSeries
    from ccscope.scenario.traffic import BulkFlow

    def sample(t: float, acked: int, event: int = 1) -> Sample:
        return Sample(t, 10, 0.04, 0, acked, acked, None, 0.04, 0, 0.0, "open", "cubic", event, 1448, 0, 0)

    check = FlowSeries(1, "192.0.2.2", 56674, "198.51.100.2", 5731, [sample(9.9, 184, event=3)])
    data = FlowSeries(2, "192.0.2.2", 56674, "198.51.100.2", 5201, [sample(10.0 + i, 400_000 * i) for i in range(20)])
    flow = BulkFlow(index=0, algorithm="cubic", port=5201, start_offset_s=0.0, local_port=56674)
    assert bulk_series(flow, {1: check, 2: data}) is data


def _l4s_run(mix: str, l_p99: float | None, c_median: float | None, flows: list[dict]) -> dict:
    up = {"sojourn": {"median_ms": 1.0, "p95_ms": 2.0}}
    up["sojourn_l"] = None if l_p99 is None else {"count": 10, "median_ms": 0.5, "p95_ms": 0.8, "p99_ms": l_p99}
    up["sojourn_c"] = None if c_median is None else {"count": 10, "median_ms": c_median, "p95_ms": 20.0,
                                                     "p99_ms": 22.0}
    per = {alg: {"goodput_bps": 1e6, "srtt_ms": {"mean": 20.0, "median": 20.0, "p95": 25.0},
                 "retransmit_ratio": 0.0, "algorithm_ok": True} for alg in mix.split("+")}
    return {"profile": "dualpi2", "algorithms": mix, "per_algorithm": per, "ping": None, "link": {"up": up},
            "jain": None, "flows": flows, "downloads": []}


def test_a_dualpi2_bottleneck_reports_each_queue_and_the_ect1_share() -> None:
    """The summary's L p99 and C median are the runs' own sojourns, averaged: prague alone leaves C empty (no
    value, not a zero), and cubic alone leaves L empty. ECT(1) is the router's count over the sender's data
    segments, only for flows that were rewritten."""
    from ccscope.scenario import summary

    prague = {"algorithm": "prague", "ecn": "ecn", "ce_fraction": 0.05, "segments_sent": 1000}
    cubic = {"algorithm": "cubic", "ecn": "off", "segments_sent": 1000}
    runs = [_l4s_run("prague", 0.9, None, [{**prague, "ect1_packets": 1000}]),
            _l4s_run("prague", 1.1, None, [{**prague, "ect1_packets": 990}]),
            _l4s_run("cubic", None, 14.0, [cubic]),
            _l4s_run("prague+cubic", 1.3, 15.0, [{**prague, "ect1_packets": 1002}, cubic])]
    rows = {(r["algorithms"], r["algorithm"]): r
            for r in analysis.summarize(runs, ["dualpi2"], ["prague", "cubic", "prague+cubic"])}
    alone = rows[("prague", "prague")]
    assert alone["l_queue_p99_ms"]["mean"] == pytest.approx(1.0) and alone["l_queue_p99_ms"]["n"] == 2
    assert alone["c_queue_median_ms"]["n"] == 0
    assert alone["ect1_share"]["mean"] == pytest.approx(0.995)
    assert rows[("cubic", "cubic")]["c_queue_median_ms"]["mean"] == 14.0
    assert "ect1_share" not in rows[("cubic", "cubic")]
    assert rows[("prague+cubic", "prague")]["ect1_share"]["mean"] == pytest.approx(1.002)
    assert "ect1_share" not in rows[("prague+cubic", "cubic")]
    assert rows[("prague+cubic", "cubic")]["l_queue_p99_ms"]["mean"] == 1.3  # the queue's, whoever's row

    doc = {"scenario": {"name": "l4s"}, "summary": list(rows.values()), "runs_per_unit": 2, "complete": True,
           "display_names": {}}
    header, *lines = summary.summary_table(doc).strip().splitlines()[1:]
    assert "L queue p99 ms" in header and "C queue p50 ms" in header and "ECT(1) %" in header
    assert "99.5" in lines[0]  # prague alone: its ECT(1) share, in percent


def test_a_link_without_dualpi2_has_no_queue_columns() -> None:
    run = _l4s_run("cubic", None, None, [{"algorithm": "cubic", "ecn": "off", "segments_sent": 10}])
    del run["link"]["up"]["sojourn_l"], run["link"]["up"]["sojourn_c"]
    (row,) = analysis.summarize([run], ["dualpi2"], ["cubic"])
    assert "l_queue_p99_ms" not in row and "c_queue_median_ms" not in row and "ect1_share" not in row


def test_the_results_causes_are_the_kernel_sides() -> None:
    """results.json's retransmits_by_cause has a key per cause the BPF side counts, named as Prometheus's label."""
    assert list(RetransmitCauses.__annotations__) == [cause.name.lower() for cause in RetransCause]
