"""Human units, one grammar each, for the command line and the YAML files alike: durations, sizes, rates,
loss fractions and listen addresses.

Every parser takes the caller's bounds and raises one UsageError line naming where the value came from:
a flag as typed (`--grace '2h' is out of range (0ms to 1h)`), a file field after a colon
(`x.yaml: warmup: '9s' must be shorter ...`). YAML numbers are accepted as the base unit.
"""

from __future__ import annotations

import math
import re
from typing import Any

from .errors import UsageError

NUMBER = r"([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)"
SECONDS_PER = {"": 1.0, "s": 1.0, "sec": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9,
               "m": 60.0, "min": 60.0, "h": 3600.0}
BYTES_PER = {
    "": 1, "b": 1, "byte": 1, "bytes": 1,
    "k": 1000, "kb": 1000, "kib": 1024,
    "m": 1000**2, "mb": 1000**2, "mib": 1024**2,
    "g": 1000**3, "gb": 1000**3, "gib": 1024**3,
}  # fmt: skip
BITS_PER_SECOND = {
    "": 1.0, "bit": 1.0, "bps": 1.0, "b": 1.0,
    "k": 1e3, "kbit": 1e3, "kbps": 1e3, "kb": 1e3,
    "m": 1e6, "mbit": 1e6, "mbps": 1e6, "mb": 1e6,
    "g": 1e9, "gbit": 1e9, "gbps": 1e9, "gb": 1e9,
}  # fmt: skip  (tc's convention: a rate's "kb" is kbit/s, a size's "KB" is 1000 bytes)
DEFAULT_LISTEN = "127.0.0.1:9977"  # the daemon's and a scenario's live endpoint
_AMOUNT = re.compile(r"(-?)" + NUMBER + r"\s*([a-zµ]*)")


def parse_duration(raw: Any, where: str, low: float = 0.0, high: float = 7 * 86400, *,
                   too_low: str | None = None, too_high: str | None = None) -> float:
    """'10ms', '200 ms', '1.5s', '2min', '1h', 0.01 (seconds) -> seconds."""
    value = _amount(raw, where, SECONDS_PER, "a duration", "10ms, 2s, 1m")
    return _within(value, raw, where, low, high, format_seconds, too_low=too_low, too_high=too_high)


def parse_size(raw: Any, where: str, low: int = 1, high: int = 1 << 40, *, too_high: str | None = None) -> int:
    """'1KB' (1000), '64KiB', '1MB', 1500 (bytes) -> a whole number of bytes."""
    value = _amount(raw, where, BYTES_PER, "a size", "1KB, 100KB, 1MB")
    if value <= 0 or value != int(value):
        raise UsageError(f"{_subject(raw, where)} is not a positive whole number of bytes")
    return int(_within(value, raw, where, low, high, format_bytes, too_high=too_high))


def parse_rate(raw: Any, where: str, low: float = 1.0, high: float = math.inf, *, too_low: str | None = None,
               too_high: str | None = None) -> float | None:
    """'50mbit', '1.5Mbit/s', '10 Gbps', 20000000 (bit/s) -> bit/s; None/'unlimited' -> None."""
    if raw is None or (isinstance(raw, str) and raw.strip().lower() in ("unlimited", "none", "inf")):
        return None
    text = raw.strip().lower().removesuffix("/s") if isinstance(raw, str) else raw
    value = _amount(text, where, BITS_PER_SECOND, "a rate", "50mbit, 1.5Mbit/s, 800kbit", shown=raw)
    if value <= 0:
        raise UsageError(f"{_subject(raw, where)} is not a positive rate (omit it for an unlimited link)")
    return _within(value, raw, where, low, high, format_rate, too_low=too_low, too_high=too_high)


def parse_loss(raw: Any, where: str) -> float:
    """'1%', '0.5 %', 0.01 (a fraction) -> fraction 0..1 (100% is refused: nothing would arrive)."""
    if is_number(raw):
        value, shown = float(raw), f"{raw}"
    elif isinstance(raw, str):
        m = re.fullmatch(r"(-?)" + NUMBER + r"\s*(%?)", raw.strip())
        if not m:
            raise UsageError(f"{where}: {raw!r} is not a loss (examples: 1%, 0.01)")
        value = float(m.group(2)) * (-1 if m.group(1) else 1) / (100 if m.group(3) else 1)
        shown = raw.strip()
    else:
        raise UsageError(f"{where}: expected a loss such as 1% or 0.01, got {type(raw).__name__} {raw!r}")
    require_finite(value, raw, where)
    if value == 1:
        raise UsageError(f"{where}: {shown} would drop every packet (use less than 100%)")
    if not 0 <= value < 1:
        raise UsageError(f"{where}: {shown} is not a loss fraction between 0 and 100%")
    return value


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


def format_seconds(seconds: float) -> str:
    return f"{seconds * 1e3:g}ms" if seconds < 1 else f"{seconds:g}s"


def format_bytes(n: float, *, cell: bool = False) -> str:
    """Sizes as people write them: 5KB, 2MB, 1GiB where a power of two is exact. cell=True: a table cell of
    at most 6 characters, binary as in `ss` and `top` (2.0K, 3.0M), whole bytes below 1 KiB."""
    if cell:
        return _cell(n, (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)), f"{n:.0f}")
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= scale and n % scale == 0:
            return f"{n // scale:g}{unit}"
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:g}{unit}"
    return f"{n:g}B"


def format_rate(bps: float, *, cell: bool = False) -> str:
    """A bit rate: 10 Mbit/s; cell=True: a table cell with one decimal, 10.0Mb."""
    if cell:
        return _cell(bps, (("Gb", 1e9), ("Mb", 1e6), ("kb", 1e3)), f"{bps:.0f}b")
    for unit, scale in (("Gbit/s", 1e9), ("Mbit/s", 1e6), ("kbit/s", 1e3)):
        if bps >= scale:
            return f"{bps / scale:g} {unit}"
    return f"{bps:g} bit/s"


def _cell(value: float, units: tuple[tuple[str, float], ...], below: str) -> str:
    for unit, scale in units:
        if value >= scale:
            return f"{value / scale:.1f}{unit}"
    return below


def is_number(v: Any) -> bool:
    """A YAML number (bool is an int in Python, not a number here)."""
    return isinstance(v, int | float) and not isinstance(v, bool)


def _subject(raw: Any, where: str) -> str:
    """A flag reads as typed (`--grace '2h'`), a file field after a colon (`x.yaml: warmup: '9s'`)."""
    return f"{where} {raw!r}" if where.startswith("--") else f"{where}: {raw!r}"


def require_finite(value: float, raw: Any, where: str) -> float:
    if not math.isfinite(value):
        raise UsageError(f"{_subject(raw, where)} is not a finite number")
    return value


def _amount(raw: Any, where: str, units: dict[str, float], what: str, examples: str, shown: Any = None) -> float:
    """A number with one of `units` (a bare YAML number is in the base unit), refusing negative values."""
    shown = raw if shown is None else shown
    if is_number(raw):
        value = float(raw)
    elif isinstance(raw, str):
        m = _AMOUNT.fullmatch(raw.strip().lower())
        if not m or m.group(3) not in units:
            raise UsageError(f"{_subject(shown, where)} is not {what} (examples: {examples})")
        value = float(m.group(2)) * units[m.group(3)] * (-1 if m.group(1) else 1)
    else:
        raise UsageError(f"{where}: expected {what} such as {examples.split(',')[0]}, "
                         f"got {type(raw).__name__} {raw!r}")
    require_finite(value, shown, where)
    if value < 0:
        raise UsageError(f"{_subject(shown, where)} is negative")
    return value


def _within(value: float, raw: Any, where: str, low: float, high: float, fmt, *, too_low: str | None = None,
            too_high: str | None = None) -> float:
    """`too_low`/`too_high` say why in the caller's words, e.g. 'is longer than {high}, too long to emulate'."""
    if value < low and too_low:
        raise UsageError(f"{_subject(raw, where)} {too_low.format(low=fmt(low))}")
    if value > high and too_high:
        raise UsageError(f"{_subject(raw, where)} {too_high.format(high=fmt(high))}")
    if not low <= value <= high:
        raise UsageError(f"{_subject(raw, where)} is out of range ({fmt(low)} to {fmt(high)})")
    return value
