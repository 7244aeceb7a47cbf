"""The pre-run path check: its model of an idle path (token buckets pass a lone ping at once) and a rate
probe that measures the saturated link. Checked on every built-in profile and at 1 Mbit/s, 400 ms RTT
with real namespaces, against the shaper's own counters."""

from __future__ import annotations

import bisect
import dataclasses
import itertools
import json
import math
import os
import re
import signal
import threading
import time
from pathlib import Path

import pytest
from ccscope.emulation import PathProfile, Testbed, pathcheck
from ccscope.emulation.backends import DELAYLINE, SHAPER_BUCKET_S, htb_class_params, tbf_params
from ccscope.errors import CcscopeError
from ccscope.scenario import spec
from ccscope.scenario.emulated import _link_delta, machine_stalls
from ccscope_testkit.prereqs import require, require_root, require_tools
from emulation_helpers import left_by


def profile(**data) -> PathProfile:
    return PathProfile.from_dict("p", data, "profiles.p")


def test_an_idle_token_bucket_adds_no_transmission_time():
    # before: 98-byte ping frames were charged 0.52 ms per direction at 1.5 Mbit/s (expected 21.05 ms)
    p = profile(rate="1.5mbit", delay="10ms")
    model = pathcheck.expected_rtt(p, pathcheck.ping_plan(p))
    assert model.expected_s == pytest.approx(0.020, abs=1e-9)
    assert model.tolerance_s == pytest.approx(0.02 * 0.020 + 0.0005)
    slow = profile(rate="1mbit", delay="200ms")
    assert pathcheck.expected_rtt(slow, pathcheck.ping_plan(slow)).expected_s == pytest.approx(0.400, abs=1e-9)


def test_bucket_waits_once_packets_outrun_the_burst():
    rate, burst = 8000.0, 3000  # 1000 bytes/s
    assert pathcheck.bucket_waits(rate, burst, 1000, [0.0, 0.0, 0.0]) == [0.0, 0.0, 0.0]
    waits = pathcheck.bucket_waits(rate, burst, 1000, [0.0] * 5)
    assert waits == pytest.approx([0, 0, 0, 1.0, 2.0])  # the 4th waits for 1000 bytes of tokens
    # a bucket refilled by idle time passes the next packet at once again
    assert pathcheck.bucket_waits(rate, burst, 1000, [0.0] * 4 + [10.0])[-1] == 0.0
    # the model uses the burst the backends install
    assert tbf_params(10e3, 15140)["burst"] >= 2 * 1514


@pytest.mark.parametrize("rate_bps", [1e6, 10e6, 50e6, 1e9])
def test_the_shaper_bucket_is_the_least_that_keeps_the_rate(rate_bps):
    """The bucket hides a sender's excess from the queue while it lasts: 4 ms (rate/HZ at HZ 250, what tbf needs),
    or two frames where that is more; 20 ms cost Copa a sixth of its goodput (backends.SHAPER_BUCKET_S,
    tests/test_cc_claims.py). htb's classes have the same bucket as tbf."""
    burst = tbf_params(rate_bps, 100_000)["burst"]
    assert burst * 8 / rate_bps == pytest.approx(max(0.004, 2 * 1514 * 8 / rate_bps), abs=1e-5)
    assert htb_class_params(rate_bps, rate_bps, 0)["cburst"] == burst


def test_jitter_widens_the_tolerance_and_spaces_the_pings():
    p = profile(rate="10mbit", delay="20ms", jitter="5ms")
    plan = pathcheck.ping_plan(p)
    assert plan.interval_s >= 2 * 0.005 and plan.count >= 30
    model = pathcheck.expected_rtt(p, plan)
    assert model.expected_s == pytest.approx(0.040)
    assert 0.0025 < model.tolerance_s - (0.02 * 0.040 + 0.0005) < 0.005


def test_trace_link_waits_for_the_next_opportunity(tmp_path):
    trace = tmp_path / "t.trace"
    trace.write_text("10\n20\n")  # an opportunity every 10 ms
    p = profile(delay="5ms", up={"trace": str(trace)})
    model = pathcheck.expected_rtt(p, pathcheck.ping_plan(p))
    assert model.expected_s == pytest.approx(0.010 + 0.005)  # on average half a gap
    plan = pathcheck.rate_plan(p)
    assert plan is not None
    assert plan.expected_bps == pytest.approx(1.2e6 * 1514 / 1500)  # 1500 IP bytes per opportunity


def test_a_varying_trace_is_checked_against_the_rates_it_spans(tmp_path):
    """12 Mbit/s for 3 s, then 4 Mbit/s for 3 s: a one-second probe sees one phase, never the 8 Mbit/s mean
    (a CPU-hogged run measured 12.08 Mbit/s and was called OFF against the mean)."""
    trace = tmp_path / "steps.trace"
    trace.write_text("".join(f"{t}\n" for t in [*range(1, 3001), *range(3003, 6001, 3)]))
    plan = pathcheck.rate_plan(profile(delay="20ms", up={"trace": str(trace), "queue": "200p"}))
    assert plan is not None
    frames = plan.expected_bps / 8e6  # wire bytes per IP byte (the mean is 8 Mbit/s of IP bytes)
    assert plan.lowest_bps == pytest.approx(4e6 * frames, rel=0.01)
    assert plan.highest_bps == pytest.approx(12e6 * frames, rel=0.01)
    assert plan.accepts(12.08e6 * frames) and plan.accepts(4e6 * frames)
    assert not plan.accepts(13e6 * frames) and not plan.accepts(3.7e6 * frames)
    outage = tmp_path / "outage.trace"  # 12 Mbit/s for 3 s, then nothing for 3 s (a cellular trace's gap)
    outage.write_text("".join(f"{t}\n" for t in [*range(1, 3001), 6000]))
    plan = pathcheck.rate_plan(profile(delay="20ms", up={"trace": str(outage), "queue": "200p"}))
    assert plan is not None and plan.lowest_bps == 0 and plan.accepts(0.5e6)
    steady = tmp_path / "steady.trace"
    steady.write_text("".join(f"{t}\n" for t in range(1, 101)))
    plan = pathcheck.rate_plan(profile(delay="20ms", up={"trace": str(steady)}))
    assert plan is not None and plan.lowest_bps is None and plan.highest_bps is None
    assert plan.accepts(plan.expected_bps * 1.02) and not plan.accepts(plan.expected_bps * 1.04)


def test_rate_probe_is_long_enough_at_low_rates_and_long_rtts():
    slow = pathcheck.rate_plan(profile(rate="1mbit", delay="200ms"))
    assert slow is not None and slow.frame_bytes == 1514
    assert slow.window_s >= 40 * 1514 * 8 / 1e6 and slow.startup_s > 6 * 0.4
    tiny = pathcheck.rate_plan(profile(rate="10kbit", delay="10ms"))
    assert tiny is not None and tiny.frame_bytes == 100 and tiny.payload_bytes == 58
    assert tiny.window_s == pytest.approx(40 * 100 * 8 / 10e3)
    assert pathcheck.rate_plan(profile(delay="10ms")) is None


def samples(rate_bps: float, seconds: float, poll: float = 0.005, read: float = 0.0005, t: float = 1.0,
            tx: int = 1000, frame: int = 0, backlog: int = 3000) -> list[pathcheck.Sample]:
    """What the probe reads from a saturated link: the counter, in whole frames when frame is set."""
    out = []
    for i in range(int(seconds / poll) + 1):
        ti = t + i * poll
        sent = rate_bps / 8 * (i * poll + read / 2)
        out.append(pathcheck.Sample(ti, ti + read, tx + (int(sent // frame) * frame if frame else int(sent)),
                                    backlog))
    return out


# burst / rate: at 1 Mbit/s as backends installs it; at 10 Mbit/s the 4 ms the recorded and modelled stalls
# were taken with (backends.SHAPER_BUCKET_S)
BUCKET_1MBIT, BUCKET_10MBIT = 3028 * 8 / 1e6, 5001 * 8 / 10e6


def test_saturated_rate_uses_the_longest_backlogged_run():
    busy = samples(1e6, 2.0)
    idle = [pathcheck.Sample(3.02, 3.021, busy[-1].tx_bytes, 0)]  # the sender stalled: the link ran dry
    short = samples(5e6, 0.1, t=3.1, tx=busy[-1].tx_bytes)  # faster, but only 0.1 s
    fit = pathcheck.saturated_rate(busy + idle + short, 1.0, BUCKET_1MBIT)
    assert fit.rate_bps == pytest.approx(1e6, rel=1e-3) and fit.seconds == pytest.approx(2.0, abs=0.06)
    assert fit.uncertainty < pathcheck.MAX_UNCERTAINTY and fit.left_out_s == 0
    assert pathcheck.saturated_rate(busy[:150] + idle + short, 1.0, BUCKET_1MBIT) is None


def test_saturated_rate_on_a_staircase_and_with_slow_readings():
    # 10 kbit/s in 100-byte frames, sampled every 5 ms: a step every 80 ms
    fit = pathcheck.saturated_rate(samples(10e3, 3.2, frame=100), 3.0, 3028 * 8 / 10e3)
    assert fit.rate_bps == pytest.approx(10e3, rel=0.005) and fit.uncertainty < pathcheck.MAX_UNCERTAINTY
    # readings that take 50 ms (a busy machine): the rate is still right, and says how uncertain it is
    slow = pathcheck.saturated_rate(samples(10e6, 1.0, poll=0.055, read=0.05), 1.0, BUCKET_10MBIT)
    assert slow.rate_bps == pytest.approx(10e6, rel=0.06) and slow.uncertainty > 5 * pathcheck.MAX_UNCERTAINTY


def tbf_departures(rate_bps: float, burst: int, frame: int, until: float,
                   stalls: list[tuple[float, float]] = ()) -> list[float]:
    """When each frame of an always-full queue leaves a token bucket that cannot run during `stalls`
    [(start, end)]: it keeps at most `burst` of the tokens it could not spend, as tbf does."""
    bytes_per_s, t, tokens, out = rate_bps / 8, 0.0, float(frame), []
    while t < until:
        depart = t + max(0.0, frame - tokens) / bytes_per_s
        stall = next((st for st in stalls if st[0] <= depart < st[1]), None)
        if stall is not None:
            tokens, t = min(burst, tokens + (stall[1] - t) * bytes_per_s), stall[1]
            continue
        tokens, t = min(burst, tokens + (depart - t) * bytes_per_s) - frame, depart
        out.append(t)
    return out


def read_counter(departures: list[float], frame: int, seconds: float, absent: list[tuple[float, float]] = (),
                 poll: float = 0.0012, read: float = 0.0001) -> list[pathcheck.Sample]:
    """The probe's readings of the egress counter every `poll` s, none while it is `absent` [(start, end)]."""
    out, t = [], 0.05
    while t < seconds:
        if not any(a <= t < b for a, b in absent):
            sent = bisect.bisect_right(departures, t + read / 2) * frame
            out.append(pathcheck.Sample(t, t + read, sent, 20 * frame))
        t += poll
    return out


def test_a_stall_of_the_machine_is_left_out_not_charged_to_the_link():
    # As measured (see pathcheck's module doc): the machine stopped the shaper for about 45 ms and the
    # probe for 66.5 ms, and a 1 s window of the 10 Mbit/s link read 9.57 Mbit/s.
    frame, burst = 1514, 5001
    sent = tbf_departures(10e6, burst, frame, 1.3, stalls=[(0.500, 0.545)])
    readings = read_counter(sent, frame, 1.25, absent=[(0.490, 0.5565)])
    before = pathcheck.saturated_rate(readings, 1.0, math.inf)  # no stall left out: what it read before
    assert before.rate_bps == pytest.approx(9.6e6, rel=0.01)
    fit = pathcheck.saturated_rate(readings, 1.0, BUCKET_10MBIT)
    assert fit.rate_bps == pytest.approx(10e6, rel=0.002) and fit.uncertainty < pathcheck.MAX_UNCERTAINTY
    assert 0.066 < fit.left_out_s < 0.066 + 3 * BUCKET_10MBIT and fit.covered_s >= 1.0


def with_steal(readings: list[pathcheck.Sample], thefts: list[tuple[float, float]],
               every: float = 0.02) -> list[pathcheck.Sample]:
    """The readings with /proc/stat's steal read every `every` s: each (end, seconds) of `thefts` is
    accounted at the first steal reading after its end, as the kernel does when the CPU runs again."""
    out, due, read_at = [], list(thefts), -math.inf
    for s in readings:
        if s.t0 - read_at >= every:
            stolen = sum(sec for end, sec in due if end <= s.t0)
            due = [(end, sec) for end, sec in due if end > s.t0]
            s, read_at = dataclasses.replace(s, stolen_s=stolen), s.t0
        out.append(s)
    return out


def test_a_cpu_the_host_took_is_left_out_though_the_probe_kept_reading():
    # As measured beside two busy loops: the host took one CPU for 100 ms (10 ticks of steal), the shaper's
    # timer was on it and a 1 s window read 9.04 Mbit/s, while the probe on the other CPU read every 1-11 ms.
    frame, burst = 1514, 5001
    sent = tbf_departures(10e6, burst, frame, 1.4, stalls=[(0.500, 0.600)])
    readings = read_counter(sent, frame, 1.35)
    assert pathcheck.saturated_rate(readings, 1.0, BUCKET_10MBIT).rate_bps < 0.95 * 10e6  # no gap to see
    fit = pathcheck.saturated_rate(with_steal(readings, [(0.600, 0.100)]), 1.0, BUCKET_10MBIT)
    assert fit.rate_bps == pytest.approx(10e6, rel=0.002) and fit.uncertainty < pathcheck.MAX_UNCERTAINTY
    assert 0.1 < fit.left_out_s < 0.1 + 0.02 + 3 * BUCKET_10MBIT and fit.covered_s >= 1.0
    # a link that is slow stays slow with the theft left out; a theft the bucket bridges stays in
    slow = read_counter(tbf_departures(9.5e6, burst, frame, 1.4, stalls=[(0.5, 0.6)]), frame, 1.35)
    assert pathcheck.saturated_rate(with_steal(slow, [(0.6, 0.1)]), 1.0,
                                    BUCKET_10MBIT).rate_bps == pytest.approx(9.5e6, rel=0.003)
    bridged = pathcheck.saturated_rate(with_steal(readings, [(0.9, 0.01)]), 1.0, BUCKET_10MBIT)
    assert bridged.left_out_s == 0


def test_recorded_false_alarms_read_the_link_rate_once_stalls_are_left_out():
    # Three probes that failed on the shared VM (9.64 and 9.44 of 10, 19.17 of 20 Mbit/s): each had a
    # 57-98 ms gap in its own readings while SCHED_FIFO 99 threads on both CPUs were late by up to 97 ms.
    recorded = json.loads((Path(__file__).parent / "data" / "pathcheck-stalls.json").read_text())["probes"]
    bucket_s = SHAPER_BUCKET_S
    for probe in recorded:
        plan = pathcheck.rate_plan(PROFILES[probe["profile"]])
        readings = [pathcheck.Sample(t0 / 1e6, t1 / 1e6, tx, backlog) for t0, t1, tx, backlog in probe["samples"]]
        assert pathcheck.saturated_rate(readings, plan.window_s, math.inf).rate_bps < 0.97 * plan.expected_bps
        # the probe stopped at 1 s; with the stall left out it would have read on, so there is too little
        assert pathcheck.saturated_rate(readings, plan.window_s, bucket_s) is None
        fit = pathcheck.saturated_rate(readings, 0.8, bucket_s)
        assert fit.rate_bps == pytest.approx(plan.expected_bps, rel=0.005), probe["profile"]
        assert 0.05 < fit.left_out_s < 0.2


def test_gaps_that_were_only_the_probes_are_fitted_whole():
    # Recorded in the lab (qemu TCG): the probe away for 25-41 ms seven times a second while the link kept
    # 1 Mbit/s; leaving each gap out (the bucket bridges 24 ms) summed to ±2-12 %, "too busy". The link kept its
    # pace over each, so none is a stall.
    recorded = json.loads((Path(__file__).parent / "data" / "pathcheck-lab-gaps.json").read_text())
    plan = pathcheck.rate_plan(profile(**recorded["profile"]))
    for probe in recorded["probes"]:
        readings = [pathcheck.Sample(t0 / 1e6, t1 / 1e6, tx, backlog) for t0, t1, tx, backlog in probe["samples"]]
        run = max(_backlogged_runs(readings), key=len)
        assert sum(b.t0 - a.t1 > plan.bucket_s for a, b in itertools.pairwise(run)) >= 5  # gaps, each cut before
        fit = pathcheck.saturated_rate(readings, plan.window_s, plan.bucket_s)
        assert fit.rate_bps == pytest.approx(1e6, rel=0.002) and fit.uncertainty <= pathcheck.MAX_UNCERTAINTY
        assert fit.left_out_s == 0 and fit.covered_s > 3.5
    # the same gaps where the machine stopped the link too (each costs 11-17 ms beyond the bucket): whole,
    # the run reads 5 % slow, so the gaps stay out and the rate is honestly unknown, never 0.95 Mbit/s
    frame, gaps = 1514, [(0.1 + 0.14 * i, 0.1 + 0.14 * i + 0.035 + 0.006 * (i % 2)) for i in range(28)]
    stalled = read_counter(tbf_departures(1e6, 3028, frame, 4.2, stalls=gaps), frame, 4.1, absent=gaps)
    fit = pathcheck.saturated_rate(stalled, 1.0, BUCKET_1MBIT)
    assert fit.uncertainty > pathcheck.MAX_UNCERTAINTY and fit.left_out_s > 1.0
    assert pathcheck._split_rate(stalled, math.inf).rate_bps < 0.97e6
    # only the probe away, the link running: taken whole, exactly
    kept = read_counter(tbf_departures(1e6, 3028, frame, 4.2), frame, 4.1, absent=gaps)
    fit = pathcheck.saturated_rate(kept, 1.0, BUCKET_1MBIT)
    assert fit.rate_bps == pytest.approx(1e6, rel=0.002) and fit.uncertainty <= pathcheck.MAX_UNCERTAINTY


def _backlogged_runs(readings: list[pathcheck.Sample]) -> list[list[pathcheck.Sample]]:
    runs: list[list[pathcheck.Sample]] = [[]]
    for r in readings:
        if r.backlog:
            runs[-1].append(r)
        else:
            runs.append([])
    return runs


def test_a_link_that_stalls_while_the_probe_runs_reads_slow():
    # Only the probe's own absence is left out: a shaper that stops while the probe watches is the link.
    frame, burst = 1514, 5001
    sent = tbf_departures(10e6, burst, frame, 1.3, stalls=[(0.500, 0.545)])
    fit = pathcheck.saturated_rate(read_counter(sent, frame, 1.25), 1.0, BUCKET_10MBIT)
    assert fit.rate_bps == pytest.approx(9.6e6, rel=0.01) and fit.left_out_s == 0
    # a slow link stays slow when the probe goes missing, and short gaps (its scheduling under load) count
    slow = tbf_departures(9.5e6, burst, frame, 1.3)
    assert pathcheck.saturated_rate(read_counter(slow, frame, 1.25, absent=[(0.4, 0.47)]), 1.0,
                                    BUCKET_10MBIT).rate_bps == pytest.approx(9.5e6, rel=0.002)
    brief = pathcheck.saturated_rate(read_counter(sent, frame, 1.25, absent=[(0.50, 0.515)]), 1.0, BUCKET_10MBIT)
    assert brief.left_out_s == 0 and brief.rate_bps < 0.97 * 10e6
    # a pause the bucket bridges costs nothing and stays in: 20 ms at 1 Mbit/s, where it holds 24.2 ms
    one = tbf_departures(1e6, 3028, frame, 1.3, stalls=[(0.5, 0.52)])
    bridged = pathcheck.saturated_rate(read_counter(one, frame, 1.25, absent=[(0.5, 0.52)]), 1.0, BUCKET_1MBIT)
    assert bridged.left_out_s == 0 and bridged.rate_bps == pytest.approx(1e6, rel=0.005)


def builtin_profiles() -> dict[str, PathProfile]:
    seen: dict[tuple, str] = {}
    out = {}
    for name, path in spec.builtin_scenarios().items():
        for pname, p in spec.load(path).profiles.items():
            if (p.up, p.down) not in seen:  # same links, same check
                seen[(p.up, p.down)] = f"{name}/{pname}"
                out[f"{name}/{pname}"] = p
    return out


PROFILES = builtin_profiles()
SLOW = profile(rate="1mbit", delay="200ms")
if not any((p.up, p.down) == (SLOW.up, SLOW.down) for p in PROFILES.values()):  # fast-vs-slow/slow is it
    PROFILES["1mbit-400ms"] = SLOW


@pytest.mark.parametrize("name", list(PROFILES))
def test_path_check_agrees_with_a_correct_emulator(name):
    require_root()
    require_tools("ip", "iptables", "ethtool", "iperf3", "ping", "ss")
    require(DELAYLINE.is_file(), f"{DELAYLINE.name} not built: run make")
    p = PROFILES[name]
    with Testbed(p) as tb:
        check = tb.verify()
        up = tb.link_stats()["up"]
    assert not left_by(os.getpid())
    # before: 1 Mbit/s, 400 ms read "rate 0.27 Mbit/s (expected 1.00) OFF"
    assert check.ok, check.message
    assert check.rtt_expected_s == pytest.approx(p.base_rtt_s, abs=0.001 if p.up.trace else 1e-9)
    assert check.rate_measured_bps == pytest.approx(check.rate_expected_bps, rel=pathcheck.RATE_TOLERANCE)
    assert up["packets"] >= pathcheck.MIN_PACKETS and up["delay_overflows"] == 0


def retune_up_shaper(tb: Testbed, rate_bps: float) -> None:
    """Changes the rate of the up bottleneck's tbf behind the testbed's back: where it sits, and its burst
    and limit, as the testbed installed them."""
    shown = tb.run(tb.router_ns, ["tc", "qdisc", "show", "dev", "veth-rr"], timeout=5).stdout
    where = re.search(r"qdisc tbf 2: (root|parent \S+)", shown)
    assert where, shown
    link = tb.profile.up
    installed = tbf_params(link.rate_bps, link.queue_bytes(tb.profile.base_rtt_s))
    tb.run(tb.router_ns, ["tc", "qdisc", "change", "dev", "veth-rr", *where.group(1).split(), "handle", "2:", "tbf",
                          "rate", f"{int(rate_bps)}bit", "burst", str(installed["burst"]),
                          "limit", str(installed["limit"])], timeout=5)


def test_path_check_calls_a_wrongly_shaped_link_off():
    """The real link differs from the profile: first its rate (tbf at 8 of 10 Mbit/s, beyond the 3 % the
    check allows), then its delay (the profile asks 15 ms each way of a link that has 10). Each time the check
    says OFF, for that quantity alone, with both numbers."""
    require_root()
    require_tools("ip", "iptables", "ethtool", "iperf3", "ping", "ss", "tc")
    require(DELAYLINE.is_file(), f"{DELAYLINE.name} not built: run make")
    with Testbed(profile(rate="10mbit", delay="10ms")) as tb:
        retune_up_shaper(tb, 8e6)
        slow = tb.verify()
        retune_up_shaper(tb, 10e6)
        tb.profile = profile(rate="10mbit", delay="15ms")  # what verify() checks the link against
        far = tb.verify()
    assert slow.rtt_ok and not slow.rate_ok and not slow.ok, slow.message
    assert slow.rate_measured_bps == pytest.approx(0.8 * slow.rate_expected_bps, rel=pathcheck.RATE_TOLERANCE)
    assert f"; rate {slow.rate_measured_bps / 1e6:.2f} Mbit/s (expected 10.00) OFF" in slow.message, slow.message
    assert far.rate_ok and not far.rtt_ok and not far.ok, far.message
    assert far.rtt_measured_s == pytest.approx(0.020, abs=0.002)
    assert far.message.startswith(f"RTT {far.rtt_measured_s * 1e3:.2f} ms (expected 30.00 ms ± "), far.message
    assert re.match(r"RTT [^;]* OFF; rate [^;]* ok", far.message), far.message


def stall(proc, seconds: float) -> threading.Thread:
    """Stops proc for `seconds` (as a machine that does not run it), in the background."""
    def hold():
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)  # the stall itself, not a wait for an effect
        finally:
            os.kill(proc.pid, signal.SIGCONT)
    thread = threading.Thread(target=hold)
    thread.start()
    return thread


def test_the_delay_line_counts_the_packets_a_stall_made_late():
    require_root()
    require_tools("ip", "iptables", "ethtool", "ping")
    require(DELAYLINE.is_file(), f"{DELAYLINE.name} not built: run make")
    with Testbed(profile(delay="10ms")) as tb:
        tb.ping_rtts(count=1)  # ARP done
        up, down = tb._delaylines["up"], tb._delaylines["down"]
        before, down_before = up.stats(), down.stats()
        held = stall(up.proc, 0.15)
        out = tb.run(tb.sender_ns, ["ping", "-n", "-c", "1", "-W", "2", tb.receiver_addr], timeout=5).stdout
        held.join()
        after, down_after = up.stats(), down.stats()
    assert after["late_releases"] - before["late_releases"] == 1
    # late_us sums every release's lateness: the one request's 150 ms, and the small change of the rest
    assert after["late_us"] - before["late_us"] == pytest.approx(after["max_late_us"], abs=2000)
    # Independent of the delay lines' own clocks: ping's RTT is the path's 20 ms plus how late the request
    # was, plus how late the reply was if the host stopped the other delay line then (beside two busy loops,
    # 1 ping in 45: 51.3 ms late, with 10 ticks of steal on one CPU).
    reply_late = down_after["max_late_us"] if down_after["late_releases"] > down_before["late_releases"] else 0
    rtt = float(re.search(r"time=([0-9.]+) ms", out).group(1)) / 1e3
    assert rtt > 0.1 and (after["max_late_us"] + reply_late) / 1e6 == pytest.approx(rtt - 0.020, abs=0.003)


def test_a_run_whose_delay_line_stalled_gets_a_warning_with_its_count():
    """What a scenario's link record says of a stall (emulated.machine_stalls), from the delay lines' counts."""
    require_root()
    require_tools("ip", "iptables", "ethtool", "ping")
    require(DELAYLINE.is_file(), f"{DELAYLINE.name} not built: run make")
    with Testbed(profile(delay="10ms")) as tb:
        tb.ping_rtts(count=1)
        before = tb.link_stats()
        held = stall(tb._delaylines["up"].proc, 0.15)
        tb.run(tb.sender_ns, ["ping", "-n", "-q", "-c", "20", "-i", "0.01", "-W", "2", tb.receiver_addr], timeout=5)
        held.join()
        link = _link_delta(tb.link_stats(), before)
    late = link["up"]["late_releases"] + link["down"]["late_releases"]
    packets = link["up"]["packets"] + link["down"]["packets"]
    # the pings sent while the 150 ms stall lasted (ping starts 20-60 ms into it: 9-15 of 20, every 10 ms), each
    # late by the stall's rest less the path's 10 ms; their replies leave on time
    assert 3 <= link["up"]["late_releases"] <= 15 and link["up"]["max_late_ms"] >= 20, link["up"]
    assert machine_stalls(link) == (f"the machine stalled the delay line: {late} of {packets} packets left over "
                                    f"2 ms late (up to {link['up']['max_late_ms']:.0f} ms); this run's delays and "
                                    "rates are partly the machine's")
    quiet = {d: {**counts, "late_releases": 0} for d, counts in link.items()}
    assert machine_stalls(quiet) is None and machine_stalls({}) is None


def test_verify_takes_the_pings_again_when_the_delay_line_ran_late():
    # before: a 150 ms stall under the ping train read "RTT 44.95 ms (expected 20.00 ms ± 0.90) OFF"
    require_root()
    require_tools("ip", "iptables", "ethtool", "ping")
    require(DELAYLINE.is_file(), f"{DELAYLINE.name} not built: run make")
    with Testbed(profile(delay="10ms")) as tb:
        up, run, stalled = tb._delaylines["up"], tb.run, []

        def stalled_once(ns, argv, timeout, **kw):  # under the first measured ping train (ping -i)
            if "-i" in argv and not stalled:
                stalled.append(stall(up.proc, 0.15))
            return run(ns, argv, timeout, **kw)

        tb.run = stalled_once
        check = tb.verify()
        stalled[0].join()
    assert check.ok, check.message
    assert check.rtt_measured_s == pytest.approx(0.020, abs=0.0009) and "late" not in check.message


def test_a_probe_the_machine_left_too_uncertain_is_tried_again(monkeypatch):
    """A busy spell passes: the rate probe is run again (testbed.BUSY_PROBES in all), and the first fit certain
    enough kept. Only when every probe is too uncertain is the machine said to be too busy, with the least
    uncertain probe's uncertainty and the stalls it left out."""
    require_tools("iperf3")
    tb = Testbed(profile(rate="1mbit", delay="200ms"))
    fits = iter([pathcheck.Fit(0.7e6, 4.0, 0.35), pathcheck.Fit(0.9e6, 4.0, 0.05), pathcheck.Fit(1e6, 4.0, 0.004)])
    monkeypatch.setattr(tb, "_udp_probe", lambda *args: next(fits))
    assert tb.udp_fit(1.2e6) == pathcheck.Fit(1e6, 4.0, 0.004)
    fits = iter([pathcheck.Fit(0.7e6, 4.0, 0.35), pathcheck.Fit(0.9e6, 4.0, 0.05, 0.6, 3.5),
                 pathcheck.Fit(1e6, 4.0, 0.2)])
    with pytest.raises(CcscopeError, match=r"^the machine is too busy to time the rate probe \(±5%; 0.60 s of "
                                           r"4.10 left out as its stalls\)$"):
        tb.udp_fit(1.2e6)
