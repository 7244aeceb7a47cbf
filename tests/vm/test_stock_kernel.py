"""ccscope on a stock Debian 6.1 kernel (under qemu): CO-RE, vegas/westwood per namespace, BBR over fq,
netem delay and loss. One boot runs every check (tests/vm/guest_checks.py); the tests here assert on
what it observed, by direction and presence, not precise figures (TCG timing is noisy)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from ccscope.emulation.pathcheck import RATE_TOLERANCE
from labhelpers import PYTHON, ROOT, lab

pytestmark = pytest.mark.stock_kernel

# The 6.1 verifier cannot follow the bound on the histogram slot index in observe() (clang checks one
# zero-extended copy of `slot` and indexes with another); 6.18's accepts the same object.


@pytest.fixture(scope="module")
def guest(kernel_lab: Path, bpf_object: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("stock-kernel")
    results = out / "results.json"
    ran = lab("run", "--share", str(out), "--timeout", "480", "--cwd", str(ROOT), "--",
              str(PYTHON), str(ROOT / "tests" / "vm" / "guest_checks.py"), str(results))
    if ran.returncode != 0 or not results.exists():
        pytest.fail(f"guest checks did not complete (status {ran.returncode}): "
                    f"{ran.stderr.strip()[-2000:]}")
    return json.loads(results.read_text())


def check(guest: dict, name: str) -> dict:
    result = guest[name]
    assert "error" not in result, f"{name} failed in the guest: {result.get('trace') or result['error']}"
    return result


def need_probe(guest: dict) -> None:
    """Telemetry assertions need the BPF object loaded on this kernel."""
    kernel = guest["kernel"]
    if kernel["probe_loaded"]:
        return
    pytest.fail(f"probe did not load on {kernel['release']}: {kernel['probe_error']} {kernel['verifier']}")


def test_guest_runs_the_stock_kernel_with_btf(guest: dict) -> None:
    kernel = check(guest, "kernel")
    assert kernel["release"].startswith("6.1.")
    assert kernel["btf"]
    assert {"vegas", "westwood", "bbr", "cubic"} <= set(kernel["available_cc"])
    assert {"sch_netem", "sch_fq", "tcp_vegas", "tcp_westwood"} <= set(kernel["modules"])


def test_bpf_object_loads_and_attaches_on_6_1(guest: dict) -> None:
    need_probe(guest)
    assert guest["kernel"]["probe_error"] is None


def test_attribution_on_6_1(guest: dict) -> None:
    """6.1's sock_cgroup_data (a cgroup pointer since 5.15) and the owner record, through the same object."""
    need_probe(guest)
    found = check(guest, "attribution")
    assert found["seeded"], "the task_file iterator did not run on 6.1"
    assert found["flow"] == [{"cgroup_id": found["cgroup_ino"], "tgid": found["pid"], "comm": found["comm"]}]


CORE_FIELDS = {"snd_cwnd": "snd_cwnd", "snd_ssthresh": "snd_ssthresh", "srtt_us": "rtt_us", "rttvar_us": "rttvar_us",
               "min_rtt_us": "min_rtt_us", "total_retrans": "total_retrans", "bytes_acked": "bytes_acked",
               "bytes_sent": "bytes_sent"}  # map field -> TCP_INFO field


def test_telemetry_matches_tcp_info_for_a_real_flow(guest: dict) -> None:
    """CO-RE on 6.1's layout, field by field: a shaped, lossy flow read once quiescent (guest_checks.check_core),
    so TCG's timing does not enter and the map equals TCP_INFO exactly. The flow is made so that the fields
    differ from each other; a unit slip (srtt unshifted) or one field read for another fails."""
    need_probe(guest)
    core = check(guest, "core")
    seen, info = core["telemetry"], core["tcp_info"]
    assert seen and not seen.get("missing"), "the shaped flow is not in the flows map"
    assert seen["ca_name"] == core["ca"] == "cubic"
    assert {k: seen[k] for k in CORE_FIELDS} == {k: info[v] for k, v in CORE_FIELDS.items()}
    assert info["total_retrans"] > 0 and info["bytes_sent"] > info["bytes_acked"] >= core["bytes"]
    assert info["rtt_us"] > 1.5 * info["min_rtt_us"] and info["rttvar_us"] < info["rtt_us"]
    assert info["snd_cwnd"] > info["snd_ssthresh"]


def test_cubic_state_through_core_on_6_1(guest: dict) -> None:
    """Algorithm state on 6.1 (issue 28): the object's helper build loads. With tcp_bbr unloaded (Debian builds
    it as a module), `ccscope check` names cubic in vmlinux, and a BBR flow started after the module is loaded
    carries no state, with no error; with the module there before the
    program, the check names its BTF and BBR's state reads through it. A lossy CUBIC flow's W_max and ssthresh
    follow β: 0.7, or 0.82 with fast convergence (after an RTO, bictcp_reset() has set W_max to 0, which must
    read as 0)."""
    state = check(guest, "ccstate")
    assert state["unloaded"] and not any(line.startswith("tcp_bbr ") for line in state["modules"]), state
    # the guest runs on the host's root, which has no /lib/modules for this kernel: without the module, bbr is
    # no algorithm this host could load (host/algorithms.py), and the check rightly says nothing of it (a host
    # with tcp_bbr.ko warns "no state for bbr ... modprobe tcp_bbr": tests/test_cli_errors.py)
    status, detail = state["check_without"]
    assert status == "ok" and "cubic (vmlinux)" in detail and "bbr" not in detail, detail
    assert state["bbr_unknown"] == {"ca": "bbr", "state": None}, state["bbr_unknown"]
    status, detail = state["check"]
    assert status == "ok" and "cubic (vmlinux)" in detail and "bbr (module tcp_bbr)" in detail, detail
    bbr = state["bbr"]  # CO-RE reads struct bbr through the module's BTF
    assert bbr["ca"] == "bbr" and bbr["state"]["mode"] in ("startup", "drain", "probe_bw", "probe_rtt"), bbr
    assert bbr["state"]["min_rtt_s"] > 0.005 and bbr["state"]["bandwidth_Bps"] > 0, bbr  # 5 ms netem each way
    assert state["ca"] == "cubic" and state["kind"] == 2 and state["state"] is not None, state
    cubic, info = state["state"], state["tcp_info"]
    assert cubic["snd_ssthresh"] == info["snd_ssthresh"] and cubic["snd_cwnd"] == info["snd_cwnd"], (cubic, info)
    if cubic["wmax"]:
        ratio = cubic["snd_ssthresh"] / cubic["wmax"]
        assert min(abs(ratio - 717 / 1024), abs(ratio - 1434 / 1741)) <= 1.5 / cubic["wmax"], cubic
    else:
        assert state["timeouts"] > 0, state


def test_vegas_and_westwood_are_a_namespace_default_once_allowed(guest: dict) -> None:
    cc = check(guest, "netns_cc")
    # A non-init namespace may only choose what the init namespace allows.
    assert cc["refused_before_allowed"] == {"vegas": True, "westwood": True}
    for algorithm in ("vegas", "westwood"):
        assert cc[algorithm]["sysctl"] == algorithm
        assert cc[algorithm]["socket_ca"] == algorithm
        assert cc[algorithm]["tcp_info"]["bytes_acked"] > 0
    assert cc["init_ns_default"] not in ("vegas", "westwood")


def test_telemetry_labels_vegas_and_westwood_flows(guest: dict) -> None:
    need_probe(guest)
    cc = check(guest, "netns_cc")
    for algorithm in ("vegas", "westwood"):
        assert cc[algorithm]["telemetry"]["ca_name"] == algorithm


def test_bbr_runs_over_fq_on_the_senders_interface(guest: dict) -> None:
    fq = check(guest, "fq_bbr")
    assert fq["socket_ca"] == "bbr"
    qdiscs = {q["kind"]: q for q in fq["qdisc"]}
    assert "fq" in qdiscs, fq["qdisc"]
    assert qdiscs["fq"]["bytes"] >= fq["bytes"]  # every payload byte (plus headers) went through fq
    assert fq["tcp_info"]["pacing_rate"] > 0


def test_telemetry_sees_bbr_pacing(guest: dict) -> None:
    need_probe(guest)
    fq = check(guest, "fq_bbr")
    assert fq["telemetry"]["ca_name"] == "bbr"
    assert fq["telemetry"]["pacing_rate"] > 0


def test_netem_delay_raises_rtt(guest: dict) -> None:
    netem = check(guest, "netem")
    plain, delayed = netem["plain"]["tcp_info"], netem["delay50"]["tcp_info"]
    assert delayed["min_rtt_us"] >= 45_000 > plain["min_rtt_us"]
    assert delayed["rtt_us"] > plain["rtt_us"] + 40_000
    assert any(q["kind"] == "netem" and q["packets"] > 0 for q in netem["delay50"]["netem"])


def test_netem_loss_causes_retransmits(guest: dict) -> None:
    netem = check(guest, "netem")
    lossy = netem["loss2"]
    netem_stats = [q for q in lossy["netem"] if q["kind"] == "netem"]
    drops, packets = sum(q["drops"] for q in netem_stats), sum(q["packets"] for q in netem_stats)
    # Per packet, about 2% (binomial over ~2900 packets: this band is many standard deviations wide).
    assert 0.005 < drops / max(packets, 1) < 0.06, (drops, packets)
    # Every data segment netem dropped was sent again (TCG's timer noise may add spurious ones, so >=). The
    # one packet that needs no resend is the handshake's last pure ACK (the first data segment carries it):
    # seen once as 60 retransmits for 61 drops.
    assert lossy["tcp_info"]["total_retrans"] >= drops - 1


def test_telemetry_sees_netem_delay_and_loss(guest: dict) -> None:
    need_probe(guest)
    netem = check(guest, "netem")
    assert netem["delay50"]["telemetry"]["srtt_us"] >= 45_000
    assert netem["plain"]["telemetry"]["srtt_us"] < netem["delay50"]["telemetry"]["srtt_us"]
    assert netem["loss2"]["telemetry"]["total_retrans"] > 0


def test_emulation_picks_the_netem_backend(guest: dict) -> None:
    engine = check(guest, "engine")
    assert {"netem", "tbf", "fq"} <= set(engine["qdiscs"])
    assert engine["backend"] == "netem"
    assert any(q.startswith("netem") for q in engine["installed"]["up"]["qdiscs"])
    # 10 ms each way through netem: the RTT moves up from the sub-millisecond veth baseline.
    assert min(engine["ping_rtts_s"]) >= 0.018


def test_emulation_namespaces_take_vegas_and_westwood(guest: dict) -> None:
    engine = check(guest, "engine")
    assert engine["algorithms"] == {"vegas": "vegas", "westwood": "westwood"}


def test_path_check_trusts_netem_at_1mbit_400ms(guest: dict) -> None:
    found = check(guest, "pathcheck")
    assert found["backend"] == "netem"
    assert found["rtt_ok"] and found["rate_ok"], found["message"]
    assert found["rtt_expected_s"] == pytest.approx(found["base_rtt_s"], abs=1e-9)
    assert found["rate_measured_bps"] == pytest.approx(found["rate_expected_bps"], rel=RATE_TOLERANCE)
    # the same link against a profile asking 1.25 Mbit/s: OFF for the rate alone
    wrong = found["wrong_rate"]
    assert wrong["rtt_ok"] and not wrong["rate_ok"], wrong["message"]
    assert wrong["rate_measured_bps"] == pytest.approx(0.8 * wrong["rate_expected_bps"], rel=RATE_TOLERANCE)
    assert "(expected 1.25) OFF" in wrong["message"], wrong["message"]
