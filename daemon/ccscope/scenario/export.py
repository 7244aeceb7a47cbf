"""A results directory as tidy tables, for pandas, Polars, DuckDB or a spreadsheet.

- samples: one row per telemetry sample of every flow and download (the per-flow CSVs), with the run's
  identity in front: run, profile, algorithms, repetition, flow, kind, algorithm, then the CSV's columns.
- runs: one row per flow (and download) of every run: the run's identity and totals, then the flow's
  numbers from results.json, nested statistics flattened (srtt_ms.p95 -> srtt_ms_p95).
- summary: results.json's summary rows, each statistic flattened (goodput_bps.ci95 -> goodput_bps_ci95).
- states: one row per algorithm-state row of every flow that has one (its state CSV: each change, and the
  readings between), with the same identity in front; a column per state key of any algorithm, null where a
  row's algorithm has none.

Column types follow the values: integers, floats or text; an empty CSV cell is null. `ccscope export`
writes them as CSV (no extra needed) or Parquet (pyarrow, the `export` extra), each file atomically
(store.write_atomic), so an interrupted export leaves no half-written table.
"""

from __future__ import annotations

import csv
import io
import math
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from ccscope.errors import PrerequisiteError, UsageError

from . import confined, results, store
from .recorder import CSV_TEXT_COLUMNS, STATE_CSV_TEXT_COLUMNS
from .store import write_atomic

Row = dict[str, Any]
FORMATS = ("csv", "parquet")
RUN_KEYS = ("label", "profile", "algorithms", "repetition")
_INTEGER = re.compile(r"^-?\d+$")
_SKIPPED = frozenset({"iperf3", "csv", "state_csv"})  # iperf3's report stays in results.json; the CSVs are tables


def samples(directory: Path, doc: dict) -> list[Row]:
    """Every flow's and download's CSV rows, each with its run and flow in front (see the module doc)."""
    rows: list[Row] = []
    for i, run in enumerate(doc["runs"]):
        for kind in ("flows", "downloads"):
            for j, flow in enumerate(run[kind]):
                if flow.get("csv") is None:
                    continue
                head = _identity(run) | {"flow": flow.get("id"), "kind": flow.get("kind"),
                                         "algorithm": flow.get("algorithm")}
                rows.extend(head | row for row in _csv_rows(directory, flow["csv"], f"runs[{i}].{kind}[{j}].csv",
                                                            CSV_TEXT_COLUMNS))
    return typed(rows)


def states(directory: Path, doc: dict) -> list[Row]:
    """Every flow's state CSV rows, each with its run and flow in front (see the module doc)."""
    rows: list[Row] = []
    for i, run in enumerate(doc["runs"]):
        for j, flow in enumerate(run["flows"]):
            if flow.get("state_csv") is None:
                continue
            head = _identity(run) | {"flow": flow.get("id"), "kind": flow.get("kind")}
            rows.extend(head | row for row in _csv_rows(directory, flow["state_csv"], f"runs[{i}].flows[{j}].state_csv",
                                                        STATE_CSV_TEXT_COLUMNS))
    return typed(rows)


def _csv_rows(directory: Path, path: str, key: str, text_columns: frozenset[str]) -> Iterable[dict[str, str]]:
    """The checked rows of a CSV that results.json names at `key`; a missing one is one line."""
    where = f"results.json: {key}"
    text = confined.read_text(directory, path, where, confined.MAX_CSV_BYTES)
    if text is None:
        raise UsageError(f"{directory}/{path}: missing ({where})")
    return _checked_rows(text, f"{directory}/{path}", text_columns)


def _checked_rows(text: str, where: str, text_columns: frozenset[str]) -> Iterable[dict[str, str]]:
    """A CSV's rows, every number column holding a finite number (an integer within 64 bits) or nothing:
    what the report refuses is refused here too, one line naming the file, line and column."""
    for line, row in enumerate(results.csv_rows(text, where), start=2):
        for column, cell in row.items():
            if cell and column not in text_columns and not _finite_cell(cell):
                shown = cell if len(cell) <= 30 else cell[:27] + "..."
                raise UsageError(f"{where}: line {line}: {column} {shown!r} is not a number the tables can hold")
        yield row


def _finite_cell(cell: str) -> bool:
    if _INTEGER.match(cell):
        return len(cell) <= 20 and -(1 << 63) <= int(cell) < 1 << 63
    try:
        return math.isfinite(float(cell))
    except ValueError:
        return False


def runs(doc: dict) -> list[Row]:
    """One row per flow and download of every run (see the module doc)."""
    rows: list[Row] = []
    for run in doc["runs"]:
        totals = {"backend": run.get("backend"), "started_at": run.get("started_at"),
                  "duration_s": run.get("duration_s"), "run_goodput_bps": run.get("goodput_bps"),
                  "run_jain": run.get("jain"), "link_window_bps": run.get("link_window_bps")}
        for item in [*run["flows"], *run["downloads"]]:
            flow = {"flow": item.get("id"), "kind": item.get("kind"), "algorithm": item.get("algorithm")}
            rest = flatten({k: v for k, v in item.items() if k not in ("id", "kind", "algorithm")})
            rows.append(_identity(run) | flow | totals | rest)
    return rows


def summary(doc: dict) -> list[Row]:
    return [flatten(row) for row in doc["summary"]]


def _identity(run: dict) -> Row:
    return {"run" if key == "label" else key: run.get(key) for key in RUN_KEYS}


def flatten(item: dict, prefix: str = "") -> Row:
    """Scalars as they are, nested mappings joined with '_', [start, end] windows as two columns; other
    lists (errors, per-size breakdowns) stay in results.json."""
    out: Row = {}
    for key, value in item.items():
        name = f"{prefix}{key}"
        if key in _SKIPPED:
            continue
        if isinstance(value, dict):
            out |= flatten(value, f"{name}_")
        elif isinstance(value, list):
            if key.endswith("window_s") and len(value) == 2:
                out[f"{name}_start"], out[f"{name}_end"] = value
        else:
            out[name] = value
    return out


def typed(rows: list[Row]) -> list[Row]:
    """CSV text to values: a column whose cells are all integers becomes int, all numbers float, else
    text; an empty cell is None."""
    kinds: dict[str, type] = {}
    for row in rows:
        for key, value in row.items():
            if isinstance(value, str) and value != "":
                kinds[key] = _widen(kinds.get(key, int), value)
    for row in rows:
        for key, kind in kinds.items():
            value = row.get(key)
            if isinstance(value, str):
                row[key] = None if value == "" else kind(value)
        for key, value in row.items():
            if value == "":
                row[key] = None
    return rows


def _widen(kind: type, text: str) -> type:
    if kind is int and _INTEGER.match(text):
        return int
    if kind in (int, float):
        try:
            float(text)
            return float
        except ValueError:
            return str
    return str


def tables(directory: Path, doc: dict | None = None) -> dict[str, list[Row]]:
    """Every table of a results directory (its document: store.load's, with the runs only the journal holds,
    as report and --resume read it)."""
    doc = store.load(directory) if doc is None else doc
    return {"samples": samples(directory, doc), "runs": runs(doc), "summary": summary(doc),
            "states": states(directory, doc)}


def export(directory: Path, fmt: str, out: Path) -> dict[str, Path]:
    """Writes each table with rows to OUT/<name>.<fmt> (states: only for runs that recorded one); returns the
    files. OUT is created if missing."""
    if fmt not in FORMATS:
        raise UsageError(f"--format {fmt!r}: use one of {', '.join(FORMATS)}")
    writer = _csv_bytes if fmt == "csv" else _parquet_bytes()
    built = tables(directory)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise UsageError(f"{out}: cannot create the output directory: {err.strerror}") from None
    written = {}
    for name, rows in built.items():
        if not rows:
            continue
        written[name] = out / f"{name}.{fmt}"
        try:
            write_atomic(written[name], writer(rows))
        except OSError as err:
            raise UsageError(f"{written[name]}: cannot write: {err.strerror}") from None
    return written


def _columns(rows: Iterable[Row]) -> list[str]:
    return list(dict.fromkeys(key for row in rows for key in row))


def _csv_bytes(rows: list[Row]) -> bytes:
    buffer = io.StringIO(newline="")
    writer = csv.DictWriter(buffer, fieldnames=_columns(rows), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue().encode()


def _parquet_bytes():
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise PrerequisiteError("Parquet needs pyarrow", "pip install 'ccscope[export]', or use --format csv") \
            from None

    def write(rows: list[Row]) -> bytes:
        columns = _columns(rows)  # from_pylist takes its columns from the first row alone
        table = pa.Table.from_pylist([{c: row.get(c) for c in columns} for row in rows])
        sink = io.BytesIO()
        pq.write_table(table, sink)
        return sink.getvalue()
    return write
