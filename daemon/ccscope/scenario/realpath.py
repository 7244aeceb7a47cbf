"""Real paths: a profile that names a far host instead of link impairments.

    profiles:
      wired:    {target: 10.68.75.53, via: eth0}
      wireless: {target: 10.68.75.53:5201, via: wlan0, direction: down}

`target` is HOST[:PORT] (PORT: the far end's iperf3 port, or the control port of `ccscope serve`; 5201 by
default, where both listen). `via` is an interface (SO_BINDTODEVICE, iperf3 --bind-dev, ping -I) or a
local source address (iperf3 -B); without it the routing table decides. `direction: up` (default) means
this host sends; `down` means the far end sends (iperf3 -R), so congestion control runs there.

Nothing here touches the host's networking: the algorithm is set per socket (iperf3 -C), never by sysctl,
and no qdisc, route or sysctl changes. This module is the profile and its derived summary; realrun.py runs
a unit over such a path.
"""

from __future__ import annotations

import copy
import ipaddress
import re
import statistics
from dataclasses import dataclass
from typing import Any

from ccscope.emulation.profile import check_text
from ccscope.errors import UsageError

DEFAULT_PORT = 5201  # iperf3's default; `ccscope serve` answers its control protocol on the same port
REAL_KEYS = ("target", "via", "direction", "description", "token_file")
TOKEN_ENV = "CCSCOPE_SERVE_TOKEN"  # the far end's serve token, when the profile names no token_file
EMULATED_KEYS = ("rate", "delay", "jitter", "loss", "queue", "trace", "isolate", "up", "down")
DIRECTIONS = ("up", "down")
# A run whose idle RTT moved this much from the profile's first run is flagged: both bounds must be exceeded
# (a 0.3 ms LAN path moving to 0.5 ms is no news; 20 ms moving to 31 ms is).
RTT_SHIFT_RATIO = 0.5
RTT_SHIFT_MIN_MS = 2.0
_HOST = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$")
_IFNAME = re.compile(r"^[A-Za-z0-9_.:@-]{1,15}$")  # IFNAMSIZ is 16 with the NUL


@dataclass(frozen=True)
class RealPath:
    """A profile whose path is the network between this host and `host`."""

    name: str
    host: str
    port: int
    port_given: bool
    via: str | None = None
    direction: str = "up"
    description: str = ""
    token_file: str | None = None  # where the far end's `ccscope serve` token is (else $CCSCOPE_SERVE_TOKEN)

    real = True  # emulated PathProfile has no such attribute

    @classmethod
    def from_dict(cls, name: str, data: dict, where: str) -> RealPath:
        emulated = [k for k in data if k in EMULATED_KEYS]
        if emulated:
            raise UsageError(f"{where}: a real path (target) takes no emulated link keys: {', '.join(emulated)} "
                             "(remove them, or remove target for an emulated link)")
        for key in data:
            if key not in REAL_KEYS:
                raise UsageError(f"{where}.{key}: unknown key (known for a real path: {', '.join(REAL_KEYS)})")
        host, port, given = parse_target(data.get("target"), f"{where}.target")
        via = data.get("via")
        if via is not None:
            via = parse_via(via, f"{where}.via")
        direction = data.get("direction", "up")
        if direction not in DIRECTIONS:
            raise UsageError(f"{where}.direction: {direction!r} must be up (this host sends) or down (the far "
                             "end sends)")
        description = check_text(data.get("description", ""), f"{where}.description")
        token_file = data.get("token_file")
        if token_file is not None and (not isinstance(token_file, str) or not token_file.strip()
                                       or len(token_file) > 4096 or "\0" in token_file):
            raise UsageError(f"{where}.token_file: expected the path of a file holding the far end's serve token")
        return cls(name=name, host=host, port=port, port_given=given, via=via, direction=direction,
                   description=description.strip(), token_file=token_file)

    @property
    def target(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    @property
    def via_is_address(self) -> bool:
        return self.via is not None and _is_address(self.via)

    def describe(self) -> str:
        via = f" via {self.via}" if self.via else ""
        who = "this host sends" if self.direction == "up" else "the far end sends"
        return f"{self.name}: real path to {self.target}{via}, {self.direction} ({who})"

    def as_dict(self) -> dict:
        return {"target": self.target, "host": self.host, "port": self.port, "via": self.via,
                "direction": self.direction}


def is_real(profile: Any) -> bool:
    return getattr(profile, "real", False) is True


def is_real_body(body: Any) -> bool:
    return isinstance(body, dict) and "target" in body


def _is_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True


def override(data: dict, target: str | None, via: list[str]) -> dict:
    """The scenario with --target (every real-path profile's far end) and --via PROFILE=IFACE applied, so a
    template such as the built-in real-wired-vs-wireless runs without editing YAML."""
    data = copy.deepcopy(data)
    profiles = data.get("profiles")
    real = {name: body for name, body in profiles.items() if is_real_body(body)} \
        if isinstance(profiles, dict) else {}
    if not real:
        flag = "--target" if target is not None else "--via"
        raise UsageError(f"{flag}: this scenario has no real-path profile (one with target:) to apply it to")
    if target is not None:
        parse_target(target, "--target")
        for body in real.values():
            body["target"] = target
    for item in via:
        name, sep, iface = item.partition("=")
        if not sep or not iface:
            raise UsageError(f"--via {item!r}: write PROFILE=INTERFACE (e.g. --via wired=eth0)")
        if name not in real:
            raise UsageError(f"--via {item!r}: no real-path profile {name!r} (the scenario has: "
                             f"{', '.join(real)})")
        real[name]["via"] = iface
    return data


def parse_target(raw: Any, where: str) -> tuple[str, int, bool]:
    """HOST, HOST:PORT, IPv6, [IPv6]:PORT -> (host, port, whether a port was given)."""
    if raw is None:
        raise UsageError(f"{where}: no far host yet: give it with --target HOST[:PORT] (e.g. --target 10.68.75.53)")
    if not isinstance(raw, str) or not raw.strip():
        raise UsageError(f"{where}: {raw!r} is not a host (give HOST or HOST:PORT, e.g. 10.68.75.53)")
    text = raw.strip()
    host, port_text = text, None
    if text.startswith("["):
        m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d+))?", text)
        if not m:
            raise UsageError(f"{where}: {raw!r} is not [IPv6]:PORT")
        host, port_text = m.group(1), m.group(2)
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    if not (_is_address(host) or _HOST.match(host)):
        raise UsageError(f"{where}: {host!r} is not a host name or address")
    if port_text is None:
        return host, DEFAULT_PORT, False
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise UsageError(f"{where}: port {port_text!r} is not between 1 and 65535")
    return host, int(port_text), True


def parse_via(raw: Any, where: str) -> str:
    if not isinstance(raw, str) or not (_is_address(raw) or _IFNAME.match(raw)):
        raise UsageError(f"{where}: {raw!r} is neither an interface name (like eth0) nor a local address")
    return raw


# --- what the runs measured about each path (derived from the runs; analysis.derive calls it) ---------------


def summary(runs: list[dict]) -> dict:
    """Per real profile: idle RTT of the first run and of each run, the runs whose idle RTT moved, and a
    rough capacity estimate next to each algorithm's mean goodput."""
    out: dict[str, dict] = {}
    for run in sorted(runs, key=lambda r: r["position"]):
        real = run.get("real")
        if not real:
            continue
        p = out.setdefault(run["profile"], {
            "target": real["target"], "address": real.get("address"), "via": real.get("via"),
            "direction": real["direction"], "far_end": real["far_end"],
            "sender_telemetry": real.get("sender_telemetry", False), "idle_rtt_first_ms": None,
            "idle_rtt_ms": [], "flagged_runs": [], "failed_runs": [], "capacity_estimate_bps": None,
            "capacity_method": "largest goodput of any run on the path (a lower bound)", "goodput_bps": {}})
        idle = real.get("idle_rtt_ms")
        if idle is not None:
            p["idle_rtt_ms"].append(idle)
            if p["idle_rtt_first_ms"] is None:
                p["idle_rtt_first_ms"] = idle
        if real.get("rtt_moved"):
            p["flagged_runs"].append(run["label"])
        if run["errors"]:
            p["failed_runs"].append(run["label"])
        p["sender_telemetry"] = p["sender_telemetry"] and real.get("sender_telemetry", False)
        for alg, per in run["per_algorithm"].items():
            if per.get("goodput_bps") is not None and not run["errors"]:
                p["goodput_bps"].setdefault(alg, []).append(per["goodput_bps"])
    for p in out.values():
        everything = [g for gs in p["goodput_bps"].values() for g in gs]
        p["capacity_estimate_bps"] = max(everything) if everything else None
        p["goodput_bps"] = {alg: statistics.fmean(gs) for alg, gs in p["goodput_bps"].items()}
    return out


def rtt_moved(first_ms: float | None, now_ms: float | None) -> bool:
    if first_ms is None or now_ms is None:
        return False
    shift = abs(now_ms - first_ms)
    return shift > RTT_SHIFT_MIN_MS and shift > RTT_SHIFT_RATIO * first_ms
