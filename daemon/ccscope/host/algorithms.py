"""TCP congestion control algorithms: which exist, and letting our namespaces use them."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterable
from pathlib import Path

from ccscope.errors import PrerequisiteError

_PROC = Path("/proc/sys/net/ipv4")
AVAILABLE = _PROC / "tcp_available_congestion_control"
ALLOWED = _PROC / "tcp_allowed_congestion_control"
ALLOWED_KEY = "net.ipv4.tcp_allowed_congestion_control"


def _kernel_order() -> list[str]:
    return AVAILABLE.read_text().split()


def _modules() -> set[str]:
    """Algorithms built as modules that the kernel loads on first use (tcp_vegas.ko ...)."""
    moddir = Path("/lib/modules") / os.uname().release / "kernel/net/ipv4"
    if not moddir.is_dir():
        return set()
    return {p.name.split(".")[0].removeprefix("tcp_") for p in moddir.glob("tcp_*.ko*")}


def available_algorithms() -> set[str]:
    """net.ipv4.tcp_available_congestion_control, plus algorithms the kernel can load as modules."""
    return set(_kernel_order()) | _modules()


def load_modules(names: Iterable[str]) -> None:
    """Loads the modules of the algorithms named that the kernel has but has not loaded yet, as their first use
    would (a root socket's TCP_CONGESTION makes the kernel request tcp_NAME): before the telemetry opens, so the
    algorithm-state program finds a module's type (BBR's, DCTCP's) in its BTF, which exists only while the module
    is loaded. A module that will not load is left to the run's own error."""
    loaded, loadable = set(_kernel_order()), _modules()
    for name in names:
        if name in loadable and name not in loaded:
            with socket.socket() as sock, contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_CONGESTION, name.encode())


def require_algorithms(requested: list[str]) -> None:
    """PrerequisiteError for the first requested algorithm this kernel lacks, naming the available ones."""
    available = available_algorithms()
    for name in requested:
        if name not in available:
            shown = _kernel_order() + sorted(_modules() - set(_kernel_order()))
            raise PrerequisiteError(f"{name} is not available in this kernel", f"available: {' '.join(shown)}")


def allowed_algorithms() -> list[str]:
    return ALLOWED.read_text().split()


def write_allowed(names: list[str]) -> None:
    # The kernel refuses an empty list; keep whatever was there then.
    if names:
        ALLOWED.write_text(" ".join(names) + "\n")
