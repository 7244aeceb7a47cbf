"""How the live page names algorithms: the kernel's name, or the name a scenario gives it (`vegas (BPF)` where
ccscope's BPF program runs, cc.display_name)."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable

from ccscope.flows import FlowRecord

CC_NAMES_INTERVAL_S = 2.0   # how often the daemon's page looks again at which algorithms ccscope's BPF runs

CcNames = Callable[[], dict[str, str]]  # kernel name -> the name the page shows


class CcNaming:
    """`source()`, asked every CC_NAMES_INTERVAL_S while a page is open, tells the names; set() sets them once."""

    def __init__(self, source: CcNames | None) -> None:
        self.source = source
        self._names: dict[str, str] = {}
        self._asked_at = float("-inf")
        self._failed = False

    @property
    def names(self) -> dict[str, str]:
        return self._names

    def set(self, names: dict[str, str]) -> None:
        self._names = dict(names)

    def of(self, name: str) -> str:
        return self._names.get(name, name)

    def of_mix(self, label: str) -> str:
        """An algorithm set's label (cubic+vegas) with each name as the page shows it."""
        return "+".join(self.of(name) for name in label.split("+"))

    def refresh(self, now: float) -> None:
        if self.source is None or now - self._asked_at < CC_NAMES_INTERVAL_S:
            return
        self._asked_at = now
        try:
            self._names = self.source()
        except Exception as exc:  # the names stay as they were; said once
            if not self._failed:
                print(f"ccscope: live page: cannot tell which algorithms are ccscope's BPF ones: "
                      f"{type(exc).__name__}: {exc}", file=sys.stderr)
            self._failed = True

    def of_flows(self, source: tuple[list[FlowRecord], int]) -> tuple[list[FlowRecord], int]:
        """The table's flows with the algorithm as the page names it (the records of renamed ones copied)."""
        flows, total = source
        names = self._names
        if not names:
            return source
        return [dataclasses.replace(f, cc=names[f.cc]) if f.cc in names else f for f in flows], total
