"""results.json: the document a scenario writes, its versioned schema, and a validator for it.

The schema is a small subset of JSON Schema (type, required, properties, additionalProperties, items,
enum, pattern, maxLength) checked by validate() here, without extra dependencies. Bump SCHEMA_VERSION on
any incompatible change and describe it in docs/scenarios.md. load() treats the file as untrusted input:
everything the report reads is typed here, so a hand-edited document is one line, not a traceback.
"""

from __future__ import annotations

import csv
import io
import json
import math
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from ccscope import __version__
from ccscope.errors import UsageError

from . import confined
from .document import ResultsDocument
from .environment import capture, now_iso
from .realpath import is_real

SCHEMA_VERSION = 2  # 2: complete, missing_runs, interrupted, backend_requested, resumed_at
NUM = ["number", "null"]
# Names the report puts into plot legends and titles: what spec.py accepts, nothing more.
_NAME = {"type": "string", "pattern": r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}"}
_ALG = {"type": "string", "pattern": r"[a-z][a-z0-9_]{0,14}"}
_MIX = {"type": "string", "pattern": r"[a-z][a-z0-9_]{0,14}(\+[a-z][a-z0-9_]{0,14})*"}
_TEXT = {"type": "string", "maxLength": 4096}

_SUMMARY = {"type": "object", "required": ["mean", "median", "p95", "count"],
            "properties": {"mean": {"type": NUM}, "median": {"type": NUM}, "p95": {"type": NUM},
                           "min": {"type": NUM}, "max": {"type": NUM}, "count": {"type": "integer"}}}
_CI = {"type": "object", "required": ["mean", "ci95", "n"],
       "properties": {"mean": {"type": NUM}, "ci95": {"type": NUM}, "n": {"type": "integer"},
                      "stdev": {"type": NUM}}}
_FLOW = {"type": "object",
         "required": ["id", "kind", "algorithm", "algorithm_kernel", "algorithm_iperf3", "algorithm_ok",
                      "goodput_bps", "srtt_ms", "retransmits", "retransmit_ratio", "samples"],
         "properties": {"id": {"type": "string"}, "kind": {"enum": ["bulk"]}, "algorithm": _ALG,
                        "algorithm_kernel": {"type": ["string", "null"]},
                        "algorithm_iperf3": {"type": ["string", "null"]}, "algorithm_ok": {"type": "boolean"},
                        "goodput_bps": {"type": NUM}, "goodput_common_bps": {"type": NUM},
                        "srtt_ms": _SUMMARY, "retransmits": {"type": ["integer", "null"]},
                        "retransmit_ratio": {"type": NUM}, "samples": {"type": "integer"},
                        "window_s": {"type": ["array", "null"], "items": {"type": "number"}},
                        "csv": {"type": "string"}, "iperf3": {"type": "object"},
                        # optional: the socket the series came from, and what the kernel counted on it
                        "cookie": {"type": ["integer", "null"]}, "sport": {"type": ["integer", "null"]},
                        "dport": {"type": ["integer", "null"]}, "start_offset_s": {"type": "number"},
                        "bytes_acked": {"type": ["integer", "null"]}, "bytes_sent": {"type": ["integer", "null"]},
                        "segments_sent": {"type": NUM},
                        # optional, real paths: whose series it is (realrun.py)
                        "view": {"enum": ["sender", "receiver", None]}, "sender_host": {"type": "string"},
                        "receiver_csv": {"type": "string"},
                        # optional: the algorithm's state at each change (recorder.write_state_csv)
                        "state_csv": {"type": "string"}}}
_DOWNLOAD = {"type": "object",
             "required": ["id", "size_bytes", "complete", "completion_time_s", "received_bytes", "algorithm"],
             "properties": {"id": {"type": "string"}, "size_bytes": {"type": "integer"},
                            "complete": {"type": "boolean"}, "completion_time_s": {"type": NUM},
                            "received_bytes": {"type": "integer"}, "algorithm": _ALG,
                            "algorithm_kernel": {"type": ["string", "null"]}, "error": {"type": ["string", "null"]},
                            "csv": {"type": ["string", "null"]}, "start_s": {"type": "number"}}}
_LINK_DIR = {"type": "object", "required": ["packets", "queue_drops", "random_drops"],
             "properties": {"packets": {"type": "integer"}, "queue_drops": {"type": "integer"},
                            "random_drops": {"type": "integer"}}}
_RUN = {"type": "object",
        "required": ["label", "position", "profile", "algorithms", "repetition", "netns", "backend", "duration_s",
                     "flows", "downloads", "ping", "link", "jain", "per_algorithm", "errors"],
        "properties": {
            "label": {"type": "string"}, "position": {"type": "integer"}, "profile": _NAME,
            "algorithms": _MIX, "repetition": {"type": "integer"}, "netns": {"type": "integer"},
            "backend": {"type": "string"}, "duration_s": {"type": "number"}, "started_at": {"type": ["string", "null"]},
            "flows": {"type": "array", "items": _FLOW}, "downloads": {"type": "array", "items": _DOWNLOAD},
            "ping": {"type": ["object", "null"], "required": ["sent", "received", "rtt_ms"],
                     "properties": {"sent": {"type": "integer"}, "received": {"type": "integer"},
                                    "rtt_ms": _SUMMARY, "csv": {"type": ["string", "null"]}}},
            # up and down on an emulated path; empty on a real one (no bottleneck of ours to count)
            "link": {"type": "object", "properties": {"up": _LINK_DIR, "down": _LINK_DIR}},
            "real": {"type": ["object", "null"]},  # a real path's run: realpath.py
            "jain": {"type": NUM}, "per_algorithm": {"type": "object"},
            # optional (older files lack them): the run's common window, the goodput summed over it, and
            # the link's own egress rate over it
            "window_s": {"type": ["array", "null"], "items": {"type": "number"}},
            "goodput_bps": {"type": NUM}, "link_window_bps": {"type": NUM},
            "convergence_s": {"type": NUM},  # optional: a competing set's (analysis.share_convergence)
            "errors": {"type": "array", "items": {"type": "string"}}}}
_ROW = {"type": "object",
        "required": ["profile", "algorithms", "algorithm", "runs", "goodput_bps", "srtt_mean_ms", "srtt_median_ms",
                     "srtt_p95_ms", "ping_median_ms", "ping_p95_ms", "retransmit_ratio", "link_drop_ratio", "jain",
                     "downloads", "algorithm_ok"],
        "properties": {"profile": _NAME, "algorithms": _MIX, "algorithm": _ALG, "runs": {"type": "integer"},
                       "goodput_bps": _CI, "srtt_mean_ms": _CI, "srtt_median_ms": _CI, "srtt_p95_ms": _CI,
                       "ping_median_ms": _CI, "ping_p95_ms": _CI, "retransmit_ratio": _CI, "link_drop_ratio": _CI,
                       "jain": _CI, "algorithm_ok": {"type": "boolean"},
                       # competing sets only: the share, and harm against the same algorithm run alone (if run)
                       "share": _CI, "convergence_s": _CI, "harm": {"type": "object", "properties": {
                           "throughput": _CI, "srtt_p95": _CI, "retransmit_ratio": _CI,
                           "solo_runs": {"type": "integer"}}},
                       "downloads": {"type": "object", "required": ["total", "complete", "by_size"],
                                     "properties": {"total": {"type": "integer"}, "complete": {"type": "integer"},
                                                    "by_size": {"type": "object", "additionalProperties": {
                                                        "type": "object",
                                                        "required": ["total", "complete", "completion_time_median_s"],
                                                        "properties": {"total": {"type": "integer"},
                                                                       "complete": {"type": "integer"},
                                                                       "completion_time_median_s": {"type": NUM}}}}}}}}
_PROFILE = {"type": "object", "required": ["description", "base_rtt_s", "bdp_bytes", "up_rate_bps"],
            # a real path has no configured RTT or rate (null) and says where it goes in `real`
            "properties": {"description": _TEXT, "base_rtt_s": {"type": NUM}, "bdp_bytes": {"type": NUM},
                           "real": {"type": "object"}, "queue_bytes": {"type": NUM},  # optional: up's queue
                           "up_rate_bps": {"type": NUM}, "down_rate_bps": {"type": NUM}}}
_IMPLEMENTATION = {"type": "object", "required": ["name", "implementation", "display"],
                   "properties": {"name": _ALG, "implementation": {"enum": ["kernel", "bpf"]},
                                  "display": {"type": "string", "maxLength": 64},
                                  "sha256": {"type": ["string", "null"], "pattern": r"[0-9a-f]{64}"},
                                  "object": {"type": ["string", "null"]}}}
_CHECK = {"type": "object", "required": ["ok", "message"],
          "properties": {"ok": {"type": "boolean"}, "message": {"type": "string"}}}
SCHEMA = {
    "type": "object",
    "required": ["schema_version", "tool", "scenario", "profiles", "algorithms", "skipped_algorithms", "quick",
                 "runs_per_unit", "seed", "run_order", "environment", "emulation_checks", "runs", "summary",
                 "errors", "warnings", "started_at", "finished_at", "complete", "missing_runs", "interrupted",
                 "backend_requested", "resumed_at"],
    "properties": {
        "schema_version": {"enum": [SCHEMA_VERSION]},
        "tool": {"type": "object", "required": ["name", "version"]},
        "scenario": {"type": "object", "required": ["name", "description", "source", "duration_s", "warmup_s",
                                                    "sample_interval_s", "definition"],
                     "properties": {"name": _NAME, "description": {"type": "string"}, "source": {"type": "string"},
                                    "duration_s": {"type": "number"}, "warmup_s": {"type": "number"},
                                    "sample_interval_s": {"type": "number"}, "definition": {"type": "object"},
                                    "download_timeout_s": {"type": NUM}}},  # optional: older files lack it
        "profiles": {"type": "object", "additionalProperties": _PROFILE},
        "algorithms": {"type": "array", "items": _MIX},
        "skipped_algorithms": {"type": "array", "items": _ALG},
        "quick": {"type": "boolean"}, "runs_per_unit": {"type": "integer"}, "seed": {"type": "integer"},
        "run_order": {"type": "array", "items": {"type": "string"}},
        "environment": {"type": "object", "required": ["kernel", "sysctls", "offloads", "ccscope_version",
                                                       "iperf3_version", "seed", "run_order"],
                        "properties": {"sysctls": {"type": "object"}, "offloads": {"type": "object"},
                                       "sysctls_sender_ns": {"type": "object"}}},
        "emulation_checks": {"type": "object", "additionalProperties": _CHECK},
        "runs": {"type": "array", "items": _RUN},
        "summary": {"type": "array", "items": _ROW},
        "errors": {"type": "array", "items": {"type": "string"}},
        "warnings": {"type": "array", "items": {"type": "string"}},
        "started_at": {"type": "string"}, "finished_at": {"type": ["string", "null"]},
        "complete": {"type": "boolean"}, "missing_runs": {"type": "array", "items": {"type": "string"}},
        "interrupted": {"type": ["string", "null"]}, "backend_requested": {"type": "string"},
        "resumed_at": {"type": "array", "items": {"type": "string"}},
        # optional: which implementation ran each algorithm (kernel module or ccscope's BPF); older files lack it
        "implementations": {"type": "object", "additionalProperties": _IMPLEMENTATION},
        # optional: what the runs measured about each real path (realpath.summary); absent without one
        "real_paths": {"type": "object"},
        # optional: the slice of the plan a `--shard K/N` run holds (shard.py); absent when one host ran it all
        "shard": {"type": ["object", "null"], "required": ["index", "count", "plan_hash", "runs"],
                  "properties": {"index": {"type": "integer"}, "count": {"type": "integer"},
                                 "plan_hash": {"type": "string", "pattern": r"sha256:[0-9a-f]{64}"},
                                 "runs": {"type": "array", "items": {"type": "string"}}}},
        # optional: the shards `ccscope merge` combined (merge.py); absent otherwise
        "merged": {"type": ["object", "null"], "required": ["plan_hash", "count", "shards", "missing_shards",
                                                            "mixed"],
                   "properties": {"plan_hash": {"type": "string"}, "count": {"type": "integer"},
                                  "shards": {"type": "array", "items": {"type": "object"}},
                                  "missing_shards": {"type": "array", "items": {"type": "integer"}},
                                  "mixed": {"type": "array", "items": {"type": "string"}}}},
    },
}
RUN_SCHEMA = _RUN
# What a --resume must match: everything that decides which units run and how (not when, or where from).
IDENTITY = ("scenario", "profiles", "algorithms", "skipped_algorithms", "quick", "runs_per_unit", "seed",
            "run_order", "backend_requested", "shard")

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":  # finite: NaN and Infinity are valid Python JSON, and no measurement
        if isinstance(value, float):
            return math.isfinite(value)
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, _TYPES[kind])


def check(value: Any, schema: dict, path: str = "$") -> list[str]:
    """Every violation of `schema` in `value`, as 'path: problem'."""
    problems = []
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_is(value, k) for k in kinds):
            got = value if isinstance(value, float) and not math.isfinite(value) else type(value).__name__
            return [f"{path}: expected {' or '.join(kinds)}, got {got}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path}: {_short(value)} is not one of {schema['enum']}")
    if isinstance(value, str):
        if "maxLength" in schema and len(value) > schema["maxLength"]:
            problems.append(f"{path}: longer than {schema['maxLength']} characters")
        if "pattern" in schema and not re.fullmatch(schema["pattern"], value):
            problems.append(f"{path}: {_short(value)} is not a valid name")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                problems.append(f"{path}: missing {key}")
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                problems += check(value[key], sub, f"{path}.{key}")
        if "additionalProperties" in schema:
            for key, item in value.items():
                problems += check(item, schema["additionalProperties"], f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problems += check(item, schema["items"], f"{path}[{i}]")
    return problems


def non_finite(value: Any, path: str = "$") -> list[str]:
    """Where NaN or Infinity sits in `value`, also inside the free-form objects the schema leaves open
    (iperf3's report): JSON text cannot hold them portably, and no measurement is one."""
    stack, found = [(value, path)], []
    while stack and len(found) < 5:
        item, at = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            found.append(f"{at}: expected a finite number, got {item}")
        elif isinstance(item, dict):
            stack.extend((v, f"{at}.{k}") for k, v in item.items())
        elif isinstance(item, list):
            stack.extend((v, f"{at}[{i}]") for i, v in enumerate(item))
    return found


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _semantic(doc: dict) -> list[str]:
    """What the schema language cannot say but the report relies on."""
    problems = []
    for i, row in enumerate(doc["summary"]):
        for size in row["downloads"]["by_size"]:
            if not size.isdigit() or len(size) > 18:
                problems.append(f"$.summary[{i}].downloads.by_size: {_short(size)} is not a size in bytes")
    return problems


def validate(doc: dict) -> None:
    problems = check(doc, SCHEMA) or _semantic(doc)
    if problems:
        raise ValueError(f"results.json does not match schema {SCHEMA_VERSION}: " + "; ".join(problems[:5]))


def new_document(scenario, units, skipped: list[str], quick: bool, backend: str = "auto") -> ResultsDocument:
    order = [u.label for u in units]
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "ccscope", "version": __version__},
        "scenario": {"name": scenario.name, "description": scenario.description, "source": scenario.source,
                     "duration_s": scenario.duration_s, "warmup_s": scenario.warmup_s,
                     "sample_interval_s": scenario.sample_interval_s,
                     "download_timeout_s": scenario.traffic.downloads.timeout_s if scenario.traffic.downloads else None,
                     "definition": _jsonable(scenario.raw)},
        "profiles": {name: _profile_entry(p) for name, p in scenario.profiles.items()},
        "algorithms": ["+".join(m) for m in scenario.algorithms],
        "skipped_algorithms": skipped, "quick": quick, "runs_per_unit": scenario.runs, "seed": scenario.seed,
        "run_order": order, "environment": capture(scenario.seed, order), "emulation_checks": {},
        "runs": [], "summary": [], "errors": [], "warnings": [], "started_at": now_iso(), "finished_at": None,
        "complete": False, "missing_runs": order, "interrupted": None, "backend_requested": backend,
        "resumed_at": [],
    }


def _profile_entry(p) -> dict:
    if is_real(p):
        return {"description": p.describe(), "base_rtt_s": None, "bdp_bytes": None, "up_rate_bps": None,
                "down_rate_bps": None, "real": p.as_dict()}
    return {"description": p.describe(), "base_rtt_s": p.base_rtt_s, "bdp_bytes": p.bdp_bytes,
            "up_rate_bps": p.up.effective_rate_bps(), "down_rate_bps": p.down.effective_rate_bps(),
            "queue_bytes": p.up.queue_bytes(p.base_rtt_s)}


def identity_mismatch(stored: dict, fresh: dict) -> str | None:
    """The first thing that differs between the scenario that wrote `stored` and `fresh`, or None."""
    for key in IDENTITY:
        a, b = stored.get(key), fresh.get(key)
        if key == "scenario":  # where the file was read from does not change what runs
            definition = _first_difference(a.get("definition"), b.get("definition"), "scenario file")
            if definition:
                return definition
            a = {k: v for k, v in a.items() if k != "source"}
            b = {k: v for k, v in b.items() if k != "source"}
        if problem := _first_difference(a, b, key):
            return problem
    return None


def _first_difference(a: Any, b: Any, path: str) -> str | None:
    """A key absent on one side and null on the other is no difference (an optional key added later)."""
    a, b = _jsonable(a), _jsonable(b)
    if isinstance(a, dict) and isinstance(b, dict):
        for key in [*a, *(k for k in b if k not in a)]:
            if problem := _first_difference(a.get(key), b.get(key), f"{path} {key}"):
                return problem
        return None
    return None if a == b else f"{path}: {_short(a)} there, {_short(b)} now"


FLOW_FILES = ("csv", "receiver_csv", "state_csv")  # a bulk flow's files (a download's and ping's: csv)


def run_files(run: dict, i: int) -> Iterator[tuple[str, str]]:
    """Each file run `i` of a document names, with where it is named ("results.json: runs[0].flows[1].csv")."""
    for kind, keys in (("flows", FLOW_FILES), ("downloads", ("csv",))):
        for j, item in enumerate(run[kind]):
            for key in keys:
                if item.get(key) is not None:
                    yield f"results.json: runs[{i}].{kind}[{j}].{key}", item[key]
    if run.get("ping") and run["ping"].get("csv") is not None:
        yield f"results.json: runs[{i}].ping.csv", run["ping"]["csv"]


def planned(doc: dict) -> list[str]:
    """The runs this document is to hold, in plan order: all of run_order, or a shard's slice of it (shard.py)."""
    return doc["shard"]["runs"] if doc.get("shard") else doc["run_order"]


def account(doc: dict) -> None:
    """What the document's runs say about the plan: their order, the missing runs, completeness, errors.
    The summary is analysis.derive's (this module holds the document's shape, not what it means)."""
    doc["runs"].sort(key=lambda r: r["position"])
    done = {r["label"] for r in doc["runs"]}
    doc["missing_runs"] = [label for label in planned(doc) if label not in done]
    doc["complete"] = not doc["missing_runs"]
    doc["errors"] = [f"{r['label']}: {e}" for r in doc["runs"] for e in r["errors"]]


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def upgrade(doc: Any) -> Any:
    """Schema 1 (before crash-safe results) was only ever written complete."""
    if isinstance(doc, dict) and doc.get("schema_version") == 1:
        doc = {**doc, "schema_version": SCHEMA_VERSION, "complete": True, "missing_runs": [], "interrupted": None,
               "backend_requested": "auto", "resumed_at": []}
    return doc


MAX_DEPTH = 32  # results.json nests 7 deep; the scenario definition a little more


def _too_deep(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict) else item))
    return False


def parse(text: str, where: str) -> dict:
    """A results document from JSON text: schema-checked, every problem one UsageError line."""
    doc = confined.parse_json(text, where)
    if _too_deep(doc):
        raise UsageError(f"{where}: nested deeper than {MAX_DEPTH} levels")
    doc = upgrade(doc)
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
        got = doc.get("schema_version") if isinstance(doc, dict) else None
        raise UsageError(f"{where}: schema_version {_short(got)}, this ccscope reads {SCHEMA_VERSION}")
    problems = check(doc, SCHEMA) or _semantic(doc)
    if problems:
        raise UsageError(f"{where}: does not match the results schema: {problems[0]}")
    return doc


def load(directory: Path) -> ResultsDocument:
    """results.json of a results directory (read as untrusted input; see confined.py)."""
    where = str(directory / "results.json")
    text = confined.read_text(directory, "results.json", where, confined.MAX_JSON_BYTES)
    if text is None:
        raise UsageError(f"{where}: no such file")
    return parse(text, where)


def csv_rows(text: str, where: str) -> Iterator[dict[str, str]]:
    """The rows of a per-flow CSV (text as read through confined.py): the one reader of those files.
    Every problem is one UsageError line naming `where`."""
    try:
        reader = csv.DictReader(io.StringIO(text, newline=""))
        if text and (not reader.fieldnames or "time_s" not in reader.fieldnames):
            raise UsageError(f"{where}: no time_s column in the first line")
        yield from reader
    except csv.Error as exc:
        raise UsageError(f"{where}: not valid CSV: {exc}") from None
