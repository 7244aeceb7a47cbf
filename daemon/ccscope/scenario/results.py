"""results.json: the document a scenario writes, its versioned schema, and a validator for it.

The schema is a small subset of JSON Schema (type, required, properties, items, enum) checked by
validate() here, without extra dependencies. Bump SCHEMA_VERSION on any incompatible change and
describe it in docs/scenarios.md.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ccscope import __version__
from ccscope.errors import UsageError

from .environment import capture, now_iso

SCHEMA_VERSION = 1
NUM = ["number", "null"]

_SUMMARY = {"type": "object", "required": ["mean", "median", "p95", "count"],
            "properties": {"mean": {"type": NUM}, "median": {"type": NUM}, "p95": {"type": NUM},
                           "min": {"type": NUM}, "max": {"type": NUM}, "count": {"type": "integer"}}}
_CI = {"type": "object", "required": ["mean", "ci95", "n"],
       "properties": {"mean": {"type": NUM}, "ci95": {"type": NUM}, "n": {"type": "integer"},
                      "stdev": {"type": NUM}}}
_FLOW = {"type": "object",
         "required": ["id", "kind", "algorithm", "algorithm_kernel", "algorithm_iperf3", "algorithm_ok",
                      "goodput_bps", "srtt_ms", "retransmits", "retransmit_ratio", "samples"],
         "properties": {"id": {"type": "string"}, "kind": {"enum": ["bulk"]}, "algorithm": {"type": "string"},
                        "algorithm_kernel": {"type": ["string", "null"]},
                        "algorithm_iperf3": {"type": ["string", "null"]}, "algorithm_ok": {"type": "boolean"},
                        "goodput_bps": {"type": NUM}, "srtt_ms": _SUMMARY, "retransmits": {"type": ["integer", "null"]},
                        "retransmit_ratio": {"type": NUM}, "samples": {"type": "integer"},
                        "window_s": {"type": ["array", "null"], "items": {"type": "number"}},
                        "csv": {"type": "string"}, "iperf3": {"type": "object"}}}
_DOWNLOAD = {"type": "object",
             "required": ["id", "size_bytes", "complete", "completion_time_s", "received_bytes", "algorithm"],
             "properties": {"id": {"type": "string"}, "size_bytes": {"type": "integer"},
                            "complete": {"type": "boolean"}, "completion_time_s": {"type": NUM},
                            "received_bytes": {"type": "integer"}, "algorithm": {"type": "string"},
                            "algorithm_kernel": {"type": ["string", "null"]}, "error": {"type": ["string", "null"]},
                            "csv": {"type": ["string", "null"]}, "start_s": {"type": "number"}}}
_LINK_DIR = {"type": "object", "required": ["packets", "queue_drops", "random_drops"],
             "properties": {"packets": {"type": "integer"}, "queue_drops": {"type": "integer"},
                            "random_drops": {"type": "integer"}}}
_RUN = {"type": "object",
        "required": ["label", "position", "profile", "algorithms", "repetition", "netns", "backend", "duration_s",
                     "flows", "downloads", "ping", "link", "jain", "per_algorithm", "errors"],
        "properties": {
            "label": {"type": "string"}, "position": {"type": "integer"}, "profile": {"type": "string"},
            "algorithms": {"type": "string"}, "repetition": {"type": "integer"}, "netns": {"type": "integer"},
            "backend": {"type": "string"}, "duration_s": {"type": "number"},
            "flows": {"type": "array", "items": _FLOW}, "downloads": {"type": "array", "items": _DOWNLOAD},
            "ping": {"type": ["object", "null"], "required": ["sent", "received", "rtt_ms"],
                     "properties": {"sent": {"type": "integer"}, "received": {"type": "integer"},
                                    "rtt_ms": _SUMMARY}},
            "link": {"type": "object", "required": ["up", "down"], "properties": {"up": _LINK_DIR, "down": _LINK_DIR}},
            "jain": {"type": NUM}, "per_algorithm": {"type": "object"},
            "errors": {"type": "array", "items": {"type": "string"}}}}
_ROW = {"type": "object",
        "required": ["profile", "algorithms", "algorithm", "runs", "goodput_bps", "srtt_mean_ms", "srtt_median_ms",
                     "srtt_p95_ms", "ping_median_ms", "ping_p95_ms", "retransmit_ratio", "link_drop_ratio", "jain",
                     "downloads", "algorithm_ok"],
        "properties": {"profile": {"type": "string"}, "algorithms": {"type": "string"},
                       "algorithm": {"type": "string"}, "runs": {"type": "integer"},
                       "goodput_bps": _CI, "srtt_mean_ms": _CI, "srtt_median_ms": _CI, "srtt_p95_ms": _CI,
                       "ping_median_ms": _CI, "ping_p95_ms": _CI, "retransmit_ratio": _CI, "link_drop_ratio": _CI,
                       "jain": _CI, "algorithm_ok": {"type": "boolean"},
                       "downloads": {"type": "object", "required": ["total", "complete", "by_size"]}}}
SCHEMA = {
    "type": "object",
    "required": ["schema_version", "tool", "scenario", "profiles", "algorithms", "skipped_algorithms", "quick",
                 "runs_per_unit", "seed", "run_order", "environment", "emulation_checks", "runs", "summary",
                 "errors", "warnings", "started_at", "finished_at"],
    "properties": {
        "schema_version": {"enum": [SCHEMA_VERSION]},
        "tool": {"type": "object", "required": ["name", "version"]},
        "scenario": {"type": "object", "required": ["name", "description", "source", "duration_s", "warmup_s",
                                                    "sample_interval_s", "definition"],
                     "properties": {"download_timeout_s": {"type": NUM}}},  # optional: older files lack it
        "profiles": {"type": "object"},
        "algorithms": {"type": "array", "items": {"type": "string"}},
        "skipped_algorithms": {"type": "array", "items": {"type": "string"}},
        "quick": {"type": "boolean"}, "runs_per_unit": {"type": "integer"}, "seed": {"type": "integer"},
        "run_order": {"type": "array", "items": {"type": "string"}},
        "environment": {"type": "object", "required": ["kernel", "sysctls", "offloads", "ccscope_version",
                                                       "iperf3_version", "seed", "run_order"]},
        "emulation_checks": {"type": "object"},
        "runs": {"type": "array", "items": _RUN},
        "summary": {"type": "array", "items": _ROW},
        "errors": {"type": "array", "items": {"type": "string"}},
        "warnings": {"type": "array", "items": {"type": "string"}},
        "started_at": {"type": "string"}, "finished_at": {"type": ["string", "null"]},
    },
}

_TYPES = {"object": dict, "array": list, "string": str, "boolean": bool, "null": type(None)}


def _is(value: Any, kind: str) -> bool:
    if kind == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == "number":
        return isinstance(value, int | float) and not isinstance(value, bool)
    return isinstance(value, _TYPES[kind])


def check(value: Any, schema: dict, path: str = "$") -> list[str]:
    """Every violation of `schema` in `value`, as 'path: problem'."""
    problems = []
    kinds = schema.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else kinds
        if not any(_is(value, k) for k in kinds):
            return [f"{path}: expected {' or '.join(kinds)}, got {type(value).__name__}"]
    if "enum" in schema and value not in schema["enum"]:
        problems.append(f"{path}: {value!r} is not one of {schema['enum']}")
    if isinstance(value, dict):
        for key in schema.get("required", []):
            if key not in value:
                problems.append(f"{path}: missing {key}")
        for key, sub in schema.get("properties", {}).items():
            if key in value:
                problems += check(value[key], sub, f"{path}.{key}")
    if isinstance(value, list) and "items" in schema:
        for i, item in enumerate(value):
            problems += check(item, schema["items"], f"{path}[{i}]")
    return problems


def validate(doc: dict) -> None:
    problems = check(doc, SCHEMA)
    if problems:
        raise ValueError(f"results.json does not match schema {SCHEMA_VERSION}: " + "; ".join(problems[:5]))


def new_document(scenario, units, skipped: list[str], quick: bool) -> dict:
    order = [u.label for u in units]
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "ccscope", "version": __version__},
        "scenario": {"name": scenario.name, "description": scenario.description, "source": scenario.source,
                     "duration_s": scenario.duration_s, "warmup_s": scenario.warmup_s,
                     "sample_interval_s": scenario.sample_interval_s,
                     "download_timeout_s": scenario.traffic.downloads.timeout_s if scenario.traffic.downloads else None,
                     "definition": _jsonable(scenario.raw)},
        "profiles": {name: {"description": p.describe(), "base_rtt_s": p.base_rtt_s, "bdp_bytes": p.bdp_bytes,
                            "up_rate_bps": p.up.effective_rate_bps(), "down_rate_bps": p.down.effective_rate_bps()}
                     for name, p in scenario.profiles.items()},
        "algorithms": ["+".join(m) for m in scenario.algorithms],
        "skipped_algorithms": skipped, "quick": quick, "runs_per_unit": scenario.runs, "seed": scenario.seed,
        "run_order": order, "environment": capture(scenario.seed, order), "emulation_checks": {},
        "runs": [], "summary": [], "errors": [], "warnings": [], "started_at": now_iso(), "finished_at": None,
    }


def new_run(unit, position: int) -> dict:
    return {"label": unit.label, "position": position, "profile": unit.profile, "algorithms": "+".join(unit.mix),
            "repetition": unit.repetition, "netns": 0, "backend": "", "started_at": None, "duration_s": 0.0,
            "flows": [], "downloads": [], "ping": None, "link": {}, "jain": None, "per_algorithm": {}, "errors": []}


def _jsonable(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def write(out: Path, doc: dict) -> Path:
    path = out / "results.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    tmp.replace(path)
    return path


def load(directory: Path) -> dict:
    path = directory / "results.json"
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise UsageError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"{path}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION:
        got = doc.get("schema_version") if isinstance(doc, dict) else None
        raise UsageError(f"{path}: schema_version {got!r}, this ccscope reads {SCHEMA_VERSION}")
    problems = check(doc, SCHEMA)
    if problems:
        raise UsageError(f"{path}: does not match the results schema: {problems[0]}")
    return doc
