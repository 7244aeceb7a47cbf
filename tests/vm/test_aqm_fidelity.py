"""ccscope's userspace CoDel, fq_codel and PIE against the kernel's own qdiscs, on Debian sid's 7.2 kernel under
qemu (tools/kernel-lab --kernel 7.2): one boot runs tests/vm/aqm-fidelity.yaml with `ccscope scenario run`, as a
user would, each AQM once as the kernel's qdisc under netem's shaper and once in ccscope's delay line, in a
seeded random order, two runs each. The tests compare the means over the runs against their spread, as the BPF
algorithms' fidelity test does, and check each AQM's counters against the endpoints' own. About 2.5 minutes:
`--no-verify`, since the path checks took 70 s of 3.6 minutes and the kernel's goodput (99.7 % of the link's
TCP maximum in every run) and the ping's floor (the path's 40 ms) already say the path is right.

What TCG and the low rate do to the comparison: at 2 Mbit/s a packet takes 6 ms on the wire, more than CoDel's
5 ms target, so both CoDels hold about one packet whatever they are told; what they are compared on is mostly
when they drop, not how low they hold the queue. Under TCG the delay line, a userspace process in an emulated
CPU, is the slower of the two: it delivered 96-98 % of the link against the kernel's 99.7 % (measured over two
lab runs of this scenario, 2026-11-27), and the ping in fq_codel's own queue waited 0.5-1.5 ms longer. It is also
the more sensitive to the host: when the guest gets less CPU, its releases come late (it counts those over 2 ms
late, late_releases), and the delays and rates it gives are partly the machine's. The bounds that do not compare
the two implementations are taken from boots of both kinds (FULL_LINK, FLOOR_PACKETS, the fq_codel signature),
and their messages carry each run's late share."""

from __future__ import annotations

import csv
import json
import shlex
import statistics
from collections.abc import Callable
from concurrent.futures import Future
from pathlib import Path

import pytest
from cchelpers import mean_tolerance, relative_tolerance
from ccscope.scenario.emulated import late_share
from labhelpers import PYTHON, ROOT, Boot

pytestmark = pytest.mark.stock_kernel

SCENARIO = ROOT / "tests" / "vm" / "aqm-fidelity.yaml"
L4S_SCENARIO = ROOT / "tests" / "vm" / "l4s-fidelity.yaml"
ACCECN_SCENARIO = ROOT / "tests" / "vm" / "l4s-accecn.yaml"
AQMS = ("codel", "fq_codel", "pie")
BASE_RTT_MS = 40.0
PACKET_MS = 1514 * 8 / 2e6 * 1e3  # one full frame's time on the 2 Mbit/s wire: 6.1 ms
TCP_MAX_BPS = 2e6 * 1448 / 1514  # TCP payload over full frames at the layer-2 rate


def _scenario(path: Path, out: Path) -> str:
    argv = [str(PYTHON), "-m", "ccscope.cli", "scenario", "run", str(path), "--out", str(out), "--listen", "off",
            "--no-report", "--no-verify"]
    return shlex.join(argv)


OUTS = {"l4s": L4S_SCENARIO, "accecn": ACCECN_SCENARIO, "aqm": SCENARIO}
LAB_BOOT_ALONE = True  # beside another boot, the delay line ran late (conftest.py)


def lab_boot(request: pytest.FixtureRequest) -> Callable[[Path], Boot]:
    """The scenarios in one boot, each into share / its key (conftest's lab_boots starts it)."""
    request.getfixturevalue("kernel_lab_sid")
    request.getfixturevalue("bpf_object")

    def start(share: Path) -> Boot:
        script = " && ".join(_scenario(path, share / name) for name, path in OUTS.items())
        # One vCPU: the guest's vCPUs take turns in one qemu thread (tools/kernel_lab/vm.py), so a second one adds
        # no CPU, and the delay line's SCHED_FIFO only comes first on the vCPU it wakes on. With two, the delay
        # line waited for the other vCPU's turn behind ccscope's Python and iperf3: l4s-fidelity.yaml's delay lines
        # released 291-435 packets of about 1450 a run over 2 ms late in three boots (2026-11-29); with one, 11-107
        # in three, at the same goodput and boot time.
        return Boot.start(share, "run", "--kernel", "7.2", "--cpus", "1", "--share", str(share), "--timeout", "840",
                          "--cwd", str(ROOT), "--", "sh", "-c", script)
    return start


@pytest.fixture(scope="module")
def lab_runs(lab_boots: dict[str, Future[Boot]]) -> dict[str, dict]:
    """{"aqm": results.json of aqm-fidelity.yaml, "l4s": of l4s-fidelity.yaml, "accecn": of l4s-accecn.yaml}."""
    boot = lab_boots[__name__].result()
    ran = boot.result()
    outs = {name: boot.directory / name for name in OUTS}
    if ran.returncode != 0 or not all((out / "results.json").exists() for out in outs.values()):
        pytest.fail(f"the AQM fidelity scenarios did not complete in the lab (status {ran.returncode}): "
                    f"{ran.stderr.strip()[-2000:]}")
    return {name: json.loads((out / "results.json").read_text()) for name, out in outs.items()}


@pytest.fixture(scope="module")
def share(lab_runs: dict[str, dict], lab_boots: dict[str, Future[Boot]]) -> Path:
    """What the lab boot shared with the host: each scenario's results directory."""
    return lab_boots[__name__].result().directory


@pytest.fixture(scope="module")
def runs(lab_runs: dict[str, dict]) -> dict:
    return lab_runs["aqm"]


def _runs(doc: dict, aqm: str, implementation: str) -> list[dict]:
    return [r for r in doc["runs"] if r["profile"] == f"{aqm}-{implementation}"]


# The share of the TCP maximum each run must deliver. The kernel's runs gave 97.2-99.7 % over three boots. The
# delay line's gave 91.8-98.7 % in two boots, and down to 89.4 % in a CI boot (2026-11-28) whose delay lines
# released 6-20 % of their packets over 2 ms late, against 1-3.5 % in a quiet boot: the guest's CPU, which the
# delay line shares with the flows, was slower that time (its boot took 345 s, against 320-324 s).
FULL_LINK = {"kernel": 0.9, "ccscope": 0.85}
# The frames a ping waits behind at best: in fq_codel's own queue only the one on the wire; in a single queue
# also the one the AQM keeps (CoDel does not drop while at most a frame is queued, PIE while under two). The
# kernel's single queues sit under tbf, which takes the next frame early, so their floors came 0.6-1.7 ms over
# the path; the delay line's codel floors came 1.4-4.5 ms over it in three boots, and 8.3 ms in a boot with a
# sampling loop of ours in the guest (its delay line released 14.5 % of its packets over 2 ms late).
FLOOR_PACKETS = {"codel": 2, "fq_codel": 1, "pie": 2}


def _mean_late_ms(run: dict) -> float:
    """How late the run's up delay line released a packet on average (0 for the kernel's qdisc): the time the
    machine did not run it, which every delay through it carries."""
    up = run["link"]["up"]
    return up.get("late_us", 0) / up["packets"] / 1e3 if up["packets"] else 0.0


def _late_share(run: dict) -> float | None:
    """The share of its packets the run's delay line released over 2 ms late (the machine's delay, not the
    emulated one's); None for the kernel's qdisc."""
    up = run["link"]["up"]
    return round(late_share(up), 3) if "late_releases" in up else None


def test_each_aqm_ran_where_it_was_asked_to(runs, machine_share) -> None:
    """results.json says which implementation ran each profile, and the kernel's qdisc counted what it did."""
    assert runs["environment"]["kernel"].startswith("7.2.")
    for aqm in AQMS:
        for implementation in ("kernel", "ccscope"):
            assert runs["profiles"][f"{aqm}-{implementation}"]["aqm"]["up"]["implementation"] == implementation
            cell = _runs(runs, aqm, implementation)
            assert len(cell) == 2 and all(r["backend"] == "netem" and not r["errors"] for r in cell), cell
            assert all(r["flows"][0]["algorithm_ok"] for r in cell)
            # the path, in place of the skipped checks: the ping's floor is the 40 ms path plus what its best
            # moment waits behind (FLOOR_PACKETS), and the link is full (FULL_LINK)
            floor = BASE_RTT_MS + FLOOR_PACKETS[aqm] * PACKET_MS
            assert all(BASE_RTT_MS <= r["ping"]["rtt_ms"]["min"] <= floor for r in cell), \
                [(r["ping"]["rtt_ms"]["min"], _late_share(r)) for r in cell]
            full = FULL_LINK[implementation] * TCP_MAX_BPS * machine_share()  # qemu runs the guest at our speed
            assert all(r["flows"][0]["goodput_bps"] >= full for r in cell), \
                [(r["flows"][0]["goodput_bps"], _late_share(r)) for r in cell]
            # CoDel and PIE drop (no ECN asked), fq_codel marks (Accurate ECN at both ends)
            counted = "aqm_marks" if aqm == "fq_codel" else "aqm_drops"
            assert all(r["link"]["up"][counted] > 0 for r in cell), [r["link"]["up"] for r in cell]


def _metric_cells(doc: dict, metric: Callable[[dict], float]) -> dict[tuple[str, str], list[float]]:
    return {(aqm, impl): [metric(r) for r in _runs(doc, aqm, impl)] for aqm in AQMS for impl in ("kernel", "ccscope")}


METRICS: dict[str, Callable[[dict], float]] = {
    "ping queueing median ms": lambda r: r["ping"]["rtt_ms"]["median"] - BASE_RTT_MS,
    "ping queueing p95 ms": lambda r: r["ping"]["rtt_ms"]["p95"] - BASE_RTT_MS,
}
# PIE's p95 is the one metric whose runs spread more between boots than within one, and ccscope's sits above the
# kernel's: two lab runs (2026-11-27) gave the kernel 25.8, 30.3 and 26.4, 24.7 ms, ccscope 26.0, 31.9 and 36.3,
# 35.7 (earlier: kernel 35.0-42.6, ccscope 39.4-47.6). The second boot's close pairs made the pooled spread 28 %
# against a 39 % gap. Its floor is that of a systematic difference, as PIE's drops have (COUNT_RATIO): ccscope's
# at most 50 % from the kernel's mean (the gaps seen: 3 % and 39 %).
# PIE's median too (2026-11-28): three boots gave the kernel 14.5, 10.0 and 10.8, 13.3 and 8.0, 7.9 ms, ccscope
# 14.0, 12.8 and 13.0, 14.1 and 12.5, 12.7. The third boot's close pairs made the pooled spread 26 % against a 60 %
# gap, where the kernel's runs across boots span 8-14.5 ms and ccscope's sit inside that span: a floor of 70 %.
FLOORS = {("pie", "ping queueing p95 ms"): 0.5, ("pie", "ping queueing median ms"): 0.7}


@pytest.mark.parametrize("aqm", AQMS)
def test_goodput_agrees(runs, aqm: str) -> None:
    """The means of the two implementations' runs within 8 %, or the 99.9 % t bound of the runs' spread pooled
    over all six cells (cchelpers.mean_tolerance). The floor is not the runs' spread (the kernel's runs lie
    within 1 % of each other) but the delay line's deficit under TCG: the kernel delivered 1.89-1.92 Mbit/s in
    every run, the delay line 1.84-1.89 under codel and fq_codel and 1.78-1.88 under PIE, whose drops empty the
    6.6-packet path more often (a gap of 5.7 % at most over three lab runs of 6 s, 3.4 % over two of 8 s). A
    PIE target raised by the 6 ms that tbf's early dequeue takes from the kernel's sojourns (kernel_aqm.py)
    closed about half of it (1.85 Mbit/s against 1.81 at 15 ms and the kernel's 1.90, three runs each, within
    their spread of each other)."""
    cells = _metric_cells(runs, lambda r: r["flows"][0]["goodput_bps"])
    a, b = cells[(aqm, "kernel")], cells[(aqm, "ccscope")]
    tolerance = mean_tolerance(list(cells.values()), a, b, rel=0.08)
    assert abs(statistics.fmean(b) - statistics.fmean(a)) <= tolerance, (a, b, tolerance)


@pytest.mark.parametrize("what", METRICS)
@pytest.mark.parametrize("aqm", AQMS)
def test_queueing_agrees(runs, aqm: str, what: str) -> None:
    """The queueing delay a ping sees (its RTT less the 40 ms path: for codel and pie the queue the flow keeps,
    for fq_codel the wait behind the packet on the wire), the two means within 5 %, or the 99.9 % t bound of the
    runs' spread relative to their cell's mean, pooled over the six cells (cchelpers.relative_tolerance: the
    cells' sizes differ tenfold, their relative spreads do not). Measured (four lab runs of the scenario): ping
    queueing medians 14-16 ms (codel), 8-18 (pie), 3.5-5 (fq_codel)."""
    cells = _metric_cells(runs, METRICS[what])
    a, b = cells[(aqm, "kernel")], cells[(aqm, "ccscope")]
    tolerance = relative_tolerance(list(cells.values()), a, b, rel=FLOORS.get((aqm, what), 0.05))
    assert abs(statistics.fmean(b) - statistics.fmean(a)) <= tolerance, (a, b, tolerance)


# ccscope's drops (codel, pie) or marks (fq_codel) over the kernel's, the means of a lab run's two runs each:
# measured in five lab runs (2026-11-27): codel 0.71-1.04, fq_codel 0.88-0.91, pie 1.18-1.56. Not within the
# runs' spread: the counts differ systematically (ccscope's fq_codel marks about 10 % fewer, its PIE drops
# 18-56 % more), which docs/scenarios.md reports. So this bound is only a gross one, a factor of 2 either way;
# the exact checks of the counts are test_the_aqms_counts_match_the_endpoints'.
COUNT_RATIO = (0.5, 2.0)


@pytest.mark.parametrize("aqm", AQMS)
def test_drops_and_marks_are_of_one_size(runs, aqm: str) -> None:
    cells = _metric_cells(runs, lambda r: r["link"]["up"]["aqm_drops"] + r["link"]["up"]["aqm_marks"])
    kernel, ours = statistics.fmean(cells[(aqm, "kernel")]), statistics.fmean(cells[(aqm, "ccscope")])
    assert COUNT_RATIO[0] <= ours / kernel <= COUNT_RATIO[1], cells


def test_fq_codel_serves_the_ping_at_once_in_both(runs) -> None:
    """fq_codel's signature, apart from the spread: the ping, in a flow queue of its own, waits only for the
    packet on the wire, where in codel's single queue it also waits behind the flow's standing queue, which is
    about a full frame (CoDel does not drop while at most one is queued). So each codel run's median wait is well
    above each fq_codel run's: by over half a packet time, where one queue for all would put them level.

    Not a whole packet time: after a drop CoDel's queue drains for a while, so the median wait behind it can come
    just under a frame. In the one-vCPU lab, whose delay line runs on time, a ccscope codel run waited 11.4 ms,
    5.9 above fq_codel's 5.5 (899fc35's CI, 2026-11-29). A difference and not a bound on fq_codel
    alone, because the machine's lateness adds to both: in a CI boot whose delay lines released 6-20 % of their
    packets over 2 ms late, ccscope's fq_codel ping waited 7.8 ms. Measured gaps (the lowest codel median less the
    highest fq_codel one): kernel 8.3, 10.3, 10.6, 9.8 ms; ccscope 10.8, 10.2, 9.8 (two vCPUs), 5.9 (one)."""
    for implementation in ("kernel", "ccscope"):
        fq = [METRICS["ping queueing median ms"](r) for r in _runs(runs, "fq_codel", implementation)]
        single = [METRICS["ping queueing median ms"](r) for r in _runs(runs, "codel", implementation)]
        late = [_late_share(r) for r in _runs(runs, "fq_codel", implementation)]
        assert min(single) - max(fq) > PACKET_MS / 2, (implementation, fq, single, late)


# Retransmits no AQM drop explains and the receiver did not report as spurious (DSACK): a CI run's fq_codel flow
# retransmitted 1 segment with no drop anywhere, and a later one's kernel codel run 27 against 26 drops, none
# spurious (2 of about 40 such runs; the others 0). Under TCG a packet may also be lost where no qdisc counts it
# (the receiver's backlog, say); which it was is not found. So each side of the accounting has the same slack.
UNEXPLAINED = 2


@pytest.mark.parametrize("aqm", AQMS)
def test_the_aqms_counts_match_the_endpoints(runs, aqm: str) -> None:
    """Each implementation's own count against the endpoints': with Accurate ECN (fq_codel) the sender's kernel
    counts every CE mark the receiver saw (tcpi_delivered_ce), which must equal the AQM's marks; a drop of a
    data packet is one retransmission (codel, pie), give or take the few packets that are not the flow's data
    (a SYN, a FIN, pure ACKs, and pings, which the AQM may drop too). Under TCG the guest's timers fire late, and
    a retransmit the receiver already had (spurious_retransmits, DSACK) is the machine's, not the AQM's; and a
    few are explained by neither (UNEXPLAINED)."""
    for implementation in ("kernel", "ccscope"):
        for run in _runs(runs, aqm, implementation):
            up, flow = run["link"]["up"], run["flows"][0]
            lost_pings = run["ping"]["sent"] - run["ping"]["received"]
            retransmits = flow["retransmits"] - flow["spurious_retransmits"]
            if aqm == "fq_codel":
                assert flow["ecn"] == "accecn", flow["ecn"]
                # it drops only what cannot carry a mark (Not-ECT: a SYN, a FIN, a pure ACK, a ping; one
                # such drop in one of 8 runs), and the flow loses nothing
                assert up["aqm_drops"] <= lost_pings + 2 and retransmits <= UNEXPLAINED, (up, flow)
                # every mark counted at the receiver, give or take iperf3's control connection, which
                # negotiates AccECN too (measured: equal in 7 of 8 runs, one apart in the eighth)
                assert 0 <= up["aqm_marks"] - flow["delivered_ce_packets"] <= 2, (implementation, flow, up)
            else:
                assert retransmits - UNEXPLAINED <= up["aqm_drops"] <= retransmits + lost_pings + 2, \
                    (implementation, up, flow, lost_pings)


# --- DualPI2: the kernel's sch_dualpi2 (built by the lab) against ccscope's, prague and cubic together ------

def _dualpi2_runs(lab_runs: dict[str, dict], implementation: str) -> list[tuple[dict, dict, dict]]:
    """(run, prague's flow, cubic's flow) of each run of the implementation."""
    out = []
    for run in lab_runs["l4s"]["runs"]:
        if run["profile"] == f"dualpi2-{implementation}":
            flows = {f["algorithm"]: f for f in run["flows"]}
            out.append((run, flows["prague"], flows["cubic"]))
    return out


def test_dualpi2_ran_where_it_was_asked_to(lab_runs) -> None:
    """The kernel's DualPI2 is the module the lab built (Debian's 7.2 has none); prague negotiated ECN and went
    into L, cubic did not; both DualPI2s marked, by the step too, and dropped only classic packets."""
    doc = lab_runs["l4s"]
    for implementation in ("kernel", "ccscope"):
        assert doc["profiles"][f"dualpi2-{implementation}"]["aqm"]["up"]["implementation"] == implementation
        cell = _dualpi2_runs(lab_runs, implementation)
        assert len(cell) == 2, cell
        for run, prague, cubic in cell:
            assert run["backend"] == "netem" and not run["errors"], run["errors"]
            assert prague["algorithm_ok"] and cubic["algorithm_ok"]
            assert (prague["ecn"], cubic["ecn"]) == ("ecn", "off"), (prague["ecn"], cubic["ecn"])
            up = run["link"]["up"]
            assert up["aqm_marks"] > up["aqm_step_marks"] > 0 and up["queue_drops"] == 0, up
            # Marks beyond the CE packets prague's receiver counted: the kernel counts a packet twice when the
            # coupling marked it and the step then does (INET_ECN_set_ce succeeds on a CE packet, so ecn_mark
            # and step_marks both rise); ccscope counts it once, and its few extra are iperf3's control
            # connection, which runs prague too. Measured before the ECT(1) ping: the kernel 19-38 over, ccscope
            # 2-15; steps 39-71. The ping shares the L queue and its marks, which are not prague's (60 pings a
            # run): with it, the kernel 49-83 over, ccscope 31-39 (two lab runs).
            beyond = up["aqm_marks"] - prague["delivered_ce_packets"]
            assert 0 <= beyond <= up["aqm_step_marks"] + run["ping_l4s"]["sent"], (up, prague)
            # every drop is a flow's retransmit or a ping's loss, as for codel and pie: cubic's in the C queue,
            # and prague's few where p passes 1/k and the L queue drops too (one lab run, 2026-11-27: prague
            # 1-4 and cubic 20-30, none spurious, against 25-39 drops and 5-9 pings lost). Before spurious
            # retransmits were counted this read "prague retransmits at most 10" (TCG's timeouts, it was thought)
            lost_pings = sum(run[s]["sent"] - run[s]["received"] for s in ("ping", "ping_l4s"))
            needed = sum(f["retransmits"] - f["spurious_retransmits"] for f in (prague, cubic))
            assert needed - UNEXPLAINED <= up["aqm_drops"] <= needed + lost_pings + 2, (up, prague, cubic, lost_pings)
            assert prague["retransmits"] < cubic["retransmits"], (prague, cubic)


# Measured over three lab runs of l4s-fidelity.yaml (2026-11-27, six runs per implementation), the numbers each
# tolerance below is taken from:
# - prague's share of the two flows' goodput: kernel 0.53-0.67, ccscope 0.49-0.67, a run's sd 0.055; the
#   difference of two runs' means then has an sd of 0.055, and 0.2 is 3.6 of it (99.9 %);
# - the L queue (prague's median srtt less the 40 ms path): kernel 14.5-15.0 ms, ccscope 14.6-15.7 (the delay
#   line's ~0.5 ms under TCG), a run's sd 0.3 ms. Since the guest's CPUs take turns in one qemu thread (kernel-lab,
#   2026-11-28) the delay line, a guest process, runs later: four boots gave the kernel 14.3-15.3 ms and ccscope
#   15.3-17.0, the means of a boot's two runs 0.8-1.8 ms apart, the delay line releasing 30-94 packets a run over
#   2 ms late: within 2.5 ms. On a machine whose host takes our CPUs for 5-80 ms each second (2026-11-28: a
#   SCHED_FIFO thread per CPU woke that late, idle or beside busy loops), two boots put ccscope 3.0 and 3.0 ms
#   above the kernel (19.1 against 16.1; 19.5 against 16.5), the delay line releasing 205-327 packets a run over
#   2 ms late. That lateness is the machine's, and each of prague's packets carries the up delay line's mean
#   (link late_us / packets: 0.92 and 1.45 ms), so it is taken off ccscope's L queue: 1.8 ms apart then.
#   Since prague's data leave as ECT(1) and the guest has one vCPU (2026-11-29), three boots put ccscope 1.5,
#   3.3 and 4.4 ms above the kernel (kernel 15.9-17.8 ms), its delay line 11-107 packets late a run. ccscope's
#   DualPI2 marks prague a little less (its CE fraction 0.31-0.34 against the kernel's 0.35-0.42 in four boots,
#   within the CE packets' 25 % below), so prague keeps up to half a packet more queued: within one packet's
#   time on the wire (PACKET_MS, 6.1 ms), the resolution a 2 Mbit/s link has;
# - the C queue (the ping's median less 40 ms): kernel 22.1-31.0 ms, ccscope 18.5-26.6, a run's sd 3 ms, and
#   on 2026-11-29 the kernel 23.3 and 31.5 against ccscope 19.3 and 14.1 (10.7 apart): within two packets'
#   time (12.2 ms, 4 sds of the difference of two runs' means);
# - the L queue as the ECT(1) ping saw it (its median less 40 ms): two lab runs (2026-11-27), the kernel 7.1,
#   8.0 and 7.8, 6.4 ms, ccscope 5.6, 6.9 and 6.6, 9.3 (a small packet waits behind at most the L queue, which
#   the 12 ms step holds near two packets), a run's sd 1.2 ms: within 4 ms (3.3 sds of the difference);
# - CE packets prague's receiver counted (tcpi_delivered_ce; the kernel's own mark count double-counts, above):
#   kernel 278-303, ccscope 259-295, ccscope's 2-11 % fewer in each of the three pairs, so within 25 %.
DUALPI2_TOLERANCES: dict[str, tuple[Callable[[dict, dict, dict], float], float, bool]] = {
    # name: (metric of a run, tolerance, relative to the kernel's mean)
    "prague's share": (lambda run, p, c: p["goodput_bps"] / (p["goodput_bps"] + c["goodput_bps"]), 0.2, False),
    "L queue ms": (lambda run, p, c: p["srtt_ms"]["median"] - BASE_RTT_MS - _mean_late_ms(run), PACKET_MS, False),
    "C queue ms": (lambda run, p, c: run["ping"]["rtt_ms"]["median"] - BASE_RTT_MS, 2 * PACKET_MS, False),
    "L ping ms": (lambda run, p, c: run["ping_l4s"]["rtt_ms"]["median"] - BASE_RTT_MS, 4.0, False),
    "CE packets": (lambda run, p, c: p["delivered_ce_packets"], 0.25, True),
}


@pytest.mark.parametrize("what", DUALPI2_TOLERANCES)
def test_dualpi2_agrees_with_the_kernels(lab_runs, what: str) -> None:
    """The coupling's rate balance, each queue's delay and the CE marks that reached prague, the two
    implementations' means within the tolerance measured from the runs' spread (above)."""
    metric, tolerance, relative = DUALPI2_TOLERANCES[what]
    kernel = [metric(*r) for r in _dualpi2_runs(lab_runs, "kernel")]
    ours = [metric(*r) for r in _dualpi2_runs(lab_runs, "ccscope")]
    bound = tolerance * statistics.fmean(kernel) if relative else tolerance
    assert abs(statistics.fmean(ours) - statistics.fmean(kernel)) <= bound, (what, kernel, ours, bound)


def test_dualpi2_l_queue_is_short_and_c_sits_near_its_target(lab_runs, machine_share) -> None:
    """RFC 9332's behaviour in both: prague's queue near the 12 ms step (two packets here), the classic one near
    the 15 ms target and above L's; together they fill the link (measured 1.87-1.92 Mbit/s)."""
    for implementation in ("kernel", "ccscope"):
        queues = []
        for run, prague, cubic in _dualpi2_runs(lab_runs, implementation):
            queues.append((prague["srtt_ms"]["median"] - BASE_RTT_MS, run["ping"]["rtt_ms"]["median"] - BASE_RTT_MS,
                           run["ping_l4s"]["rtt_ms"]["median"] - BASE_RTT_MS))
            assert prague["goodput_bps"] + cubic["goodput_bps"] >= 0.9 * TCP_MAX_BPS * machine_share(), (prague, cubic)
        l_queue, c_queue, l_ping = (statistics.fmean(q) for q in zip(*queues, strict=True))
        # The ECT(1) ping in L waits less than the 12 ms step (single runs 5.6-9.3 ms) where the plain one waits in
        # C, near its 15 ms target; prague's own queue (from its srtt, which also carries its packets' 6.1 ms on
        # the wire and the receiver's delayed ACKs: single runs 14.3-21.6 ms) stays within two steps. Prague's
        # srtt is not the ping's measure: a C queue of 14.1 ms (a ccscope run, 2026-11-29) sat below it.
        assert c_queue <= 3 * 15 and l_queue <= 2 * 12 and l_ping <= 12 < c_queue, (implementation, queues)


def test_prague_takes_accecns_feedback_where_both_ends_negotiate_it(lab_runs, machine_share) -> None:
    """With net.ipv4.tcp_ecn=3 at both ends (7.2), prague negotiates AccECN instead of falling back to reno (it
    did, before it took AccECN's mode for ECN), and leaves ECE to the kernel's ACE counter. The sender's
    tcpi_delivered_ce then reads the delay line's DualPI2 marks less a few, where classic ECN with prague's own
    receiver counted 3546 of 3546 on the host: the ACE field counts CE packets modulo 8, the 12 ms step marks
    runs of packets, and under TCG one ACK may cover more than 7 (GRO), which the AccECN option's byte counters
    only partly repair. Lab runs (2026-11-27): prague without an ACK at each change of CE 1.6-2.9 % fewer (4
    runs), with them 0.5-0.7 % (2); the kernel's dctcp, which sends them, 0-4.8 % (4). So: at most 5 % fewer,
    never more than the marks and iperf3's control connection (prague too), which a mark may hit. prague's
    packets are marked, never dropped."""
    runs = [run for run in lab_runs["accecn"]["runs"] if run["algorithms"] == "prague"]
    assert len(runs) == 2, runs
    for run in runs:
        [prague] = run["flows"]
        up = run["link"]["up"]
        assert not run["errors"] and prague["algorithm_ok"] and prague["ecn"] == "accecn", (run["errors"], prague)
        assert up["aqm_marks"] > 0 and up["aqm_drops"] == up["queue_drops"] == 0, up
        assert -2 <= up["aqm_marks"] - prague["delivered_ce_packets"] <= 0.05 * up["aqm_marks"], (up, prague)
        assert prague["retransmits"] - prague["spurious_retransmits"] <= UNEXPLAINED, prague
        assert prague["goodput_bps"] >= 0.85 * TCP_MAX_BPS * machine_share(), prague


def test_the_kernels_dctcp_shows_its_alpha_as_the_ce_fraction(lab_runs, share: Path) -> None:
    """The kernel's dctcp (7.2's module), a second scalable algorithm, behind the same DualPI2: the scenario loads
    its module before the telemetry opens, so the algorithm-state program finds struct dctcp in the module's BTF,
    and its alpha (the EWMA, g = 1/16, of each window's CE fraction) estimates the fraction of its packets the
    sender's kernel counted marked (tcpi_delivered_ce / tcpi_delivered), as prague's does on the host. Four lab
    runs (2026-11-27), AccECN negotiated: alpha's mean 0.233-0.250 against fractions 0.239-0.256, 2.3-6.2 % below
    (alpha lags a fraction that falls as the queue settles); within 15 %."""
    runs = [run for run in lab_runs["accecn"]["runs"] if run["algorithms"] == "dctcp"]
    assert len(runs) == 2, runs
    for run in runs:
        [dctcp] = run["flows"]
        assert not run["errors"] and dctcp["algorithm_ok"] and dctcp["ecn"] in ("ecn", "accecn"), (run, dctcp)
        assert run["link"]["up"]["aqm_marks"] > 0 and dctcp["ce_fraction"] > 0, (run["link"]["up"], dctcp)
        with (share / "accecn" / dctcp["state_csv"]).open() as fh:
            alphas = [float(row["alpha"]) for row in csv.DictReader(fh)]
        settled = alphas[len(alphas) // 5:]  # alpha starts at 1 (DCTCP_MAX_ALPHA) until the marks bring it down
        assert len(settled) >= 10, alphas
        assert statistics.mean(settled) == pytest.approx(dctcp["ce_fraction"], rel=0.15), (alphas, dctcp)
