"""The record of one run while it is measured: typed, written by its one owner (lifecycle.py, and through it
the path of the run), and turned into results.json's run (document.RunResult) in one place, `document()`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .document import PING_STREAMS, DownloadResult, FlowResult, PingResult, RunResult


@dataclass
class CommonWindow:
    """The run's one window that every bulk flow was measured over (analysis.apply_common_window)."""
    window_s: list[float] | None  # start and end, seconds from the run's start
    goodput_bps: float | None  # the flows' goodputs over it, summed
    jain: float | None  # Jain's index of those goodputs
    convergence_s: float | None  # a competing set's (analysis.share_convergence)


@dataclass
class RunRecord:
    label: str
    position: int
    profile: str
    algorithms: str  # the set, "cubic+bbr"
    repetition: int
    netns: int = 0  # the sender's namespace
    backend: str = ""  # the emulation backend, or "real path"
    started_at: str | None = None
    duration_s: float = 0.0
    flows: list[FlowResult] = field(default_factory=list)
    downloads: list[DownloadResult] = field(default_factory=list)
    pings: dict[str, PingResult] = field(default_factory=dict)  # by stream (document.PING_STREAMS)
    link: dict[str, dict[str, int]] = field(default_factory=dict)  # the emulated bottleneck's counters
    per_algorithm: dict[str, Any] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)
    window: CommonWindow | None = None  # None: the run was skipped before its traffic
    link_window_bps: float | None = None  # the bottleneck's own egress over the window, where it has a counter
    real: dict[str, Any] | None = None  # a real path's run (realpath.py)

    @classmethod
    def planned(cls, unit, position: int) -> RunRecord:
        return cls(label=unit.label, position=position, profile=unit.profile, algorithms="+".join(unit.mix),
                   repetition=unit.repetition)

    def document(self) -> RunResult:
        """results.json's run; keys it may leave out are left out when there is nothing to say."""
        run: RunResult = {
            "label": self.label, "position": self.position, "profile": self.profile, "algorithms": self.algorithms,
            "repetition": self.repetition, "netns": self.netns, "backend": self.backend,
            "started_at": self.started_at, "duration_s": self.duration_s, "flows": self.flows,
            "downloads": self.downloads, "ping": self.pings.get("ping"), "link": self.link,
            "jain": self.window.jain if self.window else None, "per_algorithm": self.per_algorithm,
            "errors": self.errors}
        if self.window is not None:
            run.update(convergence_s=self.window.convergence_s, window_s=self.window.window_s,
                       goodput_bps=self.window.goodput_bps)
        run.update({stream: self.pings[stream] for stream in PING_STREAMS[1:] if stream in self.pings})
        if self.link_window_bps is not None:
            run["link_window_bps"] = self.link_window_bps
        if self.real is not None:
            run["real"] = self.real
        return run
