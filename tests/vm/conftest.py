"""Tests that run inside a stock Debian kernel under qemu, through tools/kernel-lab.

The lab fetches its kernels once into /var/cache/ccscope-kernel-lab (6.1 by default; sid's 7.2 for the
kernel's AQMs); each test module boots one once
and batches its checks into that boot (TCG is slow). Under CI=true a missing prerequisite fails.

The fidelity modules' boots run one after the other (lab_boots), the AQM one first and alone: the lab's guest
takes one core (its CPUs take turns in one qemu thread), but a second guest beside it made ccscope's delay line,
a process in the AQM guest, run late. Side by side (2026-11-28) the DualPI2 runs held prague's queue at
15.3-17.0 ms against 16.1 alone, and once a fq_codel run released 48 packets late by up to 29 ms and its ping's
median (6.25 ms) passed the packet on the wire that test_fq_codel_serves_the_ping_at_once_in_both bounds it by.
So the cc-fidelity boot starts when the AQM boot has ended (LAB_BOOT_ALONE).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest
from labhelpers import LAB, ROOT, Boot, lab, require


@pytest.fixture(scope="session")
def kernel_lab() -> Path:
    """The lab, with its kernel and initramfs cached (fetched and built on first use)."""
    require(os.geteuid() == 0, "the kernel lab needs root (apt, BPF and namespaces in the guest)")
    fetched = lab("fetch", timeout=600)
    require(fetched.returncode == 0, f"tools/kernel-lab fetch failed: {fetched.stderr.strip()}")
    return LAB


@pytest.fixture(scope="session")
def kernel_lab_sid() -> Path:
    """The lab with Debian sid's 7.2 kernel (the kernel's AQM qdiscs, DCTCP, AccECN) cached."""
    require(os.geteuid() == 0, "the kernel lab needs root (apt, BPF and namespaces in the guest)")
    fetched = lab("fetch", "--kernel", "7.2", timeout=900)
    require(fetched.returncode == 0, f"tools/kernel-lab fetch --kernel 7.2 failed: {fetched.stderr.strip()}")
    return LAB


@pytest.fixture(scope="session")
def bpf_object() -> Path:
    path = ROOT / "daemon" / "ccscope" / "bpf" / "ccscope.bpf.o"
    require(path.is_file(), f"BPF object not built ({path}): run make bpf")
    return path


@pytest.fixture(scope="session")
def lab_boots(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[dict[str, Future[Boot]]]:
    """The boot of each collected module that has `lab_boot(request) -> start(directory) -> Boot`, by module name.
    A module with LAB_BOOT_ALONE = True boots first and alone; the others start when its boot has ended. A module
    whose prerequisites or start failed (or skipped) gets that exception from its future."""
    modules = {item.module.__name__: item.module for item in request.session.items
               if hasattr(getattr(item, "module", None), "lab_boot")}
    futures: dict[str, Future[Boot]] = {name: Future() for name in modules}
    starters: dict[str, Callable[[Path], Boot]] = {}
    for name, module in modules.items():  # fixtures are resolved here, in pytest's thread
        try:
            starters[name] = module.lab_boot(request)
        except (Exception, pytest.skip.Exception, pytest.fail.Exception) as err:
            futures[name].set_exception(err)

    def start(name: str) -> None:
        try:
            futures[name].set_result(starters[name](tmp_path_factory.mktemp(name)))
        except Exception as err:  # the module's fixture raises it
            futures[name].set_exception(err)

    alone = [name for name in starters if getattr(modules[name], "LAB_BOOT_ALONE", False)]
    for name in alone:
        start(name)
    stopping = threading.Event()

    def start_the_rest() -> None:
        try:
            for name in alone:
                if futures[name].exception() is None:
                    futures[name].result().wait_for_end(stopping)
        finally:
            for name in starters.keys() - set(alone):
                if stopping.is_set():
                    futures[name].cancel()
                else:
                    start(name)

    later = threading.Thread(target=start_the_rest, daemon=True)
    later.start()
    try:
        yield futures
    finally:
        stopping.set()
        later.join()
        for future in futures.values():
            if future.done() and not future.cancelled() and future.exception() is None:
                future.result().stop()
