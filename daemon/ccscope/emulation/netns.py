"""Reaching into a named network namespace: a command line (`ns_argv`), or pyroute2 (`iproute_in`) without
pyroute2's own netns support.

pyroute2 0.9 creates a namespaced socket in a forked helper process and retries it on timeouts; on this
machine that occasionally handed back a socket in the wrong namespace (links "missing"). Instead we
enter the namespace in a short-lived thread (setns affects only the calling thread) and run IPRoute
there: its netlink socket is created, used and closed in that thread, so it lives in the namespace.
"""

from __future__ import annotations

import ctypes
import os
import threading
from collections.abc import Callable
from typing import TypeVar

from pyroute2 import IPRoute

from ccscope.errors import CcscopeError

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)
T = TypeVar("T")


def ns_argv(ns: str, argv: list[str]) -> list[str]:
    """The command line that runs argv inside namespace `ns`."""
    return ["ip", "netns", "exec", ns, *argv]


def iproute_in(ns: str, fn: Callable[[IPRoute], T]) -> T:
    """Runs fn(ipr) with an IPRoute bound to namespace `ns`; returns its result or raises its error."""
    def run() -> T:
        with IPRoute() as ipr:
            return fn(ipr)

    return _in_namespace(ns, run)


def open_in(ns: str, path: str) -> int:
    """A read-only fd of `path` opened from inside namespace `ns`. A /proc/thread-self/net file stays bound
    to the namespace it was opened in, so the fd reads that namespace's counters from any thread."""
    def run() -> int:
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise CcscopeError(f"cannot open {path} in namespace {ns}: {exc.strerror}") from None

    return _in_namespace(ns, run)


def _in_namespace(ns: str, fn: Callable[[], T]) -> T:
    """fn() in a short-lived thread that entered namespace `ns` (setns affects only the calling thread)."""
    box: dict = {}

    def worker() -> None:
        try:
            fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
        except OSError as exc:
            box["error"] = CcscopeError(f"network namespace {ns} is gone: {exc.strerror}")
            return
        try:
            if _libc.setns(fd, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                box["error"] = CcscopeError(f"cannot enter network namespace {ns}: {os.strerror(err)}")
                return
        finally:
            os.close(fd)
        try:
            box["result"] = fn()
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=worker, name=f"netns-{ns}")
    thread.start()
    thread.join()
    if "error" in box:
        raise box["error"]
    return box["result"]
