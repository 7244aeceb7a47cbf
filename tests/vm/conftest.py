"""Tests that run inside a stock Debian kernel under qemu, through tools/kernel-lab.

The lab fetches its kernels once into /var/cache/ccscope-kernel-lab (6.1 by default; sid's 7.2 for the
kernel's AQMs); each test module boots one once
and batches its checks into that boot (TCG is slow). Under CI=true a missing prerequisite fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from labhelpers import LAB, ROOT, lab, require


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
