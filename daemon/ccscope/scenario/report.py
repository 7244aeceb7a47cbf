"""report.html, PNG plots and the terminal summary, from results.json and the per-flow CSVs only
(so `ccscope report DIR` can re-render any results directory).

The CSVs are read through confined.py and parsed completely by load_series() before render() writes
anything, so a bad results directory is one line and leaves no half-written report behind."""

from __future__ import annotations

import copy
import html
import io
import math
import sys
from pathlib import Path

import matplotlib

from ccscope.errors import UsageError
from ccscope.units import format_bytes

from . import confined, models
from .results import csv_rows, planned
from .store import write_atomic

matplotlib.use("Agg")
matplotlib.rcParams["text.parse_math"] = False  # names and descriptions are text, never TeX
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

COLORS = {"reno": "#1f77b4", "cubic": "#d62728", "bbr": "#2ca02c", "vegas": "#9467bd", "westwood": "#8c564b",
          "copa": "#ff7f0e"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
EXTRA = ("#ff7f0e", "#17becf", "#e377c2", "#7f7f7f", "#bcbd22")


def color(alg: str) -> str:
    if alg not in COLORS:
        COLORS[alg] = EXTRA[len([a for a in COLORS if a not in ("reno", "cubic", "bbr", "vegas", "westwood", "copa")])
                            % len(EXTRA)]
    return COLORS[alg]


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


PLOTTED_COLUMNS = ("cwnd_segments", "throughput_mbps", "srtt_ms", "rtt_ms")
Series = dict[str, dict[str, tuple[list[float], list[float]]]]  # csv path -> column -> (times, values)
Sink = Path | dict[str, bytes]  # where a plot goes: plots/ of a results directory, or name -> PNG


def load_series(directory: Path, doc: dict) -> Series:
    """The plotted columns of every CSV the plots use; checks every CSV path in the document."""
    plotted = set()
    for run in _first_runs(doc):
        plotted.update(f["csv"] for f in [*run["flows"], *run["downloads"]] if f.get("csv"))
        if run.get("ping") and run["ping"].get("csv"):
            plotted.add(run["ping"]["csv"])
    plots = directory / "plots"
    if plots.is_symlink() or (plots.exists() and not plots.is_dir()):
        raise UsageError(f"{plots}: not a directory (the report writes its plots there)")
    out: Series = {}
    for where, path in _csv_paths(doc):
        confined.inside(directory, path, where)
        if path in plotted and path not in out:
            text = confined.read_text(directory, path, where, confined.MAX_CSV_BYTES)
            if text is None:
                print(f"ccscope: note: {path} is missing; its flow is not plotted", file=sys.stderr)
            out[path] = _parse_csv(text or "", f"{directory}/{path}")
    return out


def _csv_paths(doc: dict):
    for i, run in enumerate(doc["runs"]):
        for kind in ("flows", "downloads"):
            for j, flow in enumerate(run[kind]):
                if flow.get("csv") is not None:
                    yield f"results.json: runs[{i}].{kind}[{j}].csv", flow["csv"]
        if run.get("ping") and run["ping"].get("csv") is not None:
            yield f"results.json: runs[{i}].ping.csv", run["ping"]["csv"]


def _parse_csv(text: str, where: str) -> dict[str, tuple[list[float], list[float]]]:
    columns: dict[str, tuple[list[float], list[float]]] = {key: ([], []) for key in PLOTTED_COLUMNS}
    for line, row in enumerate(csv_rows(text, where), start=2):
        for key in PLOTTED_COLUMNS:
            if row.get(key) not in (None, ""):
                columns[key][0].append(_number(row.get("time_s"), where, line, "time_s"))
                columns[key][1].append(_number(row[key], where, line, key))
    return {key: values for key, values in columns.items() if values[0]}


def _number(text, where: str, line: int, column: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise UsageError(f"{where}: line {line}: {column} {str(text)[:40]!r} is not a number")
    return value


# --- plots -----------------------------------------------------------------------------------------


def _first_runs(doc: dict) -> list[dict]:
    """The first repetition of each profile x algorithm set: the one plotted over time."""
    seen, out = set(), []
    for run in sorted(doc["runs"], key=lambda r: r["repetition"]):
        key = (run["profile"], run["algorithms"])
        if key not in seen:
            seen.add(key)
            out.append(run)
    return out


MAX_PANELS = 40  # profiles in one figure, bars in the loss plot: beyond that a figure is unreadable (and huge)


def _profiles(doc: dict) -> list[str]:
    return [p for p in doc["profiles"] if any(r["profile"] == p for r in doc["runs"])][:MAX_PANELS]


def plot_timeseries(directory: Sink, doc: dict, series: Series, column: str, ylabel: str, name: str, title: str,
                    with_ping: bool = False) -> str | None:
    profiles = _profiles(doc)
    if not profiles:
        return None
    fig, axes = plt.subplots(len(profiles), 1, figsize=(10, 3.2 * len(profiles)), squeeze=False)
    drew = False
    for ax, profile in zip(axes[:, 0], profiles, strict=True):
        labelled = set()
        for run in _first_runs(doc):
            if run["profile"] != profile:
                continue
            flows = [f for f in run["flows"] if f.get("csv")] or [d for d in run["downloads"] if d.get("csv")]
            for i, flow in enumerate(flows):
                xs, ys = series.get(flow["csv"], {}).get(column, ([], []))
                if not xs:
                    continue
                alg = flow["algorithm"]
                label = f"{alg} ({run['algorithms']})" if "+" in run["algorithms"] else alg
                ax.plot(xs, ys, color=color(alg), lw=1.1, alpha=0.9,
                        ls="-" if i % 2 == 0 or "+" not in run["algorithms"] else "--",
                        label=None if label in labelled else label)
                labelled.add(label)
                drew = True
            if with_ping and run.get("ping") and run["ping"].get("csv"):
                xs, ys = series.get(run["ping"]["csv"], {}).get("rtt_ms", ([], []))
                ping_label = f"ping ({run['algorithms']})"
                ax.scatter(xs, ys, s=10, color=color(run["algorithms"].split("+")[0]), alpha=0.35, marker=".",
                           label=None if ping_label in labelled else ping_label)
                labelled.add(ping_label)
        ax.set_title(f"{profile}: {doc['profiles'][profile]['description'].split(': ', 1)[-1]}", fontsize=9,
                     loc="left")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        if labelled:
            ax.legend(fontsize=8, loc="upper right", ncol=min(4, len(labelled)))
    axes[-1, 0].set_xlabel("time since the run started (s)")
    fig.suptitle(f"{doc['scenario']['name']}: {title} (first run of each)", fontsize=11)
    fig.tight_layout()
    return _save(fig, directory, name) if drew else _discard(fig)


def plot_tradeoff(directory: Sink, doc: dict) -> str | None:
    """Pantheon's summary plot: goodput against p95 delay, x inverted so the best lands top-right; one panel
    per profile (their scales differ by orders of magnitude), one point per algorithm, CI whiskers."""
    rows = [r for r in doc["summary"] if r["goodput_bps"]["mean"] is not None and r["srtt_p95_ms"]["mean"] is not None]
    if not rows:
        return None
    profiles = [p for p in _profiles(doc) if any(r["profile"] == p for r in rows)]
    if not profiles:  # summary rows of profiles without runs: a hand-edited document
        return None
    fig, axes = plt.subplots(1, len(profiles), figsize=(4.8 * len(profiles) + 0.6, 4.6), squeeze=False)
    for ax, profile in zip(axes[0], profiles, strict=True):
        mine = [r for r in rows if r["profile"] == profile]
        for i, row in enumerate(mine):
            x, y = row["srtt_p95_ms"]["mean"], row["goodput_bps"]["mean"] / 1e6
            xerr = row["srtt_p95_ms"]["ci95"]
            yerr = row["goodput_bps"]["ci95"] / 1e6 if row["goodput_bps"]["ci95"] is not None else None
            label = row["algorithm"] if "+" not in row["algorithms"] else f"{row['algorithm']} in {row['algorithms']}"
            ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt=MARKERS[i % len(MARKERS)], color=color(row["algorithm"]),
                        ms=9, capsize=4, mec="black", mew=0.6, label=label)
        xci = [r["srtt_p95_ms"]["ci95"] or 0.0 for r in mine]
        xs = [r["srtt_p95_ms"]["mean"] + c for r, c in zip(mine, xci, strict=True)]
        xs += [r["srtt_p95_ms"]["mean"] - c for r, c in zip(mine, xci, strict=True)]  # whiskers stay inside
        ys = [(r["goodput_bps"]["mean"] + (r["goodput_bps"]["ci95"] or 0.0)) / 1e6 for r in mine]
        span = max(xs) - min(xs)
        pad = max(span * 0.25, max(xs) * 0.08)
        ax.set_xlim(max(xs) + pad, max(0.0, min(xs) - pad))  # inverted: lower delay to the right
        ax.set_ylim(0, max(ys) * 1.15)
        rate = doc["profiles"][profile].get("up_rate_bps")
        if rate:
            ax.axhline(rate / 1e6 * 1448 / 1514, color="gray", ls=":", lw=1)
            ax.text(ax.get_xlim()[0], rate / 1e6 * 1448 / 1514, " max TCP goodput", fontsize=7, va="bottom",
                    color="gray")
            ax.set_ylim(0, max(max(ys), rate / 1e6) * 1.15)
        ax.set_title(profile, fontsize=10)
        ax.set_xlabel("p95 srtt (ms, lower is better →)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="lower left")
    axes[0, 0].set_ylabel("goodput (Mbit/s)")
    runs = doc["runs_per_unit"]
    # Two lines: one panel is 5 inches wide, and the title must fit it (it was cut at both ends).
    fig.suptitle(f"{doc['scenario']['name']}: throughput vs delay\nbest is top-right; "
                 f"{'mean ± 95% CI over ' + str(runs) + ' runs' if runs > 1 else '1 run, no interval'}", fontsize=10)
    fig.tight_layout()
    return _save(fig, directory, "tradeoff.png")


def plot_loss(directory: Sink, doc: dict) -> str | None:
    rows = [r for r in doc["summary"] if r["retransmit_ratio"]["mean"] is not None
            or r["link_drop_ratio"]["mean"] is not None][:MAX_PANELS]
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.1 * len(rows) + 2), 4.5))
    labels = [f"{r['profile']}\n{r['algorithm']}" + (f"\n({r['algorithms']})" if "+" in r["algorithms"] else "")
              for r in rows]
    xs = range(len(rows))
    retrans = [100 * (r["retransmit_ratio"]["mean"] or 0) for r in rows]
    drops = [100 * (r["link_drop_ratio"]["mean"] or 0) for r in rows]
    ax.bar([x - 0.2 for x in xs], retrans, width=0.4, color=[color(r["algorithm"]) for r in rows],
           edgecolor="black", label="retransmitted segments (sender)")
    ax.bar([x + 0.2 for x in xs], drops, width=0.4, color="lightgray", edgecolor="black", hatch="//",
           label="dropped at the emulated bottleneck (queue + random)")
    for x, a, b in zip(xs, retrans, drops, strict=True):
        ax.text(x - 0.2, a, f"{a:.2f}", ha="center", va="bottom", fontsize=7)
        ax.text(x + 0.2, b, f"{b:.2f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel("% of packets")
    ax.set_title(f"{doc['scenario']['name']}: loss", fontsize=10)
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    return _save(fig, directory, "loss.png")


def _buffer_bdp(doc: dict, profile: str) -> float | None:
    p = doc["profiles"][profile]
    queue, bdp = p.get("queue_bytes"), p.get("bdp_bytes")
    return queue / bdp if isinstance(queue, int | float) and isinstance(bdp, int | float) and bdp > 0 else None


def _competing_rows(doc: dict) -> list[dict]:
    return [r for r in doc["summary"] if "+" in r["algorithms"] and (r.get("share") or {}).get("mean") is not None]


def plot_shares(directory: Sink, doc: dict) -> str | None:
    """Each algorithm's share of its competing set against the buffer size (in BDPs), mean ± 95 % CI over
    runs, with what the scenario's `expected` says beside it: a model's curve, or a paper's numbers."""
    rows = [r for r in _competing_rows(doc) if _buffer_bdp(doc, r["profile"]) is not None]
    profiles = {r["profile"] for r in rows}
    if len(profiles) < 2:  # a share against the buffer needs more than one buffer
        return None
    definition = doc["scenario"]["definition"]
    fig, ax = plt.subplots(figsize=(7.5, 4.6))
    for i, (mix, alg) in enumerate(dict.fromkeys((r["algorithms"], r["algorithm"]) for r in rows)):
        mine = sorted((r for r in rows if (r["algorithms"], r["algorithm"]) == (mix, alg)),
                      key=lambda r: _buffer_bdp(doc, r["profile"]))
        xs = [_buffer_bdp(doc, r["profile"]) for r in mine]
        ax.errorbar(xs, [r["share"]["mean"] for r in mine], yerr=[r["share"]["ci95"] or 0 for r in mine],
                    fmt=MARKERS[i % len(MARKERS)] + "-", color=color(alg), capsize=4, ms=7, mec="black", mew=0.5,
                    label=f"{alg} in {mix} (measured)")
        expected = [(x, models.expected_share(definition, doc["profiles"][r["profile"]], r["profile"],
                                              mix.split("+"), alg)) for x, r in zip(xs, mine, strict=True)]
        expected = [(x, e) for x, e in expected if e is not None]
        if not expected:
            continue
        curve = _model_curve(doc, definition, mine[0], mix, alg, xs)
        if curve:
            ax.plot(*curve, color=color(alg), ls="--", lw=1.2, label=f"{alg}: model ({_model_name(definition, alg)})")
        else:
            ax.plot(*zip(*expected, strict=True), "x", color=color(alg), ms=9, mew=2, label=f"{alg}: expected")
    ax.set_xscale("log", base=2)
    buffers = sorted({_buffer_bdp(doc, r["profile"]) for r in rows})
    ax.set_xticks(buffers, [f"{b:g}" for b in buffers])  # plain numbers (mathtext is off in the report)
    ax.minorticks_off()
    ax.set_xlabel("bottleneck buffer (BDPs, log scale)")
    ax.set_ylabel("share of the set's goodput")
    ax.set_ylim(0, 1)
    ax.axhline(0.5, color="gray", lw=0.8, ls=":")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    runs = doc["runs_per_unit"]
    ax.set_title(f"{doc['scenario']['name']}: who wins, by buffer size\n"
                 f"{'mean ± 95% CI over ' + str(runs) + ' runs' if runs > 1 else '1 run, no interval'}", fontsize=10)
    fig.tight_layout()
    return _save(fig, directory, "shares.png")


def _model_name(definition: dict, alg: str) -> str:
    return str(((definition.get("expected") or {}).get("share") or {}).get(alg))


def _model_curve(doc: dict, definition: dict, row: dict, mix: str, alg: str, xs: list[float]):
    """A model's curve over the buffer range, when every profile has the same rate and RTT (a buffer sweep)."""
    if _model_name(definition, alg) not in models.SHARE_MODELS:
        return None
    paths = {(doc["profiles"][r]["up_rate_bps"], doc["profiles"][r]["base_rtt_s"]) for r in doc["profiles"]}
    if len(paths) != 1:
        return None
    (rate, rtt), = paths
    grid = [min(xs) * (max(xs) / min(xs)) ** (i / 60) for i in range(61)]
    return grid, [models.bbr_share(rate, rtt, x, mix.split("+").count(alg)) for x in grid]


def plot_harm(directory: Sink, doc: dict) -> str | None:
    """The harm matrix: for each algorithm in each competing set (rows) and profile (columns), the throughput
    harm against the same algorithm alone on that profile (Ware et al.: 0 none, 1 starved, < 0 gained)."""
    rows = [r for r in doc["summary"] if (r.get("harm") or {}).get("throughput", {}).get("mean") is not None]
    if not rows:
        return None
    profiles = [p for p in _profiles(doc) if any(r["profile"] == p for r in rows)]
    who = list(dict.fromkeys(f"{r['algorithm']} in {r['algorithms']}" for r in rows))
    cells = {(f"{r['algorithm']} in {r['algorithms']}", r["profile"]): r["harm"]["throughput"]["mean"] for r in rows}
    grid = [[cells.get((w, p), math.nan) for p in profiles] for w in who]
    fig, ax = plt.subplots(figsize=(1.3 * len(profiles) + 3.5, 0.6 * len(who) + 1.8))
    image = ax.imshow(grid, cmap="RdYlGn_r", vmin=-1, vmax=1, aspect="auto")
    for i, line in enumerate(grid):
        for j, value in enumerate(line):
            if not math.isnan(value):
                ax.text(j, i, f"{value:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(profiles)), profiles, fontsize=8, rotation=30, ha="right")
    ax.set_yticks(range(len(who)), who, fontsize=8)
    fig.colorbar(image, ax=ax, label="throughput harm")
    ax.set_xlabel("(solo - shared) / solo: 0 none, 1 starved, < 0 gained", fontsize=8)
    ax.set_title(f"{doc['scenario']['name']}: who is hurt, against running alone", fontsize=10)
    fig.tight_layout()
    return _save(fig, directory, "harm.png")


def plot_downloads(directory: Sink, doc: dict) -> str | None:
    if not any(r["downloads"] for r in doc["runs"]):
        return None
    profiles = [p for p in _profiles(doc) if any(r["downloads"] for r in doc["runs"] if r["profile"] == p)]
    if not profiles:
        return None
    fig, axes = plt.subplots(1, len(profiles), figsize=(4.5 * len(profiles) + 1, 4.2), squeeze=False, sharey=True)
    for ax, profile in zip(axes[0], profiles, strict=True):
        for alg in sorted({d["algorithm"] for r in doc["runs"] if r["profile"] == profile for d in r["downloads"]}):
            ds = [d for r in doc["runs"] if r["profile"] == profile for d in r["downloads"] if d["algorithm"] == alg]
            done = [(d["size_bytes"], d["completion_time_s"]) for d in ds if d["complete"]]
            failed = [d["size_bytes"] for d in ds if not d["complete"]]
            if done:
                ax.scatter([s for s, _ in done], [t for _, t in done], color=color(alg), label=alg, s=22, alpha=0.7)
            if failed:
                ys = [_download_timeout_s(doc) for _ in failed]
                ax.scatter(failed, ys, color=color(alg), marker="x", s=60,
                           label=f"{alg}: incomplete at the time limit")
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(profile, fontsize=9)
        ax.set_xlabel("transfer size (bytes)")
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    axes[0, 0].set_ylabel("completion time (s)")
    fig.suptitle(f"{doc['scenario']['name']}: download completion times", fontsize=10)
    fig.tight_layout()
    return _save(fig, directory, "downloads.png")


def _download_timeout_s(doc: dict) -> float:
    """Where an incomplete download is drawn: at its time limit (results before the limit was recorded
    plot it above the slowest complete transfer)."""
    limit = doc["scenario"].get("download_timeout_s")
    if limit is not None:
        return limit
    times = [d["completion_time_s"] for r in doc["runs"] for d in r["downloads"]
             if d["complete"] and d["completion_time_s"] is not None]
    return max(times, default=1.0) * 1.1


def _save(fig, sink: Sink, name: str) -> str:
    """The PNG into plots/ of a results directory, or into a dict (render writes none until all are drawn)."""
    image = io.BytesIO()
    try:
        fig.savefig(image, format="png", dpi=110)
    finally:
        plt.close(fig)
    if isinstance(sink, dict):
        sink[name] = image.getvalue()
    else:
        _write_plots(sink, {name: image.getvalue()})
    return f"plots/{name}"


def _write_plots(directory: Path, images: dict[str, bytes]) -> None:
    (directory / "plots").mkdir(exist_ok=True)
    for name, data in images.items():
        write_atomic(directory / "plots" / name, data)


def _discard(fig) -> None:
    plt.close(fig)
    return None


# --- tables ----------------------------------------------------------------------------------------


def _ci(value: dict, scale: float = 1.0, digits: int = 2, pct: bool = False) -> str:
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
           ("goodput Mbit/s", lambda r: _ci(r["goodput_bps"], 1e-6)),
           ("srtt mean ms", lambda r: _ci(r["srtt_mean_ms"], digits=1)),
           ("srtt p50 ms", lambda r: _ci(r["srtt_median_ms"], digits=1)),
           ("srtt p95 ms", lambda r: _ci(r["srtt_p95_ms"], digits=1)),
           ("ping p95 ms", lambda r: _ci(r["ping_p95_ms"], digits=1)),
           ("retrans %", lambda r: _ci(r["retransmit_ratio"], pct=True)),
           ("link drop %", lambda r: _ci(r["link_drop_ratio"], pct=True)),
           ("jain", lambda r: _ci(r["jain"], digits=3)),
           ("share", lambda r: _ci(r["share"], digits=2) if r.get("share") else "-"),
           ("converged s", lambda r: _ci(r["convergence_s"], digits=1) if r.get("convergence_s") else "-"),
           ("harm tput", lambda r: _ci(r["harm"]["throughput"], digits=2) if r.get("harm") else "-"),
           ("harm p95 RTT", lambda r: _ci(r["harm"]["srtt_p95"], digits=2) if r.get("harm") else "-"),
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


def render(directory: Path, doc: dict, series: Series | None = None) -> Path:
    """report.html and the PNGs it shows, from results.json and the per-flow CSVs (load_series, which
    checks and reads them all before anything is written; pass its result if you have it already)."""
    doc = with_display_names(doc)
    images: dict[str, bytes] = {}  # every plot is drawn before any file is written
    plots = _draw_plots(images, doc, load_series(directory, doc) if series is None else series)
    _write_plots(directory, images)
    sections = (_html_header(doc), _html_incomplete(directory, doc), _html_mixed(doc), _html_problems(doc),
                _html_summary(doc), _html_expected(doc),
                _html_real(doc), _html_plots(plots), _html_profiles(doc), _html_runs(doc), _html_downloads(doc),
                _html_environment(doc), _html_hosts(doc), _html_footer(doc))
    path = directory / "report.html"
    write_atomic(path, "\n".join(part for part in sections if part) + "\n")
    return path


def _draw_plots(directory: Sink, doc: dict, series: Series) -> list[str]:
    return [p for p in (
        plot_timeseries(directory, doc, series, "cwnd_segments", "cwnd (segments)", "cwnd.png", "congestion window"),
        plot_timeseries(directory, doc, series, "throughput_mbps", "throughput (Mbit/s, 200 ms window)",
                        "throughput.png", "throughput"),
        plot_timeseries(directory, doc, series, "srtt_ms", "RTT (ms): srtt lines, ping dots", "rtt.png", "RTT",
                        with_ping=True),
        plot_tradeoff(directory, doc), plot_shares(directory, doc), plot_harm(directory, doc),
        plot_loss(directory, doc), plot_downloads(directory, doc)) if p]


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
    for r in _competing_rows(doc):
        want = models.expected_share(definition, doc["profiles"][r["profile"]], r["profile"],
                                     r["algorithms"].split("+"), r["algorithm"])
        if want is not None:
            got = r["share"]["mean"]
            rows.append([r["profile"], f"{r['algorithm']} in {r['algorithms']}", _ci(r["share"]),
                         f"{want:.2f} ({_model_name(definition, r['algorithm'])})", f"{got - want:+.2f}"])
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
