"""`ccscope report DIR` on broken results directories: property-based (Hypothesis) and the issue's cases.

A results directory is untrusted input. Whatever it holds, report either renders it (exit 0, writing only
report.html and plots/) or says what is wrong in one line (exit 2) and writes nothing: no traceback, no
file read outside the directory, no unbounded read of a special file."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import resource
import subprocess
import tempfile
from pathlib import Path

import pytest
from ccscope import cli
from ccscope.errors import UsageError
from ccscope.scenario import analysis, lifecycle, results, runner, spec, store
from ccscope.scenario.record import RunRecord
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=40, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])

SCENARIO = {"name": "fuzz", "algorithms": ["cubic"], "duration": "3s", "warmup": "1s",
            "profiles": {"fast": {"rate": "20mbit", "delay": "5ms"}}, "traffic": {"bulk": {"flows": 1}}}
CSV = "flows/fast_cubic_r1_bulk0.csv"
PING = "flows/fast_cubic_r1_ping.csv"


def _base_document() -> dict:
    """A valid results document with one run, one bulk flow and ping, built by the runner's own code."""
    scenario = spec.from_dict(copy.deepcopy(SCENARIO), "fuzz.yaml")
    units = runner.plan(scenario)
    doc = results.new_document(scenario, units, [], quick=False)
    record = RunRecord.planned(units[0], 1).document()
    flow = analysis.empty_flow()
    flow.update({"id": "bulk0", "kind": "bulk", "algorithm": "cubic", "algorithm_kernel": "cubic",
                 "algorithm_iperf3": "cubic", "algorithm_ok": True, "goodput_bps": 19e6, "goodput_common_bps": 19e6,
                 "samples": 3,
                 "srtt_ms": analysis.summary([16.0, 17.0, 19.0]), "retransmits": 2, "retransmit_ratio": 0.002,
                 "segments_sent": 1000, "csv": CSV, "iperf3": {}})
    record.update({"netns": 4026532000, "backend": "userspace", "duration_s": 4.1, "flows": [flow],
                   "ping": {"sent": 3, "received": 3, "rtt_ms": analysis.summary([15.0, 16.0, 17.0]), "csv": PING},
                   "link": {d: {"packets": 1000, "queue_drops": 2, "random_drops": 0} for d in ("up", "down")}})
    record["per_algorithm"] = analysis.per_algorithm(record["flows"], {"cubic": [16.0, 17.0, 19.0]}, ("cubic",))
    doc["runs"].append(record)
    analysis.derive(doc)
    results.validate(doc)
    return doc


BASE = _base_document()
CSV_TEXT = ("time_s,cwnd_segments,srtt_ms,retransmits,throughput_mbps\n"
            "0.1000,10,16.000,0,\n0.2000,20,17.000,1,18.5\n0.3000,30,19.000,2,19.1\n")
PING_TEXT = "time_s,rtt_ms\n0.1000,15.000\n0.3000,16.000\n0.5000,17.000\n"


def _write_dir(root: Path, doc: dict | None = None, results_bytes: bytes | None = None,
               csv_bytes: bytes | None = None) -> Path:
    d = root / "res"
    (d / "flows").mkdir(parents=True)
    (d / "results.json").write_bytes(results_bytes if results_bytes is not None else
                                     json.dumps(doc if doc is not None else BASE, indent=1).encode())
    (d / CSV).write_bytes(csv_bytes if csv_bytes is not None else CSV_TEXT.encode())
    (d / PING).write_text(PING_TEXT)
    return d


def _tree(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.lstat().st_mode, p.lstat().st_size) for p in root.rglob("*")}


def _report(directory: Path) -> tuple[int, str, str]:
    """`ccscope report DIR` in this process (a traceback would propagate and fail the test)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(["report", str(directory)])
    return code, out.getvalue(), err.getvalue()


def _assert_refused(root: Path, directory: Path, before: dict) -> str:
    code, _, err = _report(directory)
    assert code == 2, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("ccscope: error: "), err
    assert _tree(root) == before, "a refused report must not write anything"
    return lines[0]


def _assert_rendered_or_refused(root: Path, directory: Path) -> None:
    before = _tree(root)
    code, _, err = _report(directory)
    assert "Traceback" not in err
    event("rendered" if code == 0 else "refused")
    if code == 0:
        new = set(_tree(root)) - set(before)
        assert new <= {"res/report.html", "res/plots"} | {f"res/plots/{p}" for p in
                                                          ("cwnd.png", "throughput.png", "rtt.png", "tradeoff.png",
                                                           "loss.png", "downloads.png")}, new
        assert (directory / "report.html").is_file()
    else:
        assert code == 2, err
        assert len(err.splitlines()) == 1 and err.startswith("ccscope: error: "), err
        assert _tree(root) == before


# --- the document: any value anywhere ---------------------------------------------------------------------------


def _paths(value, prefix=()) -> list[tuple]:
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*prefix, i))
    return out


PATHS = [p for p in _paths(BASE) if p]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3),
    max_leaves=6)


def _same_kind(value) -> st.SearchStrategy:
    if isinstance(value, bool):
        return st.booleans()
    if isinstance(value, int):
        return st.integers(-2**63, 2**63) | st.sampled_from([0, -1, 10**300])
    if isinstance(value, float):
        return st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0.0, -1.0, 1e308])
    if isinstance(value, str):
        return st.text(max_size=40) | st.sampled_from(["", "$x^2$", "a" * 5000, "cubic", "fast", "<b>", "../x"])
    if isinstance(value, list):
        return st.just(value * 2) | st.just(value[:1]) | st.just([])
    return st.just(value) | st.just({})


@st.composite
def mutated_documents(draw) -> dict:
    doc = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        parent = doc
        try:
            for key in path[:-1]:
                parent = parent[key]
            how = draw(st.sampled_from(["delete", "any", "same-kind", "same-kind"]))
            if how == "delete" and isinstance(parent, dict):
                parent.pop(path[-1], None)
            elif how == "same-kind":  # passes the type checks, so it reaches the plots and tables
                parent[path[-1]] = draw(_same_kind(parent[path[-1]]))
            else:
                parent[path[-1]] = draw(JSON_VALUES)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation removed or replaced the parent
    return doc


@settings(SETTINGS, max_examples=15)  # a valid one renders six plots (~1-4 s); 300 random ones passed locally
@given(doc=mutated_documents())
def test_any_document_renders_or_is_one_line(doc):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        try:
            text = json.dumps(doc)
        except ValueError:
            return
        directory = _write_dir(root, results_bytes=text.encode())
        _assert_rendered_or_refused(root, directory)


# --- broken files: always refused ---------------------------------------------------------------------------------

ESCAPES = st.sampled_from(["../../../../etc/passwd", "/etc/passwd", "/dev/zero", "flows/../../outside.csv",
                           "flows/link-out.csv", "flows/link-zero.csv", "flows/fifo.csv", "flows", "flows/big.csv",
                           "", "flows/\x00.csv"])


def _specials(directory: Path) -> None:
    (directory.parent / "outside.csv").write_text(CSV_TEXT)
    (directory / "flows" / "link-out.csv").symlink_to(directory.parent / "outside.csv")
    (directory / "flows" / "link-zero.csv").symlink_to("/dev/zero")
    os.mkfifo(directory / "flows" / "fifo.csv")
    with open(directory / "flows" / "big.csv", "wb") as fh:  # sparse: no disk used
        fh.truncate(results.confined.MAX_CSV_BYTES + 1)


@SETTINGS
@given(path=ESCAPES, where=st.sampled_from(["flow", "ping"]))
def test_csv_paths_outside_or_special_are_refused(path, where):
    doc = copy.deepcopy(BASE)
    if where == "flow":
        doc["runs"][0]["flows"][0]["csv"] = path
    else:
        doc["runs"][0]["ping"]["csv"] = path
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        directory = _write_dir(root, doc)
        _specials(directory)
        line = _assert_refused(root, directory, _tree(root))
        assert "root:" not in line  # nothing of /etc/passwd is shown


@st.composite
def broken_json(draw) -> bytes:
    text = json.dumps(BASE).encode()
    kind = draw(st.sampled_from(["truncate", "garbage", "non-utf8", "deep", "huge-int", "type", "empty"]))
    if kind == "truncate":
        return text[:draw(st.integers(0, len(text) - 1))]
    if kind == "garbage":
        return draw(st.binary(min_size=1, max_size=200))
    if kind == "non-utf8":
        at = draw(st.integers(0, len(text)))
        return text[:at] + draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80\x80"])) + text[at:]
    if kind == "deep":
        n = draw(st.integers(40, 200_000))
        return b'{"schema_version": 2, "x": ' + b"[" * n + b"]" * n + b"}"
    if kind == "huge-int":
        return b'{"schema_version": ' + b"9" * draw(st.integers(4301, 20_000)) + b"}"
    if kind == "type":
        return draw(st.sampled_from([b"[]", b"null", b"1", b'"x"', b"{}", b'{"schema_version": 2}']))
    return b""


def _decodes_as_valid(data: bytes) -> bool:
    try:
        results.parse(data.decode(), "x")
    except Exception:
        return False
    return True


@SETTINGS
@given(data=broken_json())
def test_broken_results_json_is_refused(data):
    if _decodes_as_valid(data):
        return  # e.g. a truncation that happens to leave a valid document: not broken
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        directory = _write_dir(root, results_bytes=data)
        _assert_refused(root, directory, _tree(root))


@settings(SETTINGS, max_examples=25)
@given(data=st.sampled_from([b"\xff\xfe", b"time_s,cwnd_segments\n0.1,\xff\n", b"time_s,cwnd_segments\n0.1,abc\n",
                             b"time_s,cwnd_segments\n0.1,inf\n", b"time_s,cwnd_segments\nnan,1\n",
                             b"time_s,cwnd_segments\n0.1,\x00\n", b"cwnd_segments\n1\n",
                             b"time_s,cwnd_segments\n" + b"1," + b"9" * 200_000 + b"\n"])
       | st.binary(max_size=120).map(lambda b: b"time_s,cwnd_segments,srtt_ms\n" + b))
def test_broken_flow_csv_renders_or_is_one_line(data):
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        directory = _write_dir(root, csv_bytes=data)
        _assert_rendered_or_refused(root, directory)


@pytest.mark.parametrize("target", ["results.json", "runs.jsonl"])
@pytest.mark.parametrize("special", ["symlink-out", "dev-zero", "fifo", "directory", "too-big"])
def test_special_results_files_are_refused(tmp_path, target, special):
    directory = _write_dir(tmp_path)
    path = directory / target
    path.unlink(missing_ok=True)
    if special == "symlink-out":
        (tmp_path / "elsewhere.json").write_text(json.dumps(BASE))
        path.symlink_to(tmp_path / "elsewhere.json")
    elif special == "dev-zero":
        path.symlink_to("/dev/zero")
    elif special == "fifo":
        os.mkfifo(path)
    elif special == "directory":
        path.mkdir()
    else:
        with open(path, "wb") as fh:
            fh.truncate(results.confined.MAX_JSON_BYTES + 1)
    if target == "runs.jsonl":
        (directory / "results.json").write_text(json.dumps(BASE))
    line = _assert_refused(tmp_path, directory, _tree(tmp_path))
    assert target in line


# --- the issue's reproducers, as a user runs them ------------------------------------------------------------------


@pytest.mark.parametrize("csv_path", ["../../../../etc/passwd", "/dev/zero"])
def test_report_cli_refuses_paths_from_the_issue(ccscope_cmd, tmp_path, csv_path):
    doc = copy.deepcopy(BASE)
    doc["runs"][0]["flows"][0]["csv"] = csv_path
    directory = _write_dir(tmp_path, doc)
    before = _tree(tmp_path)

    def limit_memory():  # before the fix, /dev/zero grew the report to 18 GB
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    res = subprocess.run([*ccscope_cmd, "report", str(directory)], capture_output=True, text=True, timeout=120,
                         preexec_fn=limit_memory)
    assert res.returncode == 2, res.stderr
    assert res.stderr.count("\n") == 1 and "Traceback" not in res.stderr
    assert repr(csv_path) in res.stderr
    assert _tree(tmp_path) == before


def test_report_of_a_valid_directory_renders(ccscope_cmd, tmp_path):
    """The base document of the fuzz tests is itself valid: the properties above are not vacuous."""
    directory = _write_dir(tmp_path)
    res = subprocess.run([*ccscope_cmd, "report", str(directory)], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert (directory / "plots" / "cwnd.png").stat().st_size > 5000
    assert "fast" in res.stdout


# --- the journal --------------------------------------------------------------------------------------------------


def _journal(directory: Path, doc: dict, runs: list[dict], tail: bytes = b"") -> None:
    header = {**copy.deepcopy(doc), "runs": [], "summary": [], "errors": [], "complete": False,
              "missing_runs": list(doc["run_order"])}
    lines = [json.dumps({"kind": "header", "document": header})]
    lines += [json.dumps({"kind": "run", "run": r, "emulation_checks": {}, "warnings": [],
                          "environment": doc["environment"]}) for r in runs]
    (directory / store.JOURNAL).write_bytes(("\n".join(lines) + "\n").encode() + tail)


def test_journal_one_run_ahead_is_merged_and_a_torn_line_ignored(tmp_path):
    """SIGKILL between the journal line and the rename of results.json, then during the next line."""
    header_only = {**copy.deepcopy(BASE), "runs": [], "complete": False, "missing_runs": list(BASE["run_order"])}
    analysis.derive(header_only)
    directory = _write_dir(tmp_path, header_only)
    _journal(directory, BASE, BASE["runs"], tail=b'{"kind":"run","run":{"label":"fa')
    code, _out, err = _report(directory)
    assert code == 0, err
    assert "rebuilt" in err
    doc = results.load(directory)
    assert [r["label"] for r in doc["runs"]] == [r["label"] for r in BASE["runs"]]
    assert doc["complete"] is True and doc["summary"] == BASE["summary"]


def test_results_json_missing_is_rebuilt_from_the_journal(tmp_path):
    directory = _write_dir(tmp_path)
    (directory / "results.json").unlink()
    _journal(directory, BASE, [])
    code, out, err = _report(directory)
    assert code == 0, err
    assert "INCOMPLETE: 0 of 1 runs" in out
    assert results.load(directory)["missing_runs"] == BASE["run_order"]


@pytest.mark.parametrize("line", [b"not json", b'{"kind":"run","run":{"label":1}}', b"[1]", b"\xff"])
def test_corrupt_journal_line_is_one_line(tmp_path, line):
    directory = _write_dir(tmp_path)
    _journal(directory, BASE, [], tail=line + b"\n" + b'{"kind":"header","document":{}}\n')
    line = _assert_refused(tmp_path, directory, _tree(tmp_path))
    assert "runs.jsonl" in line


@pytest.mark.parametrize("data", [
    b"[" * 100_000 + b"]" * 100_000,
    b'{"schema_version": 2, "a": ' + b"[" * 50 + b"]" * 50 + b"}",
    json.dumps(BASE).encode().replace(b'"fuzz"', b'"fu\xffzz"', 1)], ids=["recursion", "deep", "non-utf8"])
def test_issue_cases_in_results_json(tmp_path, data):
    directory = _write_dir(tmp_path, results_bytes=data)
    line = _assert_refused(tmp_path, directory, _tree(tmp_path))
    assert "results.json" in line and ("nested" in line or "not UTF-8" in line)


def test_non_utf8_flow_csv_is_one_line(tmp_path):
    directory = _write_dir(tmp_path, csv_bytes=CSV_TEXT.encode().replace(b"16.000", b"16.\xe900"))
    line = _assert_refused(tmp_path, directory, _tree(tmp_path))
    assert CSV in line and "byte 0xe9 is not UTF-8" in line


@pytest.mark.parametrize("link", ["plots", "report.html", "plots/.cwnd.png.tmp"])
def test_report_never_writes_through_a_symlink(tmp_path, link):
    directory = _write_dir(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "victim").write_text("untouched")
    if link == "plots":
        (directory / "plots").symlink_to(outside)
    else:
        (directory / link).parent.mkdir(exist_ok=True)
        (directory / link).symlink_to(outside / "victim")
    code, _, err = _report(directory)
    assert [p.name for p in outside.iterdir()] == ["victim"] and (outside / "victim").read_text() == "untouched"
    if link == "plots":
        assert code == 2 and err.count("\n") == 1 and "not a directory" in err, err
    else:
        assert code == 0, err
        assert not (directory / link).is_symlink() or link.endswith(".tmp")


def test_resume_cuts_a_torn_journal_line_before_appending(tmp_path):
    header_only = {**copy.deepcopy(BASE), "runs": [], "complete": False, "missing_runs": list(BASE["run_order"])}
    analysis.derive(header_only)
    directory = _write_dir(tmp_path, header_only)
    _journal(directory, BASE, [], tail=b'{"kind":"run","run":{"label":"fa')
    resumed, doc = store.Store.resume(directory, copy.deepcopy(header_only))
    try:
        assert doc["runs"] == [] and doc["missing_runs"] == BASE["run_order"]
        lifecycle.keep(doc, resumed, copy.deepcopy(BASE["runs"][0]))
    finally:
        resumed.close()
    assert [r["label"] for r in store.load(directory)["runs"]] == BASE["run_order"]
    assert (directory / store.JOURNAL).read_bytes().count(b"\n") == 2  # header and the run, nothing torn


@pytest.mark.parametrize(("poison", "problem"), [
    (lambda run: run["flows"][0]["srtt_ms"].__setitem__("p95", float("inf")), "run.flows[0].srtt_ms.p95: expected"),
    (lambda run: run["flows"][0]["iperf3"].__setitem__("goodput_bps", float("nan")),
     "run.flows[0].iperf3.goodput_bps: expected a finite number, got nan"),
    (lambda run: run.__setitem__("jain", "fair"), "run.jain: expected number or null, got str")])
def test_a_run_the_document_cannot_hold_is_quarantined_not_fatal(tmp_path, poison, problem):
    """Defence behind the runner's checks of a far end: a record with a value results.json cannot hold (also
    inside iperf3's free-form report, which the schema leaves open) is stored as a failed run with what it
    measured left out, and a warning; the directory stays readable to report and --resume."""
    header_only = {**copy.deepcopy(BASE), "runs": [], "complete": False, "missing_runs": list(BASE["run_order"])}
    analysis.derive(header_only)
    directory = _write_dir(tmp_path, header_only)
    _journal(directory, BASE, [])
    opened, doc = store.Store.resume(directory, copy.deepcopy(header_only))
    run = copy.deepcopy(BASE["runs"][0])
    run["flows"][0].setdefault("iperf3", {})
    poison(run)
    try:
        stored = lifecycle.keep(doc, opened, run)
    finally:
        opened.close()
    assert stored["flows"] == [] and stored["errors"][-1].startswith("what the run measured was not kept: ")
    assert problem in stored["errors"][-1], stored["errors"]
    loaded = store.load(directory)
    assert [r["label"] for r in loaded["runs"]] == [run["label"]] and problem in loaded["warnings"][-1]
    code, _out, err = _report(directory)
    assert code == 0, err


def _four_runs_one_done(tmp_path: Path) -> tuple[Path, dict, dict]:
    """A 4-run plan with its first run done (journal and results.json agree); and the plan as a fresh
    invocation derives it."""
    scenario = spec.from_dict({**copy.deepcopy(SCENARIO), "runs": 4}, "resume.yaml")
    units = runner.plan(scenario)
    fresh = results.new_document(scenario, units, [], quick=False)
    run = {**copy.deepcopy(BASE["runs"][0]), "label": units[0].label, "repetition": units[0].repetition}
    doc = copy.deepcopy(fresh)
    doc["runs"].append(run)
    analysis.derive(doc)
    directory = _write_dir(tmp_path, doc)
    _journal(directory, fresh, [run])
    return directory, doc, fresh


def _edited(directory: Path, edit) -> None:
    doc = json.loads((directory / "results.json").read_text())
    edit(doc)
    (directory / "results.json").write_text(json.dumps(doc))


def _resume_refused(directory: Path, fresh: dict, message: str) -> None:
    with pytest.raises(UsageError) as refused:
        store.Store.resume(directory, fresh)
    assert message in refused.value.line() and "\n" not in refused.value.line(), refused.value.line()
    store.Store(directory, store.Store._lock(directory)).close()  # the refusal released the lock


def test_resume_derives_the_state_from_the_journal(tmp_path):
    """The probe's edits: results.json marked complete (was "0 to run", exit 0, finished_at kept), a run
    relabelled (was accepted; two resumes later a 4-run plan held 5 runs). The journal decides."""
    directory, doc, fresh = _four_runs_one_done(tmp_path)
    label = doc["runs"][0]["label"]
    resumed, state = store.Store.resume(directory, copy.deepcopy(fresh))
    resumed.close()
    assert [r["label"] for r in state["runs"]] == [label] and len(state["missing_runs"]) == 3
    assert state["finished_at"] is None

    _edited(directory, lambda d: d.update(complete=True, missing_runs=[], finished_at="2026-01-01T00:00:00Z"))
    _resume_refused(directory, fresh, "results.json has run")
    _edited(directory, lambda d: d.update(complete=False, missing_runs=d["run_order"][1:]))
    _edited(directory, lambda d: d["runs"][0].update(label="zzz/cubic#1"))
    _resume_refused(directory, fresh, "results.json has run 'zzz/cubic#1' done, runs.jsonl does not")

    directory, doc, fresh = _four_runs_one_done(tmp_path / "journal")
    renamed = {**doc["runs"][0], "label": "zzz/cubic#1"}
    _journal(directory, fresh, [renamed])
    _resume_refused(directory, fresh, "runs.jsonl holds run 'zzz/cubic#1', which the plan does not have")
    _journal(directory, fresh, [doc["runs"][0], doc["runs"][0]])
    _resume_refused(directory, fresh, "twice")
    _journal(directory, fresh, [{**doc["runs"][0], "position": 2}])
    _resume_refused(directory, fresh, "at position 2, planned at 1")


@pytest.mark.parametrize("value", ["NaN", "Infinity", "-Infinity"])
def test_non_finite_number_is_refused_before_any_plot_is_rewritten(tmp_path, value):
    """The probe: NaN in summary[0].goodput_bps.mean was a traceback in plot_tradeoff (exit 1), after
    cwnd.png, rtt.png and throughput.png had been rewritten."""
    directory = _write_dir(tmp_path)
    assert _report(directory)[0] == 0  # plots of a good document exist, and must stay as they are
    plots = {p.name: p.stat().st_ino for p in (directory / "plots").iterdir()}  # write_atomic: a new inode
    text = json.dumps(BASE, indent=1)
    doc = json.loads(text)
    # Python's json writes these three as the bare tokens; a text replace of a number once hit the same digits
    # in "monotonic_started" (6461.5...) and wrote invalid JSON.
    doc["summary"][0]["goodput_bps"]["mean"] = float(value)
    (directory / "results.json").write_text(json.dumps(doc, indent=1))
    assert f'"mean": {value}' in (directory / "results.json").read_text()
    line = _assert_refused(tmp_path, directory, _tree(tmp_path))
    assert f"$.summary[0].goodput_bps.mean: expected number or null, got {float(value)}" in line, line
    assert {p.name: p.stat().st_ino for p in (directory / "plots").iterdir()} == plots
