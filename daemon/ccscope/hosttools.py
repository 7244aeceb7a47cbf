"""The host tools ccscope runs, the Debian package of each, and the one error that names it."""

from __future__ import annotations

import shutil

from .errors import PrerequisiteError

PACKAGES = {
    "ip": "iproute2", "tc": "iproute2", "ss": "iproute2", "iptables": "iptables", "ethtool": "ethtool",
    "iperf3": "iperf3", "ping": "iputils-ping", "sysctl": "procps",
}  # fmt: skip
SCENARIO_TOOLS = ("iperf3", "ping", "ss", "ip", "tc", "iptables", "ethtool", "sysctl")


def missing(*tools: str) -> list[str]:
    return [tool for tool in tools if shutil.which(tool) is None]


def need(*tools: str) -> None:
    """PrerequisiteError naming the package of the first missing tool."""
    for tool in missing(*tools):
        raise PrerequisiteError(f"{tool} is not installed", f"install it: apt-get install {PACKAGES.get(tool, tool)}")
