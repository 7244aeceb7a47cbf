"""Results in a notebook: a results directory as tables.

    import ccscope.results
    r = ccscope.results.load("results/bufferbloat-20261124-1200")
    r.samples   # every flow's telemetry samples: run, profile, algorithm, flow, time_s, cwnd_segments, srtt_ms, ...
    r.runs      # one row per flow of every run: goodput_bps, retransmits, srtt_ms_p95, ...
    r.summary   # the report's summary rows, statistics flattened (goodput_bps_mean, goodput_bps_ci95, ...)
    r.states    # each flow's algorithm state at every change and reading: mode, wmax_segments, k_s, ...
    r.document  # results.json itself

With pandas installed each table is a DataFrame; without, a list of dicts (one per row). The columns are
those of `ccscope export` (ccscope.scenario.export, defined in docs/scenarios.md). A directory that is
not a results directory raises ccscope.errors.UsageError with one line saying why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ccscope.scenario import export, store

__all__ = ["Results", "load"]


@dataclass(frozen=True)
class Results:
    document: dict
    samples: Any  # pandas.DataFrame, or list[dict] without pandas
    runs: Any
    summary: Any
    states: Any


def load(directory: str | Path, frames: bool | None = None) -> Results:
    """The tables of a results directory; frames: DataFrames (True), lists of dicts (False), or
    DataFrames when pandas is installed (None)."""
    path = Path(directory)
    doc = store.load(path)
    tables = export.tables(path, doc)
    if frames is None or frames:
        try:
            import pandas
        except ImportError:
            if frames:
                raise
        else:
            return Results(doc, **{name: pandas.DataFrame(rows) for name, rows in tables.items()})
    return Results(doc, **tables)
