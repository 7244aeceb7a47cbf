"""Helpers for the tests of ccscope's BPF congestion controls (tests/test_cc*.py), and of scenario runs' claims."""

from __future__ import annotations

import csv
import itertools
import json
import math
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from ccscope.scenario.emulated import machine_stalls
from ccscope_testkit.prereqs import require, require_root

AVAILABLE = Path("/proc/sys/net/ipv4/tcp_available_congestion_control")

# Two-sided 99.9 % quantiles of Student's t by degrees of freedom: a false alarm 1 time in 1,000 per comparison.
T_999 = {2: 31.60, 3: 12.92, 4: 8.610, 5: 6.869, 6: 5.959, 7: 5.408, 8: 5.041}

# A process that uses BPF congestion controls like a scenario does, until its stdin closes.
USER_SCRIPT = """
import sys
from ccscope.cc import provided
with provided(sys.argv[1:], "test user") as chosen:
    print(" ".join(f"{n}={i.implementation}" for n, i in chosen.items()), flush=True)
    sys.stdin.read()
"""


def available() -> set[str]:
    return set(AVAILABLE.read_text().split())


def wait_for(predicate: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)


def require_cc_objects() -> None:
    from ccscope.cc import catalog, structops

    require_root()
    missing = [a for a in catalog.BPF_ALGORITHMS if not catalog.object_path(a).is_file()]
    require(not missing, f"BPF congestion controls not built ({', '.join(missing)}): run make bpf")
    require(structops.supported(), "kernel without struct_ops congestion controls")


def start_user(env: dict[str, str], *names: str) -> tuple[subprocess.Popen, str]:
    """Starts a process holding `names` registered; returns it and its first line (name=implementation)."""
    proc = subprocess.Popen([sys.executable, "-c", USER_SCRIPT, *names], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if not line:
        proc.kill()
        raise AssertionError(f"user process failed: {proc.stderr.read().strip()}")
    return proc, line


def stop_user(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.stdin.close()
        proc.wait(timeout=20)


# --- scenarios and their per-flow series ------------------------------------------------------------

def run_scenario(ccscope_cmd: list[str], directory: Path, text: str, timeout: float = 600) -> tuple[Path, dict]:
    """`ccscope scenario run` of the YAML `text`, as a user runs it; returns the results dir and document.
    --no-verify --no-report: its callers read results.json and the CSVs, and the path checks and the report have
    tests of their own (tests/test_pathcheck.py, tests/test_report_fuzz.py, test_scenario_full.py): 2.3 s of
    test_ccstate_bpf's 53.6."""
    spec = directory / "scenario.yaml"
    spec.write_text(text)
    out = directory / "out"
    res = subprocess.run([*ccscope_cmd, "scenario", "run", str(spec), "--out", str(out), "--listen", "off",
                          "--no-verify", "--no-report"],
                         capture_output=True, text=True, timeout=timeout)
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads((out / "results.json").read_text())
    assert not doc["errors"], doc["errors"]
    return out, doc


def flow_rows(out: Path, flow: dict, warmup: bool = True) -> list[dict[str, float]]:
    """The flow's telemetry samples (its CSV) inside its measurement window (after the warmup), or all
    of them with warmup=False."""
    start, end = flow["window_s"] if warmup else (float("-inf"), float("inf"))
    with (out / flow["csv"]).open() as fh:
        rows = [{k: float(v) for k, v in row.items() if k not in ("cc", "event", "ca_state") and v != ""}
                for row in csv.DictReader(fh)]
    return [r for r in rows if start <= r["time_s"] <= end]


def queueing_delays_ms(rows: list[dict[str, float]]) -> list[float]:
    """srtt - min_rtt per sample: the delay the flow's own queue adds."""
    return [r["srtt_ms"] - r["min_rtt_ms"] for r in rows if "min_rtt_ms" in r]


def flows_by_algorithm(doc: dict, algorithm: str) -> list[dict]:
    return [f for run in doc["runs"] for f in run["flows"] if f["algorithm"] == algorithm]


# --- algorithm signatures ---------------------------------------------------------------------------

MSS = 1448  # bytes of payload per segment on these paths (1500-byte MTU, timestamps on)


def queued_packets(rows: list[dict[str, float]], rate_bps: float) -> float:
    """Median packets a flow keeps in the bottleneck queue: its queueing delay x the link rate / MSS."""
    return statistics.median(queueing_delays_ms(rows)) / 1e3 * rate_bps / (MSS * 8)


def post_recovery_ratios(out: Path, flow: dict) -> list[float]:
    """For each fast recovery of the flow: cwnd right after it ends, divided by the bandwidth estimate x
    RTTmin / MSS just before it started (the kernel's delivery rate and min_rtt of the last sample in
    Open). Westwood+ sets cwnd to BWE x RTTmin there (~1); Reno halves it (~0.5 when the pipe is not full)."""
    with (out / flow["csv"]).open() as fh:
        rows = list(csv.DictReader(fh))
    ratios = []
    for i in range(1, len(rows)):
        if rows[i - 1]["ca_state"] == "recovery" and rows[i]["ca_state"] == "open":
            start = i - 1
            while start > 0 and rows[start]["ca_state"] != "open":
                start -= 1
            before = rows[start]
            pipe = float(before["delivery_rate_mbps"]) * 1e6 * float(before["min_rtt_ms"]) / 1e3 / (MSS * 8)
            if pipe >= 2:
                ratios.append(float(rows[i]["cwnd_segments"]) / pipe)
    return ratios


def recovery_windows(out: Path, flow: dict) -> list[tuple[float, float]]:
    """(cwnd right before, cwnd right after) each fast recovery of the flow, from its samples."""
    with (out / flow["csv"]).open() as fh:
        rows = list(csv.DictReader(fh))
    pairs = []
    for i in range(1, len(rows)):
        if rows[i - 1]["ca_state"] == "recovery" and rows[i]["ca_state"] == "open":
            start = i - 1
            while start > 0 and rows[start]["ca_state"] != "open":
                start -= 1
            pairs.append((float(rows[start]["cwnd_segments"]), float(rows[i]["cwnd_segments"])))
    return pairs


REDUCTIONS = ("cwr", "recovery", "loss")


def segments(field: str) -> float:
    """A CSV's cwnd or ssthresh: empty is an ssthresh not yet set, slow start's infinite one."""
    return float(field) if field else math.inf


def undone(before: dict, after: dict) -> bool:
    """Whether a flow's samples either side of a loss show it undone (tcp_undo_cwnd_reduction): cwnd given back,
    max(cwnd, prior_cwnd), so not below the sample before, and ssthresh given back, max(ssthresh, prior_ssthresh),
    where prior_ssthresh was max(ssthresh, 3/4 cwnd) at the loss (tcp_current_ssthresh): at least the lower of the
    sample before's ssthresh and 3/4 of its cwnd. CUBIC's own cut is to 0.7 cwnd, Reno's to half, Westwood+'s to
    BWE x RTTmin below the window that overflowed the queue. Seen: a slow-start loss at 37 % steal left cwnd
    growing, 130 then 133 (ssthresh empty: slow start's infinite one), and HyStart then set ssthresh 139; in a CI
    run at 14 % steal, HyStart set ssthresh to a cwnd of 168, a loss set W_max 168, and the sample 14 ms later read
    cwnd 168 and ssthresh 168, where the one before read 162 and infinite."""
    cwnd = segments(before["cwnd_segments"])
    prior = min(segments(before["ssthresh_segments"]), (int(cwnd) >> 1) + (int(cwnd) >> 2))
    return segments(after["cwnd_segments"]) >= cwnd and segments(after["ssthresh_segments"]) >= prior


def undone_reductions(rows: list[dict]) -> list[float]:
    """When a flow's telemetry (rows every 10 ms) shows a reduction the kernel undid. One the samples saw (cwr,
    recovery or loss) was undone if the flow left it with at least the window it entered with (cwnd given back;
    within it PRR lowers cwnd, so the row before it is what counts). One too short for a sample (a CI run's
    Westwood+ went from disorder at cwnd 60, ssthresh 9, to open at 60 and 45, (60 >> 1) + (60 >> 2), in 13 ms)
    shows as an ssthresh that moved between two rows outside reductions, the two as `undone` says. A machine stall
    that holds the ACKs past the retransmit timers makes such needless reductions."""
    found, entered = [], None
    for previous, row in itertools.pairwise(rows):
        if row["ca_state"] in REDUCTIONS:
            entered = entered or previous
        elif entered is not None:
            if segments(row["cwnd_segments"]) >= segments(entered["cwnd_segments"]):
                found.append(float(row["time_s"]))
            entered = None
        elif row["ssthresh_segments"] != previous["ssthresh_segments"] and undone(previous, row):
            found.append(float(row["time_s"]))
    return found


MIN_WINDOW_GAP = 2  # segments between the windows of a pair window_slope takes


def window_slope(pairs: list[tuple[float, float]]) -> float:
    """How cwnd after a recovery follows cwnd before it: the Theil-Sen slope (the median of the pairwise
    slopes) over `pairs`, 0.5 for a rule that halves the window (Reno, and Vegas on loss), about 0 for one that
    sets it from a bandwidth estimate whatever the window was (Westwood+). The median, not least squares: the
    last sample before a recovery is sometimes stale (Vegas lowers cwnd by delay between two samples, and
    then halves what it lowered), and one such point (18 -> 4 of 16) pulled a least-squares slope to 0.21.
    Only pairs of windows at least MIN_WINDOW_GAP apart: halving in integers gives windows one segment apart the
    same half for one of two (10 and 11 both give 5), a slope of 0 that says nothing of the rule. A lab run whose
    windows were mostly 10 and 11 read the kernel's Vegas as 0.0 with every pair, 0.57 without the adjacent ones
    (BPF Vegas 0.5 either way, Westwood+ 0.0 either way)."""
    slopes = [(b[1] - a[1]) / (b[0] - a[0]) for i, a in enumerate(pairs) for b in pairs[i + 1:]
              if abs(b[0] - a[0]) >= MIN_WINDOW_GAP]
    return statistics.median(slopes)


def mean_tolerance(cells: list[list[float]], a: list[float], b: list[float], rel: float = 0.05) -> float:
    """How far the means of the runs a and b may lie apart: `rel` of a's mean or, where runs vary more than
    that, the 99.9 % bound of Student's t for the difference of two means, with the standard deviation of
    a run around its cell's mean pooled over `cells` (every cell run under the same conditions, a and b
    among them)."""
    squares = sum((v - statistics.fmean(cell)) ** 2 for cell in cells for v in cell)
    df = sum(len(cell) - 1 for cell in cells)
    return max(rel * statistics.fmean(a), T_999[df] * math.sqrt(squares / df) * math.sqrt(1 / len(a) + 1 / len(b)))


def relative_tolerance(cells: list[list[float]], a: list[float], b: list[float], rel: float = 0.05) -> float:
    """mean_tolerance for quantities whose spread grows with their size (the queueing delays and drop counts of
    different AQMs): a run's deviation from its cell's mean is taken relative to that mean before pooling."""
    squares = sum((v / statistics.fmean(cell) - 1) ** 2 for cell in cells for v in cell)
    df = sum(len(cell) - 1 for cell in cells)
    spread = T_999[df] * math.sqrt(squares / df) * math.sqrt(1 / len(a) + 1 / len(b))
    return statistics.fmean(a) * max(rel, spread)


def delay_lines_kept_time(doc: dict, run: dict) -> bool:
    """Whether the delay lines kept a run's time (it has no machine_stalls warning): the claims on rates and queues
    that a stall of the machine moves are held only then, and otherwise the run must say that they were the
    machine's. At 37 % steal (2026-11-29) 16-27 % of l4s's packets left over 2 ms late."""
    stalled = machine_stalls(run["link"])
    if stalled is not None:
        assert f"{run['label']}: {stalled}" in doc["warnings"], doc["warnings"]
    return stalled is None
