"""Progress of a scenario on stderr: a bar per run on a terminal, plain lines otherwise; and the same events to
an optional listener (the live page): listener(kind, data) with kind note, run, progress or done."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

Listener = Callable[[str, dict], None]


class Progress:
    WIDTH = 30

    def __init__(self, total_runs: int, planned_s: float, stream=None, listener: Listener | None = None,
                 names: dict[str, str] | None = None) -> None:
        """`names`: algorithm -> how the summary names it (`vegas (BPF)`), as the report does."""
        self.total = total_runs
        self.planned = planned_s
        self.stream = stream or sys.stderr
        self.tty = self.stream.isatty()
        self.position = 0
        self.label = ""
        self._last = 0.0
        self._started = time.monotonic()
        self._listener = listener or (lambda kind, data: None)
        self._names = names or {}

    def note(self, text: str) -> None:
        self._write(f"ccscope: {text}")
        self._listener("note", {"note": text})

    def start(self, position: int, label: str, **details: object) -> None:
        """`details` (profile, algorithm, repetition) go to the listener."""
        self.position, self.label = position, label
        self._listener("run", {"position": position, "total": self.total, "label": label,
                               "planned_s": self.planned, **details})
        if not self.tty:
            self._write(f"[{position}/{self.total}] {label}: running ({self.planned:.0f} s of traffic)")

    def update(self, elapsed: float) -> None:
        self._listener("progress", {"elapsed_s": round(elapsed, 2)})
        if not self.tty or time.monotonic() - self._last < 0.25:
            return
        self._last = time.monotonic()
        filled = int(self.WIDTH * min(1.0, elapsed / self.planned)) if self.planned else self.WIDTH
        bar = "#" * filled + "-" * (self.WIDTH - filled)
        self.stream.write(f"\r[{self.position}/{self.total}] {self.label:<28} [{bar}] "
                          f"{elapsed:5.1f}/{self.planned:.0f}s")
        self.stream.flush()

    def done(self, record: dict) -> None:
        parts = []
        for name, per in record["per_algorithm"].items():
            alg = self._names.get(name, name)
            if per["goodput_bps"] is not None:
                p95 = per["srtt_ms"]["p95"]
                parts.append(f"{alg} {per['goodput_bps'] / 1e6:.2f} Mbit/s, srtt p95 "
                             f"{p95:.1f} ms" if p95 is not None else f"{alg} {per['goodput_bps'] / 1e6:.2f} Mbit/s")
        if record["downloads"]:
            done = sum(d["complete"] for d in record["downloads"])
            parts.append(f"downloads {done}/{len(record['downloads'])} complete")
        if record["errors"]:
            parts.append(f"{len(record['errors'])} error(s)")
        text = f"[{self.position}/{self.total}] {self.label}: done in {record['duration_s']:.1f} s: " + "; ".join(parts)
        if self.tty:
            self.stream.write("\r\033[K")
        self._write(text)
        self._listener("done", {"label": self.label, "summary": "; ".join(parts)})

    def _write(self, text: str) -> None:
        if self.tty:
            self.stream.write("\r\033[K")
        print(text, file=self.stream, flush=True)
