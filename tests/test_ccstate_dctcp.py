"""The kernel's DCTCP state decoder (ccstate/dctcp.py). This VM's kernel has no dctcp (not built in, no modules):
the lab's 7.2 reads it from the module's BTF and checks alpha against the flow's CE fraction
(tests/vm/test_aqm_fidelity.py::test_the_kernels_dctcp_shows_its_alpha_as_the_ce_fraction)."""

from __future__ import annotations

from ccscope.ccstate.dctcp import DctcpState
from ccscope.ccstate.decoders import decode, metrics_of
from ccscope.ccstate.record import CcState, DctcpStateC, Kind


def test_dctcp_decoder_units() -> None:
    """tcp_dctcp.c keeps alpha in 1/1024 (DCTCP_MAX_ALPHA), 1024 until the first window with a mark."""
    raw = CcState(kind=Kind.DCTCP, updated_ns=1)
    raw.dctcp = DctcpStateC(alpha=1024, loss_cwnd=10, snd_cwnd=10, snd_ssthresh=0x7FFFFFFF)
    start = decode(raw)
    assert isinstance(start, DctcpState) and start.alpha == 1.0 and not start.receiving_ce
    raw.dctcp = DctcpStateC(alpha=51, loss_cwnd=42, snd_cwnd=40, snd_ssthresh=38, ce_state=1)
    marked = decode(raw)
    assert (marked.alpha, marked.loss_cwnd_segments, marked.receiving_ce) == (51 / 1024, 42, True)
    assert marked.as_dict() == {"algorithm": "dctcp", "alpha": 51 / 1024, "loss_cwnd_segments": 42,
                                "receiving_ce": True, "cwnd_segments": 40, "ssthresh_segments": 38}
    assert "alpha 0.050" in marked.summary() and marked.change is None
    assert [m.name for m in metrics_of(marked)] == ["ccscope_flow_dctcp_alpha"]
    raw.dctcp.alpha = 1025  # past DCTCP_MAX_ALPHA: not a struct dctcp this ccscope knows
    assert decode(raw) is None
