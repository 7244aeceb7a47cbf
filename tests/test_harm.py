"""The share, harm and convergence math on hand-computed fixtures, and Ware et al.'s BBR model against the
paper's own figures."""

from __future__ import annotations

import pytest
from ccscope.scenario import analysis, harm, models


def test_model_gives_the_published_shares_at_10mbit_40ms() -> None:
    """IMC 2019, BBR against CUBIC on 10 Mbit/s and 40 ms: 0.97, 0.78, 0.63, 0.55, 0.49 at 1..16 BDP."""
    published = {1: 0.97, 2: 0.78, 4: 0.63, 8: 0.55, 16: 0.49}
    for bdp, share in published.items():
        assert models.bbr_share(10e6, 0.040, bdp) == pytest.approx(share, abs=0.005), bdp


def test_model_by_hand_at_4_bdp() -> None:
    # c = 833.33 pkt/s, q = 4 x 33.33 = 133.33 pkt, q/c = 0.16 s: (1 - 0.345) x (1 - 0.40/10) = 0.6288
    assert models.bbr_share(10e6, 0.040, 4) == pytest.approx(0.655 * 0.96, rel=1e-9)


def test_more_bbr_flows_take_more_and_a_deeper_buffer_less() -> None:
    assert models.bbr_share(10e6, 0.04, 8, bbr_flows=4) > models.bbr_share(10e6, 0.04, 8, bbr_flows=1)
    shares = [models.bbr_share(10e6, 0.04, x) for x in (1, 2, 4, 8, 16)]
    assert shares == sorted(shares, reverse=True)
    with pytest.raises(ValueError):
        models.bbr_share(10e6, 0.04, 0)


def test_shares_and_jain() -> None:
    assert harm.shares({"bbr": 7.5, "cubic": 2.5}) == {"bbr": 0.75, "cubic": 0.25}
    assert harm.shares({"a": 0.0, "b": 0.0}) is None
    assert analysis.jain([7.5, 2.5]) == pytest.approx(100 / (2 * (56.25 + 6.25)))  # 0.8


def test_harm_both_directions() -> None:
    # cubic alone 9.5 Mbit/s, 2.5 beside bbr: (9.5 - 2.5) / 9.5
    assert harm.harm_more_is_better(9.5, 2.5) == pytest.approx(7 / 9.5)
    # p95 RTT 45 ms alone, 180 ms shared: (180 - 45) / 180 = 0.75
    assert harm.harm_less_is_better(45.0, 180.0) == pytest.approx(0.75)
    assert harm.harm_more_is_better(9.5, 10.0) < 0  # did better than alone
    assert harm.harm_more_is_better(0.0, 1.0) is None and harm.harm_less_is_better(1.0, None) is None


def test_convergence_time() -> None:
    times = [float(t) for t in range(20)]
    settles = {"bbr": [0.9] * 5 + [0.6] * 15, "cubic": [0.1] * 5 + [0.4] * 15}
    assert harm.convergence_time(times, settles) == 5.0
    within_band = {"bbr": [0.9, 0.8] + [0.62, 0.58] * 9, "cubic": [0.1, 0.2] + [0.38, 0.42] * 9}
    assert harm.convergence_time(times, within_band) == 2.0
    still_moving = {"bbr": [0.5] * 17 + [0.9] * 3, "cubic": [0.5] * 17 + [0.1] * 3}
    assert harm.convergence_time(times, still_moving) is None
    assert harm.convergence_time(times[:3], {"a": [1, 1, 1]}) is None
    # a small share that wobbles by more than 10 % of itself has still settled: the band is in share points
    small = {"bbr": [0.25, 0.2] + [0.05, 0.08, 0.03, 0.07] * 4 + [0.06, 0.05],
             "cubic": [0.75, 0.8] + [0.95, 0.92, 0.97, 0.93] * 4 + [0.94, 0.95]}
    assert harm.convergence_time(times, small) == 2.0  # medians 0.2, 0.2 are 0.14 off the final 0.06


def test_one_bin_excursion_is_not_a_split_still_moving() -> None:
    """A CI run's shallow BBR/CUBIC pair: BBR's PROBE_RTT (200 ms at cwnd 4) in the ninth of ten 1 s bins took
    its share from 0.92 to 0.70. Averaged into the final value, it made the settled pair 'settle' at 8 s."""
    times = [float(t) for t in range(10)]
    bbr = [0.73, 0.77, 0.82, 0.83, 0.85, 0.87, 0.91, 0.92, 0.70, 0.85]
    assert harm.convergence_time(times, {"bbr": bbr, "cubic": [1 - x for x in bbr]}) == 0.0
    assert harm.running_median3(bbr)[7:] == [0.91, 0.85, 0.85]
    assert harm.running_median3([0.5, 0.1, 0.9, 0.4]) == [0.5, 0.5, 0.4, 0.4]
    # three low bins in a row are a real move, not an excursion
    moved = [0.9] * 7 + [0.6] * 3
    assert harm.convergence_time(times, {"bbr": moved, "cubic": [1 - x for x in moved]}) == 7.0


def test_per_algorithm_shares_in_a_competing_run() -> None:
    def flow(alg: str, bps: float) -> dict:
        return {"algorithm": alg, "goodput_common_bps": bps, "retransmits": 0, "segments_sent": 10,
                "algorithm_ok": True}

    both = analysis.per_algorithm([flow("bbr", 6e6), flow("cubic", 3e6), flow("cubic", 1e6)], {}, ("bbr", "cubic"))
    assert (both["bbr"]["share"], both["cubic"]["share"]) == (0.6, 0.4)
    alone = analysis.per_algorithm([flow("cubic", 9e6)], {}, ("cubic",))
    assert "share" not in alone["cubic"]


def _run(mix: str, per: dict) -> dict:
    return {"profile": "p", "algorithms": mix, "per_algorithm": per, "ping": None, "link": {}, "jain": None,
            "flows": [], "downloads": []}  # a run's flows are in every results document


def _per(goodput: float, p95: float, ratio: float, share: float | None = None) -> dict:
    entry = {"goodput_bps": goodput, "srtt_ms": {"mean": p95, "median": p95, "p95": p95},
             "retransmit_ratio": ratio, "algorithm_ok": True}
    return entry if share is None else {**entry, "share": share}


def test_summary_reuses_solo_runs_as_the_baseline_of_harm() -> None:
    """cubic alone (9 Mbit/s, p95 40 ms, 1 % retransmits) and beside bbr (3 and 4 Mbit/s, 160 ms, 2 %): the
    solo runs the scenario already has are the baseline; no extra run is made."""
    runs = [_run("cubic", {"cubic": _per(9e6, 40.0, 0.01)}) for _ in range(2)]
    runs += [_run("cubic+bbr", {"cubic": _per(g, 160.0, 0.02, s), "bbr": _per(9e6 - g, 160.0, 0.0, 1 - s)})
             for g, s in ((3e6, 1 / 3), (4e6, 4 / 9))]
    rows = {(r["algorithms"], r["algorithm"]): r for r in analysis.summarize(runs, ["p"], ["cubic", "cubic+bbr"])}
    cubic = rows[("cubic+bbr", "cubic")]
    assert cubic["harm"]["throughput"]["mean"] == pytest.approx(((6 / 9) + (5 / 9)) / 2)
    assert cubic["harm"]["srtt_p95"]["mean"] == pytest.approx(0.75)  # (160 - 40) / 160
    assert cubic["harm"]["retransmit_ratio"]["mean"] == pytest.approx(0.5)
    assert cubic["harm"]["solo_runs"] == 2 and cubic["harm"]["throughput"]["n"] == 2
    assert cubic["share"]["mean"] == pytest.approx((1 / 3 + 4 / 9) / 2)
    assert "harm" not in rows[("cubic+bbr", "bbr")]  # bbr never ran alone here
    assert "share" not in rows[("cubic", "cubic")]
