"""The decoders by kind: a kernel record (record.CcState) to its algorithm's state, and every state series."""

from __future__ import annotations

from dataclasses import fields

from . import bbr, copa, cubic, dctcp, prague, vegas, westwood
from .record import CcState, Kind, StateMetric

AlgorithmState = (bbr.BbrState | cubic.CubicState | vegas.VegasState | westwood.WestwoodState | copa.CopaState
                  | prague.PragueState | dctcp.DctcpState)
# kind -> (its union member, decode, series); a new algorithm adds one line here and a file of its own
DECODERS = {
    Kind.BBR: ("bbr", bbr.decode, bbr.METRICS),
    Kind.CUBIC: ("cubic", cubic.decode, cubic.METRICS),
    Kind.VEGAS: ("vegas", vegas.decode, vegas.METRICS),
    Kind.WESTWOOD: ("westwood", westwood.decode, westwood.METRICS),
    Kind.COPA: ("copa", copa.decode, copa.METRICS),
    Kind.PRAGUE: ("prague", prague.decode, prague.METRICS),
    Kind.DCTCP: ("dctcp", dctcp.decode, dctcp.METRICS),
}
STATE_TYPES: dict[type, tuple[StateMetric, ...]] = {
    bbr.BbrState: bbr.METRICS, cubic.CubicState: cubic.METRICS, vegas.VegasState: vegas.METRICS,
    westwood.WestwoodState: westwood.METRICS, copa.CopaState: copa.METRICS, prague.PragueState: prague.METRICS,
    dctcp.DctcpState: dctcp.METRICS}


def decode(raw: CcState) -> AlgorithmState | None:
    found = DECODERS.get(raw.kind)
    if found is None or not raw.updated_ns:
        return None
    member, decoder, _ = found
    return decoder(getattr(raw, member))


def metrics_of(state: AlgorithmState) -> tuple[StateMetric, ...]:
    return STATE_TYPES[type(state)]


# the keys of as_dict() that hold text (the rest are numbers, booleans and None): the state CSV's text columns
TEXT_KEYS = frozenset({"algorithm"} | {f.name for cls in STATE_TYPES for f in fields(cls) if f.type == "str"})

ALL_METRICS: tuple[StateMetric, ...] = tuple(m for _, _, metrics in DECODERS.values() for m in metrics)
