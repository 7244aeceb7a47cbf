"""CUBIC's own state (ccstate/cubic.py) against CUBIC's own formulas (RFC 9438, tcp_cubic.c): after each loss
ssthresh is β·W_max (β = 717/1024), or with fast convergence β·cwnd where W_max = cwnd·(1+β)/2; and K, set at
the epoch's start from the window then (ssthresh, once recovery ends), is the cube root of (W_max - cwnd)/C."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ccscope.ccstate.decoders import decode
from ccscope.ccstate.probe import StateProbe
from ccscope.ccstate.record import CcState, CubicStateC, Kind
from ccscope_testkit.net import Daemon, Link, parse_metrics
from ccscope_testkit.prereqs import require_bpf_object, require_root, require_tools

PEER = str(Path(__file__).with_name("ccstate_peer.py"))
PORT = 5302
BETA = 717 / 1024
C = 410 / 1024  # bic_scale 41 (x10): 0.4


def test_decoder_units() -> None:
    raw = CcState(kind=Kind.CUBIC, updated_ns=1)
    raw.cubic = CubicStateC(last_max_cwnd=100, bic_K=2048, bic_origin_point=100, epoch_start=5, tcp_cwnd=80,
                            snd_cwnd=75, snd_ssthresh=70, wmax_updates=3, found=2)
    state = decode(raw)
    assert (state.wmax_segments, state.k_s, state.origin_segments, state.hystart_done) == (100, 2.0, 100, True)
    assert state.reno_governs and state.summary() == "cubic:wmax:100 K:2.000s origin:100 reno_cwnd:80 reno"
    raw.cubic.epoch_start = 0  # between a loss and the next ACK: no epoch, so K and the region say nothing
    assert not decode(raw).reno_governs


@pytest.fixture
def link() -> Iterator[Link]:
    require_root()
    require_tools("ip", "tc")
    require_bpf_object()
    made = Link.create("203.0.113")
    try:
        made.shape("20mbit", burst="16kb", limit="30kb")
        made.drop_randomly(PORT, 0.002)  # besides the queue's own drops: K is seconds, so a loss every ~0.3 s
        yield made
    finally:
        made.close()


def test_wmax_and_k_follow_cubics_formulas(link: Link) -> None:
    server = link.popen(link.b, sys.executable, PEER, "serve", str(PORT), str(1 << 62))
    client = link.popen(link.a, sys.executable, PEER, "bulk", link.addr_b, str(PORT), "cubic", "8",
                        stdout=subprocess.PIPE, text=True)
    epochs: dict[tuple[int, int, int], object] = {}
    scraped: dict[str, float] | None = None
    daemon = Daemon("--flows", "all")
    try:
        with StateProbe() as probe:
            cookie = int(client.stdout.readline())
            while client.poll() is None:
                raw = probe.raw(cookie)
                state = decode(raw) if raw else None
                if state and state.in_epoch and state.wmax_segments:
                    epochs[(state.wmax_segments, state.ssthresh_segments, raw.cubic.bic_K)] = state
                time.sleep(0.005)
                if len(epochs) >= 3 and scraped is None:  # once, mid-flow: the daemon's series of this flow
                    scraped = {name: value for name, labels, value in parse_metrics(daemon.scrape_text())
                               if labels.get("dport") == str(PORT)}
    finally:
        daemon.stop()
        for proc in (client, server):
            proc.kill()
            proc.wait()
    assert len(epochs) >= 5, epochs
    # (K, the origin and the region are absent between a loss and its epoch's first ACK; a loss in slow start
    # ends no epoch, as none ran)
    assert scraped["ccscope_flow_cubic_wmax_segments"] > 0 and scraped["ccscope_flow_cubic_wmax_updates_total"] >= 1
    assert not [name for name in scraped if "_bbr_" in name], scraped
    for (wmax, ssthresh, _), state in epochs.items():
        # ssthresh = max(cwnd·β, 2), W_max = cwnd or cwnd·(1+β)/2: either ratio, to the segment
        ratio = ssthresh / wmax
        assert min(abs(ratio - BETA), abs(ratio - 2 * BETA / (1 + BETA))) <= 1.5 / wmax, (ssthresh, wmax)
        if wmax > ssthresh:
            expected_k = ((wmax - ssthresh) / C) ** (1 / 3)
            # cubic_root()'s table and one Newton step (0.2 %), and K counted in 1/1024 s
            assert state.k_s == pytest.approx(expected_k, rel=0.005, abs=2 / 1024), (state, expected_k)
            assert state.origin_segments == wmax
    assert state.wmax_updates >= len(epochs), state  # one loss (at least) began each epoch seen
