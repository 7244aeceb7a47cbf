"""The terminal summary of a results document: one line per profile and algorithm, with the columns that
have a value. Apart from report.py, which draws the plots, so that a run with --no-report never imports
matplotlib (under the stock-kernel lab's TCG, matplotlib's import and its font cache took 20 s a boot)."""

from __future__ import annotations

import copy

from ccscope.units import format_bytes

from .results import planned


def with_display_names(doc: dict) -> dict:
    """A copy of `doc` whose algorithm names say which implementation ran: `vegas (BPF)` where ccscope's
    BPF program did (results.json's `implementations`); kernel ones stay plain."""
    names = {name: impl.get("display", name) for name, impl in doc.get("implementations", {}).items()}
    if all(name == shown for name, shown in names.items()):
        return doc

    def one(name: str) -> str:
        return names.get(name, name)

    def mix(label: str) -> str:
        return "+".join(one(name) for name in label.split("+"))

    doc = copy.deepcopy(doc)
    for row in doc["summary"]:
        row["algorithm"], row["algorithms"] = one(row["algorithm"]), mix(row["algorithms"])
    for run in doc["runs"]:
        run["algorithms"] = mix(run["algorithms"])
        for item in run["flows"] + run["downloads"]:
            item["algorithm"] = one(item["algorithm"])
    return doc


def ci(value: dict, scale: float = 1.0, digits: int = 2, pct: bool = False) -> str:
    if value["mean"] is None:
        return "-"
    m = value["mean"] * (100 if pct else scale)
    text = f"{m:.{digits}f}"
    if value["ci95"] is not None:
        text += f"±{value['ci95'] * (100 if pct else scale):.{digits}f}"
    return text


def _downloads_cell(row: dict) -> str:
    d = row["downloads"]
    if not d["total"]:
        return "-"
    parts = []
    for size, s in d["by_size"].items():
        t = s["completion_time_median_s"]
        median = f" {t:.2f}s" if t is not None else ""
        parts.append(f"{format_bytes(int(size))}:{s['complete']}/{s['total']}{median}")
    return " ".join(parts)


COLUMNS = (("profile", lambda r: r["profile"]),
           ("algorithm", lambda r: r["algorithm"] + (f" ({r['algorithms']})" if "+" in r["algorithms"] else "")),
           ("runs", lambda r: str(r["runs"])),
           ("goodput Mbit/s", lambda r: ci(r["goodput_bps"], 1e-6)),
           ("srtt mean ms", lambda r: ci(r["srtt_mean_ms"], digits=1)),
           ("srtt p50 ms", lambda r: ci(r["srtt_median_ms"], digits=1)),
           ("srtt p95 ms", lambda r: ci(r["srtt_p95_ms"], digits=1)),
           ("ping p95 ms", lambda r: ci(r["ping_p95_ms"], digits=1)),
           ("L ping p95 ms", lambda r: ci(r["ping_l4s_p95_ms"], digits=1) if r.get("ping_l4s_p95_ms") else "-"),
           ("queue p50 ms", lambda r: ci(r["queue_delay_median_ms"], digits=1) if r.get("queue_delay_median_ms")
            else "-"),
           ("queue p95 ms", lambda r: ci(r["queue_delay_p95_ms"], digits=1) if r.get("queue_delay_p95_ms") else "-"),
           ("L queue p99 ms", lambda r: ci(r["l_queue_p99_ms"], digits=2) if r.get("l_queue_p99_ms") else "-"),
           ("C queue p50 ms", lambda r: ci(r["c_queue_median_ms"], digits=1) if r.get("c_queue_median_ms") else "-"),
           ("ecn", lambda r: r["ecn"] if r.get("ecn", "off") != "off" else "-"),  # "-": no ECN, or not known
           ("CE %", lambda r: ci(r["ce_fraction"], pct=True) if r.get("ce_fraction") else "-"),
           ("ECT(1) %", lambda r: ci(r["ect1_share"], pct=True, digits=1) if r.get("ect1_share") else "-"),
           ("retrans %", lambda r: ci(r["retransmit_ratio"], pct=True)),
           ("link drop %", lambda r: ci(r["link_drop_ratio"], pct=True)),
           ("jain", lambda r: ci(r["jain"], digits=3)),
           ("share", lambda r: ci(r["share"], digits=2) if r.get("share") else "-"),
           ("converged s", lambda r: ci(r["convergence_s"], digits=1) if r.get("convergence_s") else "-"),
           ("harm tput", lambda r: ci(r["harm"]["throughput"], digits=2) if r.get("harm") else "-"),
           ("harm p95 RTT", lambda r: ci(r["harm"]["srtt_p95"], digits=2) if r.get("harm") else "-"),
           ("downloads done/total median", _downloads_cell),
           ("cc ok", lambda r: "yes" if r["algorithm_ok"] else "NO"))


def summary_table(doc: dict) -> str:
    doc = with_display_names(doc)
    rows = doc["summary"]
    used = [c for c in COLUMNS if any(c[1](r) != "-" for r in rows) or c[0] in ("profile", "algorithm")]
    cells = [[c[0] for c in used]] + [[c[1](r) for c in used] for r in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(used))]
    lines = ["  ".join(v.ljust(w) if i < 2 else v.rjust(w) for i, (v, w) in enumerate(zip(row, widths, strict=True)))
             for row in cells]
    note = "± is the 95% confidence interval over runs" if doc["runs_per_unit"] > 1 else "1 run per cell: no interval"
    if doc.get("shard"):
        note += f"; shard {doc['shard']['index']} of {doc['shard']['count']}"
    if not doc["complete"]:
        note += f"; INCOMPLETE: {len(doc['runs'])} of {len(planned(doc))} runs"
    for mixed in (doc.get("merged") or {}).get("mixed", []):
        note += f"; UNEVEN: {mixed}"
    lines += [_real_line(name, p) for name, p in (doc.get("real_paths") or {}).items()]
    return f"\n{doc['scenario']['name']} ({note})\n" + "\n".join(lines)


def _real_line(name: str, p: dict) -> str:
    cap, idle = p.get("capacity_estimate_bps"), p.get("idle_rtt_first_ms")
    parts = [f"real path {name}: {p.get('target')} via {p.get('via') or 'routing table'}, {p.get('direction')}, "
             f"{p.get('far_end')}", "idle RTT " + ("-" if idle is None else f"{idle:.2f} ms"),
             "capacity estimate " + ("-" if not cap else f"{cap / 1e6:.2f} Mbit/s")]
    if p.get("flagged_runs"):
        parts.append(f"idle RTT moved in {', '.join(p['flagged_runs'])}")
    if not p.get("sender_telemetry"):
        parts.append("sender telemetry absent (this host's receiver view)")
    return "; ".join(parts)
