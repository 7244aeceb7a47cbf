"""The change events of the state ring (ccstate/changes.py) and trace's lines of them (ccstate/trace_lines.py):
repeats dropped per flow, memory bounded, and a change shown only for a flow the trace shows."""

from __future__ import annotations

import json

from ccscope.ccstate.changes import ChangeReader
from ccscope.ccstate.record import BbrStateC, CcState, CubicStateC, Kind
from ccscope.ccstate.trace_lines import TracedFlows


def bbr(cookie: int, mode: int, t: int = 1) -> bytes:
    raw = CcState(cookie=cookie, kind=Kind.BBR, updated_ns=t)
    raw.bbr = BbrStateC(mode=mode, mss=1448, pacing_gain=256, cwnd_gain=512)
    return bytes(raw)


def cubic(cookie: int, wmax: int, epoch: int, t: int = 1) -> bytes:
    raw = CcState(cookie=cookie, kind=Kind.CUBIC, updated_ns=t)
    raw.cubic = CubicStateC(last_max_cwnd=wmax, epoch_start=epoch, bic_K=1024)
    return bytes(raw)


def test_a_repeat_of_the_key_is_no_event() -> None:
    reader = ChangeReader()
    # a copy from a second CPU repeats probe_bw; flow 2's own first copy is an event of its own
    events = reader.read([bbr(1, 0), bbr(1, 2, 5), bbr(1, 2, 6), bbr(2, 2), bbr(1, 3, 7)])
    assert [(e.cookie, e.state.mode, e.time_ns) for e in events] == [(1, "startup", 1), (1, "probe_bw", 5),
                                                                     (2, "probe_bw", 1), (1, "probe_rtt", 7)]
    # CUBIC: a new W_max, and the epoch starting at the next ACK, are two events; the same W_max again is none
    events = reader.read([cubic(3, 100, 0), cubic(3, 100, 5000), cubic(3, 100, 6000), cubic(3, 70, 0)])
    assert [(e.state.wmax_segments, e.state.in_epoch) for e in events] == [(100, False), (100, True), (70, False)]
    assert reader.read([b"short", bytes(CcState(cookie=4, kind=Kind.BBR))]) == []  # foreign, never copied


def test_memory_is_bounded_oldest_first() -> None:
    reader = ChangeReader(max_flows=2)
    reader.read([bbr(1, 0), bbr(2, 0), bbr(3, 0)])
    assert [e.cookie for e in reader.read([bbr(1, 0), bbr(3, 0)])] == [1]  # 1 was forgotten, 3 was not


def test_trace_shows_changes_of_its_flows_only() -> None:
    flows = TracedFlows()
    flows.saw(1, "10.0.0.1:40000->10.0.0.2:5201")
    lines = flows.state_lines([bbr(1, 0), bbr(9, 0)], 0.0, as_json=True)
    [line] = [json.loads(x) for x in lines]
    assert (line["flow"], line["event"], line["state"]["mode"]) == ("10.0.0.1:40000->10.0.0.2:5201", "state_change",
                                                                    "startup")
    # flow 9's change waits one poll for its first sample; met then, it is shown, in text too
    flows.saw(9, "10.0.0.1:40001->10.0.0.2:5201")
    assert flows.knows(9) and not flows.knows(5)
    [text] = flows.state_lines([], 0.0, as_json=False)
    assert b"10.0.0.1:40001->10.0.0.2:5201 bbr:startup" in text
    assert flows.state_lines([bbr(5, 0)], 0.0, as_json=True) == []
    assert flows.state_lines([], 0.0, as_json=True) == []  # not met after one more poll: not this trace's
