"""Pure userspace logic: decoding kernel records, unit conversion, flag parsing, selection and formatting."""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import json
import re
import socket

import pytest
from ccscope import bpf_types as bt
from ccscope.cli import _trace_text, format_flows
from ccscope.errors import UsageError
from ccscope.exporter import histogram_buckets
from ccscope.flows import FLOW_COLUMNS, FlowFilter, FlowSelection, decode
from ccscope.flowscan import FlowColumns
from ccscope.units import format_bytes, format_rate, parse_duration, parse_listen, parse_loss, parse_rate, parse_size
from records import raw_flow


def test_decode_ipv4_units_and_derived_values() -> None:
    flow = decode(raw_flow(saddr="192.0.2.1", daddr="198.51.100.7"))
    assert (flow.family, flow.src, flow.dst, flow.name) == ("ipv4", "192.0.2.1", "198.51.100.7",
                                                            "192.0.2.1:40000->198.51.100.7:5201")
    assert flow.srtt_s == pytest.approx(0.0125)
    assert flow.rttvar_s == pytest.approx(0.0007)
    assert flow.min_rtt_s == pytest.approx(0.010)
    assert flow.queueing_delay_s == pytest.approx(0.0025)
    # tcp_packets_in_flight(): packets_out - (sacked_out + lost_out) + retrans_out
    assert flow.packets_in_flight == 18 - 3 - 2 + 1
    # tcp_get_info(): rate_delivered * mss * 1e6 / rate_interval_us
    assert flow.delivery_rate_Bps == pytest.approx(10 * 1448 * 1e6 / 2000)
    assert flow.pacing_rate_Bps == 3_000_000.0
    assert (flow.cc, flow.ca_state, flow.state) == ("cubic", "open", "established")
    assert (flow.retransmits, flow.lost_packets, flow.cwnd_segments, flow.ssthresh_segments) == (7, 9, 20, 14)
    assert flow.bytes_total == 1_000_500


def test_decode_ipv6_and_v4_mapped() -> None:
    v6 = decode(raw_flow(family=socket.AF_INET6, saddr="fd00:cc5::1", daddr="fd00:cc5::2"))
    assert (v6.family, v6.src, v6.dst) == ("ipv6", "fd00:cc5::1", "fd00:cc5::2")
    assert v6.name == "[fd00:cc5::1]:40000->[fd00:cc5::2]:5201"
    mapped = decode(raw_flow(family=socket.AF_INET6, saddr="::ffff:192.0.2.9", daddr="::ffff:192.0.2.10"))
    assert (mapped.src, mapped.dst) == ("192.0.2.9", "192.0.2.10")


@pytest.mark.parametrize("state, name", [(0, "open"), (1, "disorder"), (2, "cwr"), (3, "recovery"), (4, "loss"),
                                         (9, "9")])
def test_decode_ca_states(state: int, name: str) -> None:
    assert decode(raw_flow(ca_state=state)).ca_state == name


def test_decode_sentinels() -> None:
    flow = decode(raw_flow(snd_ssthresh=0x7FFFFFFF, min_rtt_us=0xFFFFFFFF, pacing_rate=(1 << 64) - 1,
                           rate_interval_us=0, sk_state=7, ca_name=b"", packets_out=0, retrans_out=0))
    assert flow.ssthresh_segments is None  # still in initial slow start
    assert flow.min_rtt_s is None and flow.queueing_delay_s == 0.0
    assert flow.pacing_rate_Bps is None
    assert flow.delivery_rate_Bps == 0.0
    assert flow.packets_in_flight == 0  # never negative
    assert (flow.state, flow.cc) == ("close", "unknown")


def test_as_dict_is_json() -> None:
    data = json.loads(json.dumps(decode(raw_flow(saddr="192.0.2.1", daddr="192.0.2.2")).as_dict()))
    assert data["flow"] == "192.0.2.1:40000->192.0.2.2:5201"
    assert data["queueing_delay_s"] == pytest.approx(0.0025)
    assert data["cwnd_segments"] == 20


@pytest.mark.parametrize("text, seconds", [("10ms", 0.01), ("2s", 2.0), ("1m", 60.0), ("1h", 3600.0),
                                           ("250us", 0.00025), ("1.5", 1.5), (" 3 s ", 3.0), (".5s", 0.5),
                                           ("2min", 120.0), ("10MS", 0.01), ("1e3", 1000.0), (0.25, 0.25)])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text, "--x") == pytest.approx(seconds)


@pytest.mark.parametrize("text, words", [("-1", "is negative"), ("", "is not a duration"),
                                         ("ten", "is not a duration"), ("10 parsecs", "is not a duration"),
                                         ("ms", "is not a duration"), ("1e999s", "is not a finite number")])
def test_parse_duration_rejects(text: str, words: str) -> None:
    with pytest.raises(UsageError) as info:
        parse_duration(text, "--x")
    assert info.value.line() == f"--x {text!r} {words}" + (" (examples: 10ms, 2s, 1m)" if "not a dur" in words else "")


def test_parse_duration_range_names_the_bounds_in_the_callers_words() -> None:
    with pytest.raises(UsageError, match=r"^--sample-interval '20s' is out of range \(0.1ms to 10s\)$"):
        parse_duration("20s", "--sample-interval", 0.0001, 10.0)
    with pytest.raises(UsageError, match="out of range"):
        parse_duration("10us", "--sample-interval", 0.0001, 10.0)
    with pytest.raises(UsageError, match=r"^x.yaml: delay: '11s' is longer than 10s, too long$"):
        parse_duration("11s", "x.yaml: delay", 0, 10, too_high="is longer than {high}, too long")
    with pytest.raises(UsageError, match="expected a duration"):
        parse_duration(True, "x.yaml: delay")


@pytest.mark.parametrize("raw, size", [("1KB", 1000), ("64KiB", 65536), ("1MB", 10**6), ("2 mib", 2 << 20),
                                       (1500, 1500), ("1gb", 10**9), ("10", 10), ("1.5k", 1500)])
def test_parse_size(raw, size: int) -> None:
    assert parse_size(raw, "s") == size


@pytest.mark.parametrize("raw, words", [("1.5", "not a positive whole number of bytes"), (0, "not a positive whole"),
                                        ("-1KB", "is negative"), ("1 furlong", "is not a size"),
                                        ("2KB", "is out of range (1B to 1.5KB)"), (True, "expected a size")])
def test_parse_size_rejects(raw, words: str) -> None:
    with pytest.raises(UsageError, match=re.escape(words)):
        parse_size(raw, "s", 1, 1500)


@pytest.mark.parametrize("raw, bps", [("50mbit", 50e6), ("1.5Mbit/s", 1.5e6), ("10 Gbps", 10e9), (2e7, 2e7),
                                      ("800kbit", 8e5), ("unlimited", None), (None, None)])
def test_parse_rate(raw, bps) -> None:
    assert parse_rate(raw, "r") == bps


def test_parse_rate_bounds() -> None:
    with pytest.raises(UsageError, match=r"^r: 10 is below 1 kbit/s, too slow$"):
        parse_rate(10, "r", 1e3, 1e9, too_low="is below {low}, too slow")
    with pytest.raises(UsageError, match=re.escape("r: '2gbit' is out of range (1 kbit/s to 1 Gbit/s)")):
        parse_rate("2gbit", "r", 1e3, 1e9)
    with pytest.raises(UsageError, match="not a positive rate"):
        parse_rate("0mbit", "r")


@pytest.mark.parametrize("raw, fraction", [("1%", 0.01), ("0.5 %", 0.005), (0.01, 0.01), (0, 0.0)])
def test_parse_loss(raw, fraction: float) -> None:
    assert parse_loss(raw, "l") == pytest.approx(fraction)


@pytest.mark.parametrize("raw, words", [("100%", "would drop every packet"), ("150%", "not a loss fraction"),
                                        ("-1%", "not a loss fraction"), ("lots", "is not a loss")])
def test_parse_loss_rejects(raw, words: str) -> None:
    with pytest.raises(UsageError, match=words):
        parse_loss(raw, "l")


@pytest.mark.parametrize("text, expected", [("127.0.0.1:9977", ("127.0.0.1", 9977)), (":9977", ("0.0.0.0", 9977)),
                                            ("[::1]:80", ("::1", 80)), ("host.example:1", ("host.example", 1))])
def test_parse_listen(text: str, expected: tuple[str, int]) -> None:
    assert parse_listen(text) == expected


@pytest.mark.parametrize("text", ["garbage", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:65536", "1.2.3.4:http", "",
                                  "[::1:80", "::1:80", "[]:80", "[[::1]]:80", "::1]:80"])
def test_parse_listen_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="--listen"):
        parse_listen(text)


def test_flow_selection() -> None:
    flows = [decode(raw_flow(cookie=i, bytes_acked=i * 100, bytes_received=0)) for i in range(10)]
    assert [f.cookie for f in FlowSelection.parse("top:3").pick(flows)] == [9, 8, 7]
    assert len(FlowSelection.parse("all").pick(flows)) == 10
    assert FlowSelection.parse("none").pick(flows) == []
    assert len(FlowSelection.parse("top:50").pick(flows)) == 10


@pytest.mark.parametrize("text", ["top:0", "top:-1", "top:x", "top:", "some", "top:100001"])
def test_flow_selection_rejects(text: str) -> None:
    with pytest.raises(UsageError, match="--flows"):
        FlowSelection.parse(text)


def test_flow_filter() -> None:
    a = decode(raw_flow(netns=1, sport=1000, dport=80, saddr="192.0.2.1", daddr="192.0.2.2"))
    b = decode(raw_flow(netns=2, sport=2000, dport=443, family=socket.AF_INET6, saddr="fd00:cc5::1",
                        daddr="fd00:cc5::2"))
    cases = {
        (): {a, b},
        (("netns", "2"),): {b},
        (("ports", "80"),): {a},
        (("ports", "1000"),): {a},
        (("cidrs", "192.0.2.0/24"),): {a},
        (("cidrs", "fd00:cc5::/48"),): {b},
        (("cidrs", "192.0.2.2"),): {a},
        (("cidrs", "198.51.100.0/24"),): set(),
        (("ports", "443"), ("netns", "1")): set(),
    }
    for spec, expected in cases.items():
        kwargs: dict[str, list[str]] = {}
        for key, value in spec:
            kwargs.setdefault(key, []).append(value)
        chosen = FlowFilter.parse(**kwargs)
        assert {f for f in (a, b) if chosen.matches(f)} == expected, spec


@pytest.mark.parametrize("kwargs, flag", [({"ports": ["0"]}, "--port"), ({"ports": ["http"]}, "--port"),
                                          ({"netns": ["-1"]}, "--netns"), ({"cidrs": ["10.0.0.0/33"]}, "--cidr"),
                                          ({"cidrs": ["nope"]}, "--cidr")])
def test_flow_filter_rejects(kwargs: dict, flag: str) -> None:
    with pytest.raises(UsageError, match=flag):
        FlowFilter.parse(**kwargs)


def test_histogram_buckets_cumulative_in_seconds() -> None:
    hist = bt.Hist()
    hist.slots[0] = 1      # [0, 2) us
    hist.slots[10] = 5     # [1024, 2048) us
    hist.slots[bt.HIST_SLOTS - 1] = 2  # top slot -> only in +Inf
    buckets = histogram_buckets(hist)
    assert len(buckets) == bt.HIST_SLOTS
    assert buckets[0] == (repr(2e-6), 1)
    assert dict(buckets)[repr(2048 / 1e6)] == 6
    assert buckets[-2][1] == 6
    assert buckets[-1] == ("+Inf", 8)
    assert all(x[1] <= y[1] for x, y in itertools.pairwise(buckets))


@pytest.mark.parametrize("value, text", [(1e6, "1.0Mb"), (1e9, "1.0Gb"), (800, "800b"), (1e4, "10.0kb")])
def test_rate_cell_format(value, text: str) -> None:
    assert format_rate(value, cell=True) == text


@pytest.mark.parametrize("value, text", [(512, "512"), (2048, "2.0K"), (3 << 20, "3.0M"), (5 << 30, "5.0G")])
def test_bytes_cell_format(value: int, text: str) -> None:
    assert format_bytes(value, cell=True) == text


def test_flows_table_rate_cells_are_bits_per_second() -> None:
    flow = dataclasses.replace(decode(raw_flow(saddr="192.0.2.1", daddr="192.0.2.2")),
                               delivery_rate_Bps=125_000, pacing_rate_Bps=None)
    cells = {c.title: c.text(flow) for c in FLOW_COLUMNS}
    assert (cells["DELIVERY"], cells["PACING"]) == ("1.0Mb", "-")


def test_format_flows_table() -> None:
    flow = decode(raw_flow(saddr="192.0.2.1", daddr="192.0.2.2"))
    lines = format_flows([flow]).splitlines()
    assert lines[0].split() == [c.title for c in FLOW_COLUMNS] + ["COMM", "CGROUP/POD"]
    row = lines[1].split()
    assert row[0] == "192.0.2.1:40000->192.0.2.2:5201"
    assert row[2:8] == ["cubic", "open", "20", "14", "12.50ms", "10.00ms"]
    assert row[-3:] == ["7", "-", "-"]  # retransmits; this record names no process, and no cgroup resolver


def test_format_flows_says_why_each_flow_retransmitted() -> None:
    first, second = (decode(raw_flow(saddr="192.0.2.1", daddr="192.0.2.2", cookie=c)) for c in (1, 2))
    lines = format_flows([first, second], causes={1: {bt.RetransCause.RTO: 0, bt.RetransCause.FAST: 12,
                                                      bt.RetransCause.TLP: 3, bt.RetransCause.OTHER: 0}}).splitlines()
    assert lines[0].split()[-2:] == ["WHY", "RETRANS"]
    assert lines[1].split()[-1] == "fast:12,tlp:3" and lines[2].split()[-1] == "-"  # none counted: none shown


def test_trace_line_text() -> None:
    raw = raw_flow(saddr="192.0.2.1", daddr="192.0.2.2", last_ns=5_000_000_000, event=3, closed_ns=9)
    text = _trace_text(decode(raw), 1000.0).decode()
    assert "192.0.2.1:40000->192.0.2.2:5201 cubic cwnd=20 srtt=12.50ms retrans=7 open CLOSED" in text


def _columns(flows: list[bt.Flow]) -> FlowColumns:
    return FlowColumns(b"".join(bytes(f) for f in flows), len(flows))


def test_flow_columns_read_the_fields_of_every_record() -> None:
    raws = [raw_flow(cookie=i, netns=10 + i % 3, sport=1000 + i, dport=80, bytes_acked=i * 7, closed_ns=i % 2,
                     saddr="192.0.2.1", daddr="192.0.2.2", ca_name=b"cubic" if i % 2 else b"bbr") for i in range(9)]
    # what the kernel leaves after a switch from cubic ("bbr\0ic"): another key, the same name
    ctypes.memmove(ctypes.addressof(raws[4]) + bt.Flow.ca_name.offset, b"bbr\0ic", 6)
    columns = _columns(raws)
    assert len(columns) == 9
    for name in ("cookie", "netns", "sport", "dport", "bytes_acked", "closed_ns", "ca_state", "srtt_us"):
        assert columns.column(name) == [getattr(f, name) for f in raws], name
    assert [columns.name(key) for key in columns.ca_names()] == [decode(f).cc for f in raws]
    assert len(set(columns.ca_names())) == 3
    assert [decode(columns.record(i)) for i in range(9)] == [decode(f) for f in raws]
    assert bytes(columns.raw(5)) == bytes(raws[5])


def test_flow_columns_select_and_pick_as_the_records_do() -> None:
    comms = (b"nginx", b"", b"kube-apiserver")  # the last is longer than 8 bytes: two-integer keys
    raws = [raw_flow(cookie=i, netns=1 + i % 4, sport=2000 + i, dport=443 if i % 5 == 0 else 80,
                     bytes_acked=(i * 7919) % 1000, bytes_received=i, saddr=f"192.0.2.{i + 1}", daddr="198.51.100.1",
                     comm=comms[i % 3], cgroup_id=100 + i % 6)
            for i in range(40)]
    columns, flows = _columns(raws), [decode(f) for f in raws]
    everything = list(range(len(raws)))
    paths = {100: "/system.slice/nginx.service", 101: "/system.slice", 102: "/kubepods.slice/pod1", 103: "/"}
    for kwargs in ({}, {"netns": ["2"]}, {"ports": ["443"]}, {"ports": ["2003"], "netns": ["4"]},
                   {"cidrs": ["192.0.2.0/28"]}, {"comms": ["nginx"]}, {"comms": ["kube-apiserver", "x"]},
                   {"cgroups": ["/system.slice"]}, {"cgroups": ["/kubepods.slice/pod1", "/system"], "netns": ["3"]},
                   {"comms": ["nginx"], "cgroups": ["/system.slice/nginx.service"]}):
        chosen = FlowFilter.parse(**kwargs)
        chosen.cgroup_path = paths.get
        assert [flows[i] for i in chosen.select(columns, everything)] == [f for f in flows if chosen.matches(f)]
    for text in ("top:5", "top:100", "all", "none"):
        selection = FlowSelection.parse(text)
        assert [flows[i] for i in selection.pick_indexes(columns, everything)] == selection.pick(flows)
        assert [flows[i] for i in selection.pick_indexes(columns, range(40))] == selection.pick(flows)
    ties = [raw_flow(cookie=i, bytes_acked=i % 3, bytes_received=0) for i in range(30)]
    columns, flows = _columns(ties), [decode(f) for f in ties]
    for n in (1, 7, 10, 11, 29):
        selection = FlowSelection.parse(f"top:{n}")
        assert [flows[i] for i in selection.pick_indexes(columns, range(30))] == selection.pick(flows)
        odd = list(range(1, 30, 2))
        assert [flows[i] for i in selection.pick_indexes(columns, odd)] == selection.pick([flows[i] for i in odd])
