"""kernel-lab: boot a stock Debian kernel under qemu with this machine's root shared read-only.

Used to test ccscope on a kernel that has what the dev VM lacks (netem, fq, vegas, westwood, modules)
and to check CO-RE on another kernel version. Entry point: tools/kernel-lab.
"""

from __future__ import annotations

import os
from pathlib import Path


class LabError(Exception):
    """A failure reported as one line `kernel-lab: error: ...`; `exit_code` is the process status."""

    def __init__(self, message: str, exit_code: int = 125) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# Exit statuses of `run` besides the command's own.
EXIT_TIMEOUT = 124
EXIT_LAB = 125

PACKAGE_DIR = Path(__file__).resolve().parent


def cache_dir() -> Path:
    return Path(os.environ.get("KERNEL_LAB_CACHE", "/var/cache/ccscope-kernel-lab"))
