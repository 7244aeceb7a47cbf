"""`ccscope export` and ccscope.results.load against the committed results fixture: every value in the
tables equals results.json and the per-flow CSVs, read back by the tools users analyse with (pyarrow,
DuckDB, pandas). No root needed."""

from __future__ import annotations

import csv
import json
import math
import re
import shutil
import subprocess
import sys
from pathlib import Path

import duckdb
import pandas
import pyarrow.parquet as pq
import pytest
from ccscope import results as notebook
from ccscope.errors import UsageError
from ccscope.scenario import export
from ccscope_testkit.prereqs import ROOT

FIXTURE = ROOT / "tests" / "data" / "results-fixture"


def ccscope(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ccscope.cli", *args], capture_output=True, text=True, timeout=120,
                          check=False)


def csv_files() -> dict[str, list[dict[str, str]]]:
    doc = json.loads((FIXTURE / "results.json").read_text())
    out = {}
    for run in doc["runs"]:
        for item in run["flows"] + run["downloads"]:
            if item.get("csv"):
                with (FIXTURE / item["csv"]).open(newline="") as fh:
                    out[(run["label"], item["id"])] = list(csv.DictReader(fh))
    return out


def same(a, b) -> bool:
    if a is None or (isinstance(a, float) and math.isnan(a)):
        return b in (None, "") or (isinstance(b, float) and math.isnan(b))
    if isinstance(b, str) and not isinstance(a, str):
        return float(b) == pytest.approx(float(a), rel=1e-12)
    return a == b or (isinstance(a, float) and a == pytest.approx(b, rel=1e-12))


@pytest.fixture(scope="module")
def parquet(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("tables")
    ran = ccscope("export", str(FIXTURE), "--out", str(out))
    assert ran.returncode == 0, ran.stderr
    assert sorted(p.name for p in out.iterdir()) == ["runs.parquet", "samples.parquet", "summary.parquet"]
    return out


def test_parquet_samples_equal_every_csv_cell(parquet: Path) -> None:
    table = pq.read_table(parquet / "samples.parquet").to_pylist()
    files = csv_files()
    assert len(table) == sum(len(rows) for rows in files.values()) > 500
    by_flow: dict = {}
    for row in table:
        by_flow.setdefault((row["run"], row["flow"]), []).append(row)
    assert by_flow.keys() == files.keys()
    for key, rows in files.items():
        for got, want in zip(by_flow[key], rows, strict=True):
            assert all(same(got[col], value) for col, value in want.items()), (key, got, want)
    schema = pq.read_schema(parquet / "samples.parquet")
    assert str(schema.field("cwnd_segments").type) == "int64" and str(schema.field("srtt_ms").type) == "double"
    assert str(schema.field("cc").type) == "string"


def test_parquet_runs_and_summary_equal_results_json(parquet: Path) -> None:
    doc = json.loads((FIXTURE / "results.json").read_text())
    runs = pq.read_table(parquet / "runs.parquet").to_pylist()
    flows = [(run, item) for run in doc["runs"] for item in run["flows"] + run["downloads"]]
    assert len(runs) == len(flows)
    for row, (run, item) in zip(runs, flows, strict=True):
        assert (row["run"], row["profile"], row["repetition"], row["flow"]) == \
            (run["label"], run["profile"], run["repetition"], item["id"])
        assert same(row["goodput_bps"], item.get("goodput_bps")) and same(row["run_jain"], run["jain"])
        if item.get("srtt_ms"):
            assert same(row["srtt_ms_p95"], item["srtt_ms"]["p95"])
    summary = pq.read_table(parquet / "summary.parquet").to_pylist()
    assert [(r["profile"], r["algorithms"]) for r in summary] == \
        [(r["profile"], r["algorithms"]) for r in doc["summary"]]
    for got, want in zip(summary, doc["summary"], strict=True):
        assert same(got["goodput_bps_mean"], want["goodput_bps"]["mean"])
        assert same(got["goodput_bps_ci95"], want["goodput_bps"]["ci95"])


def test_duckdb_queries_the_parquet_as_users_would(parquet: Path) -> None:
    doc = json.loads((FIXTURE / "results.json").read_text())
    query = (f"select algorithm, avg(goodput_bps) from '{parquet}/runs.parquet' "
             "where kind = 'bulk' group by algorithm order by algorithm")
    got = dict(duckdb.sql(query).fetchall())
    want: dict[str, list[float]] = {}
    for run in doc["runs"]:
        for flow in run["flows"]:
            want.setdefault(flow["algorithm"], []).append(flow["goodput_bps"])
    assert got.keys() == want.keys()
    for alg, values in want.items():
        assert got[alg] == pytest.approx(sum(values) / len(values), rel=1e-12)


def test_csv_export_reads_back_equal(tmp_path: Path) -> None:
    ran = ccscope("export", str(FIXTURE), "--format", "csv", "--out", str(tmp_path))
    assert ran.returncode == 0, ran.stderr
    frame = pandas.read_csv(tmp_path / "samples.csv")
    assert len(frame) == sum(len(rows) for rows in csv_files().values())
    parquet_rows = export.samples(FIXTURE, json.loads((FIXTURE / "results.json").read_text()))
    assert list(frame.columns) == list(parquet_rows[0].keys())
    assert frame["cwnd_segments"].sum() == sum(r["cwnd_segments"] for r in parquet_rows)


def test_results_load_gives_dataframes_or_rows() -> None:
    r = notebook.load(FIXTURE)
    assert isinstance(r.samples, pandas.DataFrame) and isinstance(r.runs, pandas.DataFrame)
    assert len(r.runs) == sum(len(run["flows"]) + len(run["downloads"]) for run in r.document["runs"])
    plain = notebook.load(FIXTURE, frames=False)
    assert plain.samples[0] == r.samples.iloc[0].to_dict() | {k: None for k, v in plain.samples[0].items()
                                                              if v is None}


def test_the_docs_example_runs() -> None:
    """docs/scenarios.md's notebook example, as written, on the fixture: it draws one report plot."""
    text = (ROOT / "docs" / "scenarios.md").read_text()
    example = text.split("<!-- notebook example -->")[1].split("```python")[1].split("```")[0]
    example = example.replace('"results/bufferbloat-20261124-1200"', repr(str(FIXTURE)))
    namespace: dict = {}
    exec(compile(example, "docs/scenarios.md", "exec"), namespace)
    figure = namespace["ax"].figure
    lines = [line for ax in figure.axes for line in ax.get_lines()]
    assert len(lines) >= 2 and all(len(line.get_xdata()) > 10 for line in lines)


def test_bad_input_is_one_line_and_leaves_nothing(tmp_path: Path) -> None:
    for args, expect in ((["/nonexistent"], "results.json: no such file"),
                         ([str(tmp_path)], "results.json: no such file"),
                         ([str(FIXTURE), "--format", "xlsx"], "invalid choice")):
        ran = ccscope("export", *args, "--out", str(tmp_path / "out"))
        assert ran.returncode == 2 and expect in ran.stderr and "Traceback" not in ran.stderr, ran.stderr
    assert not (tmp_path / "out").exists()
    broken = tmp_path / "broken"
    shutil.copytree(FIXTURE, broken)
    first_csv = sorted((broken / "flows").iterdir())[0]
    first_csv.write_text("cwnd_segments\n10\n")  # no time_s: not a flow CSV
    ran = ccscope("export", str(broken), "--format", "csv", "--out", str(tmp_path / "out2"))
    assert ran.returncode == 2 and len(ran.stderr.strip().splitlines()) == 1, ran.stderr
    assert not (tmp_path / "out2").exists()


def test_a_missing_csv_names_the_file(tmp_path: Path) -> None:
    broken = tmp_path / "r"
    shutil.copytree(FIXTURE, broken)
    victim = sorted((broken / "flows").iterdir())[0]
    victim.unlink()
    with pytest.raises(UsageError, match=re.escape(victim.name)):
        export.tables(broken)


@pytest.mark.parametrize(("cell", "column"), [("12345678901234567890123", "bytes_acked"), ("nan", "srtt_ms"),
                                              ("inf", "cwnd_segments"), ("fast", "retransmits")])
def test_a_value_the_report_refuses_is_refused_here_too(tmp_path: Path, cell: str, column: str) -> None:
    """The serve probe's findings: a 23-digit integer gave pyarrow's OverflowError as a traceback; nan, inf
    and text in number columns were exported although `ccscope report` refuses them. One line each now,
    naming the file, line and column, and nothing written."""
    broken = tmp_path / "r"
    shutil.copytree(FIXTURE, broken)
    victim = broken / "flows" / "fast_cubic_r1_bulk0.csv"
    rows = list(csv.DictReader(victim.open(newline="")))
    rows[1][column] = cell
    with victim.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]), lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    for fmt in ("parquet", "csv"):
        ran = ccscope("export", str(broken), "--format", fmt, "--out", str(tmp_path / fmt))
        assert ran.returncode == 2 and "Traceback" not in ran.stderr, ran.stderr
        assert ran.stderr.count("\n") == 1 and f"{victim.name}: line 3: {column} {cell!r}" in ran.stderr, ran.stderr
        assert not (tmp_path / fmt).exists()


def test_runs_only_the_journal_holds_are_exported(tmp_path: Path) -> None:
    """A kill between the journal line and results.json leaves results.json one run behind; export (like
    report and --resume) reads the run from the journal, where it left it out and exited 0."""
    directory = tmp_path / "r"
    shutil.copytree(FIXTURE, directory)
    doc = json.loads((FIXTURE / "results.json").read_text())
    header = {**doc, "runs": []}
    lines = [{"kind": "header", "document": header}]
    lines += [{"kind": "run", "run": run, "emulation_checks": doc["emulation_checks"], "warnings": doc["warnings"],
               "environment": doc["environment"]} for run in doc["runs"]]
    (directory / "runs.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    behind = {**doc, "runs": doc["runs"][:-1]}
    (directory / "results.json").write_text(json.dumps(behind))
    ran = ccscope("export", str(directory), "--format", "csv", "--out", str(tmp_path / "tables"))
    assert ran.returncode == 0, ran.stderr
    exported = {row["run"] for row in csv.DictReader((tmp_path / "tables" / "runs.csv").open(newline=""))}
    assert exported == {run["label"] for run in doc["runs"]}  # the last run, only in the journal, too


def test_states_table_holds_every_state_row(tmp_path: Path) -> None:
    """A flow's state CSV becomes the states table, each cell as written, its flow's identity in front; a
    directory from before states (the fixture as committed) writes no states table at all (above)."""
    directory = tmp_path / "results"
    shutil.copytree(FIXTURE, directory)
    doc = json.loads((directory / "results.json").read_text())
    flow = doc["runs"][0]["flows"][0]
    flow["state_csv"] = "flows/state_of_bulk0.csv"
    (directory / flow["state_csv"]).write_text(
        "time_s,event,algorithm,mode,bandwidth_Bps,pacing_gain\n0.1000,change,bbr,startup,0,0\n"
        "0.3000,reading,bbr,startup,125000,2.88672\n0.9000,change,bbr,probe_bw,1.25e+06,1.25\n")
    (directory / "results.json").write_text(json.dumps(doc))
    ran = ccscope("export", str(directory), "--out", str(tmp_path / "tables"))
    assert ran.returncode == 0, ran.stderr
    rows = pq.read_table(tmp_path / "tables" / "states.parquet").to_pylist()
    assert [(r["run"], r["flow"], r["time_s"], r["event"], r["mode"], r["bandwidth_Bps"]) for r in rows] == [
        (doc["runs"][0]["label"], flow["id"], 0.1, "change", "startup", 0.0),
        (doc["runs"][0]["label"], flow["id"], 0.3, "reading", "startup", 125000.0),
        (doc["runs"][0]["label"], flow["id"], 0.9, "change", "probe_bw", 1.25e6)]
    assert notebook.load(directory, frames=False).states == rows
