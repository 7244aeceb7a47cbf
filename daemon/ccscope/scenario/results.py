"""results.json: the document a scenario writes, its versioned schema, and a validator for it.

The schema is a small subset of JSON Schema (type, required, properties, additionalProperties, items,
enum, pattern, maxLength), derived from document.py's TypedDicts (typed_schema.py) and checked by validate()
here, without extra dependencies. Bump SCHEMA_VERSION (document.py) on any incompatible change and describe
it in docs/scenarios.md. load() treats the file as untrusted input:
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
from .document import PING_STREAMS, SCHEMA_VERSION, ResultsDocument
from .environment import capture, now_iso
from .realpath import is_real
from .typed_schema import schema_of

SCHEMA = schema_of(ResultsDocument)  # the validator, from the document's one definition (document.py)
RUN_SCHEMA = SCHEMA["properties"]["runs"]["items"]
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
    entry = {"description": p.describe(), "base_rtt_s": p.base_rtt_s, "bdp_bytes": p.bdp_bytes,
             "up_rate_bps": p.up.effective_rate_bps(), "down_rate_bps": p.down.effective_rate_bps(),
             "queue_bytes": p.up.queue_bytes(p.base_rtt_s)}
    aqms = {direction: link.aqm.as_dict()
            for direction, link in (("up", p.up), ("down", p.down)) if link.aqm is not None}
    if aqms:
        entry["aqm"] = aqms
    if p.ecn is not None:
        entry["ecn"] = p.ecn
    return entry


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
    for stream in PING_STREAMS:
        if run.get(stream) and run[stream].get("csv") is not None:
            yield f"results.json: runs[{i}].{stream}.csv", run[stream]["csv"]


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
