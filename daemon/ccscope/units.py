"""Parsing of human units on the command line: durations ("10ms", "2s", "1m")."""

from __future__ import annotations

import re

from .errors import UsageError

_DURATION = re.compile(r"^\s*(-?)([0-9]*\.?[0-9]+)\s*(us|µs|ms|s|m|h)?\s*$")
_SECONDS = {"us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def parse_duration(flag: str, text: str, minimum: float = 0.0, maximum: float = 7 * 86400) -> float:
    """'10ms' -> 0.01 seconds; a bare number means seconds."""
    match = _DURATION.match(text)
    if not match:
        raise UsageError(f"{flag} {text!r} is not a duration like 10ms, 2s or 1m")
    if match.group(1):
        raise UsageError(f"{flag} {text.strip()}: a duration must be positive (like 10ms, 2s or 1m)")
    # Rounded to the nanosecond: 100us is 1e-4 s exactly, as 0.1ms is (100 * 1e-6 is not).
    seconds = round(float(match.group(2)) * _SECONDS[match.group(3)], 9)
    if not minimum <= seconds <= maximum:
        raise UsageError(f"{flag} {text} is out of range ({_fmt(minimum)} to {_fmt(maximum)})")
    return seconds


def _fmt(seconds: float) -> str:
    return f"{seconds * 1e3:g}ms" if seconds < 1 else f"{seconds:g}s"


def parse_listen(text: str) -> tuple[str, int]:
    """HOST:PORT, [V6]:PORT or :PORT (all interfaces)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(f"--listen {text!r} is not HOST:PORT (for example 127.0.0.1:9977)")
    bracketed = host.startswith("[") and host.endswith("]") and len(host) > 2
    if ("[" in host or "]" in host or ":" in host) and not (bracketed and "[" not in host[1:-1] + "]"):
        raise UsageError(f"--listen {text!r}: write an IPv6 address in brackets, as in [::1]:9977")
    host = host[1:-1] if bracketed else host or "0.0.0.0"
    return host, int(port)
