"""tools/kernel-lab itself: status and output come back, shares are writable and the root is not,
and every failure is one `kernel-lab: error:` line with a non-zero status and nothing left running."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from labhelpers import lab

pytestmark = pytest.mark.stock_kernel


def one_error_line(stderr: str) -> str:
    """Progress lines may come first; the failure itself is exactly one line, the last."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("kernel-lab: error: ")]
    assert len(errors) == 1 and lines[-1] == errors[0], stderr
    assert "Traceback" not in stderr
    return errors[0]


def qemu_processes_using(path: Path) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if "qemu-system" in cmdline and str(path) in cmdline:
            found.append(int(pid))
    return found


def test_run_returns_status_output_and_shared_files(kernel_lab: Path, tmp_path: Path) -> None:
    script = (
        "echo to-stdout; echo to-stderr >&2; uname -r > out/release; pwd > out/cwd; "
        "if touch /etc/kernel-lab-must-not-exist 2>/dev/null; then echo root-writable; fi; "
        "touch /tmp/scratch && echo tmp-writable; exit 7"
    )
    (tmp_path / "out").mkdir()
    ran = lab("run", "--share", str(tmp_path / "out"), "--cwd", str(tmp_path), "--timeout", "300",
              "--", "sh", "-c", script, timeout=400)
    assert ran.returncode == 7, ran.stderr
    assert ran.stdout.split() == ["to-stdout", "tmp-writable"]
    assert "to-stderr" in ran.stderr
    assert (tmp_path / "out" / "release").read_text().startswith("6.1.")
    assert (tmp_path / "out" / "cwd").read_text().strip() == str(tmp_path)
    assert not Path("/etc/kernel-lab-must-not-exist").exists()


def test_a_hung_guest_is_killed_at_the_timeout(kernel_lab: Path, tmp_path: Path) -> None:
    started = time.monotonic()
    ran = lab("run", "--timeout", "5", "--", "sleep", "600", env={"TMPDIR": str(tmp_path)}, timeout=120)
    assert ran.returncode == 124
    assert "did not finish within 5 s" in one_error_line(ran.stderr)
    assert time.monotonic() - started < 60
    assert qemu_processes_using(tmp_path) == []


@pytest.fixture
def kept_panic_console() -> Iterator[Path]:
    """The lab's copy of a panicked guest's console; whatever a test leaves there is put back as it was."""
    kept = Path(os.environ.get("KERNEL_LAB_CACHE", "/var/cache/ccscope-kernel-lab")) / "last-panic-console.log"
    before = kept.read_bytes() if kept.exists() else None
    kept.unlink(missing_ok=True)
    yield kept
    if before is None:
        kept.unlink(missing_ok=True)
    else:
        kept.write_bytes(before)


def test_a_guest_panic_is_one_line_and_its_console_is_kept(kernel_lab: Path, kept_panic_console: Path) -> None:
    """The CI run of 454a740 lost a 7.2 guest's oops: the next boot overwrote last-console.log."""
    ran = lab("run", "--timeout", "120", "--", "sh", "-c", "echo c > /proc/sysrq-trigger; sleep 60", timeout=200)
    assert ran.returncode == 125
    line = one_error_line(ran.stderr)
    assert "Kernel panic - not syncing: sysrq triggered crash" in line and str(kept_panic_console) in line
    # a file of its own, written only when a console has a panic: the boots after it leave it alone
    assert "sysrq triggered crash" in kept_panic_console.read_text(errors="replace")


def test_missing_qemu_is_one_error_line(kernel_lab: Path) -> None:
    ran = lab("run", "--", "true", env={"KERNEL_LAB_QEMU": "/nonexistent/qemu-system-x86_64"})
    assert ran.returncode == 3
    assert "not found" in one_error_line(ran.stderr)


def test_missing_kernel_package_is_one_error_line(tmp_path: Path) -> None:
    ran = lab("fetch", "--package", "linux-image-6.1.0-99999-amd64",
              env={"KERNEL_LAB_CACHE": str(tmp_path / "cache")}, timeout=300)
    assert ran.returncode == 3
    assert "linux-image-6.1.0-99999-amd64" in one_error_line(ran.stderr)


@pytest.mark.parametrize("args", [
    ["run"],
    ["run", "--timeout", "soon", "--", "true"],
    ["run", "--env", "NOEQUALS", "--", "true"],
    ["fetch", "--package", "not-a-kernel"],
    ["fetch", "--kernel", "9.9"],
    ["run", "--kernel", "5.10", "--", "true"],
    ["explode"],
])
def test_bad_input_is_one_error_line(args: list[str], tmp_path: Path) -> None:
    ran = lab(*args, env={"KERNEL_LAB_CACHE": str(tmp_path / "cache")}, timeout=60)
    assert ran.returncode == 2
    one_error_line(ran.stderr)


def test_info_reports_the_cached_kernel(kernel_lab: Path) -> None:
    ran = lab("info", "--json")
    assert ran.returncode == 0, ran.stderr
    info = json.loads(ran.stdout)
    assert info["kernel"].startswith("6.1.") and info["missing_prerequisites"] == [] and info["btf"] == "y"
    assert "sch_netem" in info["modules_loaded_at_boot"]
    # what fetch cached is where info says, in the lab's cache
    for key in ("vmlinuz", "initramfs"):
        assert Path(info[key]).is_file() and Path(info[key]).is_relative_to(info["cache"]), (key, info[key])
