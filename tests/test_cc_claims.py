"""ccscope's BPF Copa against the claims of its paper (Arun and Balakrishnan, NSDI 2018), and BPF Reno
against the kernel's reno as a control of the mechanism, on this kernel's emulated paths (userspace
backend here). Each scenario runs once per module, as a user runs it; the tests assert on its results
and its per-flow telemetry (cross-checked: iperf3 and the kernel agree on the algorithm, see
results.json's algorithm_ok). Runtime: about 2 minutes in all."""

from __future__ import annotations

import bisect
import statistics
import sys
from pathlib import Path

import pytest
from cchelpers import (
    flow_rows,
    flows_by_algorithm,
    mean_tolerance,
    queueing_delays_ms,
    require_cc_objects,
    run_scenario,
)
from ccscope_testkit.prereqs import require_tools

RATE_BPS = 12e6
PHASE_S = 3.0  # the rate-step trace: 12 Mbit/s, then 4 Mbit/s, this long each
GOODPUT_CEILING = 1448 / 1500  # payload share of a full-sized packet on the wire

DEEP_QUEUE = """
name: copa-deep-queue
description: Copa and cubic alone on 12 Mbit/s, 40 ms RTT, a 4-BDP queue
algorithms: [cubic, copa, [copa, copa]]
duration: 12s
warmup: 3s
runs: 1
seed: 7
profiles:
  deep: {rate: 12mbit, delay: 20ms, queue: 4bdp}
traffic:
  bulk: {flows: 1}
"""

STEPS = """
name: copa-rate-steps
description: Copa over a link that alternates 12 Mbit/s and 4 Mbit/s every 3 s
algorithms: [copa]
duration: 14s
warmup: 2s
runs: 1
seed: 7
profiles:
  steps: {trace: TRACE, delay: 20ms, queue: 200p}
traffic:
  bulk: {flows: 1}
"""

CONTROL = """
name: reno-control
description: BPF Reno (kfuncs only) against the kernel's reno, 20 Mbit/s, 40 ms RTT, 1 BDP queue
algorithms: [reno, bpf:reno]
duration: 10s
warmup: 2s
runs: 3
seed: 11
profiles:
  clean: {rate: 20mbit, delay: 20ms, queue: 1bdp}
traffic:
  bulk: {flows: 1}
"""


CCSCOPE = [sys.executable, "-m", "ccscope.cli"]  # as the ccscope_cmd fixture, for module-scoped runs


def _run(tmp_path_factory, text: str) -> tuple[Path, dict]:
    require_cc_objects()
    require_tools("iperf3", "ping", "tc")
    return run_scenario(CCSCOPE, tmp_path_factory.mktemp("cc-claims"), text)


@pytest.fixture(scope="module")
def deep(tmp_path_factory) -> tuple[Path, dict]:
    return _run(tmp_path_factory, DEEP_QUEUE)


@pytest.fixture(scope="module")
def steps(tmp_path_factory) -> tuple[Path, dict]:
    # Our own trace (Mahimahi format: one 1500-byte delivery opportunity per line, in ms): 12 Mbit/s
    # (one per ms) for 3 s, then 4 Mbit/s (one per 3 ms) for 3 s, looping.
    trace = tmp_path_factory.mktemp("trace") / "steps.trace"
    period_ms = int(2 * PHASE_S * 1000)
    times = [*range(1, period_ms // 2 + 1), *range(period_ms // 2 + 3, period_ms + 1, 3)]
    trace.write_text("".join(f"{t}\n" for t in times))
    return _run(tmp_path_factory, STEPS.replace("TRACE", str(trace)))


@pytest.fixture(scope="module")
def control(tmp_path_factory) -> tuple[Path, dict]:
    return _run(tmp_path_factory, CONTROL)


def _solo(doc: dict, algorithm: str) -> dict:
    [flow] = [f for run in doc["runs"] if run["algorithms"] == algorithm for f in run["flows"]]
    assert flow["algorithm_ok"], flow
    return flow


def test_copa_is_ccscopes_bpf_program(deep) -> None:
    _, doc = deep
    impl = doc["implementations"]["copa"]
    assert impl["implementation"] == "bpf" and len(impl["sha256"]) == 64
    assert doc["implementations"]["cubic"]["implementation"] == "kernel"
    assert _solo(doc, "copa")["algorithm_kernel"] == "copa"


def test_copa_fills_the_link_with_a_short_queue_where_cubic_fills_the_queue(deep, machine_share) -> None:
    out, doc = deep
    copa, cubic = _solo(doc, "copa"), _solo(doc, "cubic")
    copa_delay = statistics.median(queueing_delays_ms(flow_rows(out, copa)))
    cubic_delay = statistics.median(queueing_delays_ms(flow_rows(out, cubic)))
    assert copa["goodput_bps"] >= 0.85 * RATE_BPS * GOODPUT_CEILING * machine_share(), copa["goodput_bps"]
    assert copa_delay <= 10.0, copa_delay
    # The 4-BDP queue holds 160 ms; cubic keeps most of it full.
    assert cubic_delay >= 60.0 and cubic_delay >= 5 * copa_delay, (cubic_delay, copa_delay)


def test_two_copa_flows_share_fairly(deep, machine_share) -> None:
    _, doc = deep
    [run] = [r for r in doc["runs"] if r["algorithms"] == "copa+copa"]
    goodputs = [f["goodput_bps"] for f in run["flows"]]
    assert len(goodputs) == 2 and all(f["algorithm_ok"] for f in run["flows"])
    assert run["jain"] >= 0.95, goodputs
    assert sum(goodputs) >= 0.85 * RATE_BPS * GOODPUT_CEILING * machine_share(), goodputs


SPIKE_S = 0.1


def _fall_onsets(t: list[float], delay: list[float]) -> list[int]:
    """Where the link slowed down: the start of each climb of the queueing delay above 40 ms that stays above
    it for SPIKE_S and follows 0.5 s below 20 ms, but for at most a tenth of its samples. Shorter spikes are
    machine stalls, not the link: beside a CPU hog the samples stopped for 110 ms (7.00-7.11 s), and the
    delay line then released the held packets at once (26.5 ms for one sample), 0.26 s before a real fall to
    4 Mbit/s; in another run two such stalls at 12 Mbit/s read 60 and 67 ms, back under 40 ms within 15 ms,
    and were taken for falls. After a real fall the delay stays above 40 ms until Copa slows down (0.3 s
    and more)."""
    onsets: list[int] = []
    for i, d in enumerate(delay):
        held = delay[i:bisect.bisect_right(t, t[i] + SPIKE_S)]  # the samples of the next SPIKE_S (t ascends)
        if d <= 40.0 or t[i] + SPIKE_S > t[-1] or min(held) <= 40.0:
            continue
        start = i
        while start > 0 and delay[start - 1] >= 20.0:
            start -= 1
        before = [delay[j] for j in range(start) if t[start] - 0.5 <= t[j]]
        quiet = sum(d >= 20.0 for d in before) <= len(before) // 10
        if start not in onsets and t[start] - 0.5 >= t[0] and before and quiet:
            onsets.append(start)
    return onsets


def test_a_stall_of_the_machine_is_not_a_fall_of_the_link() -> None:
    """The shape of the failing run (samples every 12 ms): a 100 ms gap in the samples, then 60, 41, 28 ms of
    queueing delay back to 2 ms within 15 ms; later a real fall, the queue climbing to 80 ms and staying."""
    t = [1.0 + 0.012 * i for i in range(200)]
    delay = [2.0] * 200
    t[50:] = [x + 0.1 for x in t[50:]]  # the machine stopped for 100 ms
    delay[50:55] = [60.2, 40.9, 27.8, 21.7, 15.0]
    climb = [5.7, 11.7, 22.2, 33.4, 42.6, 52.5, 62.1, 68.8, 73.3, 77.3, 80.7, 82.2]
    delay[150:] = climb + [82.0] * (50 - len(climb))
    assert _fall_onsets(t, delay) == [152]  # the climb's start: its first sample at or above 20 ms


def test_copa_follows_rate_changes(steps, machine_share) -> None:
    out, doc = steps
    flow = _solo(doc, "copa")
    rows = [r for r in flow_rows(out, flow, warmup=False) if r["time_s"] >= 1.0]  # after slow start
    t = [r["time_s"] for r in rows]
    delay = queueing_delays_ms(rows)
    tput = [r.get("throughput_mbps", 0.0) for r in rows]
    # A fall to 4 Mbit/s shows as a queueing-delay spike (the queue builds until Copa slows down); the
    # rise back to 12 Mbit/s comes one half-period (3 s) after the fall.
    onsets = [i for i in _fall_onsets(t, delay) if t[i] + PHASE_S + 1.5 <= t[-1]]
    assert onsets, "no rate fall with a full cycle after it in the flow's samples"
    fall = onsets[0]
    drained = next(i for i in range(fall, len(t)) if all(d < 20.0 for d in delay[i:i + 25]))
    assert t[drained] - t[fall] <= 1.5, f"queue drained {t[drained] - t[fall]:.2f} s after the fall"
    rise_at = t[fall] + PHASE_S
    rose = next(i for i in range(len(t)) if t[i] >= rise_at and tput[i] >= 0.7 * 12 * GOODPUT_CEILING)
    assert t[rose] - rise_at <= 1.0, f"copa took {t[rose] - rise_at:.2f} s to take the link back"
    # At the low rate, between the changes, Copa did not overreact for good: the link stays mostly used.
    # (0.75, not the 0.85 of the steady test: the phase is short, and the userspace delay line jitters
    # on a busy machine, which a delay-based algorithm reads as queueing.)
    low = [tput[i] for i in range(len(t)) if t[fall] + 1.5 <= t[i] <= t[fall] + PHASE_S - 0.2]
    assert statistics.median(low) >= 0.75 * 4 * GOODPUT_CEILING * machine_share(), statistics.median(low)


def test_bpf_reno_matches_the_kernels_reno(control) -> None:
    """BPF Reno (kfuncs only) is the kernel's reno: their means over three runs agree within 5 %, or within
    what the runs' own spread allows (cchelpers.mean_tolerance, as the lab's fidelity tests). On a quiet
    machine all runs lie within 19.03-19.13 Mbit/s and 62.2-63.2 ms of mean srtt. Beside two busy loops the
    host's thefts moved single runs to 54-60 ms (bpf_reno 54.56 and 59.45, reno 62.77 and 60.09), and the
    medians of two runs each then differed by 7 %. Three runs each there: srtt 48.6-50.6 against 48.7-57.2 ms
    (means 4.8 ms apart, tolerance 24 ms). bpf_reno's means were the lower ones in three such sets, by 3-6 %;
    eight runs each beside the loops then read 18.49 (sd 0.27) against 18.31 Mbit/s (sd 0.71), srtt 57.7
    against 57.2 ms: no cost of the program's, which bench/cc.py puts at ~65 ns per ACK (~0.1 ms/s here)."""
    _, doc = control
    assert doc["implementations"]["bpf_reno"]["implementation"] == "bpf"
    assert doc["implementations"]["reno"]["implementation"] == "kernel"
    native, bpf = flows_by_algorithm(doc, "reno"), flows_by_algorithm(doc, "bpf_reno")
    assert len(native) == len(bpf) == 3 and all(f["algorithm_ok"] for f in native + bpf)
    for key in ("goodput_bps", "srtt_mean"):
        def value(f: dict, key: str = key) -> float:
            return f["goodput_bps"] if key == "goodput_bps" else f["srtt_ms"]["mean"]

        a, b = [value(f) for f in native], [value(f) for f in bpf]
        tolerance = mean_tolerance([a, b], a, b)
        assert abs(statistics.fmean(b) - statistics.fmean(a)) <= tolerance, (
            f"{key}: reno {sorted(a)}, bpf_reno {sorted(b)} (tolerance {tolerance:.4g})")
