"""One quick scenario run, watched as a user watches it: `ccscope scenario wired-vs-wireless --quick` with its
live page open in headless Chromium and /metrics scraped meanwhile. The scenario tests check what the run
wrote and served (test_scenario_run.py), the live tests what the page showed (test_live.py); running it once
for both saves the suite a minute (each ran it on its own: 68 and 55 s).

Nothing is asserted here: the run records what it saw, and each test asserts on its part of the record.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ccscope.live import vendor
from ccscope_testkit.net import free_port, stop_process
from ccscope_testkit.prereqs import require, require_bpf_object, require_root, require_tools
from emulation_helpers import HostSnapshot
from livehelpers import artifacts_dir, chromium, console_errors, require_browser, screenshot, wait_js

FLOW_SECONDS = 5  # per run; 8 runs with the path check, set-up and teardown: ~70 s on an idle machine
# the scenario's own bound: 8 runs, much longer beside other work than the ~70 s of an idle machine
RUN_TIMEOUT_S = 300
OVERLAID = "Number(document.body.dataset.currentOverlaid) >= 1 && Number(document.body.dataset.currentPoints)"


@dataclass
class WatchedScenario:
    out: Path
    returncode: int | None = None
    stdout: str = ""
    stderr: str = ""
    labelled: set[tuple[str, str]] = field(default_factory=set)  # (profile, algorithm) of flows on /metrics
    page: dict[str, Any] = field(default_factory=dict)  # what the live page showed, by moment
    left_behind: str = ""  # HostSnapshot's complaint after the run, if any
    ran: tuple[float, float] = (0.0, 0.0)  # when the scenario started and ended (time.monotonic)


def require_prerequisites() -> None:
    require_root()
    require_bpf_object()
    require_tools("iperf3", "ping", "ip", "tc", "ethtool", "ss", "iptables")
    require(not vendor.missing_files(), "live page assets not built: make assets")
    require_browser()


def watch(directory: Path) -> WatchedScenario:
    """Runs the scenario to its end (or its bound) and returns what was seen. The process is stopped on any
    way out (SIGTERM, then SIGKILL), and the host is checked afterwards."""
    require_prerequisites()
    run = WatchedScenario(out=directory / "wvw")
    port, stdout, stderr = free_port(), directory / "stdout", directory / "stderr"
    argv = [sys.executable, "-m", "ccscope.cli", "scenario", "wired-vs-wireless", "--quick", "--duration",
            f"{FLOW_SECONDS}s", "--out", str(run.out), "--listen", f"127.0.0.1:{port}"]
    snapshot = HostSnapshot.take()
    started = time.monotonic()
    with stdout.open("w") as out_file, stderr.open("w") as err_file:
        proc = subprocess.Popen(argv, stdout=out_file, stderr=err_file, text=True)
    done = threading.Event()
    scraper = threading.Thread(target=_scrape_labels, args=(port, run.labelled, done), daemon=True)
    scraper.start()
    try:
        _watch_page(proc, stderr, port, run, directory)
        run.returncode = proc.wait(timeout=RUN_TIMEOUT_S)
    finally:
        done.set()
        stop_process(proc, timeout=30)
        scraper.join(timeout=10)
        run.ran = (started, time.monotonic())
    run.stdout, run.stderr = stdout.read_text(), stderr.read_text()
    try:
        snapshot.assert_unchanged()
    except AssertionError as exc:
        run.left_behind = str(exc)
    return run


def _watch_page(proc: subprocess.Popen, stderr: Path, port: int, run: WatchedScenario, directory: Path) -> None:
    page = run.page
    page["announced"] = _wait_for_line(proc, stderr, f"http://127.0.0.1:{port}/", deadline_s=60)
    if not page["announced"]:
        return
    with chromium() as driver:
        driver.get(f"http://127.0.0.1:{port}/")
        page["started"] = wait_js(driver, "Number(document.body.dataset.scenarioRun) >= 1 "
                                          "&& Number(document.body.dataset.scenarioProgress) > 0", timeout=60)
        page["label"] = driver.find_element("id", "sc-label").text
        page["planned"] = driver.execute_script("return window.ccscopeLive.scenario.algorithms;")
        page["table"] = wait_js(driver, "window.ccscopeLive.table.rows.length ? window.ccscopeLive.table : null",
                                timeout=30)
        # a run in progress drawn over finished runs of its profile, its curve growing
        page["first_points"] = wait_js(driver, f"{OVERLAID} >= 20 && Number(document.body.dataset.currentPoints)",
                                       timeout=60)
        if page["first_points"]:
            page["grew"] = wait_js(driver, f"{OVERLAID} >= {page['first_points'] + 20}", timeout=5)
        page["state_then"] = driver.execute_script("return [document.body.dataset, window.ccscopeLive.scenario];")
        page["screenshot"] = screenshot(driver, artifacts_dir(directory), "live-scenario.png")
        page["report_url"] = wait_js(driver, "window.ccscopeLive.scenario.report_url", timeout=RUN_TIMEOUT_S)
        page["state_at_end"] = driver.execute_script("return [document.body.dataset, window.ccscopeLive.scenario];")
        page["runs"] = driver.execute_script("return window.ccscopeLive.runs;")
        # each flow's algorithm state as its points carried it, and the most BBR mode bands one drawing had
        page["state_columns"] = driver.execute_script(
            "return Object.values(window.ccscopeLive.flows).map((f) => ({cc: f.info.cc, sport: f.info.sport, "
            "mode: f.cols.bbr_mode || [], wmax: f.cols.cubic_wmax_segments || [], cwnd: f.cols.cwnd_segments}));")
        page["mode_bands"] = driver.execute_script("return window.ccscopeLive.modeBands;")
        page["legends"] = driver.execute_script(
            "return [...document.querySelectorAll('#sc-charts .u-legend .u-label')].map((l) => l.textContent);")
        page["finished"] = driver.execute_script("return [...document.querySelectorAll('#sc-runs li')]"
                                                 ".map((li) => li.textContent);")
        page["console_errors"] = console_errors(driver)


def _wait_for_line(proc: subprocess.Popen, stderr: Path, text: str, deadline_s: float) -> bool:
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if text in stderr.read_text():
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.1)
    return False


def _scrape_labels(port: int, labelled: set[tuple[str, str]], done: threading.Event) -> None:
    """(profile, algorithm) of every flow the endpoint labelled with this scenario, scraped every 0.5 s."""
    while not done.is_set():
        with contextlib.suppress(OSError):
            body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
            for line in body.splitlines():
                if line.startswith("ccscope_flow_cwnd_segments{") and 'scenario="wired-vs-wireless"' in line:
                    labelled.add((line.split('profile="')[1].split('"')[0],
                                  line.split('algorithm="')[1].split('"')[0]))
        done.wait(0.5)
