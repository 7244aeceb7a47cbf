"""Scenarios at their full durations, as a user types them (no --quick), and bulk flows that outlive a pipe.

These are the suite's slowest tests (about 10 minutes together on 2 cores): every built-in at its full
duration with one run and one algorithm set (l4s: its three; bbr-vs-cubic's flows last 60 s, and their reports
outgrow a pipe), and a bulk flow whose iperf3 client is killed.
Each checks the host afterwards with HostSnapshot, like the quick scenario tests."""

from __future__ import annotations

import bisect
import csv
import itertools
import os
import signal
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
from cchelpers import delay_lines_kept_time, undone
from ccscope.emulation.backends import tbf_params
from ccscope.scenario import results, spec
from ccscope.scenario.coupling import coupling_rows
from ccscope.scenario.emulated import late_share
from ccscope.units import parse_duration
from ccscope_testkit.kernel_cc import bbr_gains_match, cubic_reduction
from ccscope_testkit.prereqs import require_bpf_object, require_root, require_tools
from emulation_helpers import HostSnapshot

PIPE_CAPACITY = 65536  # Linux default

# Each built-in at full duration: --runs 1, one algorithm set (fairness keeps a competing pair). A test asserts
# that this covers every built-in.
BUILTINS = {
    "wired-vs-wireless": "cubic",
    "fast-vs-slow": "cubic",
    "bufferbloat": "cubic",
    "rate-size": "cubic",
    "fairness": "cubic+bbr",
    "pantheon-12mbit": "copa",  # ccscope's BPF Copa: no kernel has it
    "bbr-vs-cubic": "bbr+cubic",
    "l4s": "prague,cubic,prague+cubic",  # its point is the three runs side by side
}
# Built-ins whose profiles differ only in one knob run one profile at full length, as one shard of the plan:
# bbr-vs-cubic's five buffers at 65 s each would add 5.5 minutes to the suite (tests/test_bbr_vs_cubic.py
# runs two of them, short, and checks the shares move as the model says).
SHARDS = {"bbr-vs-cubic": "1/5"}

KILLED_CLIENT = """\
name: killed-client
description: one bulk flow of 12 s with ping under load, its iperf3 client killed
algorithms: [cubic]
duration: 12s
warmup: 3s
runs: 1
profiles:
  path: {rate: 20mbit, delay: 10ms, queue: 1bdp}
traffic:
  bulk: {flows: 1}
  ping: {interval: 100ms}
"""


@pytest.fixture(autouse=True)
def prerequisites():
    require_root()
    require_tools("iperf3", "ping", "ip", "tc", "ethtool", "ss", "iptables")
    require_bpf_object()


@pytest.fixture
def host():
    snapshot = HostSnapshot.take()
    yield
    snapshot.assert_unchanged()


def _scenario(ccscope_cmd: list[str], *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([*ccscope_cmd, "scenario", *args, "--listen", "off"], capture_output=True, text=True,
                          timeout=timeout)


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open() as fh:
        return list(csv.DictReader(fh))


class _Loss(NamedTuple):
    """A CUBIC loss as its state event and the telemetry's next sample show it."""
    wmax: int
    ssthresh: int  # the next sample's
    undone: bool  # the next sample's cwnd and ssthresh are not below the ones before: the reduction was undone


def _assert_state_explains(out: Path, doc: dict, run: dict) -> None:
    """A CUBIC or BBR flow's state CSV against the kernel's own formulas, on every full-length run: each loss's
    W_max and the ssthresh that the telemetry (equal to TCP_INFO) shows next come from one window, as
    cubictcp_recalc_ssthresh() computes them (all 115 losses of the six built-ins with CUBIC matched exactly,
    2026-11-26); BBR starts in startup, and every reading carries its mode's gains, as bbr_update_gains() sets them
    (all 524 of fairness and bbr-vs-cubic)."""
    for flow in run["flows"]:
        assert flow.get("state_csv"), flow  # every built-in's algorithms have a decoder (copa: ccscope's BPF one)
        if flow["algorithm"] == "prague":
            _assert_alpha_is_the_ce_fraction(out, flow, stalled=not delay_lines_kept_time(doc, run))
            continue
        if flow["algorithm"] not in ("cubic", "bbr"):
            continue  # tests/test_ccstate_bpf.py checks ccscope's own algorithms' state
        states = _rows(out / flow["state_csv"])
        if flow["algorithm"] == "bbr":
            modes = [r["mode"] for r in states if r["event"] == "change"]
            assert modes[0] == "startup" and all(a != b for a, b in itertools.pairwise(modes)), modes
            # before BBR's first ACK (no bandwidth sample yet) its gains are not set: 0, or 1 on 6.18
            moved = [r for r in states if float(r["bandwidth_Bps"]) > 0]
            assert moved and all(bbr_gains_match(r["mode"], float(r["pacing_gain"]), float(r["cwnd_gain"]))
                                 for r in moved), flow["state_csv"]
            continue
        every = _rows(out / flow["csv"])
        samples = [r for r in every if r["ssthresh_segments"]]
        times, every_time = [float(r["time_s"]) for r in samples], [float(r["time_s"]) for r in every]
        losses, last = [], 0
        for r in (r for r in states if r["event"] == "change"):
            wmax = int(r["wmax_segments"])
            if wmax and wmax != last and r["in_epoch"] == "0":  # set by a loss, which also ended the epoch
                # the first sample after it: the CSVs' times are rounded to 0.1 ms, and a sample of the same
                # rounded time may be of the segment before the loss (3 of 43 on the wireless path were)
                after = bisect.bisect_right(times, float(r["time_s"]))
                if after == len(samples):
                    continue  # the flow ended before a sample showed it
                at = bisect.bisect_right(every_time, float(r["time_s"]))
                kept = 0 < at < len(every) and undone(every[at - 1], every[at])
                losses.append(_Loss(wmax, int(samples[after]["ssthresh_segments"]), undone=kept))
            last = wmax
        assert losses or not flow["retransmits"], flow["state_csv"]
        # A reduction the kernel undid is gone by the next sample: cwnd not cut, and ssthresh back to at least the
        # one before (tcp_undo_cwnd_reduction: max(ssthresh, prior_ssthresh)). A busy host's delay spikes make
        # such needless retransmits. The kernel undoes on DSACK or on timestamps (tcp_packet_delayed: the ACK
        # echoes a time before the retransmit), and the latter leaves no DSACK to count: in 4d6a671's CI, one of
        # bbr-vs-cubic's losses (W_max 272, ssthresh 314 after it) was undone in a flow with no DSACK. In the
        # fresh-clone run of 2be9b69, 10 of 248 losses did not match, each one undone. A misread W_max instead
        # shows as a cut that does not fit it.
        unmatched = [loss for loss in losses if not cubic_reduction(loss.wmax, loss.ssthresh)]
        assert all(loss.undone for loss in unmatched), (flow["state_csv"], flow["spurious_retransmits"], losses)


def _assert_goodput_is_iperf3s(flow: dict, duration_s: float) -> None:
    """iperf3's receiver counts its bytes over a window bounded by control messages that cross the same
    queue, so the window is the sender's duration plus up to one loaded RTT at each end, and it is not always
    full of data: on fast-vs-slow's slow path (780 ms srtt p95) three runs gave 30.79 s with the link idle
    0.8 s of it (iperf3's rate 2.6 % under the link's), and 31.63 s, 31.65 s full (iperf3's rate right).
    Goodput from bytes_acked lies between the receiver's bytes over its own seconds and over the sender's
    duration: inside it in those six runs (at its low edge, within 0.01 %, on the fast path, whose receiver
    window is 39 ms longer), so 2 % either side is margin."""
    iperf = flow["iperf3"]
    received_bits = iperf["received_bytes"] * 8
    low, high = received_bits / iperf["received_seconds"], received_bits / duration_s
    low, high = min(low, high), max(low, high)
    assert low * 0.98 <= flow["goodput_bps"] <= high * 1.02, (flow["goodput_bps"], low, high, iperf)


def _csv_times(path: Path) -> list[float]:
    with path.open() as fh:
        return [float(row["time_s"]) for row in csv.DictReader(fh)]


def test_every_builtin_is_run_at_full_duration():
    assert set(BUILTINS) == set(spec.builtin_scenarios()) == set(CLAIMS)


@pytest.mark.parametrize("name", list(BUILTINS))
def test_builtin_at_full_duration(ccscope_cmd, tmp_path, host, name, machine_share):
    out = tmp_path / name
    shard = ["--shard", SHARDS[name]] if name in SHARDS else []
    res = _scenario(ccscope_cmd, name, "--runs", "1", "--algorithms", BUILTINS[name], *shard, "--out", str(out),
                    timeout=600)
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    doc = results.load(out)
    assert doc["errors"] == []
    sets = len(BUILTINS[name].split(","))  # one run per profile (of the shard) and algorithm set
    assert len(doc["runs"]) == (1 if shard else len(doc["profiles"]) * sets)
    traffic = doc["scenario"]["definition"]["traffic"]
    for run in doc["runs"]:
        assert run["errors"] == [], run["errors"]
        assert run["flows"] or not traffic.get("bulk", True)  # goodput for every run with bulk flows
        for flow in run["flows"]:
            assert flow["goodput_bps"] and flow["goodput_bps"] > 0
            _assert_goodput_is_iperf3s(flow, doc["scenario"]["duration_s"])
            assert flow["algorithm_ok"] is True
        _assert_every_report_kept(out, doc, run)
        _assert_state_explains(out, doc, run)
        if traffic.get("downloads"):
            assert run["downloads"] and all(d["error"] is None or "time limit" in d["error"]
                                            for d in run["downloads"])
            assert any(d["complete"] for d in run["downloads"])
        if traffic.get("ping"):
            assert run["ping"]["received"] > 0
    CLAIMS[name](doc, lambda: machine_share(this_test=True))
    drawn = [f for run in doc["runs"] for f in run["flows"] if f["algorithm"] in ("cubic", "bbr")]
    assert not drawn or (out / "plots" / "state.png").stat().st_size > 0
    # the queueing plot where an AQM's queue was measured (bufferbloat's cures), and only there
    measured = any("sojourn" in (run["link"].get("up") or {}) for run in doc["runs"])
    assert (out / "plots" / "queueing.png").exists() == measured == (name in ("bufferbloat", "l4s"))


# --- each built-in's own claim, on the full-length run the test pays for anyway ---------------------------------
# The numbers in the comments are one full run of each (2026-11-26, this 2-core VM); every bound is a property of
# the path (its rate, delay, loss, queue), with room for run-to-run spread, not a fit to that run.

PAYLOAD = 1448 / 1514  # TCP payload in a full Ethernet frame: what goodput can reach of a link's rate


def _runs(doc: dict) -> dict[str, dict]:
    return {run["profile"]: run for run in doc["runs"]}


# How far alpha's mean may be from the CE fraction taken one RTT at a time: quiet runs read 2-4 % apart; runs whose
# delay lines a busy machine stalled (machine_stalls) read -5 % to +12 % apart in three runs at 34-38 % steal, and
# +29 % in one whose delay lines released 42 % of its packets over 2 ms late (0.0161 against 0.0125): prague's
# windows, which end when the data of their start is acknowledged, stretch by the stalls and no longer match RTTs
# of time.
ALPHA_TOLERANCE = {False: 0.10, True: 0.40}  # by whether the run was stalled


def _assert_alpha_is_the_ce_fraction(out: Path, flow: dict, stalled: bool) -> None:
    """Prague's alpha (its BPF state) is its estimate of the fraction of its packets marked: the EWMA, window by
    window, of each window's delivered_ce / delivered. Its mean past the first fifth of the flow is held against
    the same fraction from the kernel's own counters (TCP_INFO, in the flow's CSV), taken over the same stretch
    one RTT (the stretch's median srtt) at a time and averaged with each RTT counting once, as alpha counts each
    window once. The whole flow's fraction, start-up included, was no oracle: 0.0377 against 0.0463 at 20 % steal
    (4ce7673's CI); nor was the stretch's fraction of packets at 38 % steal (0.0564 against alpha's 0.0468): a
    stall builds a queue, so a window after one is both marked more and longer. One RTT at a time, that run read
    0.0458, and 0.0386 against 0.0407 together; lab runs at 2 Mbit/s, -8 % to +9 %."""
    states = _rows(out / flow["state_csv"])
    settled = states[len(states) // 5:]
    assert len(settled) > 50, len(settled)
    start, end = float(settled[0]["time_s"]), float(settled[-1]["time_s"])
    samples = [r for r in _rows(out / flow["csv"]) if start <= float(r["time_s"]) <= end]
    assert len(samples) >= 2, (start, end)
    rtt_s = statistics.median(float(r["srtt_ms"]) for r in samples) / 1e3
    fractions, window_start = [], samples[0]
    for sample in samples[1:]:
        if float(sample["time_s"]) - float(window_start["time_s"]) >= rtt_s:
            delivered = int(sample["delivered_packets"]) - int(window_start["delivered_packets"])
            marked = int(sample["delivered_ce_packets"]) - int(window_start["delivered_ce_packets"])
            if delivered:
                fractions.append(marked / delivered)
            window_start = sample
    assert len(fractions) >= 20 and sum(fractions) > 0, fractions
    alpha = statistics.mean(float(r["alpha"]) for r in settled)
    ce_fraction = statistics.mean(fractions)
    assert alpha == pytest.approx(ce_fraction, rel=ALPHA_TOLERANCE[stalled]), (alpha, ce_fraction, flow["ce_fraction"])


def _claim_wired_vs_wireless(doc: dict, share: Callable[[], float]) -> None:
    """Seed 001: the lossy, jittery wireless path carries far less than the clean wired one, at a longer RTT,
    and its retransmits are its 1 % random loss (wired 47.8 Mbit/s, 16.5 ms ping; wireless 3.2 Mbit/s, 41.4 ms,
    1.16 % of segments sent again)."""
    runs, profiles = _runs(doc), doc["profiles"]
    wired, wireless = (runs[p]["flows"][0] for p in ("wired", "wireless"))
    assert wired["goodput_bps"] >= 0.9 * profiles["wired"]["up_rate_bps"] * PAYLOAD * share(), wired["goodput_bps"]
    assert wireless["goodput_bps"] < 0.5 * wired["goodput_bps"]
    assert runs["wireless"]["ping"]["rtt_ms"]["median"] >= profiles["wireless"]["base_rtt_s"] * 1e3 - 5  # ±5 ms jitter
    assert runs["wired"]["ping"]["rtt_ms"]["median"] < runs["wireless"]["ping"]["rtt_ms"]["median"]
    assert 0.005 <= wireless["retransmit_ratio"] <= 0.02 and wired["retransmit_ratio"] < 0.005


def _claim_fast_vs_slow(doc: dict, share: Callable[[], float]) -> None:
    """Seed 000: each path full at its own rate, and the slow one's delay an order above the fast one's (fast
    47.8 of 50 Mbit/s at a 36 ms ping, slow 0.96 of 1 Mbit/s at 714 ms behind its queue)."""
    runs, profiles = _runs(doc), doc["profiles"]
    for name in ("fast", "slow"):
        payload = profiles[name]["up_rate_bps"] * PAYLOAD
        # the token bucket's burst lets a window's goodput exceed the payload rate a little (test_scenario_run)
        assert 0.9 * payload * share() <= runs[name]["flows"][0]["goodput_bps"] <= 1.03 * payload, name
        assert runs[name]["ping"]["rtt_ms"]["median"] >= profiles[name]["base_rtt_s"] * 1e3, name
    assert runs["slow"]["ping"]["rtt_ms"]["median"] > 10 * runs["fast"]["ping"]["rtt_ms"]["median"]


def _claim_bufferbloat(doc: dict, share: Callable[[], float]) -> None:
    """Seed 004: the large queue's pings and downloads wait behind the bulk flow; the two-queue fix gives them
    the path's own RTT back at no cost to the bulk flow (pings 35 / 101 / 20.0 ms small, large, isolated;
    100 KB downloads' median 0.43 / 0.63 / 0.19 s; bulk 9.20-9.22 Mbit/s in all three), and CoDel nearly so."""
    runs = _runs(doc)
    ping = {p: runs[p]["ping"]["rtt_ms"]["median"] for p in runs}
    took = {p: statistics.median(d["completion_time_s"] for d in runs[p]["downloads"]) for p in runs}
    assert all(d["complete"] for run in runs.values() for d in run["downloads"])
    assert ping["large-queue"] > 2 * ping["small-queue"], ping
    assert ping["large-queue-isolated"] < 1.2 * doc["profiles"]["large-queue-isolated"]["base_rtt_s"] * 1e3, ping
    assert took["large-queue-isolated"] < 0.5 * took["large-queue"], took
    bulk = {p: runs[p]["flows"][0]["goodput_bps"] for p in runs}
    assert bulk["large-queue-isolated"] >= 0.95 * bulk["large-queue"], bulk
    # the fix leaves the bulk flow its own 100 packets (its srtt stays bloated: median 35 / 101 / 112 ms), and
    # the report's rows are the runs' (one run each)
    rows = {row["profile"]: row for row in doc["summary"]}
    srtt = {p: rows[p]["srtt_median_ms"]["mean"] for p in rows}
    assert min(srtt["large-queue"], srtt["large-queue-isolated"]) > 2 * srtt["small-queue"], srtt
    assert {p: rows[p]["ping_median_ms"]["mean"] for p in rows} == ping
    assert runs["large-queue-isolated"]["link"]["up"]["interactive_packets"] > 0
    assert all(d["algorithm_kernel"] == "cubic" for run in runs.values() for d in run["downloads"] if d["csv"])
    _claim_aqm_cures(doc, runs, ping, took, bulk)


def _claim_aqm_cures(doc: dict, runs: dict, ping: dict, took: dict, bulk: dict) -> None:
    """fq_codel and CoDel on the large queue (the delay line's; tests/test_aqm.py for their parts): pings
    20.4 and 23.9 ms against drop-tail's 106 (base 20), the delay line's sojourn median 3.2 and 4.5 ms,
    downloads 0.21 s against 0.73, bulk 8.87 and 8.95 Mbit/s against 9.20 (a short queue leaves the link idle
    now and then). fq_codel drops (the endpoints ask for no ECN): its 63 drops were the bulk flow's 54 and
    the downloads' 9 retransmitted segments; CoDel marking (ECN at both ends): 62 marks, 1 drop (a ping,
    which carries no mark), no retransmit; once 0 pings lost and 1 drop."""
    base_ms = doc["profiles"]["large-queue-fq-codel"]["base_rtt_s"] * 1e3
    assert doc["profiles"]["large-queue-fq-codel"]["aqm"]["up"] == {
        "name": "fq_codel", "target_s": 0.005, "interval_s": 0.1, "ecn": True, "implementation": "ccscope"}
    assert doc["profiles"]["large-queue-codel-ecn"]["ecn"] == "on"
    # the ping's own flow queue goes first; it waits as long as the delay lines ran late on average, both ways
    late_ms = sum(d["late_us"] / d["packets"] for d in runs["large-queue-fq-codel"]["link"].values()) / 1e3
    assert ping["large-queue-fq-codel"] < base_ms + 2 + late_ms, (ping, late_ms)
    for name in ("large-queue-fq-codel", "large-queue-codel-ecn"):
        up = runs[name]["link"]["up"]
        # the cure halves drop-tail's ping at least, and where the delay lines kept time it is within half the
        # path's RTT of it (CoDel-ECN's 32.8 ms against 98.4 at 26 % steal, 4879 of 25076 packets late)
        assert ping[name] < 0.5 * ping["large-queue"], ping
        if delay_lines_kept_time(doc, runs[name]):
            assert ping[name] < 1.5 * base_ms < ping["large-queue"], ping
        assert up["sojourn"]["median_ms"] < 10 and up["sojourn"]["count"] >= 0.99 * up["packets"], up
        assert took[name] < 0.5 * took["large-queue"], took
        assert bulk[name] >= 0.9 * bulk["large-queue"], bulk
    dropping, marking = runs["large-queue-fq-codel"], runs["large-queue-codel-ecn"]
    # every drop is a segment sent again or a lost ping (a pure ACK or a FIN could be neither: 3 is margin)
    drops = dropping["link"]["up"]["aqm_drops"] - (dropping["ping"]["sent"] - dropping["ping"]["received"])
    assert abs(_retransmits(dropping) - drops) <= 3 and drops > 0, (_retransmits(dropping), drops)
    up = marking["link"]["up"]
    assert up["aqm_marks"] > 0 and up["queue_drops"] == 0, up
    # CoDel drops only what carries no ECT: the pings, and now and then a SYN, a bare FIN or a pure ACK (Linux
    # sends those, and retransmits, as Not-ECT: RFC 3168 6.1.4-6.1.5). CI once saw 1 such drop beside 0 lost pings.
    assert up["aqm_drops"] <= marking["ping"]["sent"] - marking["ping"]["received"] + 2, up
    # a retransmit the kernel found needless (spurious_retransmits: its undo) is a stall's of the machine, not a
    # loss: 4 of 4 at 28 % steal
    assert _retransmits(marking) - _spurious(marking) <= 2, (_retransmits(marking), _spurious(marking))
    # the bulk flow negotiated ECN only where the profile asks for it, and was fed back marks (the count against
    # the kernel's own: tests/test_aqm.py)
    (flow,) = marking["flows"]
    assert flow["ecn"] == "ecn" and flow["delivered_ce_packets"] > 0 and 0 < flow["ce_fraction"] < 1, flow
    assert [f["ecn"] for f in dropping["flows"]] == ["off"] and dropping["flows"][0]["ce_fraction"] == 0


def _retransmits(run: dict) -> int:
    return sum(f["retransmits"] or 0 for f in [*run["flows"], *run["downloads"]])


def _spurious(run: dict) -> int:
    """The bulk flows' retransmits the kernel undid as needless (downloads carry no such count)."""
    return sum(f["spurious_retransmits"] or 0 for f in run["flows"])


def _claim_rate_size(doc: dict, share: Callable[[], float]) -> None:
    """Seed 002: no transfer beats its link (its frames beyond the shaper's burst, at the rate), and the ones the
    link alone cannot carry within the time limit are reported incomplete, the rest complete (1 MB at 1 Mbit/s:
    8.38 s for 8.34 s; 100 KB at 100 kbit/s 10.8 s for 8.13; 1 MB at 100 kbit/s needs 84 s of a 20 s limit)."""
    limit_s = parse_duration(doc["scenario"]["definition"]["traffic"]["downloads"]["timeout"], "timeout")
    for run in doc["runs"]:
        rate = doc["profiles"][run["profile"]]["up_rate_bps"]
        burst = tbf_params(rate, 0)["burst"]  # bytes the token bucket lets through at once
        for d in run["downloads"]:
            least_s = max(0.0, d["size_bytes"] / PAYLOAD - burst) * 8 / rate
            assert d["complete"] == (least_s < limit_s), (run["profile"], d)
            if d["complete"]:
                assert d["completion_time_s"] >= least_s, (run["profile"], d)


def _claim_fairness(doc: dict, share: Callable[[], float]) -> None:
    """CUBIC and BBR on a 2-BDP buffer: both keep a real share (cubic 0.36, bbr 0.64; Jain 0.92)."""
    [run] = doc["runs"]
    shares = {a: p["share"] for a, p in run["per_algorithm"].items()}
    assert sum(shares.values()) == pytest.approx(1.0) and min(shares.values()) >= 0.2, shares
    assert run["jain"] >= 0.75, run["jain"]


def _claim_pantheon_12mbit(doc: dict, share: Callable[[], float]) -> None:
    """Seed 003: Copa fills the link without the standing queue a loss-based algorithm builds in the 4-BDP
    buffer (11.5 of 12 Mbit/s at a 43 ms median srtt on the 40 ms path, where the full queue would add 160 ms)."""
    [run] = doc["runs"]
    [flow] = run["flows"]
    profile = doc["profiles"]["12mbit"]
    full_queue_ms = profile["queue_bytes"] * 8 / profile["up_rate_bps"] * 1e3
    assert flow["goodput_bps"] >= 0.85 * profile["up_rate_bps"] * PAYLOAD * share(), flow["goodput_bps"]
    assert flow["srtt_ms"]["median"] < profile["base_rtt_s"] * 1e3 + 0.25 * full_queue_ms, flow["srtt_ms"]


def _claim_bbr_vs_cubic(doc: dict, share: Callable[[], float]) -> None:
    """Its 16-BDP shard: CUBIC fills the deep buffer and takes most of the link from BBR (BBR's share 0.18;
    the model's 0.49 is an upper bound here), and the queue stands (ping 600 ms on a 40 ms path)."""
    [run] = doc["runs"]
    profile = doc["profiles"][run["profile"]]
    assert run["per_algorithm"]["bbr"]["share"] < 0.5, run["per_algorithm"]
    full_queue_ms = profile["queue_bytes"] * 8 / profile["up_rate_bps"] * 1e3
    assert run["ping"]["rtt_ms"]["median"] > profile["base_rtt_s"] * 1e3 + 0.5 * full_queue_ms, run["ping"]


# prague's packets counted as ECT(1) at the router over its segments' worth of bytes sent (analysis.ect1_share):
# 1.0003 alone and 1.0005 beside cubic in a full run (2026-12-02); a percent either way is the rewrite missing data
ECT1_SHARE = (0.99, 1.01)


def _claim_l4s(doc: dict, share: Callable[[], float]) -> None:
    """L4S end to end on this kernel: bpf prague (ECT(1) by the sender's egress, classic ECN feedback made exact by
    its receiver) in DualPI2's L queue (l4s_ect, RFC 9332's), cubic (Not-ECT) in its C queue, 50 Mbit/s, 20 ms.
    Until 2026-11-29 prague sent ECT(0) and the DualPI2 took any ECT into L (any_ect); these numbers are from then.
    Measured in 5 full runs
    (2026-11-27): prague alone 46.9 Mbit/s, L p99 1.12 ms, every mark the delay line made in its TCP_INFO
    delivered_ce (3546 and 3546); cubic alone 47.8 Mbit/s at a C median of 12.6 ms (the target is 15 ms); together
    prague/cubic 2.38, 2.20, 2.35, 1.92, that is 1.4-1.8 times what RFC 9332's coupling predicts for a Reno-like
    classic against a scalable flow (2 / (1.22 k) x RTT_C / RTT_L = 1.31-1.37): prague cuts once per CWR round,
    about 1.3 RTT here, so its window holds 2.6 / p_L, not 2 / p_L, while cubic held 1.22 / sqrt(p_C) within 8 %.
    Marks less the flows' delivered_ce: 0, 3, 2, 9 (iperf3's control connection runs prague too). After prague's
    review fixes (loss and CWR handling, cwnd down by the segments acked), 3 more runs: ratio/prediction 1.81,
    1.60, 1.42; marks less delivered_ce 17, 2, 4 alone (0.56 % at most) and 5, 3, 2 together. Since the delay
    line's DualPI2 gives L the first turn again whenever the link drains (as sch_dualpi2 under tbf does), two runs
    (2026-11-29) read 1.31 and 1.55."""
    runs = {run["algorithms"]: run for run in doc["runs"]}
    profile = doc["profiles"]["dualpi2"]
    payload = profile["up_rate_bps"] * PAYLOAD
    assert profile["aqm"]["up"]["ecn_mask"] == "l4s_ect" and profile["aqm"]["up"]["implementation"] == "ccscope"
    alone, classic, both = runs["prague"], runs["cubic"], runs["prague+cubic"]
    [prague] = alone["flows"]
    up = alone["link"]["up"]
    assert prague["ecn"] == "ecn", prague
    # prague's 1 ms of queue rides out no stall of the machine: 27.0 Mbit/s at 37 % steal
    if delay_lines_kept_time(doc, alone):
        assert prague["goodput_bps"] >= 0.9 * payload, prague
    assert up["sojourn_l"]["p99_ms"] <= 2.0 and up["sojourn_l"]["count"] >= 0.99 * up["packets"], up
    # within 1 % either way: the flow's delivered_ce once exceeded the marks by 1 (3022 against 3021); an ECE
    # ACK may cover a neighbour of the marked segment, and iperf3's control connection carries marks too. And
    # the ECT(1) ping shares the L queue's marks (120 pings, as likely marked as prague's packets: 5 % of them)
    assert abs(up["aqm_marks"] - prague["delivered_ce_packets"]) <= _marks_allowance(alone), (up, prague)
    # nothing dropped, so nothing sent again but what the kernel undid as needless (2 of 2 at 36 % steal)
    assert up["aqm_drops"] == up["queue_drops"] == 0, up
    assert prague["retransmits"] == prague["spurious_retransmits"], prague
    # the L queue served the packets that reached the router as ECT(1) and the ECT(1) pings, nothing else
    # (42566 = 42447 + 119 in one full run)
    assert up["sojourn_l"]["count"] == prague["ect1_packets"] + alone["ping_l4s"]["sent"], (up, prague)
    [cubic] = classic["flows"]
    assert cubic["ecn"] == "off" and cubic["goodput_bps"] >= 0.9 * payload * share(), cubic
    # the PI controller reads the delay line's lateness as queue and marks for it: 3.8-4.5 ms at 37 % steal
    if delay_lines_kept_time(doc, classic):
        assert 8 <= classic["link"]["up"]["sojourn"]["median_ms"] <= 20, classic["link"]["up"]
    # together: the L queue stays short beside the C queue's standing one, and the coupling shares the link
    flows = {f["algorithm"]: f for f in both["flows"]}
    up = both["link"]["up"]
    assert [flows["prague"]["ecn"], flows["cubic"]["ecn"]] == ["ecn", "off"], flows  # off: it left prague's ECN
    assert up["sojourn_l"]["p99_ms"] <= 2.0 and up["sojourn_c"]["median_ms"] >= 4 * up["sojourn_l"]["median_ms"], up
    assert abs(up["aqm_marks"] - flows["prague"]["delivered_ce_packets"]) <= _marks_allowance(both), up
    k = profile["aqm"]["up"]["coupling"]
    predicted = 2 / (1.22 * k) * flows["cubic"]["srtt_ms"]["mean"] / flows["prague"]["srtt_ms"]["mean"]
    ratio = flows["prague"]["goodput_bps"] / flows["cubic"]["goodput_bps"]
    assert 1.0 <= ratio / predicted <= 2.3, (ratio, predicted)  # measured 1.40-1.80
    assert sum(f["goodput_bps"] for f in flows.values()) >= 0.9 * payload * share(), flows
    # the report's coupling table (scenario/coupling.py) says the same of each run
    coupled = {row.algorithms: row for row in coupling_rows(doc)}
    together, scalable = coupled["prague+cubic"], coupled["prague"]
    assert together.balance == pytest.approx(ratio) and together.predicted == pytest.approx(predicted), together
    assert together.utilization == pytest.approx(sum(f["goodput_bps"] for f in flows.values()) / payload)
    assert scalable.balance is None and scalable.utilization == pytest.approx(prague["goodput_bps"] / payload)
    _l4s_pings(doc, runs, profile["base_rtt_s"] * 1e3)
    # the report's rows say what each negotiated and how much of it was marked
    rows = {(r["algorithms"], r["algorithm"]): r for r in doc["summary"]}
    assert rows["prague", "prague"]["ecn"] == "ecn" and rows["cubic", "cubic"]["ecn"] == "off"
    assert rows["prague", "prague"]["ce_fraction"]["mean"] == prague["ce_fraction"]
    assert "ce_fraction" not in rows["cubic", "cubic"] and "ce_fraction" not in rows["prague+cubic", "cubic"]
    # each of DualPI2's queues as the delay line measured it, and how much of prague's data reached it as ECT(1)
    assert rows["prague", "prague"]["l_queue_p99_ms"]["mean"] == alone["link"]["up"]["sojourn_l"]["p99_ms"]
    assert rows["prague+cubic", "cubic"]["c_queue_median_ms"]["mean"] == up["sojourn_c"]["median_ms"]
    for mix in ("prague", "prague+cubic"):
        assert ECT1_SHARE[0] <= rows[mix, "prague"]["ect1_share"]["mean"] <= ECT1_SHARE[1], rows[mix, "prague"]
    assert "ect1_share" not in rows["cubic", "cubic"] and "ect1_share" not in rows["prague+cubic", "cubic"]


def _marks_allowance(run: dict) -> float:
    """How far the L queue's marks may be from prague's delivered_ce: 1 %, and the ECT(1) pings' own marks at
    three times prague's CE fraction (4.7-5.1 %: 6 of 120 pings expected, 18 allowed)."""
    [prague] = [f for f in run["flows"] if f["algorithm"] == "prague"]
    return 0.01 * run["link"]["up"]["aqm_marks"] + 3 * prague["ce_fraction"] * run["ping_l4s"]["sent"]


QUIET_LATE_SHARE = 0.001  # of the link's packets: a tenth of the stall warning's share
BUCKET_HALF = 2 ** (1 / 8)  # a sojourn percentile is its histogram bucket's middle (emulation/sojourn.py)


def _l4s_pings(doc: dict, runs: dict[str, dict], base_ms: float) -> None:
    """A ping in each queue (traffic.ping.l4s), measured apart from the delay line's own sojourn counts: the
    ECT(1) one waits as long as the L queue's packets, the plain one as long as the C queue's, and beside cubic's
    standing C queue the ECT(1) ping passes it. Three full runs (2026-11-27): the ECT(1) ping's median less the
    path 0.2-0.8 ms, 0.08-0.33 ms above the L queue's median sojourn; the plain one's 13.9-15.1 ms beside cubic,
    12-19 % above the C queue's median (a histogram bucket's middle, within 9 %; the ping's own path adds ~1 ms).
    A ping also carries the time the machine did not run the delay lines, which they record (link late_releases,
    max_late_ms): in a CI run on a busy host cubic's L ping had a p95 5.7 ms above the path while the L queue's
    sojourn p99 was 0.23 ms, and in a run with 1.5 % of its packets late (up to 19 ms) the plain ping's median
    was 3.3 ms (44 %) above the C queue's. So the ECT(1) ping's tail may add each direction's longest lateness,
    and where the run has a stall warning (machine_stalls) the run says so. The medians are held to the queues'
    only where the delay lines released at most QUIET_LATE_SHARE of the packets late: a full suite's prague+cubic
    run, 658 of 55,327 (1.2 %; 0.8 % of both directions', under the warning's 1 %) late by up to 8 and 13 ms, had
    its plain ping's median 33 % above the C queue's; runs with none late read 1-19 %."""
    for label in ("cubic", "prague+cubic"):
        run = runs[label]
        up, plain, marked = run["link"]["up"], run["ping"]["rtt_ms"], run["ping_l4s"]["rtt_ms"]
        machine_ms = up["max_late_ms"] + run["link"]["down"]["max_late_ms"]
        assert marked["p95"] - base_ms <= 2.0 + machine_ms, (label, marked, machine_ms)
        # beside cubic's standing C queue the ECT(1) ping passes it; the C queue near its target where the delay
        # lines kept time (a plain ping 6.25 ms over the path at 28 % steal, where the controller marked for
        # the lateness)
        assert plain["median"] > marked["median"], (label, plain, marked)
        if delay_lines_kept_time(doc, run):
            assert plain["median"] - base_ms >= 8.0, (label, plain, marked)
        if late_share(*run["link"].values()) > QUIET_LATE_SHARE:
            continue
        assert abs(marked["median"] - base_ms - up["sojourn_l"]["median_ms"]) <= 0.5, (label, marked, up)
        # the plain ping samples the C queue in time, its sojourns are per packet: C's packets leave slower while
        # L takes the link, when C's queue is longest, so the ping's median sits above theirs, by 1-19 % in the
        # runs above, by 1-16 % in five prague+cubic runs (2026-12-02, late share 0.02-0.4 %) and by 34 % in one
        # beside them (late share under 0.1 %). So it is held inside the C queue's body: from the median's
        # bucket's lower edge to the p95's upper one (the buckets are 2^(1/4) wide, ~9 % each side of the middle)
        c_queue = up["sojourn_c"]
        assert c_queue["median_ms"] / BUCKET_HALF <= plain["median"] - base_ms <= c_queue["p95_ms"] * BUCKET_HALF, \
            (label, plain, up)
    rows = {(r["algorithms"], r["algorithm"]): r for r in doc["summary"]}
    assert rows["cubic", "cubic"]["ping_l4s_p95_ms"]["mean"] == runs["cubic"]["ping_l4s"]["rtt_ms"]["p95"]


CLAIMS = {"wired-vs-wireless": _claim_wired_vs_wireless, "fast-vs-slow": _claim_fast_vs_slow,
          "bufferbloat": _claim_bufferbloat, "rate-size": _claim_rate_size, "fairness": _claim_fairness,
          "pantheon-12mbit": _claim_pantheon_12mbit, "bbr-vs-cubic": _claim_bbr_vs_cubic, "l4s": _claim_l4s}


def _assert_every_report_kept(out: Path, doc: dict, run: dict) -> None:
    """Each flow's iperf3 report, BPF series and ping cover the whole duration, however large the reports grew."""
    duration_s = doc["scenario"]["duration_s"]
    for flow in run["flows"]:
        # at least the duration: the receiver's report also covers the queue's drain (31.6 s of a 30 s flow at 1 Mbit/s)
        assert flow["iperf3"]["received_seconds"] >= duration_s - 1, flow["iperf3"]
        times = _csv_times(out / flow["csv"])
        assert times[-1] - times[0] >= duration_s - 2, (flow["csv"], times[0], times[-1])
    if duration_s >= 60:  # ~3 KB of iperf3 report per second: these outgrow a pipe, the case that blocked before
        raw = sorted((out / "raw").glob("*/iperf3-client*.out"))
        assert raw and all(path.stat().st_size > PIPE_CAPACITY for path in raw), raw
    interval = doc["scenario"]["definition"]["traffic"].get("ping", {}).get("interval")
    if interval and run["flows"]:  # ping lasts as long as the bulk flows
        expected = duration_s / parse_duration(interval, "ping interval")
        assert run["ping"]["sent"] >= 0.9 * expected, (run["ping"], expected)


def _pid_writing_to(path: Path, deadline_s: float) -> int:
    """The process whose stdout is `path`: the iperf3 client of this test's run, not anyone else's."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    if os.readlink(f"/proc/{entry}/fd/1") == str(path):
                        return int(entry)
                except OSError:
                    pass
        time.sleep(0.1)
    raise AssertionError(f"no process writes to {path} within {deadline_s} s")


def _wait_written(pid: int, nbytes: int, deadline_s: float) -> None:
    """Until `pid` has written nbytes (its sockets included, /proc/PID/io wchar)."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        io = dict(line.split(": ") for line in Path(f"/proc/{pid}/io").read_text().splitlines())
        if int(io["wchar"]) >= nbytes:
            return
        time.sleep(0.1)
    raise AssertionError(f"process {pid} wrote less than {nbytes} bytes in {deadline_s} s")


def test_failed_bulk_flow_keeps_bpf_series_and_ping(ccscope_cmd, tmp_path, host):
    spec, out = tmp_path / "killed.yaml", tmp_path / "out"
    spec.write_text(KILLED_CLIENT)
    proc = subprocess.Popen([*ccscope_cmd, "scenario", "run", str(spec), "--out", str(out), "--listen", "off",
                             "--no-verify"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        client = _pid_writing_to(out / "raw" / "path_cubic_r1" / "iperf3-client0.out", deadline_s=60)
        _wait_written(client, 10_000_000, deadline_s=60)  # the flow has moved data: ~4 s at 20 Mbit/s
        os.kill(client, signal.SIGKILL)  # no JSON report from iperf3 now
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, stderr  # the run is complete, with an error in results
    assert "Traceback" not in stderr
    [run] = results.load(out)["runs"]
    assert any("iperf3 gave no JSON" in e for e in run["errors"]), run["errors"]
    assert len(run["errors"]) == 1, run["errors"]  # no "no telemetry", no algorithm mismatch
    [flow] = run["flows"]
    # the data connection, found by server port: seconds of a 20 Mbit/s flow, not the control connection
    assert flow["csv"] and flow["goodput_bps"] > 5e6
    times = _csv_times(out / flow["csv"])
    assert times[-1] - times[0] >= 4
    assert run["ping"]["received"] >= 50
