"""The exposition formats of prometheus_client, byte for byte, at a fraction of its cost per sample.

Why: at --flows top:50 a scrape holds ~900 samples with 11 labels each, and prometheus_client's renderers
(generate_latest for the text format, its OpenMetrics twin) check and escape every label name of every sample
again: two regular expressions and three replaces per label, ~85 % of a scrape's CPU (10-15 ms on this VM). While
one scrape renders it holds the GIL, and concurrent scrapers queue behind it.

Here each distinct label set is escaped once per rendering (a flow's labels are shared by its 16 metrics) and
each label name once per process, with the library's own escaping functions. Only the common case is rendered
here: counters, gauges and histograms whose sample names are plain `[a-zA-Z_][a-zA-Z0-9_]*`, without unit,
timestamp, exemplar or native histogram, under the escapings that leave such names alone. Any other family is
rendered by the library itself, so the output is always the library's (tests/test_exposition.py compares them).
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable
from typing import Protocol

from prometheus_client import exposition
from prometheus_client.core import Metric
from prometheus_client.openmetrics import exposition as om_exposition
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

SIMPLE_TYPES = frozenset({"counter", "gauge", "histogram"})
PLAIN_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")  # unchanged by every escaping, in either format
# The escapings that leave plain names alone in both formats (VALUES prefixes OpenMetrics sample names with U__)
PLAIN_ESCAPINGS = frozenset({om_exposition.UNDERSCORES, om_exposition.ALLOWUTF8})
TEXT_ONLY_SUFFIXES = ("_created", "_gsum", "_gcount")  # the text format moves these to families of their own


class Source(Protocol):
    def collect(self) -> Iterable[Metric]: ...


class _One:
    """One family as a registry, for the library's renderers."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterable[Metric]:
        return (self.metric,)


def render_text(registry: Source, escaping: str = om_exposition.UNDERSCORES) -> bytes:
    """exposition.generate_latest(registry, escaping)."""
    return _render(registry, escaping, openmetrics_format=False)


def render_openmetrics(registry: Source, escaping: str = om_exposition.UNDERSCORES,
                       version: str = "1.0.0") -> bytes:
    """openmetrics.exposition.generate_latest(registry, escaping, version)."""
    return _render(registry, escaping, openmetrics_format=True, version=version) + b"# EOF\n"


def fast_encoder(encoder: Callable[[Source], bytes]) -> Callable[[Source], bytes]:
    """The renderer here that produces what `encoder` (from exposition.choose_encoder) does."""
    target = getattr(encoder, "func", encoder)
    keywords = getattr(encoder, "keywords", {})
    if target is exposition.generate_latest:
        return functools.partial(render_text, **keywords)
    if target is om_exposition.generate_latest:
        return functools.partial(render_openmetrics, **keywords)
    return encoder


def _render(registry: Source, escaping: str, *, openmetrics_format: bool, version: str = "1.0.0") -> bytes:
    labelsets: dict[tuple[tuple[str, str], ...], str] = {}
    output: list[str] = []
    for metric in registry.collect():
        lines = _family(metric, escaping, openmetrics_format, labelsets) if escaping in PLAIN_ESCAPINGS else None
        if lines is None:
            output.append(_library(metric, escaping, openmetrics_format, version))
        else:
            output.extend(lines)
    return "".join(output).encode("utf-8")


def _library(metric: Metric, escaping: str, openmetrics_format: bool, version: str) -> str:
    if openmetrics_format:
        text = om_exposition.generate_latest(_One(metric), escaping=escaping, version=version).decode("utf-8")
        return text.removesuffix("# EOF\n")
    return exposition.generate_latest(_One(metric), escaping=escaping).decode("utf-8")


def _family(metric: Metric, escaping: str, openmetrics_format: bool,
            labelsets: dict[tuple[tuple[str, str], ...], str]) -> list[str] | None:
    """The family's lines, or None when it is not the common case."""
    if metric.type not in SIMPLE_TYPES or metric.unit or not PLAIN_NAME.fullmatch(metric.name):
        return None
    name = metric.name
    if openmetrics_format:
        lines = [f"# HELP {name} {_escape_value(metric.documentation)}\n", f"# TYPE {name} {metric.type}\n"]
    else:
        if metric.type == "counter":
            name += "_total"
        help_text = metric.documentation.replace("\\", r"\\").replace("\n", r"\n")
        lines = [f"# HELP {name} {help_text}\n", f"# TYPE {name} {metric.type}\n"]
    for sample in metric.samples:
        if not _plain(sample, metric.name, openmetrics_format):
            return None
        labelstr = _labels(sample.labels, escaping, labelsets) if sample.labels else ""
        lines.append(f"{sample.name}{labelstr} {floatToGoString(sample.value)}\n")
    return lines


def _plain(sample: Sample, family: str, openmetrics_format: bool) -> bool:
    if sample.timestamp is not None or sample.exemplar or sample.native_histogram or sample.value is None:
        return False
    if not openmetrics_format and sample.name.startswith(family) \
            and sample.name[len(family):] in TEXT_ONLY_SUFFIXES:
        return False
    return PLAIN_NAME.fullmatch(sample.name) is not None


def _labels(labels: dict[str, str], escaping: str, labelsets: dict[tuple[tuple[str, str], ...], str]) -> str:
    key = tuple(labels.items())  # unsorted: the same label set in another order only costs one more miss
    found = labelsets.get(key)
    if found is None:
        found = labelsets[key] = "{" + ",".join(
            f'{_label_name(k, escaping)}="{_escape_value(v)}"' for k, v in sorted(key)) + "}"
    return found


@functools.cache
def _label_name(name: str, escaping: str) -> str:
    return om_exposition.escape_label_name(name, escaping)


def _escape_value(value: str) -> str:
    """A label value (both formats) or an OpenMetrics help text: backslash, newline and double quote."""
    return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
