"""The quantity table (telemetry/quantities.py): each per-flow quantity has one entry, and one entry is all a new
quantity needs to reach Prometheus, OTLP, a flow's sample and serve's rows, the scenario's CSV and the live page."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from ccscope import bpf_types as bt
from ccscope.flows import FlowRecord
from ccscope.scenario.recorder import CSV_HEADER
from ccscope.telemetry import quantities
from ccscope_testkit.prereqs import require_bpf_object, require_root

# Run in a fresh interpreter: the table gets the entry before any output is derived from it (at import). rttvar was
# in Prometheus and OTLP only; the fixture's entry puts it, under new names, in every output, and a real loopback
# flow's record is then read back from each.
ADD_A_QUANTITY = r'''
import contextlib, json, socket, threading, time
from ccscope.telemetry import quantities as q

q.QUANTITIES = (*(x for x in q.QUANTITIES if x.name != "rttvar_s"),
                q.Quantity("rttvar_s", "gauge", "RTT variation, again.", "ccscope_flow_test_rttvar_seconds",
                           q.Otlp("ccscope.test.rttvar", "s", "RTT variation, again."), q.Column("rttvar_ms", 1e3, 3),
                           q.seconds(), "float", q.Live("rttvar_us", 1e3)))

from ccscope import bpf_types as bt
from ccscope.exporter import FlowCollector
from ccscope.flows import FlowFilter, FlowSelection, FlowTable, decode
from ccscope.live.rings import POINT_LAYOUT, Rings
from ccscope.loader import ProbeOptions, TelemetryProbe
from ccscope.otlp import instruments, observations
from ccscope.sample import Sample
from ccscope.scenario.recorder import CSV_HEADER, csv_text

with TelemetryProbe(ProbeOptions()) as probe, socket.create_server(("127.0.0.1", 0)) as listener:
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    port = client.getsockname()[1]
    for _ in range(50):  # a few round trips, so that rttvar is not its first value alone
        client.sendall(b"x" * 1000)
        server.recv(65536)
        server.sendall(b"y")
        client.recv(1)
    time.sleep(0.2)
    raw = next(bt.unpack_flow(bytes(f)) for f in probe.read_flows() if f.sport == port)
    record = decode(raw)
    table = FlowTable(probe, grace_s=5.0)
    collector = FlowCollector(table, FlowSelection("all"))
    families = {f.name: f for f in collector.collect()}
    collector.close()
    prometheus = [s.value for s in families["ccscope_flow_test_rttvar_seconds"].samples
                  if s.labels["sport"] == str(port)]
    [instrument] = [i for i in instruments() if i.name == "ccscope.test.rttvar"]
    otlp = [v for v, attrs in observations(families, instrument) if attrs["network.local.port"] == port]
    sample = Sample.of(record)
    row = [sample.t, *(getattr(sample, name) for name in list(Sample.__dataclass_fields__)[1:])]
    header, line = csv_text([sample], 0.0, [None]).splitlines()
    rings = Rings(FlowFilter(), threading.Lock(), str)
    rings.on_sample(raw)
    [point] = [json.loads(p) for ring in rings for p in ring.points]
    client.close()
    server.close()
print(json.dumps({
    "record": record.rttvar_s, "kernel_us": raw.rttvar_us, "prometheus": prometheus, "otlp": otlp,
    "sample": sample.rttvar_s, "row": Sample.from_row(row).rttvar_s,
    "csv": dict(zip(header.split(","), line.split(","))).get("rttvar_ms"), "csv_header": list(CSV_HEADER),
    "live": point[POINT_LAYOUT["fields"].index("rttvar_s")], "divisor": POINT_LAYOUT["divisors"][
        POINT_LAYOUT["fields"].index("rttvar_s")]}))
'''


def test_a_quantity_added_to_the_table_reaches_every_output() -> None:
    require_root()
    require_bpf_object()
    assert "rttvar_ms" not in CSV_HEADER  # not there before the fixture's entry
    ran = subprocess.run([sys.executable, "-c", ADD_A_QUANTITY], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    rttvar = out["record"]
    assert rttvar > 0 and rttvar == out["kernel_us"] / 1e6, out
    assert out["prometheus"] == [rttvar] and out["otlp"] == [rttvar], out
    assert out["sample"] == out["row"] == rttvar, out
    assert out["csv_header"][-1] == "rttvar_ms" and out["csv"] == f"{rttvar * 1e3:.3f}", out
    assert out["live"] / out["divisor"] == pytest.approx(rttvar * 1e3), out  # the page's milliseconds


def test_each_output_name_belongs_to_one_quantity() -> None:
    table = quantities.QUANTITIES
    assert len({q.name for q in table}) == len(table)
    prometheus = [q.prometheus for q in table if q.prometheus]
    assert len(set(prometheus)) == len(prometheus)
    assert all(name.startswith("ccscope_flow_") and not name.endswith("_total") for name in prometheus)
    columns = [q.column.name for q in table if q.column]
    assert len(set(columns)) == len(columns)
    otlp = [(q.otlp.name, q.otlp.attributes) for q in table if q.otlp]
    assert len(set(otlp)) == len(otlp)
    # one instrument name means one unit and one kind
    assert len({q.otlp.name for q in table if q.otlp}) == len({(q.otlp.name, q.otlp.unit, q.kind) for q in table
                                                              if q.otlp})


def test_each_entry_names_what_exists() -> None:
    """A sampled or exported quantity is FlowRecord's attribute (or has its own value); a charted one names a field
    of struct flow; a windowed one is a column the recorder computes, nothing else."""
    fields = set(FlowRecord.__dataclass_fields__)
    for q in quantities.QUANTITIES:
        if q.windowed:
            assert q.column and not (q.sampled or q.prometheus or q.otlp or q.live), q
            continue
        assert q.name in fields or q.value is not None, q
        assert q.sampled or not q.column, q  # the CSV is written from samples
        assert q.kind in ("gauge", "counter") and (q.otlp is None or q.prometheus), q
        if q.live:
            assert hasattr(bt.Flow, q.live.kernel), q
