"""One slice of a scenario's seeded plan (`--shard K/N`), and the identity of that plan.

The plan is runner.plan(): every profile x algorithm set x repetition in one seeded random order, run
`position` 1..M, each run's emulation seeded with seed + position. Shard K of N runs the positions p with
(p - 1) mod N == K, so every shard gets a spread of the order (M/N runs, give or take one) and a run has the
same label, position and seed whichever machine runs it. The shards' results directories record which
shard of which plan they hold; `ccscope merge` (scenario/merge.py) puts them back together.

The plan hash covers what decides which runs run and how: the scenario's definition and its effective
settings (profiles, algorithm sets, quick, runs, duration, seed, backend), the seeded order and the
ccscope version; not where the file was read from, nor when or on which host it ran, nor which far host a
real-path profile measured to (each shard may have its own; merge flags them).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ccscope.errors import UsageError

from .results import IDENTITY

# Where an index comes from with `--shard env/N`: a Kubernetes Indexed Job, a Slurm array job.
INDEX_VARIABLES = ("JOB_COMPLETION_INDEX", "SLURM_ARRAY_TASK_ID")
MAX_SHARDS = 10_000  # more machines than a plan of at most 100 runs x 64 profiles x 64 sets is ever split over
_FORM = re.compile(r"(\d{1,6}|env)/(\d{1,6})")


@dataclass(frozen=True)
class Shard:
    index: int
    count: int

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"

    def holds(self, position: int) -> bool:
        return (position - 1) % self.count == self.index


def parse(text: str, environ: Mapping[str, str] | None = None) -> Shard:
    """K/N, or env/N with K from JOB_COMPLETION_INDEX or SLURM_ARRAY_TASK_ID; one UsageError line otherwise."""
    environ = os.environ if environ is None else environ
    match = _FORM.fullmatch(text.strip())
    if not match:
        raise UsageError(f"--shard {text!r}: expected K/N (shard K of N, counted from 0, e.g. 0/3) or env/N "
                         f"(K from {' or '.join(INDEX_VARIABLES)})")
    count = int(match[2])
    if not 1 <= count <= MAX_SHARDS:
        raise UsageError(f"--shard {text}: N must be 1..{MAX_SHARDS}, got {count}")
    index = _from_environment(text, environ) if match[1] == "env" else int(match[1])
    if index >= count:
        raise UsageError(f"--shard {text}: shard {index} does not exist in {count} shards (0..{count - 1})")
    return Shard(index, count)


def _from_environment(text: str, environ: Mapping[str, str]) -> int:
    found = {name: environ[name] for name in INDEX_VARIABLES if environ.get(name, "") != ""}
    if not found:
        raise UsageError(f"--shard {text}: neither {' nor '.join(INDEX_VARIABLES)} is set",
                         "give the index as K/N, or run as a Kubernetes Indexed Job or a Slurm array job")
    if len(set(found.values())) > 1:
        raise UsageError(f"--shard {text}: {', '.join(f'{k}={v}' for k, v in found.items())} disagree")
    name, value = next(iter(found.items()))
    if not re.fullmatch(r"\d{1,6}", value):
        raise UsageError(f"--shard {text}: {name}={value[:40]!r} is not a shard index")
    return int(value)


def positions(total: int, shard: Shard) -> list[int]:
    """The plan positions (1..total) shard `shard` runs; UsageError if it would run none."""
    if shard.count > total:
        raise UsageError(f"--shard {shard}: the plan has {total} run{'s' if total != 1 else ''}, fewer than "
                         f"{shard.count} shards", f"use at most {total} shards")
    return [p for p in range(1, total + 1) if shard.holds(p)]


def plan_hash(doc: dict) -> str:
    """sha256 of the plan a results document (new_document's, before any run) describes; see the module."""
    doc = without_far_ends(doc)
    identity = {key: doc.get(key) for key in IDENTITY if key != "shard"}
    identity["scenario"] = {k: v for k, v in (identity["scenario"] or {}).items() if k != "source"}
    identity["ccscope_version"] = doc.get("tool", {}).get("version")
    text = json.dumps(_dropped_nulls(identity), sort_keys=True, separators=(",", ":"), default=str)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def without_far_ends(doc: dict) -> dict:
    """`doc` without its real-path profiles' far ends (target): like the host a shard ran on, the host it
    measured to is where the plan ran, not what it is. A Kubernetes sweep pairs each shard with a `ccscope
    serve` pod of its own (deploy/kubernetes/sweep/realpath.yaml); `ccscope merge` lists and flags them."""
    profiles = {name: _entry_without_far_end(entry) for name, entry in (doc.get("profiles") or {}).items()}
    scenario = dict(doc.get("scenario") or {})
    definition = scenario.get("definition")
    if isinstance(definition, dict) and isinstance(definition.get("profiles"), dict):
        bodies = {name: {k: v for k, v in body.items() if k != "target"} if isinstance(body, dict) else body
                  for name, body in definition["profiles"].items()}
        scenario["definition"] = {**definition, "profiles": bodies}
    return {**doc, "profiles": profiles, "scenario": scenario}


def _entry_without_far_end(entry: Any) -> Any:
    if not isinstance(entry, dict) or not isinstance(entry.get("real"), dict):
        return entry
    real = {k: v for k, v in entry["real"].items() if k not in ("target", "host", "port")}
    return {k: v for k, v in entry.items() if k != "description"} | {"real": real}  # the description names it


def far_ends(doc: dict) -> list[str]:
    """The targets of the document's real-path profiles."""
    return sorted({entry["real"]["target"] for entry in (doc.get("profiles") or {}).values()
                   if isinstance(entry, dict) and isinstance(entry.get("real"), dict)})


def _dropped_nulls(value: Any) -> Any:
    """An optional key absent on one side and null on the other is the same plan (as results.identity_mismatch)."""
    if isinstance(value, dict):
        return {k: _dropped_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_dropped_nulls(v) for v in value]
    return value


def apply(doc: dict, shard: Shard) -> None:
    """Makes a fresh results document (results.new_document) the document of one shard of its plan."""
    order = doc["run_order"]
    mine = positions(len(order), shard)
    doc["shard"] = {"index": shard.index, "count": shard.count, "plan_hash": plan_hash(doc),
                    "runs": [order[p - 1] for p in mine]}
    doc["missing_runs"] = list(doc["shard"]["runs"])
