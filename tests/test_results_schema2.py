"""A schema-2 results directory written before the typed run record (tests/data/results-schema2: the two
shards of `ccscope scenario run tests/data/fixture.yaml --shard K/2`, written by 2026-11-27's main, bcb845a)
still reports, merges, exports and resumes. What each command gives is checked against the shards' own runs.
Never regenerate these directories: they stand for what users already have on disk."""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from ccscope.scenario import results
from ccscope_testkit.prereqs import ROOT, require_root, require_scenario

OLD = ROOT / "tests" / "data" / "results-schema2"
SHARDS = [OLD / "shard-a", OLD / "shard-b"]
SPEC = ROOT / "tests" / "data" / "fixture.yaml"


def ccscope(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    ran = subprocess.run([sys.executable, "-m", "ccscope.cli", *args], capture_output=True, text=True,
                         timeout=timeout, check=False)
    assert "Traceback" not in ran.stderr, ran.stderr
    return ran


def _stored(directory: Path) -> dict:
    return json.loads((directory / "results.json").read_text())


@pytest.fixture(scope="module")
def merged(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("merged") / "all"
    ran = ccscope("merge", str(out), *map(str, SHARDS))
    assert ran.returncode == 0, ran.stderr
    return out


def test_the_old_directories_are_schema_2() -> None:
    for shard in SHARDS:
        doc = _stored(shard)
        assert doc["schema_version"] == 2 and doc["complete"] is True and len(doc["runs"]) == 4


def test_an_old_shard_reports(tmp_path: Path) -> None:
    copy = tmp_path / "a"
    shutil.copytree(SHARDS[0], copy)
    ran = ccscope("report", str(copy))
    assert ran.returncode == 0, ran.stderr
    html = (copy / "report.html").read_text()
    for row in _stored(SHARDS[0])["summary"]:
        assert f"{row['goodput_bps']['mean'] / 1e6:.2f}" in html
    assert (copy / "plots" / "state.png").stat().st_size > 0


def test_old_shards_merge_into_the_whole_plan(merged: Path) -> None:
    doc = results.load(merged)
    shards = [_stored(s) for s in SHARDS]
    assert doc["complete"] is True and doc["missing_runs"] == []
    assert sorted(r["label"] for r in doc["runs"]) == sorted(doc["run_order"])
    by_label = {r["label"]: r for shard in shards for r in shard["runs"]}
    assert all(run == by_label[run["label"]] for run in doc["runs"])
    # every summary row is the mean of the runs' own per-algorithm goodputs, over both shards
    assert len(doc["summary"]) == 6
    for row in doc["summary"]:
        goodputs = [r["per_algorithm"][row["algorithm"]]["goodput_bps"] for r in by_label.values()
                    if r["profile"] == row["profile"] and r["algorithms"] == row["algorithms"]]
        assert row["runs"] == len(goodputs) == 2
        assert row["goodput_bps"]["mean"] == pytest.approx(statistics.fmean(goodputs), rel=1e-12)


def test_an_old_merge_exports_every_flow_and_sample(merged: Path, tmp_path: Path) -> None:
    ran = ccscope("export", str(merged), "--out", str(tmp_path))
    assert ran.returncode == 0, ran.stderr
    doc = _stored(merged)
    flows = [f for run in doc["runs"] for f in run["flows"]]
    downloads = [d for run in doc["runs"] for d in run["downloads"]]
    assert pq.read_table(tmp_path / "runs.parquet").num_rows == len(flows) + len(downloads) == 12 + 16
    rows = sum(len((merged / item["csv"]).read_text().splitlines()) - 1
               for run in doc["runs"] for item in run["flows"] + run["downloads"] if item.get("csv"))
    assert pq.read_table(tmp_path / "samples.parquet").num_rows == rows
    states = sum(len((merged / f["state_csv"]).read_text().splitlines()) - 1 for f in flows if f.get("state_csv"))
    assert states > 0 and pq.read_table(tmp_path / "states.parquet").num_rows == states


def test_an_old_interrupted_shard_resumes(tmp_path: Path) -> None:
    """The shard as a kill after its third run leaves it: the journal's last run gone, results.json without it."""
    require_root()
    require_scenario()
    copy = tmp_path / "a"
    shutil.copytree(SHARDS[0], copy)
    journal = (copy / "runs.jsonl").read_text().splitlines(keepends=True)
    dropped = json.loads(journal[-1])["run"]
    (copy / "runs.jsonl").write_text("".join(journal[:-1]))
    before = _stored(copy)
    before["runs"] = [r for r in before["runs"] if r["label"] != dropped["label"]]
    before.update(missing_runs=[dropped["label"]], complete=False, finished_at=None)
    (copy / "results.json").write_text(json.dumps(before))
    ran = ccscope("scenario", "run", str(SPEC), "--shard", "0/2", "--resume", str(copy), "--listen", "off",
                  timeout=300)
    assert ran.returncode == 0, ran.stderr
    assert "3 of 4 runs done, 1 to run" in ran.stderr
    doc = results.load(copy)
    assert doc["complete"] is True and doc["errors"] == []
    assert [r["label"] for r in doc["runs"]] == [r["label"] for r in _stored(SHARDS[0])["runs"]]
    kept = {r["label"]: r for r in before["runs"]}
    assert all(run == kept[run["label"]] for run in doc["runs"] if run["label"] in kept)
    rerun = next(r for r in doc["runs"] if r["label"] == dropped["label"])
    assert rerun["position"] == dropped["position"] and rerun["flows"] and rerun["per_algorithm"]
