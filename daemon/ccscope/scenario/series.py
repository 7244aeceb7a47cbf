"""The per-flow CSVs' plotted columns, read for the report: every CSV path in results.json is checked to
stay inside the results directory (confined.py), and every plotted file is parsed completely, before the
report writes anything."""

from __future__ import annotations

import math
import sys
from pathlib import Path

from ccscope.ccstate.bbr import MODES
from ccscope.errors import UsageError

from . import confined
from .document import PING_STREAMS
from .results import csv_rows, run_files

PLOTTED_COLUMNS = ("cwnd_segments", "throughput_mbps", "srtt_ms", "rtt_ms", "delivery_rate_mbps")
# of a state CSV (recorder.write_state_csv): CUBIC's W_max, K and epoch; BBR's bandwidth estimate; and BBR's mode,
# read as its number (bbr.MODES)
STATE_COLUMNS = ("wmax_segments", "k_s", "in_epoch", "bandwidth_Bps")
Series = dict[str, dict[str, tuple[list[float], list[float]]]]  # csv path -> column -> (times, values)


def load_series(directory: Path, doc: dict) -> Series:
    """The plotted columns of every CSV the plots use; checks every CSV path in the document."""
    plotted = set()
    states = set()
    for run in first_runs(doc):
        plotted.update(f["csv"] for f in [*run["flows"], *run["downloads"]] if f.get("csv"))
        states.update(f["state_csv"] for f in run["flows"] if f.get("state_csv"))
        plotted |= {run[s]["csv"] for s in PING_STREAMS if run.get(s) and run[s].get("csv")}
    plots = directory / "plots"
    if plots.is_symlink() or (plots.exists() and not plots.is_dir()):
        raise UsageError(f"{plots}: not a directory (the report writes its plots there)")
    out: Series = {}
    for where, path in _csv_paths(doc):
        confined.inside(directory, path, where)
        if (path in plotted or path in states) and path not in out:
            text = confined.read_text(directory, path, where, confined.MAX_CSV_BYTES)
            if text is None:
                print(f"ccscope: note: {path} is missing; its flow is not plotted", file=sys.stderr)
            parse = _parse_state_csv if path in states else _parse_csv
            out[path] = parse(text or "", f"{directory}/{path}")
    return out


def _csv_paths(doc: dict):
    for i, run in enumerate(doc["runs"]):
        yield from run_files(run, i)


def _parse_csv(text: str, where: str) -> dict[str, tuple[list[float], list[float]]]:
    columns: dict[str, tuple[list[float], list[float]]] = {key: ([], []) for key in PLOTTED_COLUMNS}
    for line, row in enumerate(csv_rows(text, where), start=2):
        for key in PLOTTED_COLUMNS:
            if row.get(key) not in (None, ""):
                columns[key][0].append(_number(row.get("time_s"), where, line, "time_s"))
                columns[key][1].append(_number(row[key], where, line, key))
    return {key: values for key, values in columns.items() if values[0]}


def _parse_state_csv(text: str, where: str) -> dict[str, tuple[list[float], list[float]]]:
    columns: dict[str, tuple[list[float], list[float]]] = {key: ([], []) for key in (*STATE_COLUMNS, "mode")}
    for line, row in enumerate(csv_rows(text, where), start=2):
        t = _number(row.get("time_s"), where, line, "time_s")
        for key in STATE_COLUMNS:
            if row.get(key) not in (None, ""):
                columns[key][0].append(t)
                columns[key][1].append(_number(row[key], where, line, key))
        if row.get("mode") not in (None, ""):
            if row["mode"] not in MODES:
                raise UsageError(f"{where}: line {line}: mode {row['mode'][:40]!r} is not one of BBR's modes")
            columns["mode"][0].append(t)
            columns["mode"][1].append(float(MODES.index(row["mode"])))
    return {key: values for key, values in columns.items() if values[0]}


def _number(text, where: str, line: int, column: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise UsageError(f"{where}: line {line}: {column} {str(text)[:40]!r} is not a number")
    return value


def first_runs(doc: dict) -> list[dict]:
    """The first repetition of each profile x algorithm set: the one plotted over time."""
    seen, out = set(), []
    for run in sorted(doc["runs"], key=lambda r: r["repetition"]):
        key = (run["profile"], run["algorithms"])
        if key not in seen:
            seen.add(key)
            out.append(run)
    return out
