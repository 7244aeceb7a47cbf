"""A real-path run against a far end that is buggy or hostile (the serve probe's findings 8-10): the runner
checks everything a far end sends before it uses or stores it. A bad greeting is one line before anything
is created; a bad answer fails that run with one line and the others go on; nothing a far end sends makes
the results directory unreadable to report, export or --resume.

The far end is tests/hostile_far_end.py (serve's protocol with bad values, and a real `iperf3 -s -1` for the
test itself), the runner `ccscope scenario run`, both in one namespace on loopback, as the probe ran them.
"""

from __future__ import annotations

import csv
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ccscope_testkit.net import netns, shape_loopback, wait_port
from ccscope_testkit.prereqs import ROOT, require_bpf_object, require_root, require_tools

FAR_END = Path(__file__).with_name("hostile_far_end.py")
BASE_PORT = 7301  # each far end takes PORT (control) and PORT + 1 (its iperf3)


@pytest.fixture(scope="module")
def ns() -> Iterator[str]:
    require_root()
    require_tools("iperf3", "ping", "ip", "ss", "tc")
    require_bpf_object()
    with netns("hostile") as name:
        shape_loopback(name)  # 20 Mbit/s: the tests' flows are bounded, as on a real path
        yield name


class FarEnds:
    """One hostile far end per mode, each on its own port pair, in the namespace."""

    def __init__(self, ns: str) -> None:
        self.ns = ns
        self.procs: list[subprocess.Popen] = []
        self.ports: dict[str, int] = {}

    def start(self, *modes: str) -> dict[str, int]:
        for mode in modes:
            port = BASE_PORT + 2 * len(self.procs)
            self.procs.append(subprocess.Popen(["ip", "netns", "exec", self.ns, sys.executable, str(FAR_END),
                                                str(port), mode], stderr=subprocess.PIPE, text=True))
            self.ports[mode] = port
        for port in self.ports.values():
            wait_port(port, netns=self.ns)
        return self.ports

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
            proc.wait(timeout=5)


@pytest.fixture
def far_ends(ns: str) -> Iterator[FarEnds]:
    ends = FarEnds(ns)
    try:
        yield ends
    finally:
        ends.close()


def write_scenario(path: Path, ports: dict[str, int], duration: int = 2, runs: int = 1) -> Path:
    profiles = {mode: {"target": f"127.0.0.1:{port}", "direction": "down"} for mode, port in ports.items()}
    path.write_text(json.dumps({"name": path.stem, "algorithms": ["cubic"], "duration": duration, "warmup": 0,
                                "runs": runs, "traffic": {"bulk": {"flows": 1}}, "profiles": profiles}))
    return path


def ccscope(ns: str, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-m", "ccscope.cli", *args],
                          capture_output=True, text=True, timeout=timeout, cwd=ROOT)


def one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("ccscope: error: ") and "Traceback" not in stderr, stderr
    return lines[0]


GREETINGS = {  # mode: what the one line must say
    "bad-ports": "the greeting's ports 'ab'",
    "ports-int": "the greeting's ports 5",
    "bad-maxsec": "the greeting's max_seconds 'x'",
    "old-version": "a greeting of protocol version 0",
    "http": "it answered 'HTTP/1.1 400 Bad'",
    "silent": "no answer to the iperf3 cookie within 3 s",
}


def test_a_bad_greeting_is_one_line_before_anything_is_created(ns, far_ends, tmp_path):
    ports = far_ends.start(*GREETINGS)
    for mode, text in GREETINGS.items():
        file = write_scenario(tmp_path / f"{mode}.yaml", {mode: ports[mode]}, duration=30)
        started = time.monotonic()
        done = ccscope(ns, "scenario", "run", str(file), "--out", str(tmp_path / mode), "--listen", "off")
        line = one_line(done.stderr)
        assert done.returncode == 3 and text in line and f"127.0.0.1:{ports[mode]}" in line, (mode, line)
        if mode in ("http", "silent"):
            assert "not an iperf3 server or ccscope serve" in line, line
        # named at the greeting, not after the run's 30 s plus the runner's slack, as before
        assert time.monotonic() - started < 30, mode
        assert not (tmp_path / mode).exists()


TEST_REPLIES = {"no-port": "a test port None", "port-string": "a test port 'http'", "port-outside": "a test port 22"}
TELEMETRY = {  # mode: what the run's one error says
    "bad-now": "telemetry with a clock reading of 'x'",
    "str-samples": "srtt_s 't' is out of range",
    "nan-srtt": "srtt_s nan is out of range",
}


def test_bad_answers_fail_their_run_with_one_line(ns, far_ends, tmp_path):
    """Each far end answers one kind of garbage to the test request or to "done": its run fails, one line."""
    ports = far_ends.start(*TEST_REPLIES, *TELEMETRY)
    out = tmp_path / "out"
    done = ccscope(ns, "scenario", "run", str(write_scenario(tmp_path / "bad.yaml", ports)), "--out", str(out),
                   "--listen", "off", timeout=300)
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    doc = json.loads((out / "results.json").read_text())
    assert doc["complete"] and {r["profile"] for r in doc["runs"]} == set(ports)
    for run in doc["runs"]:
        expected = {**TEST_REPLIES, **TELEMETRY}[run["profile"]]
        assert len(run["errors"]) == 1 and expected in run["errors"][0], run["errors"]
    assert ccscope(ns, "report", str(out)).returncode == 0


def test_a_poisoned_run_costs_no_other_run(ns, far_ends, tmp_path):
    """The probe's fake_second: run 1 of 2 is good, run 2 carries a 1e308 s srtt, which had made report and
    --resume refuse the whole directory (`got inf`). Now run 2 fails with one line, run 1 keeps its numbers,
    and report, export and --resume read the directory."""
    ports = far_ends.start("second-huge")
    file = write_scenario(tmp_path / "poisoned.yaml", ports, runs=2)
    out = tmp_path / "out"
    done = ccscope(ns, "scenario", "run", str(file), "--out", str(out), "--listen", "off")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    doc = json.loads((out / "results.json").read_text())
    good, bad = sorted(doc["runs"], key=lambda r: r["position"])  # the far end poisons every test after its first
    assert good["errors"] == [] and good["flows"][0]["view"] == "sender"
    assert good["flows"][0]["srtt_ms"]["median"] == pytest.approx(1.0)  # the far end's 0.001 s
    assert good["flows"][0]["goodput_bps"] > 0
    assert len(bad["errors"]) == 1 and "srtt_s 1e+308 is out of range" in bad["errors"][0], bad["errors"]
    report = ccscope(ns, "report", str(out))
    assert report.returncode == 0, report.stderr
    export = ccscope(ns, "export", "--format", "csv", str(out))
    assert export.returncode == 0, export.stderr
    with (out / "tables" / "runs.csv").open(newline="") as fh:
        assert sorted(row["run"] for row in csv.DictReader(fh)) == sorted([good["label"], bad["label"]])
    resumed = ccscope(ns, "scenario", "run", str(file), "--resume", str(out), "--listen", "off")
    assert "Traceback" not in resumed.stderr and "2 of 2 runs done, 0 to run" in resumed.stderr, resumed.stderr


def test_an_endless_answer_is_cut_at_the_reply_cap():
    """fake_serve.py huge-reply: a telemetry answer beyond MAX_REPLY_BYTES is refused once that much has
    arrived, not read on without end (no namespace: the cap is the protocol's, a socket pair shows it)."""
    from ccscope.serve import protocol

    ours, theirs = socket.socketpair()
    chunk = b"x" * (1 << 20)

    def flood() -> None:
        with theirs:
            try:
                for _ in range((protocol.MAX_REPLY_BYTES >> 20) + 8):
                    theirs.sendall(chunk)
            except OSError:
                pass

    writer = threading.Thread(target=flood)
    writer.start()
    with ours, pytest.raises(protocol.ServeError, match="a line longer than 67108864 bytes"):
        protocol.read_line(ours, protocol.MAX_REPLY_BYTES, time.monotonic() + 30)
    writer.join(timeout=10)
