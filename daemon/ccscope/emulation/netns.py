"""Reaching into a named network namespace: a command line (`ns_argv`), pyroute2 (`iproute_in`) without
pyroute2's own netns support, its sysctls (`write_sysctl`, `read_sysctl`) and a device's offloads
(`offloads_off`), and whether a port listens there (`listening`).

The last three are calls from a thread in the namespace, not `ip netns exec sysctl|ethtool|ss`: a testbed made
about 30 such processes per run, about 0.1 s of each run on this host and seconds under the lab's TCG.

pyroute2 0.9 creates a namespaced socket in a forked helper process and retries it on timeouts; on this
machine that occasionally handed back a socket in the wrong namespace (links "missing"). Instead we
enter the namespace in a short-lived thread (setns affects only the calling thread) and run IPRoute
there: its netlink socket is created, used and closed in that thread, so it lives in the namespace.
"""

from __future__ import annotations

import ctypes
import fnmatch
import os
import threading
from collections.abc import Callable
from typing import TypeVar

from pyroute2 import IPRoute
from pyroute2.ethtool import Ethtool

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


def write_sysctl(ns: str, key: str, value: object) -> None:
    """`sysctl -w key=value` inside namespace `ns` (a thread's /proc/sys/net is its namespace's)."""
    def run() -> None:
        try:
            with open(_sysctl_path(key), "w") as f:
                f.write(str(value))
        except OSError as exc:
            raise CcscopeError(f"sysctl {key}={value} in namespace {ns}: {exc.strerror}") from None

    _in_namespace(ns, run)


def read_sysctl(ns: str, key: str) -> str:
    def run() -> str:
        try:
            with open(_sysctl_path(key)) as f:
                return f.read().strip()
        except OSError as exc:
            raise CcscopeError(f"sysctl {key} in namespace {ns}: {exc.strerror}") from None

    return _in_namespace(ns, run)


def listening(ns: str, port: int) -> bool:
    """Whether a TCP socket listens on `port` in namespace `ns` (`ss -Hltn sport = :port`, from /proc)."""
    def run() -> bool:
        for table in ("tcp", "tcp6"):
            try:
                with open(f"/proc/thread-self/net/{table}") as f:
                    rows = f.read().splitlines()[1:]
            except FileNotFoundError:  # no IPv6
                continue
            for row in rows:
                # "sl local_address rem_address st ...": the local port in hex after the colon, 0A is LISTEN
                fields = row.split()
                if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                    return True
        return False

    return _in_namespace(ns, run)


def _sysctl_path(key: str) -> str:
    return "/proc/sys/" + key.replace(".", "/")


# ethtool's names for the offloads (`ethtool -K dev tso off`) as the kernel's feature names: "tso" is every
# tx-tcp*-segmentation feature, tx-tcp-accecn-segmentation (6.18) included, which the old one-offload ioctl
# (ETHTOOL_STSO) leaves on.
OFFLOAD_FEATURES = {"tso": "tx-tcp*-segmentation", "gso": "tx-generic-segmentation", "gro": "rx-gro"}


def offloads_off(ns: str, dev: str, names: tuple[str, ...]) -> dict[str, str]:
    """`ethtool -K dev tso off ...` inside namespace `ns` (pyroute2's ethtool: the kernel's named features);
    each offload's state as the kernel then reports it, "off" once none of its features is on."""
    patterns = {name: OFFLOAD_FEATURES[name] for name in names}

    def run() -> dict[str, str]:
        ethtool = Ethtool()
        try:
            features = ethtool.get_features(dev)
            for feature, state in features.features.items():
                if any(fnmatch.fnmatchcase(feature, pattern) for pattern in patterns.values()):
                    state.enable = False
            ethtool.set_features(dev, features)
            now = ethtool.get_features(dev).features
        except OSError as exc:
            raise CcscopeError(f"cannot turn offloads off on {dev} in namespace {ns}: {exc.strerror}") from None
        finally:
            ethtool.close()
        return {name: "on" if any(state.enable for feature, state in now.items()
                                  if fnmatch.fnmatchcase(feature, pattern)) else "off"
                for name, pattern in patterns.items()}

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
