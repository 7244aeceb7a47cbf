"""The host tools ccscope runs, the Debian package of each, the one error that names it, and `sh`."""

from __future__ import annotations

import shutil
import subprocess

from .errors import CcscopeError, PrerequisiteError

PACKAGES = {
    "ip": "iproute2", "tc": "iproute2", "ss": "iproute2", "iptables": "iptables", "ethtool": "ethtool",
    "iperf3": "iperf3", "ping": "iputils-ping", "sysctl": "procps",
}  # fmt: skip
SCENARIO_TOOLS = ("iperf3", "ping", "ip", "tc", "iptables", "sysctl")


def missing(*tools: str) -> list[str]:
    return [tool for tool in tools if shutil.which(tool) is None]


def need(*tools: str) -> None:
    """PrerequisiteError naming the package of the first missing tool."""
    for tool in missing(*tools):
        raise PrerequisiteError(f"{tool} is not installed", f"install it: apt-get install {PACKAGES.get(tool, tool)}")


def sh(argv: list[str], *, timeout: float = 30, check: bool = True) -> subprocess.CompletedProcess:
    """Run a command; a failure becomes one line naming the command and its first error line."""
    need(argv[0])
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise CcscopeError(f"{' '.join(argv)} did not finish within {timeout:g} s") from None
    if check and proc.returncode != 0:
        msg = (proc.stderr.strip() or proc.stdout.strip() or f"exit status {proc.returncode}").splitlines()[0]
        raise CcscopeError(f"{' '.join(argv)} failed: {msg}")
    return proc
