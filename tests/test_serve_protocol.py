"""What the runner believes of a far end, value by value: serve's greeting, a test grant, a telemetry reply and
a sample row, each at and just past its bounds (the kernel's field widths, the export's int64). No root, no
network: the end-to-end cases are tests/test_far_end_hostile.py."""

from __future__ import annotations

import math

import pytest
from ccscope import sample
from ccscope.sample import Sample
from ccscope.serve import protocol

GREETING = {"ccscope_serve": protocol.VERSION, "ports": [5201, 5216], "max_seconds": 120, "telemetry": True,
            "auth": "token", "nonce": "0123456789abcdef" * 2}
ROW = [100.0, 10, 0.02, 0, 1448, 2896, None, 0.01, 2, 1e6, "open", "cubic", 1, 1448, 2, 1]


def test_a_good_greeting_is_read_as_sent():
    g = protocol.parse_greeting(GREETING)
    assert (g.ports, g.max_seconds, g.telemetry, g.auth, g.nonce) == ((5201, 5216), 120.0, True, "token",
                                                                       GREETING["nonce"])


@pytest.mark.parametrize(("key", "value", "says"), [
    ("ccscope_serve", 1, "protocol version 1"), ("ports", [5216, 5201], "ports [5216, 5201]"),
    ("ports", [0, 5216], "ports [0, 5216]"), ("ports", [5201, 65536], "ports [5201, 65536]"),
    ("ports", [True, 5216], "ports [True, 5216]"), ("ports", "5201-5216", "ports '5201-5216'"),
    ("max_seconds", math.inf, "max_seconds inf"), ("max_seconds", -1, "max_seconds -1"),
    ("max_seconds", 86401, "max_seconds 86401"), ("telemetry", 1, "telemetry 1"), ("auth", "none", "auth 'none'"),
    ("nonce", "XYZ" * 11 + "Z", "nonce"), ("nonce", "00", "nonce '00'")])
def test_a_bad_greeting_value_is_one_line(key, value, says):
    with pytest.raises(protocol.ServeError, match="^" + "|".join(["a greeting", "the greeting"])) as caught:
        protocol.parse_greeting({**GREETING, key: value})
    assert says in str(caught.value) and "\n" not in str(caught.value)


def test_a_grant_is_a_test_port_of_the_greeting_and_a_user():
    g = protocol.parse_greeting(GREETING)
    key = "-----BEGIN PUBLIC KEY-----\nMIIB\n-----END PUBLIC KEY-----\n"
    grant = protocol.test_grant({"ok": True, "port": 5216, "iperf3": {"username": "t5216-ab12",
                                                                     "password": "pw_-9", "public_key": key}}, g)
    assert grant.port == 5216 and grant.credentials == protocol.Iperf3Credentials("t5216-ab12", "pw_-9", key)
    assert protocol.test_grant({"ok": True, "port": 5202}, g).credentials is None
    for port in (5201, 5217, "5202", None, 5202.0):
        with pytest.raises(protocol.ServeError, match="a test port"):
            protocol.test_grant({"ok": True, "port": port}, g)
    for bad in ({"username": "a b", "password": "p", "public_key": key},
                {"username": "u", "password": "p\n", "public_key": key},
                {"username": "u", "password": "p", "public_key": "ssh-rsa AAAA"}, "u:p"):
        with pytest.raises(protocol.ServeError, match="iperf3 credentials"):
            protocol.test_grant({"ok": True, "port": 5202, "iperf3": bad}, g)


def test_a_telemetry_reply_is_shaped_before_use():
    ok = protocol.parse_telemetry({"now": 5.0, "flows": [{"src": "a", "dst": "b", "sport": 1, "dport": 2,
                                                          "samples": [ROW]}]}, 7.0)
    assert ok.now == 5.0 and ok.received_mono == 7.0 and ok.flows[0].rows == [ROW]
    for reply, says in (({"now": "x", "flows": []}, "clock reading of 'x'"),
                        ({"now": math.nan, "flows": []}, "clock reading of nan"),
                        ({"now": 1.0, "flows": {}}, "flows are {}"),
                        ({"now": 1.0, "flows": [{}] * (protocol.MAX_REMOTE_FLOWS + 1)}, "at most 4096"),
                        ({"now": 1.0, "flows": [[]]}, "flow 0: [] is not an object"),
                        ({"now": 1.0, "flows": [{"src": 1, "dst": "b", "sport": 1, "dport": 2, "samples": []}]},
                         "flow 0: addresses"),
                        ({"now": 1.0, "flows": [{"src": "a", "dst": "b", "sport": 0, "dport": 2, "samples": []}]},
                         "flow 0: ports"),
                        ({"now": 1.0, "flows": [{"src": "a", "dst": "b", "sport": 1, "dport": 2, "samples": "x"}]},
                         "samples 'x' are not a list")):
        with pytest.raises(protocol.ServeError, match="telemetry") as caught:
            protocol.parse_telemetry(reply, 0.0)
        assert says in str(caught.value), str(caught.value)


def test_a_sample_row_is_typed_and_bounded():
    s = Sample.from_row(ROW, shift_s=2.5)
    assert s.t == 102.5 and s.cwnd_segments == 10 and s.ssthresh_segments is None and s.cc == "cubic"
    edges = {1: ((1 << 32) - 1, 1 << 32), 2: (4294.9, 4295.0), 4: ((1 << 63) - 1, 1 << 63),
             12: (255, 256), 13: (65535, 65536), 14: ((1 << 32) - 1, 1 << 32), 15: ((1 << 32) - 1, 1 << 32)}
    for index, (last_good, first_bad) in edges.items():
        Sample.from_row([*ROW[:index], last_good, *ROW[index + 1:]])
        with pytest.raises(ValueError, match="is out of range"):
            Sample.from_row([*ROW[:index], first_bad, *ROW[index + 1:]])
    for index, bad in ((1, True), (1, -1), (1, 10.5), (2, math.nan), (2, "0.02"), (7, math.inf), (9, -1.0),
                       (10, "open\n"), (11, "cu bic"), (11, ""), (0, 1e12)):
        with pytest.raises(ValueError, match="is out of range"):
            Sample.from_row([*ROW[:index], bad, *ROW[index + 1:]])
    for row in (ROW[:-1], [*ROW, 0], "row", {"t": 1}):
        with pytest.raises(ValueError, match="fields, not 16"):
            Sample.from_row(row)


def test_named_fields_are_checked_and_kept():
    reply = {"now": 5.0, "flows": [], "fields": list(sample.ROW_FIELDS)}
    assert protocol.parse_telemetry(reply, 7.0).fields == sample.ROW_FIELDS
    assert protocol.parse_telemetry({"now": 5.0, "flows": []}, 7.0).fields is None  # a serve before they were named
    for fields in ("t,cc", ["t", "t"], ["t", "a b"], ["t", 1], ["x"] * 2 + [f"f{i}" for i in range(300)]):
        with pytest.raises(protocol.ServeError, match=r"^telemetry whose fields are"):
            protocol.parse_telemetry({**reply, "fields": fields}, 0.0)


def test_rows_are_read_by_the_names_the_far_end_gave():
    named = dict(zip(sample.ROW_FIELDS, ROW, strict=True))
    # a newer far end: a field this ccscope does not know, and another order
    newer = ["brand_new_quantity", *reversed(sample.ROW_FIELDS)]
    order = sample.row_order(newer)
    s = Sample.from_row([7, *(named[name] for name in reversed(sample.ROW_FIELDS))], 2.5, order)
    assert s == Sample.from_row(ROW, 2.5)
    with pytest.raises(ValueError, match=f"fields, not {len(newer)}"):
        Sample.from_row(ROW, 0.0, order)
    # an older far end, without a field this ccscope keeps: one line that names it
    with pytest.raises(ValueError, match=r"^the far end sends no cwnd_segments \(its ccscope is another version"):
        sample.row_order([name for name in sample.ROW_FIELDS if name != "cwnd_segments"])


def test_the_row_checks_name_every_sample_field_in_order():
    assert tuple(name for name, _ in sample._ROW_CHECKS) == tuple(Sample.__dataclass_fields__)


def test_a_proof_holds_for_its_nonce_and_token_alone():
    shown = protocol.proof("tok", "n1")
    assert protocol.proof_holds("tok", "n1", shown)
    assert not protocol.proof_holds("tok", "n2", shown) and not protocol.proof_holds("other", "n1", shown)
    assert not protocol.proof_holds("tok", "n1", None) and not protocol.proof_holds("tok", "n1", "\u00e9" * 64)
