"""`ccscope trace --json`'s encoder (tracejson.py) against the record it encodes: every line holds what
FlowRecord.as_dict(), the attribution, the event's name and the time say, for records of every shape; a flow's
cached first bytes follow its algorithm, and its attribution within REENCODE_S."""

from __future__ import annotations

import json
import random
import socket

import pytest
from ccscope import bpf_types as bt
from ccscope import tracejson
from ccscope.attribution import Attribution
from ccscope.flows import RECORD_FIELDS, FlowRecord, compile_record, decode
from ccscope.tracejson import REENCODE_S, TraceEncoder
from records import raw_flow

UNATTRIBUTED = {"cgroup": "", "container": "", "pod": "", "namespace": "", "pod_uid": ""}


def expected(raw: bt.Flow, wall_offset: float, attribution: dict) -> dict:
    record = decode(raw)
    return {**record.as_dict(), **attribution, "event": bt.EVENT_NAMES.get(record.event, str(record.event)),
            "time": pytest.approx(record.last_ns / 1e9 + wall_offset, abs=1e-6)}


def tuple_of(raw: bt.Flow) -> bt.FlowTuple:
    return bt.unpack_flow(bytes(raw))


def random_record(rng: random.Random) -> bt.Flow:
    """Records across the encoder's branches: IPv6 and IPv4, an infinite ssthresh, no min_rtt yet, unlimited
    pacing, no delivery rate, unknown ca and socket states, every ECN mode, a closed flow."""
    v6 = rng.random() < 0.5
    return raw_flow(
        cookie=rng.randrange(1, 1 << 64), netns=rng.randrange(1 << 32),
        family=socket.AF_INET6 if v6 else socket.AF_INET,
        saddr="2001:db8::1" if v6 else f"192.0.2.{rng.randrange(256)}", daddr="2001:db8::2" if v6 else "198.51.100.7",
        sport=rng.randrange(1 << 16), dport=rng.randrange(1 << 16), ca_state=rng.choice([0, 1, 2, 3, 4, 9]),
        sk_state=rng.choice([1, 4, 7, 99]), event=rng.randrange(6), snd_cwnd=rng.randrange(1 << 32),
        snd_ssthresh=rng.choice([0x7FFFFFFF, 0xFFFFFFFF, rng.randrange(1 << 31)]), srtt_us=rng.randrange(1 << 32),
        rttvar_us=rng.randrange(1 << 32), min_rtt_us=rng.choice([0, 0xFFFFFFFF, rng.randrange(1, 1 << 32)]),
        packets_out=rng.randrange(100), sacked_out=rng.randrange(200), rate_delivered=rng.choice([0, 37]),
        rate_interval_us=rng.choice([0, 1234]), pacing_rate=rng.choice([(1 << 64) - 1, rng.randrange(1 << 40)]),
        bytes_acked=rng.randrange(1 << 63), last_ns=rng.randrange(1 << 62), closed_ns=rng.choice([0, 5]),
        ca_name=rng.choice([b"cubic", b"bbr", b"ccscope_copa", b""]), comm=rng.choice([b"iperf3", b"", b'a"b\\']),
        tgid=rng.randrange(1 << 31), cgroup_id=rng.randrange(1 << 40), ecn_flags=rng.choice([0, 1, 0x10, 0x11]),
        delivered_ce=rng.randrange(1 << 32), dsack_dups=rng.randrange(1 << 32))


def test_every_line_holds_what_the_record_says() -> None:
    rng = random.Random(7)
    encoder = TraceEncoder(1000.25, None)
    for _ in range(2000):
        raw = random_record(rng)
        for _repeat in range(2):  # the flow's first bytes encoded, then taken from the cache
            assert json.loads(encoder.line(tuple_of(raw))) == expected(raw, 1000.25, UNATTRIBUTED)


def test_the_table_is_flow_records_fields() -> None:
    assert [f.name for f in RECORD_FIELDS] == list(FlowRecord.__dataclass_fields__)


def test_a_flow_that_switches_algorithm_is_encoded_again() -> None:
    encoder = TraceEncoder(0.0, None)
    assert json.loads(encoder.line(tuple_of(raw_flow(ca_name=b"cubic"))))["cc"] == "cubic"
    assert json.loads(encoder.line(tuple_of(raw_flow(ca_name=b"bbr"))))["cc"] == "bbr"


def test_attribution_is_read_again_after_reencode_s() -> None:
    clock_s = [0.0]
    pods = {5: Attribution("/kubepods/x", "c1", "", "", "")}
    encoder = TraceEncoder(0.0, lambda cgroup_id: pods[cgroup_id], clock=lambda: clock_s[0])
    raw = tuple_of(raw_flow(cgroup_id=5))
    assert json.loads(encoder.line(raw))["pod"] == ""
    pods[5] = Attribution("/kubepods/x", "c1", "web-1", "default", "u1")  # the pod's name found later
    clock_s[0] = REENCODE_S / 2
    encoder.refresh()
    assert json.loads(encoder.line(raw))["pod"] == ""  # within REENCODE_S the first bytes are kept
    clock_s[0] = REENCODE_S * 1.5
    encoder.refresh()
    assert json.loads(encoder.line(raw))["pod"] == "web-1"


def test_the_cache_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tracejson, "MAX_FLOWS", 100)
    encoder = TraceEncoder(0.0, None)
    for cookie in range(250):
        line = json.loads(encoder.line(tuple_of(raw_flow(cookie=cookie))))
        assert line["cookie"] == cookie
        assert len(encoder._first_bytes) <= 100


def test_compiled_code_refuses_a_name_that_clashes_with_a_kernel_field() -> None:
    with pytest.raises(ValueError, match=r"srtt_us'\] clash"):
        compile_record(RECORD_FIELDS, "clashing", arguments=("srtt_us",))
