"""The report's PNG plots (matplotlib, Agg): time series of the first repetition of each profile x algorithm
set, the throughput/delay trade-off, shares and harm beside their models, losses, download times and where
the queueing delay is (an AQM's own queue beside the ping). Each
plot goes to a Sink: drawn into a dict first, so that a failing plot leaves no file written."""

from __future__ import annotations

import io
import math
import statistics
from pathlib import Path

import matplotlib
import matplotlib.ticker

from ccscope.ccstate.bbr import MODES

from . import models
from .document import PING_STREAMS
from .series import Series, first_runs
from .store import write_atomic

matplotlib.use("Agg")
matplotlib.rcParams["text.parse_math"] = False  # names and descriptions are text, never TeX
import matplotlib.pyplot as plt  # noqa: E402  (after the backend is chosen)

COLORS = {"reno": "#1f77b4", "cubic": "#d62728", "bbr": "#2ca02c", "vegas": "#9467bd", "westwood": "#8c564b",
          "copa": "#ff7f0e"}
MARKERS = ("o", "s", "^", "D", "v", "P", "X")
PING_LABELS = {"ping": "ping", "ping_l4s": "ECT(1) ping"}  # each of document.PING_STREAMS
PING_MARKERS = {"ping": ".", "ping_l4s": "x"}
EXTRA = ("#ff7f0e", "#17becf", "#e377c2", "#7f7f7f", "#bcbd22")


def color(alg: str) -> str:
    if alg not in COLORS:
        COLORS[alg] = EXTRA[len([a for a in COLORS if a not in ("reno", "cubic", "bbr", "vegas", "westwood", "copa")])
                            % len(EXTRA)]
    return COLORS[alg]


Sink = Path | dict[str, bytes]  # where a plot goes: plots/ of a results directory, or name -> PNG


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
        for run in first_runs(doc):
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
            for stream in PING_STREAMS if with_ping else ():
                if not (run.get(stream) and run[stream].get("csv")):
                    continue
                xs, ys = series.get(run[stream]["csv"], {}).get("rtt_ms", ([], []))
                ping_label = f"{PING_LABELS[stream]} ({run['algorithms']})"
                ax.scatter(xs, ys, s=10, color=color(run["algorithms"].split("+")[0]), alpha=0.35,
                           marker=PING_MARKERS[stream], label=None if ping_label in labelled else ping_label)
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


MODE_COLORS = ("#fdd49e", "#c6dbef", "#e5f5e0", "#fcbba1")  # BBR's startup, drain, probe_bw, probe_rtt
MAX_STATE_PANELS = 12  # flows with a state in one figure


def plot_state(directory: Sink, doc: dict, series: Series) -> str | None:
    """Why the window moves: per CUBIC or BBR flow with a recorded state (first runs), CUBIC's cwnd under its W_max
    with K marked after each epoch's start, or BBR's bandwidth estimate against the delivery rate over its modes
    (ccscope's own algorithms' state is in the state CSVs and the states table, not drawn yet)."""
    panels = [(run, flow) for run in first_runs(doc) for flow in run["flows"]
              if {"mode", "wmax_segments"} & set(series.get(flow.get("state_csv") or "", {}))][:MAX_STATE_PANELS]
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 3.2 * len(panels)), squeeze=False)
    for ax, (run, flow) in zip(axes[:, 0], panels, strict=True):
        state, samples = series[flow["state_csv"]], series.get(flow.get("csv") or "", {})
        if "mode" in state:
            _draw_bbr(ax, state, samples)
        else:
            _draw_cubic(ax, state, samples, color(flow["algorithm"]))
        ax.set_title(f"{run['profile']}: {flow['id']} ({flow['algorithm']}, run {run['algorithms']})", fontsize=9,
                     loc="left")
        ax.grid(alpha=0.3)
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8, loc="upper right", ncol=3)
    axes[-1, 0].set_xlabel("time since the run started (s)")
    fig.suptitle(f"{doc['scenario']['name']}: each algorithm's own state (first run of each)", fontsize=11)
    fig.tight_layout()
    return _save(fig, directory, "state.png")


def _draw_cubic(ax, state: dict, samples: dict, line_color: str) -> None:
    xs, ys = samples.get("cwnd_segments", ([], []))
    ax.plot(xs, ys, color=line_color, lw=1.1, label="cwnd")
    wx, wy = state.get("wmax_segments", ([], []))
    wy = [w or math.nan for w in wy]  # none before the first loss (and after an RTO)
    ax.step(wx, wy, where="post", color="#444444", ls="--", lw=1.0, label="W_max (set at each loss)")
    ex, epoch = state.get("in_epoch", ([], []))
    kx, ks = state.get("k_s", ([], []))
    k_at = dict(zip(kx, ks, strict=True))
    wmax_at = dict(zip(wx, wy, strict=True))
    starts = [t for i, (t, e) in enumerate(zip(ex, epoch, strict=True))
              if e and (i == 0 or not epoch[i - 1]) and not math.isnan(wmax_at.get(t, math.nan))]
    for n, t in enumerate(starts):  # K: when the cubic regains W_max, counted from the epoch's start
        ax.axvline(t + k_at.get(t, 0.0), color="#444444", ls=":", lw=0.8, label=None if n else "epoch start + K")
    ax.set_ylabel("segments")


def _draw_bbr(ax, state: dict, samples: dict) -> None:
    mx, modes = state["mode"]
    end = max([*samples.get("delivery_rate_mbps", ([0.0], []))[0], *mx])
    shown = set()
    for i, (t, mode) in enumerate(zip(mx, modes, strict=True)):
        until = mx[i + 1] if i + 1 < len(mx) else end
        name = MODES[int(mode)]
        ax.axvspan(t, until, color=MODE_COLORS[int(mode)], lw=0, label=None if name in shown else name)
        shown.add(name)
    xs, ys = samples.get("delivery_rate_mbps", ([], []))
    ax.plot(xs, ys, color=color("bbr"), lw=1.0, alpha=0.8, label="delivery rate")
    bx, bw = state.get("bandwidth_Bps", ([], []))
    ax.step(bx, [b * 8 / 1e6 for b in bw], where="post", color="#444444", ls="--", lw=1.0,
            label="bandwidth estimate")
    ax.set_ylabel("Mbit/s")


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
            ax.axhline(rate / 1e6 * models.PAYLOAD_SHARE, color="gray", ls=":", lw=1)
            ax.text(ax.get_xlim()[0], rate / 1e6 * models.PAYLOAD_SHARE, " max TCP goodput", fontsize=7, va="bottom",
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


# The delay line's histograms of one direction (results' link.up): every packet's, or dualpi2's two queues.
SOJOURN_QUEUES = (("sojourn", " queue"), ("sojourn_l", " L queue"), ("sojourn_c", " C queue"))


def plot_queueing(directory: Sink, doc: dict) -> str | None:
    """Where the delay is, profile by profile (and algorithm set by set where a profile has several, as the l4s
    built-in's prague, cubic and both): the ping's RTT above the path's base RTT (what an interactive user waits),
    and where the delay line owns the bottleneck (an AQM), the time packets waited in its queue, median to p99
    (dualpi2's L and C queues apart); medians over the runs. None without any queue measured."""
    rows: list[tuple[str, float | None, tuple[float, float, float] | None]] = []
    for profile in _profiles(doc):
        runs = [r for r in doc["runs"] if r["profile"] == profile]
        sets = list(dict.fromkeys(r["algorithms"] for r in runs))
        for algorithms in sets:
            name = profile if len(sets) == 1 else f"{profile} {algorithms}"
            rows += _queueing_rows(name, [r for r in runs if r["algorithms"] == algorithms],
                                   (doc["profiles"][profile].get("base_rtt_s") or 0) * 1e3)
    if not any(q for _, _, q in rows):
        return None
    fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.8))
    for y, (_, ping, queue) in enumerate(rows):
        if queue is not None:
            ax.plot([queue[0], queue[2]], [y, y], color="#1f77b4", linewidth=2)
            ax.scatter(queue, [y] * 3, color="#1f77b4", marker="|", s=120, zorder=3)
            ax.text(queue[2], y, "  " + " / ".join(f"{v:.2f}" if v < 1 else f"{v:.1f}" for v in queue), va="center",
                    fontsize=7)
        if ping is not None:
            ax.scatter([ping], [y], color="#d62728", marker="o", s=30, zorder=3)
            ax.text(ping, y, f"  {ping:.1f}", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)), [label for label, _, _ in rows], fontsize=8)
    ax.invert_yaxis()
    ax.set_xscale("symlog", linthresh=1.0)
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))  # no TeX (parse_math off)
    largest = max(max(q[2] if q else 0, ping or 0) for _, ping, q in rows)
    ax.set_xlim(0, largest * 4 + 1)  # room for the numbers on the right
    ax.set_xlabel("ms. Blue: the queue's sojourn, median / p95 / p99. Red: ping RTT above the base RTT.",
                  fontsize=8)
    ax.set_title(f"{doc['scenario']['name']}: queueing delay", fontsize=10)
    ax.grid(axis="x", alpha=0.3, which="both")
    fig.tight_layout()
    return _save(fig, directory, "queueing.png")


def _queueing_rows(name: str, runs: list[dict], base_ms: float) -> list[tuple[str, float | None, tuple | None]]:
    """One row per queue that carried at least 1 % of the link's packets (dualpi2's L and C apart, not their sum),
    then the ping's."""
    rows: list[tuple[str, float | None, tuple | None]] = []
    ups = [(r.get("link") or {}).get("up") or {} for r in runs]
    carried = [(key, label) for key, label in SOJOURN_QUEUES
               if any(key in up and up[key]["count"] >= 0.01 * (up.get("packets") or 0) for up in ups)]
    for key, label in [q for q in carried if q[0] != "sojourn"] or carried:
        found = [up[key] for up in ups if key in up]
        rows.append((name + label, None, tuple(statistics.median([q[f"{p}_ms"] for q in found])
                                               for p in ("median", "p95", "p99"))))
    for stream in PING_STREAMS:
        pings = [r[stream]["rtt_ms"]["median"] for r in runs if r.get(stream) and r[stream]["rtt_ms"].get("median")]
        if pings:
            rows.append((f"{name} {PING_LABELS[stream]}", max(0.0, statistics.median(pings) - base_ms), None))
    return rows


def _buffer_bdp(doc: dict, profile: str) -> float | None:
    p = doc["profiles"][profile]
    queue, bdp = p.get("queue_bytes"), p.get("bdp_bytes")
    return queue / bdp if isinstance(queue, int | float) and isinstance(bdp, int | float) and bdp > 0 else None


def plot_shares(directory: Sink, doc: dict) -> str | None:
    """Each algorithm's share of its competing set against the buffer size (in BDPs), mean ± 95 % CI over
    runs, with what the scenario's `expected` says beside it: a model's curve, or a paper's numbers."""
    rows = [r for r in models.competing_rows(doc) if _buffer_bdp(doc, r["profile"]) is not None]
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
            model = models.model_name(definition, alg)
            ax.plot(*curve, color=color(alg), ls="--", lw=1.2, label=f"{alg}: model ({model})")
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


def _model_curve(doc: dict, definition: dict, row: dict, mix: str, alg: str, xs: list[float]):
    """A model's curve over the buffer range, when every profile has the same rate and RTT (a buffer sweep)."""
    if models.model_name(definition, alg) not in models.SHARE_MODELS:
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
        write_plots(sink, {name: image.getvalue()})
    return f"plots/{name}"


def write_plots(directory: Path, images: dict[str, bytes]) -> None:
    (directory / "plots").mkdir(exist_ok=True)
    for name, data in images.items():
        write_atomic(directory / "plots" / name, data)


def _discard(fig) -> None:
    plt.close(fig)
    return None


def draw_all(sink: Sink, doc: dict, series: Series) -> list[str]:
    """Every plot that applies to `doc`, as their paths under the results directory."""
    return [p for p in (
        plot_timeseries(sink, doc, series, "cwnd_segments", "cwnd (segments)", "cwnd.png", "congestion window"),
        plot_timeseries(sink, doc, series, "throughput_mbps", "throughput (Mbit/s, 200 ms window)",
                        "throughput.png", "throughput"),
        plot_timeseries(sink, doc, series, "srtt_ms", "RTT (ms): srtt lines, ping dots", "rtt.png", "RTT",
                        with_ping=True),
        plot_state(sink, doc, series), plot_tradeoff(sink, doc), plot_shares(sink, doc), plot_harm(sink, doc),
        plot_loss(sink, doc), plot_downloads(sink, doc), plot_queueing(sink, doc)) if p]
