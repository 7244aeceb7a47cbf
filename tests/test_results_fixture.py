"""results.load and report.render against a committed results directory, without root, as flent tests its
plotters. tests/data/results-fixture is what `ccscope scenario run tests/data/fixture.yaml` wrote (results.json
and the per-flow CSVs; plots and report.html are rendered here). Rerun it when the results schema changes."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path

import pytest
from ccscope.ccstate.changes import StateChange
from ccscope.ccstate.cubic import CubicState
from ccscope.errors import UsageError
from ccscope.scenario import document, plots, report, results, series, summary
from ccscope.scenario.recorder import CSV_HEADER, write_state_csv
from ccscope.scenario.typed_schema import schema_of
from ccscope_testkit.prereqs import ROOT

FIXTURE = ROOT / "tests" / "data" / "results-fixture"
PLOTS = ["cwnd.png", "downloads.png", "loss.png", "rtt.png", "throughput.png", "tradeoff.png"]


@pytest.fixture
def copy(tmp_path: Path) -> Path:
    target = tmp_path / "results"
    shutil.copytree(FIXTURE, target)
    return target


def test_load_reads_every_run_and_its_csvs() -> None:
    doc = results.load(FIXTURE)
    assert len(doc["runs"]) == doc["runs_per_unit"] * len(doc["profiles"]) * len(doc["algorithms"]) == 8
    assert doc["scenario"]["download_timeout_s"] == 2.0
    csvs = [f["csv"] for run in doc["runs"] for f in run["flows"] + run["downloads"] if f.get("csv")]
    assert len(csvs) >= 8 * 2
    for name in csvs:
        with (FIXTURE / name).open() as fh:
            rows = list(csv.reader(fh))
        # written by an older ccscope: the columns added since (delivered_packets, delivered_ce_packets) come
        # after its own, and the readers go by name, so an older results directory still loads
        assert rows[0] == list(CSV_HEADER[:len(rows[0])]) and "event" in rows[0], name
        assert len(rows) > 2 and all(len(row) == len(rows[0]) for row in rows), name


@pytest.mark.parametrize("damage, words", [
    (lambda doc: doc.pop("runs"), "does not match the results schema: $: missing runs"),
    (lambda doc: doc.update(schema_version=99), f"schema_version 99, this ccscope reads {results.SCHEMA_VERSION}"),
    (lambda doc: doc["runs"][0].update(netns="x"),
     "does not match the results schema: $.runs[0].netns: expected integer, got str"),
    (lambda doc: doc.update(implementations={"bpf_vegas": {"name": "bpf_vegas", "implementation": "module",
                                                           "display": "vegas (BPF)"}}),
     "does not match the results schema: $.implementations.bpf_vegas.implementation: 'module' is not one of "
     "['kernel', 'bpf']"),
])
def test_load_refuses_a_damaged_document_in_one_line(copy: Path, damage, words: str) -> None:
    doc = json.loads((copy / "results.json").read_text())
    damage(doc)
    (copy / "results.json").write_text(json.dumps(doc))
    with pytest.raises(UsageError) as info:
        results.load(copy)
    assert info.value.line() == f"{copy / 'results.json'}: {words}"


def test_load_reads_which_implementation_ran(copy: Path) -> None:
    doc = json.loads((copy / "results.json").read_text())
    doc["implementations"] = {"bpf_vegas": {"name": "bpf_vegas", "implementation": "bpf", "display": "vegas (BPF)",
                                            "sha256": "0" * 64, "object": "/x/vegas.bpf.o"},
                              "cubic": {"name": "cubic", "implementation": "kernel", "display": "cubic",
                                        "sha256": None, "object": None}}
    (copy / "results.json").write_text(json.dumps(doc))
    assert results.load(copy)["implementations"]["bpf_vegas"]["display"] == "vegas (BPF)"


def test_load_refuses_what_is_not_json(copy: Path) -> None:
    (copy / "results.json").write_text('{"runs": [')
    with pytest.raises(UsageError, match=r"results.json: not valid JSON: .* at line 1$"):
        results.load(copy)


def test_render_draws_every_plot_and_shows_the_numbers(copy: Path) -> None:
    doc = results.load(copy)
    page = report.render(copy, doc).read_text()
    assert sorted(p.name for p in (copy / "plots").iterdir()) == PLOTS
    for name in PLOTS:
        data = (copy / "plots" / name).read_bytes()
        assert data.startswith(b"\x89PNG") and len(data) > 10_000, name
        assert f"<img src='plots/{name}'" in page
    for row in doc["summary"]:
        goodput = row["goodput_bps"]
        assert f"{goodput['mean'] / 1e6:.2f}±{goodput['ci95'] / 1e6:.2f}" in page
    for run in doc["runs"]:
        assert f"<td>{run['label']}</td>" in page
    incomplete = [d for run in doc["runs"] for d in run["downloads"] if not d["complete"]]
    assert incomplete and page.count("NO (incomplete)") == len(incomplete)


def test_summary_table_has_one_line_per_row() -> None:
    doc = results.load(FIXTURE)
    lines = summary.summary_table(doc).strip().splitlines()
    assert lines[0] == "fixture (± is the 95% confidence interval over runs)"
    assert lines[1].split()[:3] == ["profile", "algorithm", "runs"]
    body = lines[2:]
    assert len(body) == len(doc["summary"])
    for line, row in zip(body, doc["summary"], strict=True):
        assert line.split()[0] == row["profile"] and f"{row['goodput_bps']['mean'] / 1e6:.2f}" in line


def test_render_results_without_the_recorded_download_limit(copy: Path) -> None:
    """Results written before scenario.download_timeout_s existed still render."""
    doc = results.load(copy)
    del doc["scenario"]["download_timeout_s"]
    assert plots.plot_downloads(copy, doc) == "plots/downloads.png"
    assert (copy / "plots" / "downloads.png").stat().st_size > 10_000


def test_the_validator_is_derived_from_the_typed_shape() -> None:
    """results.py holds no schema of its own: SCHEMA is document.ResultsDocument through typed_schema."""
    assert schema_of(document.ResultsDocument) == results.SCHEMA
    assert results.SCHEMA["properties"]["schema_version"] == {"enum": [document.SCHEMA_VERSION]}
    assert results.SCHEMA["properties"]["runs"]["items"] == results.RUN_SCHEMA
    flow = results.RUN_SCHEMA["properties"]["flows"]["items"]
    assert flow["properties"]["kind"] == {"enum": ["bulk"]}
    assert flow["properties"]["view"] == {"enum": ["sender", "receiver", None]}
    assert results.RUN_SCHEMA["properties"]["profile"]["pattern"].startswith("[A-Za-z0-9]")


@pytest.mark.parametrize(("value", "shape", "problem"), [
    ({"a": 1}, dict[str, str], "$.a: expected string, got int"),
    ([1.5, None], list[float | None], None),
    (float("nan"), float, "$: expected number, got nan"),
    (True, int, "$: expected integer, got bool"),
    ("x y", document.Algorithm, "$: 'x y' is not a valid name"),
    (None, document.FlowResult, "$: expected object, got NoneType"),
])
def test_typed_schema_checks_what_the_type_says(value, shape, problem) -> None:
    problems = results.check(value, schema_of(shape))
    assert problems == ([] if problem is None else [problem])


def _docs_section() -> str:
    text = (ROOT / "docs" / "scenarios.md").read_text()
    return text[text.index("### results.json (schema_version"):text.index("## Pitfalls handled")]


@pytest.mark.parametrize("shape", [document.ResultsDocument, document.RunResult, document.FlowResult,
                                   document.DownloadResult, document.PingResult, document.SummaryRow],
                         ids=lambda shape: shape.__name__)
def test_the_docs_name_every_key_of_the_shape(shape) -> None:
    """docs/scenarios.md's results.json section names each key in backticks (a list as `key[]`)."""
    named = set(re.findall(r"`([a-z_0-9]+)(?:\[\])?`", _docs_section()))
    assert set(shape.__annotations__) - named == set()


def test_the_docs_table_holds_the_top_level_keys_and_no_others() -> None:
    rows = [line for line in _docs_section().splitlines() if line.startswith("| `")]
    keys = {key for row in rows for key in re.findall(r"`([a-z_]+)(?:\[\])?`", row.split("|")[1])}
    assert keys == set(document.ResultsDocument.__annotations__)


def test_a_written_document_has_the_typed_shape() -> None:
    doc = results.load(FIXTURE)
    assert document.ResultsDocument.__required_keys__ <= set(doc)
    for run in doc["runs"]:
        assert document.RunResult.__required_keys__ <= set(run) <= set(document.RunResult.__annotations__)
        for flow in run["flows"]:
            assert document.FlowResult.__required_keys__ <= set(flow) <= set(document.FlowResult.__annotations__)


def test_state_of_a_flow_is_written_read_and_drawn(copy: Path) -> None:
    """A flow's state CSV (recorder.write_state_csv), as a run writes it, in a document from before there was one:
    the report reads it back (series.load_series) and draws state.png from it; the other plots stay as they were."""
    doc = json.loads((copy / "results.json").read_text())
    run = next(r for r in doc["runs"] if r["repetition"] == min(x["repetition"] for x in doc["runs"]))
    flow = run["flows"][0]
    t0 = 100.0

    def cubic(t: float, wmax: int, in_epoch: bool, periodic: bool = False) -> StateChange:
        return StateChange(1, int((t0 + t) * 1e9), CubicState(wmax, 1.25, wmax, in_epoch, 0, 40, 28, False, 1),
                           periodic)
    flow["state_csv"] = write_state_csv(copy, "state_of_bulk0.csv", [
        cubic(0.5, 0, False), cubic(1.0, 40, False), cubic(1.02, 40, True), cubic(1.2, 40, True, periodic=True)], t0)
    (copy / "results.json").write_text(json.dumps(doc))
    loaded = results.load(copy)
    text = (copy / flow["state_csv"]).read_text().splitlines()
    assert text[0].startswith("time_s,event,algorithm,wmax_segments,k_s,")
    assert text[-1].startswith("1.2000,reading,cubic,40,1.25,")
    read = series.load_series(copy, loaded)[flow["state_csv"]]
    assert read["wmax_segments"] == ([0.5, 1.0, 1.02, 1.2], [0.0, 40.0, 40.0, 40.0])
    assert read["in_epoch"][1] == [0.0, 0.0, 1.0, 1.0]
    page = report.render(copy, loaded).read_text()
    assert sorted(p.name for p in (copy / "plots").iterdir()) == sorted([*PLOTS, "state.png"])
    assert "<img src='plots/state.png'" in page


def test_queueing_plot_shows_each_aqm_queue_beside_the_ping(copy: Path) -> None:
    """No queue measured (the fixture's links are the kernel's tbf): no plot. With the delay line's sojourn on
    one profile and dualpi2's two queues on the other, one row per queue and one per profile's ping."""
    doc = results.load(copy)
    assert plots.plot_queueing(copy, doc) is None
    first = next(iter(doc["profiles"]))
    for run in doc["runs"]:
        up = run["link"].setdefault("up", {})
        if run["profile"] == first:
            up["sojourn"] = {"count": 100, "median_ms": 3.2, "p95_ms": 6.3, "p99_ms": 9.0}
        else:
            up["sojourn_l"] = {"count": 50, "median_ms": 0.33, "p95_ms": 0.94, "p99_ms": 1.12}
            up["sojourn_c"] = {"count": 50, "median_ms": 12.6, "p95_ms": 21.2, "p99_ms": 30.0}
    assert plots.plot_queueing(copy, doc) == "plots/queueing.png"
    assert (copy / "plots" / "queueing.png").stat().st_size > 10_000
    drawn: dict[str, bytes] = {}
    assert "plots/queueing.png" in plots.draw_all(drawn, doc, series.load_series(copy, doc))
    assert drawn["queueing.png"] == (copy / "plots" / "queueing.png").read_bytes()
