"""The shape of results.json (schema_version 2), defined once: these TypedDicts are what the code that builds
and reads a document is typed against, and results.py's validator is derived from them (typed_schema.py).
Required keys are plain, optional ones NotRequired; constraints beyond the type (a name's pattern, a length)
ride on Annotated. Extra keys are allowed, and free-form parts (iperf3's report, the environment's sysctls)
are dict[str, Any]. docs/scenarios.md's tables are checked against these by tests/test_results_fixture.py.
At run time a document is a plain dict.
"""

# No `from __future__ import annotations` here: TypedDict tells NotRequired keys apart only when the
# annotations are evaluated (Python 3.11 sees strings as required).
from typing import Annotated, Any, Literal, NotRequired, TypedDict

from .typed_schema import Rule

SCHEMA_VERSION = 2  # 2: complete, missing_runs, interrupted, backend_requested, resumed_at; bump it with the
# Literal of ResultsDocument.schema_version (a Literal takes no name), and keep reading the version before

# Names the report puts into plot legends and titles: what spec.py accepts, nothing more.
Name = Annotated[str, Rule(pattern=r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")]
Algorithm = Annotated[str, Rule(pattern=r"[a-z][a-z0-9_]{0,14}")]
AlgorithmSet = Annotated[str, Rule(pattern=r"[a-z][a-z0-9_]{0,14}(\+[a-z][a-z0-9_]{0,14})*")]  # "cubic+bbr"
Text = Annotated[str, Rule(max_length=4096)]


class Summary(TypedDict):
    """Percentiles of one series (analysis.summary)."""
    mean: float | None
    median: float | None
    p95: float | None
    count: int
    min: NotRequired[float | None]
    max: NotRequired[float | None]


class Interval(TypedDict):
    """A mean over runs with its 95 % confidence interval (analysis.mean_ci95)."""
    mean: float | None
    ci95: float | None
    n: int
    stdev: NotRequired[float | None]


class RetransmitCauses(TypedDict):
    """A flow's retransmitted segments by cause, as the kernel side counted them (bt.RetransCause)."""
    rto: int
    fast: int
    tlp: int
    other: int


class FlowResult(TypedDict):
    """One bulk flow of a run."""
    id: str
    kind: Literal["bulk"]
    algorithm: Algorithm
    algorithm_kernel: str | None
    algorithm_iperf3: str | None
    algorithm_ok: bool
    goodput_bps: float | None
    srtt_ms: Summary
    retransmits: int | None
    spurious_retransmits: NotRequired[int | None]  # tcpi_dsack_dups: of those, the peer already had (DSACK)
    retransmits_by_cause: NotRequired[RetransmitCauses | None]  # where ccscope's probe saw the sender
    retransmit_ratio: float | None
    samples: int
    goodput_common_bps: NotRequired[float | None]
    window_s: NotRequired[list[float] | None]
    csv: NotRequired[str]
    iperf3: NotRequired[dict[str, Any]]
    # the socket the series came from, and what the kernel counted on it
    cookie: NotRequired[int | None]
    sport: NotRequired[int | None]
    dport: NotRequired[int | None]
    start_offset_s: NotRequired[float]
    bytes_acked: NotRequired[int | None]
    bytes_sent: NotRequired[int | None]
    segments_sent: NotRequired[float | None]
    ecn: NotRequired[Literal["off", "ecn", "accecn", "pending"] | None]  # what the handshake negotiated
    delivered_ce_packets: NotRequired[int | None]
    ect1_packets: NotRequired[int]  # an L4S sender's (prague) on an emulated path: its packets sent as ECT(1)
    ce_fraction: NotRequired[float | None]
    # real paths: whose series it is (realrun.py)
    view: NotRequired[Literal["sender", "receiver"] | None]
    sender_host: NotRequired[str]
    receiver_csv: NotRequired[str]
    state_csv: NotRequired[str]  # the algorithm's state at each change (recorder.write_state_csv)


class DownloadResult(TypedDict):
    id: str
    size_bytes: int
    complete: bool
    completion_time_s: float | None
    received_bytes: int
    algorithm: Algorithm
    algorithm_kernel: NotRequired[str | None]
    retransmits: NotRequired[int | None]
    error: NotRequired[str | None]
    csv: NotRequired[str | None]
    start_s: NotRequired[float]


# The ping streams a run may have, each a key of its run (RunResult): a plain ping, and one marked ECT(1)
# (traffic.ping_streams), L4S's identifier, which a DualPI2 queues in its L queue.
PING_STREAMS = ("ping", "ping_l4s")


class PingResult(TypedDict):
    sent: int
    received: int
    rtt_ms: Summary
    csv: NotRequired[str | None]


class Sojourn(TypedDict):
    """The queueing delay packets saw at a bottleneck the delay line owns (emulation/sojourn.py)."""
    count: int
    median_ms: float
    p95_ms: float
    p99_ms: float


class LinkDirection(TypedDict):
    """The emulated bottleneck's counters of one direction over the run (the backend may add more)."""
    packets: int
    queue_drops: int  # at the queue's hard limit (tail drops)
    random_drops: int
    aqm_drops: NotRequired[int]  # the AQM's own, before the limit (a link whose AQM runs in the delay line)
    aqm_marks: NotRequired[int]  # CE marks it set instead of dropping
    aqm_step_marks: NotRequired[int]  # dualpi2: those of its L queue's step (a subset of aqm_marks)
    sojourn: NotRequired[Sojourn]
    sojourn_l: NotRequired[Sojourn]  # dualpi2: its L queue's packets
    sojourn_c: NotRequired[Sojourn]  # and its C queue's
    late_releases: NotRequired[int]  # the delay line's: packets released over 2 ms after due (the machine's stall)
    max_late_ms: NotRequired[float]  # the longest such stall since the path was made
    late_us: NotRequired[int]  # the delay line's releases' lateness summed, below 2 ms too: / packets, the mean


class Link(TypedDict, total=False):
    """Up and down on an emulated path; empty on a real one (no bottleneck of ours to count)."""
    up: LinkDirection
    down: LinkDirection


class RunResult(TypedDict):
    """One run: a profile x algorithm set x repetition, at its position in the seeded order."""
    label: str
    position: int
    profile: Name
    algorithms: AlgorithmSet
    repetition: int
    netns: int
    backend: str
    duration_s: float
    flows: list[FlowResult]
    downloads: list[DownloadResult]
    ping: PingResult | None
    ping_l4s: NotRequired[PingResult]  # traffic.ping.l4s
    link: Link
    jain: float | None
    per_algorithm: dict[str, Any]
    errors: list[str]
    started_at: NotRequired[str | None]
    real: NotRequired[dict[str, Any] | None]  # a real path's run: realpath.py
    # older files lack these: the run's common window, the goodput summed over it, the link's own egress
    # rate over it, and a competing set's convergence (analysis.share_convergence)
    window_s: NotRequired[list[float] | None]
    goodput_bps: NotRequired[float | None]
    link_window_bps: NotRequired[float | None]
    convergence_s: NotRequired[float | None]


class SizeSummary(TypedDict):
    total: int
    complete: int
    completion_time_median_s: float | None
    completion_time_s: NotRequired[Interval]


class DownloadsSummary(TypedDict):
    total: int
    complete: int
    by_size: dict[str, SizeSummary]  # by size in bytes, "102400"


class Harm(TypedDict, total=False):
    """Harm against the same algorithm run alone (harm.py), where the scenario has those runs."""
    throughput: Interval
    srtt_p95: Interval
    retransmit_ratio: Interval
    solo_runs: int


class SummaryRow(TypedDict):
    """One profile x algorithm set x algorithm, over its runs."""
    profile: Name
    algorithms: AlgorithmSet
    algorithm: Algorithm
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
    downloads: DownloadsSummary
    algorithm_ok: bool
    # the data direction's queueing delay, where the delay line measured it (an AQM link); older files lack it
    queue_delay_median_ms: NotRequired[Interval]
    queue_delay_p95_ms: NotRequired[Interval]
    # ECN as the flows negotiated it ("off", "ecn", "accecn"; "off/ecn" where runs differed), and where any did,
    # the fraction of their delivered packets fed back as CE; files before ECN telemetry lack them
    ecn: NotRequired[str]
    ce_fraction: NotRequired[Interval]
    # the ECT(1) ping's RTT, where the runs had one (traffic.ping.l4s)
    ping_l4s_median_ms: NotRequired[Interval]
    ping_l4s_p95_ms: NotRequired[Interval]
    # a DualPI2 bottleneck's two queues: L's p99 sojourn, C's median (analysis._add_dualpi2_queues)
    l_queue_p99_ms: NotRequired[Interval]
    c_queue_median_ms: NotRequired[Interval]
    # how much of an L4S sender's data reached the bottleneck as ECT(1) (analysis.ect1_share)
    ect1_share: NotRequired[Interval]
    # competing sets only
    share: NotRequired[Interval]
    convergence_s: NotRequired[Interval]
    harm: NotRequired[Harm]


class AqmEntry(TypedDict):
    """A direction's AQM (emulation/aqm.py) and which implementation ran it."""
    name: str
    target_s: float | None
    interval_s: float | None
    ecn: NotRequired[bool]  # marks instead of dropping
    tupdate_s: NotRequired[float]  # pie, dualpi2
    step_s: NotRequired[float]  # dualpi2
    coupling: NotRequired[float]  # dualpi2
    ecn_mask: NotRequired[Literal["l4s_ect", "cla_ect", "any_ect"]]  # dualpi2: what its L queue takes
    implementation: Literal["kernel", "ccscope"]


class ProfileEntry(TypedDict):
    description: Text
    base_rtt_s: float | None  # a real path has no configured RTT or rate (null) and says where it goes in `real`
    bdp_bytes: float | None
    up_rate_bps: float | None
    down_rate_bps: NotRequired[float | None]
    queue_bytes: NotRequired[float | None]  # up's queue
    aqm: NotRequired[dict[str, AqmEntry]]  # by direction, where a link has an AQM
    ecn: NotRequired[str]  # what the endpoints' TCP was set to negotiate (off, on, accecn), where the profile says
    real: NotRequired[dict[str, Any]]


class ScenarioEntry(TypedDict):
    name: Name
    description: str
    source: str
    duration_s: float
    warmup_s: float
    sample_interval_s: float
    definition: dict[str, Any]
    download_timeout_s: NotRequired[float | None]  # older files lack it


class Tool(TypedDict):
    name: str
    version: str


class Environment(TypedDict):
    """environment.capture(): what the host was (free-form beyond these)."""
    kernel: Any
    sysctls: dict[str, Any]
    offloads: dict[str, Any]
    ccscope_version: Any
    iperf3_version: Any
    seed: Any
    run_order: Any
    sysctls_sender_ns: NotRequired[dict[str, Any]]


class EmulationCheck(TypedDict):
    """A profile's path check before its first run (pathcheck.py; the measured values beside these)."""
    ok: bool
    message: str


class Implementation(TypedDict):
    """Which implementation ran an algorithm: the kernel's, or ccscope's BPF program (cc/provide.py)."""
    name: Algorithm
    implementation: Literal["kernel", "bpf"]
    display: Annotated[str, Rule(max_length=64)]
    sha256: NotRequired[Annotated[str, Rule(pattern=r"[0-9a-f]{64}")] | None]
    object: NotRequired[str | None]


class Shard(TypedDict):
    """The slice of the plan a `--shard K/N` run holds (shard.py)."""
    index: int
    count: int
    plan_hash: Annotated[str, Rule(pattern=r"sha256:[0-9a-f]{64}")]
    runs: list[str]


class Merged(TypedDict):
    """The shards `ccscope merge` combined (merge.py)."""
    plan_hash: str
    count: int
    shards: list[dict[str, Any]]
    missing_shards: list[int]
    mixed: list[str]
    merged_at: NotRequired[str]


class ResultsDocument(TypedDict):
    """results.json."""
    schema_version: Literal[2]
    tool: Tool
    scenario: ScenarioEntry
    profiles: dict[str, ProfileEntry]
    algorithms: list[AlgorithmSet]
    skipped_algorithms: list[Algorithm]
    quick: bool
    runs_per_unit: int
    seed: int
    run_order: list[str]
    environment: Environment
    emulation_checks: dict[str, EmulationCheck]
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
    implementations: NotRequired[dict[str, Implementation]]  # older files lack it
    real_paths: NotRequired[dict[str, Any]]  # what the runs measured about each real path (realpath.summary)
    shard: NotRequired[Shard | None]  # absent when one host ran the whole plan
    merged: NotRequired[Merged | None]  # absent unless `ccscope merge` wrote it
