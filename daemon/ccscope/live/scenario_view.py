"""A scenario as the live page shows it: the plan, the run in progress, and the finished runs' cwnd curves
(at most MAX_RUNS, each thinned to RUN_CURVE_POINTS points per flow)."""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable

from .clients import event
from .naming import CcNaming
from .rings import POINT_LAYOUT, Rings

RUN_CURVE_POINTS = 600      # a finished run's cwnd curve, thinned to this many points per flow
MAX_RUNS = 256
PROGRESS_INTERVAL_S = 0.2


class ScenarioView:
    """The scenario's state (`state`, sent whole with every change) and its finished runs (`runs`)."""

    def __init__(self, rings: Rings, naming: CcNaming, lock: threading.Lock,
                 send_all: Callable[[bytes], None]) -> None:
        self.state: dict = {}
        self.runs: deque[dict] = deque(maxlen=MAX_RUNS)
        self._rings = rings
        self._naming = naming
        self._lock = lock
        self._send_all = send_all
        self._planned: list[str] = []  # the scenario's algorithm sets, as the kernel names them
        self._run_t0 = 0.0
        self._progress_at = 0.0

    def plan(self, name: str, profiles: list[str], algorithms: list[str], total: int) -> None:
        """`algorithms`: the algorithm sets as the kernel names them (cubic+bbr); the page gets them as it names
        them, again after renamed()."""
        self._planned = list(algorithms)
        self._update("plan", {"scenario": name, "profiles": profiles, "total": total,
                              "algorithms": [self._naming.of_mix(a) for a in algorithms]})

    def renamed(self) -> None:
        """The algorithms' names changed: the plan follows."""
        if self._planned:
            self._update(self.state.get("phase", "plan"),
                         {"algorithms": [self._naming.of_mix(a) for a in self._planned]})

    def on_event(self, kind: str, data: dict) -> None:
        """From the scenario's progress: `note`, `run` (one starts), `progress`, `done` (one finished)."""
        if kind == "progress":
            now = time.monotonic()
            if now - self._progress_at < PROGRESS_INTERVAL_S:
                return
            self._progress_at = now
        if kind == "run":
            data = {**data, "t0": round(time.time(), 3), "elapsed_s": 0.0}
            if "algorithm" in data:
                data["algorithm"] = self._naming.of_mix(data["algorithm"])
            self._rings.run_label, self._run_t0 = data["label"], data["t0"]
        if kind == "done":
            finished = {**data, "profile": self.state.get("profile"), "repetition": self.state.get("repetition"),
                        "flows": self._run_curves(self._rings.run_label)}
            with self._lock:
                self.runs.append(finished)
            self._send_all(event("run", finished))
            self._rings.run_label = None
        self._update(kind, data)

    def report(self, path: str, url: str) -> None:
        self._update("report", {"report": path, "report_url": url})

    def _update(self, phase: str, data: dict) -> None:
        with self._lock:
            self.state.update(data)
            self.state["phase"] = phase
            message = event("scenario", self.state)
        self._send_all(message)

    def _run_curves(self, label: str | None) -> list[dict]:
        """cwnd of the finished run's busy flows (>= 10% of the busiest's bytes), time from the run's start."""
        rings = self._rings.of_run(label) if label is not None else []
        most = max((r.bytes for r in rings), default=0)
        curves = []
        for ring in rings:
            if not ring.points or ring.bytes < 0.1 * most:
                continue
            points = thin((json.loads(p) for p in ring.points), RUN_CURVE_POINTS)
            curves.append({"cc": self._naming.of(ring.cc), "flow": ring.info["flow"],
                           "t": [round(p[0] - self._run_t0, 3) for p in points], "cwnd": [p[_CWND] for p in points]})
        return curves


_CWND = POINT_LAYOUT["fields"].index("cwnd_segments")  # in a ring's points, as the kernel keeps it


def thin(values: Iterable, limit: int) -> list:
    values = list(values)
    if len(values) <= limit:
        return values
    step = len(values) / limit
    return [values[int(i * step)] for i in range(limit)] + [values[-1]]
