"""Headless Chromium (Debian's chromium + chromium-driver) driven by selenium, for the live page's tests.

Screenshots go to $CCSCOPE_TEST_ARTIFACTS when set (CI keeps that directory), else to pytest's tmp_path; the
path is printed (pytest -s, or the captured output of a failing test).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from ccscope_testkit.prereqs import require

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
# As root Chromium needs --no-sandbox; the background-networking flags keep it from dialing out (the closed
# network refuses those connections, and they would show up as console errors or slow start-up).
CHROMIUM_FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--disable-dev-shm-usage", "--window-size=1400,1700")


def require_browser() -> None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        require(False, "selenium not installed: tools/bootstrap --dev")
    require(Path(CHROMIUM).is_file() and Path(CHROMEDRIVER).is_file(),
            "chromium and chromium-driver not installed: tools/bootstrap --dev")


def artifacts_dir(tmp_path: Path) -> Path:
    base = os.environ.get("CCSCOPE_TEST_ARTIFACTS")
    path = Path(base) if base else tmp_path
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextlib.contextmanager
def chromium() -> Iterator:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    profile = tempfile.mkdtemp(prefix="ccscope-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*CHROMIUM_FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def wait_js(driver, script: str, timeout: float, step: float = 0.05):
    """Polls a JS expression until it is truthy; returns its last value (falsy on timeout)."""
    deadline = time.monotonic() + timeout
    while True:
        value = driver.execute_script(f"return ({script});")
        if value or time.monotonic() > deadline:
            return value
        time.sleep(step)


def console_errors(driver) -> list[str]:
    return [entry["message"] for entry in driver.get_log("browser") if entry["level"] == "SEVERE"]


def screenshot(driver, directory: Path, name: str) -> Path:
    path = directory / name
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")
    return path
