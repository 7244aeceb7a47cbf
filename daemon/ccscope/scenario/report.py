"""report.html, from results.json and the per-flow CSVs only (so `ccscope report DIR` can re-render any
results directory); the plots are plots.py's, the CSVs series.py's, the terminal summary summary.py's.

The CSVs are read through confined.py and parsed completely by load_series() before render() writes
anything, so a bad results directory is one line and leaves no half-written report behind."""

from __future__ import annotations

import contextlib
import html
import signal
import sys
from collections.abc import Callable
from pathlib import Path

from ccscope.errors import Interrupted
from ccscope.units import format_bytes

from . import models
from .coupling import coupling_rows
from .document import ResultsDocument
from .plots import draw_all, write_plots
from .results import planned
from .series import Series, load_series
from .store import write_atomic
from .summary import COLUMNS, ci, with_display_names

# --- html ------------------------------------------------------------------------------------------

_CSS = """body{font-family:system-ui,sans-serif;max-width:1150px;margin:2em auto;color:#222}
table{border-collapse:collapse;font-size:13px;margin:1em 0}td,th{border:1px solid #ccc;padding:3px 7px}
th{background:#f3f3f3}td.n{text-align:right;font-variant-numeric:tabular-nums}img{max-width:100%}
.err{color:#b00}code{background:#f3f3f3;padding:1px 3px}"""


def _table(header: list[str], rows: list[list[str]], numeric_from: int = 2) -> str:
    h = "".join(f"<th>{html.escape(c)}</th>" for c in header)
    body = "".join("<tr>" + "".join(f"<td{' class=n' if i >= numeric_from else ''}>{html.escape(str(v))}</td>"
                                    for i, v in enumerate(r)) + "</tr>" for r in rows)
    return f"<table><tr>{h}</tr>{body}</table>"


def render(directory: Path, doc: ResultsDocument, series: Series | None = None) -> Path:
    """report.html and the PNGs it shows, from results.json and the per-flow CSVs (load_series, which
    checks and reads them all before anything is written; pass its result if you have it already)."""
    doc = with_display_names(doc)
    images: dict[str, bytes] = {}  # every plot is drawn before any file is written
    plots = draw_all(images, doc, load_series(directory, doc) if series is None else series)
    write_plots(directory, images)
    sections = (_html_header(doc), _html_incomplete(directory, doc), _html_mixed(doc), _html_problems(doc),
                _html_summary(doc), _html_expected(doc), _html_coupling(doc),
                _html_real(doc), _html_plots(plots), _html_profiles(doc), _html_runs(doc), _html_downloads(doc),
                _html_environment(doc), _html_hosts(doc), _html_footer(doc))
    path = directory / "report.html"
    write_atomic(path, "\n".join(part for part in sections if part) + "\n")
    return path


def _html_header(doc: dict) -> str:
    scenario = doc["scenario"]
    return "\n".join([
        f"<!doctype html><meta charset=utf-8><title>ccscope: {html.escape(scenario['name'])}</title>",
        f"<style>{_CSS}</style>", f"<h1>{html.escape(scenario['name'])}</h1>",
        f"<p>{html.escape(scenario['description'])}</p>",
        f"<p>{len(doc['runs'])} runs, {doc['runs_per_unit']} per profile × algorithm"
        f"{' (quick)' if doc['quick'] else ''}; bulk flows {scenario['duration_s']:g} s with the first "
        f"{scenario['warmup_s']:g} s trimmed; started {html.escape(doc['started_at'])}.</p>",
        _shard_line(doc)])


def _shard_line(doc: dict) -> str:
    part = doc.get("shard")
    if not part:
        return ""
    return (f"<p>Shard {part['index']} of {part['count']} of plan <code>{html.escape(part['plan_hash'])}</code>: "
            f"{len(part['runs'])} of the plan's {len(doc['run_order'])} runs. Combine the shards with "
            "<code>ccscope merge OUT DIR...</code>.</p>")


def _html_incomplete(directory: Path, doc: dict) -> str:
    if doc["complete"]:
        return ""
    why = f", interrupted by {doc['interrupted']}" if doc["interrupted"] else ""
    merged = doc.get("merged")
    if merged:  # every missing run is named: the list is what a user reruns
        missing = ", ".join(doc["missing_runs"])
        absent = ", ".join(f"{i}/{merged['count']}" for i in merged["missing_shards"])
        fix = (f"Run the missing shard{'s' if len(merged['missing_shards']) > 1 else ''} {absent} "
               "(or --resume the incomplete ones) and merge again." if absent else
               "Finish the incomplete shards with --resume and merge again.")
    else:
        missing = ", ".join(doc["missing_runs"][:20]) + (", ..." if len(doc["missing_runs"]) > 20 else "")
        fix = f"Finish with the scenario's command and <code>--resume {html.escape(str(directory))}</code>."
    return (f"<h2 class=err>Incomplete: {len(doc['runs'])} of {len(planned(doc))} runs{html.escape(why)}</h2>"
            f"<p class=err>Missing: {html.escape(missing)}. {fix if merged is None else html.escape(fix)}</p>")


def _html_mixed(doc: dict) -> str:
    """Shards from hosts that differ in kernel, backend or implementation: the comparison is uneven."""
    mixed = (doc.get("merged") or {}).get("mixed", [])
    if not mixed:
        return ""
    return ("<h2 class=err>Uneven comparison: the shards ran on different setups</h2><ul class=err>" +
            "".join(f"<li>{html.escape(m)}</li>" for m in mixed) +
            "</ul><p class=err>Runs from different kernels or emulation backends are not directly comparable; "
            "see Hosts below for which shard ran where.</p>")


def _html_hosts(doc: dict) -> str:
    merged = doc.get("merged")
    if not merged:
        return ""
    rows = [[f"{s.get('index')}/{merged['count']}", s.get("hostname", "-"), s.get("kernel", "-"),
             ", ".join(s.get("backends") or []) or "-", ", ".join(s.get("far_ends") or []) or "-",
             s.get("ccscope_version", "-"), str(s.get("runs", "-")), s.get("directory", "-")]
            for s in merged["shards"]]
    rows += [[f"{i}/{merged['count']}", "(missing)", "-", "-", "-", "-", "0", "-"] for i in merged["missing_shards"]]
    rows.sort(key=lambda r: int(r[0].split("/")[0]))
    return (f"<h2>Hosts</h2><p>Merged from {len(merged['shards'])} of {merged['count']} shards of plan "
            f"<code>{html.escape(merged['plan_hash'])}</code>.</p>" +
            _table(["shard", "host", "kernel", "backend", "far end", "ccscope", "runs", "directory"], rows,
                   numeric_from=9))


def _html_problems(doc: dict) -> str:
    parts = []
    if doc["errors"]:
        parts.append("<h2 class=err>Errors</h2><ul class=err>" +
                     "".join(f"<li>{html.escape(e)}</li>" for e in doc["errors"]) + "</ul>")
    if doc.get("warnings"):
        parts.append("<h2>Warnings</h2><ul>" + "".join(f"<li>{html.escape(w)}</li>" for w in doc["warnings"]) + "</ul>")
    if doc["skipped_algorithms"]:
        skipped = html.escape(", ".join(doc["skipped_algorithms"]))
        parts.append(f"<p>Not available in this kernel, skipped: {skipped}</p>")
    return "\n".join(parts)


def _html_summary(doc: dict) -> str:
    used = [c for c in COLUMNS if any(c[1](r) != "-" for r in doc["summary"]) or c[0] in ("profile", "algorithm")]
    return "\n".join([
        "<h2>Summary</h2>" + _table([c[0] for c in used], [[c[1](r) for c in used] for r in doc["summary"]]),
        "<p>Goodput: bytes acknowledged over each flow's active window after the warm-up. srtt: the "
        "kernel's smoothed RTT sampled by ccscope's BPF probe. ± is the 95% confidence interval (Student t) "
        "over runs. Definitions: docs/scenarios.md.</p>"])


def _html_expected(doc: dict) -> str:
    """Measured against what the scenario's `expected` declares (a model or a paper's numbers)."""
    definition = doc["scenario"]["definition"]
    rows = []
    for r in models.competing_rows(doc):
        want = models.expected_share(definition, doc["profiles"][r["profile"]], r["profile"],
                                     r["algorithms"].split("+"), r["algorithm"])
        if want is not None:
            got = r["share"]["mean"]
            rows.append([r["profile"], f"{r['algorithm']} in {r['algorithms']}", ci(r["share"]),
                         f"{want:.2f} ({models.model_name(definition, r['algorithm'])})", f"{got - want:+.2f}"])
    if not rows:
        return ""
    return ("<h2>Measured against expected</h2>" + _table(
        ["profile", "algorithm", "measured share", "expected", "difference"], rows, numeric_from=2) +
        "<p>Share: the algorithm's part of its set's goodput over the run's common window. ware2019: BBRv1 against "
        "loss-based flows (Ware et al., IMC 2019), from the profile's rate, base RTT and buffer; it assumes a full "
        "buffer and flows that have converged. Where measured shares sit below it, BBR's own state showed why in "
        "our runs: in "
        "deep buffers BBR's bandwidth estimate climbs for over a minute (one 1.25 gain per 8 rounds of the full "
        "queue's RTT), its min RTT is the trough of CUBIC's sawtooth rather than a full buffer's, and in a 1-BDP "
        "buffer CUBIC keeps its loss-limited rate (docs/scenarios.md, \"BBR against CUBIC\"). Definitions and "
        "sources: docs/scenarios.md.</p>")


def _html_coupling(doc: dict) -> str:
    """A DualPI2 bottleneck's runs: the link used, and the L4S and classic flows' rates against the coupling."""
    rows = coupling_rows(doc)
    if not rows:
        return ""

    def mbps(bps: float | None) -> str:
        return "-" if bps is None else f"{bps / 1e6:.2f}"

    def ratio(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    cells = [[r.profile, r.label, "-" if r.utilization is None else f"{100 * r.utilization:.1f}",
              mbps(r.scalable_bps), mbps(r.classic_bps), ratio(r.balance), ratio(r.predicted),
              "-" if r.balance is None or r.predicted is None else f"{r.balance / r.predicted:.2f}"] for r in rows]
    return ("<h2>DualPI2: utilization and the coupling</h2>" + _table(
        ["profile", "run", "utilization %", "L4S Mbit/s", "classic Mbit/s", "L4S / classic", "coupling predicts",
         "measured / predicted"], cells) +
        "<p>Utilization: the run's bulk goodput over what TCP can carry of the bottleneck's rate (1448 of each "
        "1514-byte frame). The coupling (RFC 9332) marks the L queue at k times the base probability p' and the "
        "C queue at p' squared, so a scalable flow (2 / p_L segments) and a Reno-like one (1.22 / sqrt(p_C)) "
        "should settle at 2 / (1.22 k) times RTT_C / RTT_L of each other, taken here at the flows' mean srtt. "
        "ccscope's prague cuts once per CWR round, about 1.3 RTTs, so it holds more than 2 / p_L and sits above "
        "the prediction (docs/congestion-control.md).</p>")


def _html_real(doc: dict) -> str:
    """What was measured about each real path: idle RTT before every run, moved runs, capacity estimate."""
    paths = doc.get("real_paths") or {}
    if not paths:
        return ""
    rows = []
    for name, p in paths.items():
        idle = [x for x in p.get("idle_rtt_ms", []) if isinstance(x, int | float)]
        cap = p.get("capacity_estimate_bps")
        goodputs = "; ".join(f"{alg} {g / 1e6:.2f}" + (f" ({100 * g / cap:.0f}%)" if cap else "")
                             for alg, g in (p.get("goodput_bps") or {}).items() if isinstance(g, int | float))
        rows.append([name, p.get("target"), p.get("via") or "(routing table)", p.get("direction"), p.get("far_end"),
                     "yes" if p.get("sender_telemetry") else "ABSENT (this host's receiver view)",
                     "-" if not idle else f"{idle[0]:.2f} ({min(idle):.2f}-{max(idle):.2f})",
                     ", ".join(p.get("flagged_runs") or []) or "-",
                     "-" if not cap else f"{cap / 1e6:.2f}", goodputs or "-"])
    note = ("<p>A real network, not an emulated one: nothing of the path is configured, so it is measured. "
            "Idle RTT: median of pings to the target right before each run (first run, and the range). A run is "
            "flagged when its idle RTT moved by more than 50% and 2 ms from the first run's: the path changed "
            "under the experiment. Capacity estimate: the largest goodput any run reached on the path, a lower "
            "bound; each algorithm's mean goodput is shown as a share of it.</p>")
    return "<h2>Real paths</h2>" + _table(
        ["profile", "target", "via", "direction", "far end", "sender telemetry", "idle RTT ms first (range)",
         "flagged runs (idle RTT moved)", "capacity estimate Mbit/s", "goodput Mbit/s (of estimate)"],
        rows, numeric_from=99) + note


def _html_plots(plots: list[str]) -> str:
    return "<h2>Plots</h2>" + "".join(f"<p><img src='{p}' alt='{p}'></p>" for p in plots)


def _html_profiles(doc: dict) -> str:
    part = "<h2>Profiles</h2>" + _table(["profile", "path", "base RTT ms", "BDP bytes"], [
        [n, p["description"], "-" if p["base_rtt_s"] is None else f"{p['base_rtt_s'] * 1e3:g}",
         "-" if p["bdp_bytes"] is None else f"{p['bdp_bytes']:.0f}"]
        for n, p in doc["profiles"].items()],
        numeric_from=2)
    if doc["emulation_checks"]:
        part += "\n<h3>Emulation check (unloaded ping RTT, UDP rate probe)</h3>" + _table(
            ["profile", "ok", "result"], [[n, "yes" if c["ok"] else "NO", c["message"]]
                                          for n, c in doc["emulation_checks"].items()], numeric_from=9)
    return part


def _html_runs(doc: dict) -> str:
    return "<h2>Runs</h2>" + _table(
        ["#", "run", "backend", "s", "flows: algorithm requested / kernel / iperf3, goodput Mbit/s", "errors"],
        [[r["position"], r["label"], r["backend"], f"{r['duration_s']:.1f}",
          "; ".join(f"{f['id']} {f['algorithm']}/{f['algorithm_kernel']}/{f['algorithm_iperf3']} "
                    f"{(f['goodput_bps'] or 0) / 1e6:.2f}" for f in r["flows"]) or "-",
          "; ".join(r["errors"]) or "-"] for r in doc["runs"]], numeric_from=9)


def _html_downloads(doc: dict) -> str:
    downloads = [[r["label"], d["id"], format_bytes(d["size_bytes"]), "yes" if d["complete"] else "NO (incomplete)",
                  "-" if d["completion_time_s"] is None else f"{d['completion_time_s']:.3f}", d["received_bytes"],
                  d.get("error") or ""] for r in doc["runs"] for d in r["downloads"]]
    if not downloads:
        return ""
    return "<h2>Downloads</h2>" + _table(["run", "id", "size", "complete", "time s", "bytes received", "note"],
                                         downloads, numeric_from=9)


def _html_environment(doc: dict) -> str:
    env = doc["environment"]
    env_rows = [[k, v if not isinstance(v, dict | list) else ", ".join(
        f"{a}={b}" for a, b in v.items()) if isinstance(v, dict) else ", ".join(map(str, v))]
        for k, v in env.items() if k not in ("sysctls", "offloads", "sysctls_sender_ns")]
    env_rows += [[k, v] for k, v in env.get("sysctls", {}).items()]
    env_rows += [[f"{k} (sender namespace)", v] for k, v in env.get("sysctls_sender_ns", {}).items()]
    env_rows += [[f"offloads {k}", ", ".join(f"{a} {b}" for a, b in v.items()) if isinstance(v, dict) else v]
                 for k, v in env.get("offloads", {}).items()]
    backends = sorted({r["backend"] for r in doc["runs"]})
    env_rows.insert(0, ["emulation backend", ", ".join(backends)])
    merged = doc.get("merged")
    whose = f" (shard {merged['shards'][0]['index']}'s host; every host under Hosts)" if merged else ""
    return f"<h2>Environment{html.escape(whose)}</h2>" + _table(["what", "value"], env_rows, numeric_from=9)


def _html_footer(doc: dict) -> str:
    return ("<p>Data: <code>results.json</code> (schema version "
            f"{doc['schema_version']}) and per-flow CSVs in <code>flows/</code>. "
            "Re-render with <code>ccscope report DIR</code>.</p>")


def write(out: Path, doc: ResultsDocument) -> Path:
    """render(), so that a signal while it runs ends the command with 128 + N (guarded)."""
    return guarded(lambda: render(out, doc), out, len(doc["runs"]))


def guarded(write: Callable[[], Path], out: Path, runs: int) -> Path:
    """Writes the report; SIGINT, SIGTERM or SIGHUP meanwhile ends the command with 128 + N. Rendering makes
    much garbage, so a signal often lands in a finalizer, where Python prints "Exception ignored" and goes on:
    Ctrl-C was lost (exit 0) about 2 times in 3. The handler records the signal, so it counts wherever it lands,
    and the finalizers' noise about it is dropped."""
    caught: list[int] = []

    def stop(signum, frame):
        caught.append(signum)
        raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)

    def unraisable(info) -> None:
        if not isinstance(info.exc_value, KeyboardInterrupt | SystemExit):
            hook(info)

    hook, sys.unraisablehook = sys.unraisablehook, unraisable
    old = {}
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread
            old[sig] = signal.signal(sig, stop)
    try:
        report = write()
    except (KeyboardInterrupt, SystemExit):
        if not caught:
            raise
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
        sys.unraisablehook = hook
    if caught:
        raise Interrupted(caught[0], f"interrupted by {signal.Signals(caught[0]).name} while writing the report; "
                                     f"the {runs} runs are saved in {out}/results.json",
                          f"write the report with `ccscope report {out}`")
    return report
