"""The typed shape of results.json (schema_version 2), for the code that builds and reads it.

results.py's SCHEMA is what a file on disk is checked against; these TypedDicts say the same for a type
checker and a reader of the code: required keys are plain, optional ones NotRequired. tests/test_results_fixture.py
keeps the two in step (same keys, same required ones). At run time a document is a plain dict.
"""

# No `from __future__ import annotations` here: TypedDict tells NotRequired keys apart only when the
# annotations are evaluated (Python 3.11 sees strings as required).
from typing import Any, NotRequired, TypedDict


class Summary(TypedDict):
    """Percentiles of one series (analysis.summary)."""
    mean: float | None
    median: float | None
    p95: float | None
    count: int
    min: NotRequired[float | None]
    max: NotRequired[float | None]


class Interval(TypedDict):
    """A mean over runs with its 95 % confidence interval (analysis.ci)."""
    mean: float | None
    ci95: float | None
    n: int
    stdev: NotRequired[float | None]


class FlowResult(TypedDict):
    """One bulk flow of a run."""
    id: str
    kind: str
    algorithm: str
    algorithm_kernel: str | None
    algorithm_iperf3: str | None
    algorithm_ok: bool
    goodput_bps: float | None
    srtt_ms: Summary
    retransmits: int | None
    retransmit_ratio: float | None
    samples: int
    goodput_common_bps: NotRequired[float | None]
    window_s: NotRequired[list[float] | None]
    csv: NotRequired[str]
    iperf3: NotRequired[dict[str, Any]]
    cookie: NotRequired[int | None]
    sport: NotRequired[int | None]
    dport: NotRequired[int | None]
    start_offset_s: NotRequired[float]
    bytes_acked: NotRequired[int | None]
    bytes_sent: NotRequired[int | None]
    segments_sent: NotRequired[float | None]
    view: NotRequired[str | None]          # real paths: "sender" or "receiver" (realrun.py)
    sender_host: NotRequired[str]
    receiver_csv: NotRequired[str]
    state_csv: NotRequired[str]            # the algorithm's state at each change


class DownloadResult(TypedDict):
    id: str
    size_bytes: int
    complete: bool
    completion_time_s: float | None
    received_bytes: int
    algorithm: str
    algorithm_kernel: NotRequired[str | None]
    error: NotRequired[str | None]
    csv: NotRequired[str | None]
    start_s: NotRequired[float]


class PingResult(TypedDict):
    sent: int
    received: int
    rtt_ms: Summary
    csv: NotRequired[str | None]


class RunResult(TypedDict):
    """One run: a profile x algorithm set x repetition, at its position in the seeded order."""
    label: str
    position: int
    profile: str
    algorithms: str
    repetition: int
    netns: int
    backend: str
    duration_s: float
    flows: list[FlowResult]
    downloads: list[DownloadResult]
    ping: PingResult | None
    link: dict[str, dict[str, int]]
    jain: float | None
    per_algorithm: dict[str, Any]
    errors: list[str]
    started_at: NotRequired[str | None]
    real: NotRequired[dict[str, Any] | None]
    window_s: NotRequired[list[float] | None]
    goodput_bps: NotRequired[float | None]
    link_window_bps: NotRequired[float | None]
    convergence_s: NotRequired[float | None]


class SummaryRow(TypedDict):
    """One profile x algorithm set x algorithm, over its runs."""
    profile: str
    algorithms: str
    algorithm: str
    runs: int
    goodput_bps: Interval
    srtt_mean_ms: Interval
    srtt_median_ms: Interval
    srtt_p95_ms: Interval
    ping_median_ms: Interval
    ping_p95_ms: Interval
    retransmit_ratio: Interval
    link_drop_ratio: Interval
    jain: Interval
    downloads: dict[str, Any]
    algorithm_ok: bool
    share: NotRequired[Interval]
    convergence_s: NotRequired[Interval]
    harm: NotRequired[dict[str, Any]]


class ProfileEntry(TypedDict):
    description: str
    base_rtt_s: float | None
    bdp_bytes: float | None
    up_rate_bps: float | None
    down_rate_bps: NotRequired[float | None]
    queue_bytes: NotRequired[float | None]
    real: NotRequired[dict[str, Any]]


class ScenarioEntry(TypedDict):
    name: str
    description: str
    source: str
    duration_s: float
    warmup_s: float
    sample_interval_s: float
    definition: dict[str, Any]
    download_timeout_s: NotRequired[float | None]


class ResultsDocument(TypedDict):
    """results.json."""
    schema_version: int
    tool: dict[str, str]
    scenario: ScenarioEntry
    profiles: dict[str, ProfileEntry]
    algorithms: list[str]
    skipped_algorithms: list[str]
    quick: bool
    runs_per_unit: int
    seed: int
    run_order: list[str]
    environment: dict[str, Any]
    emulation_checks: dict[str, dict[str, Any]]
    runs: list[RunResult]
    summary: list[SummaryRow]
    errors: list[str]
    warnings: list[str]
    started_at: str
    finished_at: str | None
    complete: bool
    missing_runs: list[str]
    interrupted: str | None
    backend_requested: str
    resumed_at: list[str]
    implementations: NotRequired[dict[str, dict[str, Any]]]
    real_paths: NotRequired[dict[str, Any]]
    shard: NotRequired[dict[str, Any] | None]
    merged: NotRequired[dict[str, Any] | None]
