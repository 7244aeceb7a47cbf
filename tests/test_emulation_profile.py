"""Path profile parsing: good inputs give the right numbers, bad ones a UsageError naming the field."""

from __future__ import annotations

import pytest
from ccscope.emulation import PathProfile, QueueSize
from ccscope.emulation.profile import SHORT_FLOW_PORT, Isolation, LinkProfile
from ccscope.errors import PrerequisiteError, UsageError
from ccscope.host.algorithms import available_algorithms, require_algorithms
from ccscope.hosttools import need


@pytest.mark.parametrize(
    ("data", "field", "expected"),
    [
        ({"rate": "50mbit"}, "rate_bps", 50e6),
        ({"rate": "1.5Mbit/s"}, "rate_bps", 1.5e6),
        ({"rate": "800kbit"}, "rate_bps", 800e3),
        ({"rate": "1gbit"}, "rate_bps", 1e9),
        ({"rate": 20_000_000}, "rate_bps", 20e6),
        ({"delay": "10ms"}, "delay_s", 0.010),
        ({"delay": "200 ms"}, "delay_s", 0.200),
        ({"delay": "1.5s"}, "delay_s", 1.5),
        ({"delay": "500us"}, "delay_s", 0.0005),
        ({"delay": 0.02}, "delay_s", 0.02),
        ({"delay": "10ms", "jitter": "2ms"}, "jitter_s", 0.002),
        ({"loss": "1%"}, "loss", 0.01),
        ({"loss": "0.5 %"}, "loss", 0.005),
        ({"loss": 0.01}, "loss", 0.01),
        ({"rate": "10mbit", "queue": "100p"}, "queue", QueueSize(packets=100)),
        ({"rate": "10mbit", "queue": "100 packets"}, "queue", QueueSize(packets=100)),
        ({"rate": "10mbit", "queue": 20}, "queue", QueueSize(packets=20)),
        ({"rate": "10mbit", "queue": "64KB"}, "queue", QueueSize(bytes=64_000)),
        ({"rate": "10mbit", "queue": "64KiB"}, "queue", QueueSize(bytes=65_536)),
        ({"rate": "10mbit", "queue": "1.5bdp"}, "queue", QueueSize(bdp=1.5)),
        ({"rate": "10mbit", "queue": {"packets": 30}}, "queue", QueueSize(packets=30)),
    ],
)
def test_good_link_values(data, field, expected):
    link = LinkProfile.from_dict(data, "profiles.x.up")
    got = getattr(link, field)
    assert got == pytest.approx(expected) if isinstance(expected, float) else got == expected


@pytest.mark.parametrize(
    ("data", "where", "words"),
    [
        ({"down": {"loss": "150%"}}, "profiles.wireless.down.loss", "150% is not a loss fraction between 0 and 100%"),
        ({"loss": 1.5}, "profiles.wireless.loss", "not a loss fraction"),
        ({"loss": "100%"}, "profiles.wireless.loss", "every packet"),
        ({"loss": "-1%"}, "profiles.wireless.loss", "not a loss fraction"),
        ({"delay": "-5 ms"}, "profiles.wireless.delay", "negative"),
        ({"up": {"delay": "-5ms"}}, "profiles.wireless.up.delay", "negative"),
        ({"delay": "5 parsecs"}, "profiles.wireless.delay", "not a duration"),
        ({"delay": "11s"}, "profiles.wireless.delay", "too long"),
        ({"delay": True}, "profiles.wireless.delay", "expected a duration"),
        ({"rate": 0}, "profiles.wireless.rate", "not a positive rate"),
        ({"rate": "0mbit"}, "profiles.wireless.rate", "not a positive rate"),
        ({"rate": "fast"}, "profiles.wireless.rate", "not a rate"),
        ({"rate": "500tbit"}, "profiles.wireless.rate", "not a rate"),
        ({"rate": "100gbit"}, "profiles.wireless.rate", "above"),
        ({"rate": 10}, "profiles.wireless.rate", "below 1 kbit/s"),
        ({"rate": [1]}, "profiles.wireless.rate", "expected a rate"),
        ({"rate": "10mbit", "queue": "0p"}, "profiles.wireless.queue", "not a positive queue size"),
        ({"rate": "10mbit", "queue": "1.5p"}, "profiles.wireless.queue", "whole number"),
        ({"rate": "10mbit", "queue": "10 furlongs"}, "profiles.wireless.queue", "unknown queue unit"),
        ({"rate": "10mbit", "queue": "100B"}, "profiles.wireless.queue", "smaller than one"),
        ({"up": {"queue": "10p"}}, "profiles.wireless.up.queue", "needs a rate"),
        ({"delay": "1ms", "jitter": "5ms"}, "profiles.wireless.up.jitter", "larger than the delay"),
        ({"bandwidth": "10mbit"}, "profiles.wireless.bandwidth", "unknown key"),
        ({"up": {"lossy": 1}}, "profiles.wireless.up.lossy", "unknown key"),
        ({"up": "fast"}, "profiles.wireless.up", "expected a mapping"),
        ({"rate": "10mbit", "trace": "/nonexistent.trace"}, "profiles.wireless", "cannot read a Mahimahi trace"),
        ({"rate": "10mbit", "isolate": "long"}, "profiles.wireless.isolate", "expected `short` or a mapping"),
        ({"rate": "10mbit", "isolate": 3}, "profiles.wireless.isolate", "expected `short` or a mapping"),
        ({"rate": "10mbit", "isolate": {"queue": "0p"}}, "profiles.wireless.isolate.queue", "not a positive"),
        ({"rate": "10mbit", "isolate": {"queue": "9 furlongs"}}, "profiles.wireless.isolate.queue", "unknown queue"),
        ({"rate": "10mbit", "isolate": {"ports": [70000]}}, "profiles.wireless.isolate.ports[0]", "not a port"),
        ({"rate": "10mbit", "isolate": {"ports": [80, "http"]}}, "profiles.wireless.isolate.ports[1]", "not a port"),
        ({"rate": "10mbit", "isolate": {"ports": [80, 80]}}, "profiles.wireless.isolate.ports", "twice"),
        ({"rate": "10mbit", "isolate": {"ports": []}}, "profiles.wireless.isolate.ports", "expected a list"),
        ({"rate": "10mbit", "isolate": {"prio": 1}}, "profiles.wireless.isolate.prio", "unknown key"),
        ({"up": {"rate": "10mbit", "isolate": "short"}, "down": {"isolate": "short"}},
         "profiles.wireless.down.isolate", "give a rate"),
        ({"up": {"isolate": {"queue": "10p", "ports": [1, 0]}}}, "profiles.wireless.up.isolate.ports[1]", "not a port"),
    ],
)
def test_bad_profiles_name_the_field(data, where, words):
    with pytest.raises(UsageError) as err:
        PathProfile.from_dict("wireless", data, "profiles.wireless")
    line = str(err.value)
    assert line.startswith(where + ":") or line.startswith(where + "."), line
    assert words in line, line
    assert "\n" not in line


def test_flat_keys_apply_both_ways_and_sections_override():
    p = PathProfile.from_dict("w", {"rate": "50mbit", "delay": "20ms", "down": {"rate": "5mbit"}}, "profiles.w")
    assert p.up.rate_bps == 50e6 and p.down.rate_bps == 5e6
    assert p.up.delay_s == p.down.delay_s == 0.020
    assert p.base_rtt_s == pytest.approx(0.040)  # delay is one-way, per direction
    assert p.bdp_bytes == pytest.approx(50e6 * 0.040 / 8)  # 250 kB
    assert p.up.queue_bytes(p.base_rtt_s) == 250_000  # default queue: 1 BDP
    assert p.down.queue_bytes(p.base_rtt_s) == 25_000
    q = PathProfile.from_dict("q", {"rate": "1mbit", "delay": "1ms", "queue": "2bdp"}, "x")
    assert q.up.queue_bytes(q.base_rtt_s) == 1514  # an explicit 2 BDP (500 B) still holds one full frame
    assert PathProfile.from_dict("d", {"rate": "1mbit", "delay": "1ms"}, "x").up.queue_bytes(0.002) == 10 * 1514
    # 1 Mbit/s x 200 ms (seed 000): a BDP of 25 kB, about 16 packets
    s = PathProfile.from_dict("s", {"rate": "1mbit", "delay": "100ms"}, "x")
    assert s.bdp_bytes == pytest.approx(25_000)


def test_isolate_key():
    p = PathProfile.from_dict("i", {"rate": "10mbit", "delay": "10ms", "queue": "100p", "isolate": "short"}, "x")
    assert p.up.isolate == p.down.isolate == Isolation(queue=None, ports=(SHORT_FLOW_PORT,))
    assert p.up.isolate_queue_bytes(p.base_rtt_s) == 25_000  # default: 1 BDP, at least 10 packets
    assert p.up.queue_bytes(p.base_rtt_s) == 100 * 1514  # the bulk class keeps the link's queue
    q = PathProfile.from_dict("q", {"rate": "10mbit", "up": {"isolate": {"queue": "20p", "ports": [80, 443]}}}, "x")
    assert q.up.isolate == Isolation(queue=QueueSize(packets=20), ports=(80, 443))
    assert q.down.isolate is None and q.up.isolate_queue_bytes(0.0) == 20 * 1514
    assert "isolate icmp+port 80,443 queue 20p" in q.up.describe()
    for off in (False, None, "off"):
        assert PathProfile.from_dict("o", {"rate": "10mbit", "isolate": off}, "x").up.isolate is None
    assert PathProfile.from_dict("t", {"rate": "1mbit", "isolate": True}, "x").up.isolate == Isolation()
    assert PathProfile.from_dict("p", {"rate": "1mbit", "isolate": {"ports": 53}}, "x").up.isolate.ports == (53,)


def test_trace_profile(tmp_path):
    trace = tmp_path / "const12.trace"
    trace.write_text("".join(f"{i}\n" for i in range(1, 1001)))  # one opportunity per ms: 12 Mbit/s
    p = PathProfile.from_dict("t", {"up": {"trace": str(trace)}, "delay": "5ms"}, "profiles.t")
    assert p.up.trace == trace and p.up.rate_bps is None
    assert p.up.effective_rate_bps() == pytest.approx(12e6)
    bad = tmp_path / "bad.trace"
    bad.write_text("5\n3\n")
    with pytest.raises(UsageError, match=r"profiles\.t\.up\.trace: .*ascending"):
        PathProfile.from_dict("t", {"up": {"trace": str(bad)}}, "profiles.t")
    with pytest.raises(UsageError, match=r"profiles\.t\.up\.isolate: a trace link"):
        PathProfile.from_dict("t", {"up": {"trace": str(trace), "isolate": "short"}}, "profiles.t")


def test_require_algorithms_names_the_available_ones():
    have = available_algorithms()
    assert {"reno", "cubic"} <= have
    require_algorithms(sorted(have))
    with pytest.raises(PrerequisiteError) as err:
        require_algorithms(["cubic", "vegas-not-real"])
    line = str(err.value)
    assert line.startswith("vegas-not-real is not available in this kernel (available: ")
    assert all(a in line for a in have)


def test_missing_tool_names_the_package(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(PrerequisiteError, match=r"iperf3 is not installed \(install it: apt-get install iperf3\)"):
        need("iperf3")
    with pytest.raises(PrerequisiteError, match=r"apt-get install iputils-ping"):
        need("ping")
