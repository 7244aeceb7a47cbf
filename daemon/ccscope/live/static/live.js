// ccscope live page: Server-Sent Events from the daemon in, uPlot charts and a flows table out.
// State is kept on window.ccscopeLive (and counters on <body data-*>) so tests and curious users can read it.
"use strict";

(() => {
  const AUTO_FLOWS = 4;          // charted when nothing is selected: the busiest flows with samples
  const MAX_CHARTED = 8;
  const LAG_SHOWN_MS = 5000;
  const PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2"];
  // the charted columns by the name the server gives each value of a point (hello's `point`)
  const P = { t: "t", cwnd: "cwnd_segments", srtt: "srtt_s", minrtt: "min_rtt_s", mbps: "throughput_bps",
              retrans: "retransmits", wmax: "cubic_wmax_segments", mode: "bbr_mode" };
  // BBR's modes (0 startup, 1 drain, 2 probe_bw, 3 probe_rtt) as bands behind the cwnd chart
  const MODE_FILLS = ["rgba(255,127,14,0.18)", "rgba(148,103,189,0.22)", "rgba(44,160,44,0.10)", "rgba(214,39,40,0.30)"];

  const state = {
    mode: "daemon", ringPoints: 2400, bloat: { queueing_delay_s: 0.1, ratio: 3, for_s: 120 },
    point: { fields: ["t"], divisors: [1] },  // a point's values on the wire: names, and each one's divisor
    flows: {},              // id -> {info, cols: {name: values[]} (point.fields, in the charts' units), received}
    pointsReceived: 0, messages: 0, pushTimes: [], chartUpdates: 0, dropped: 0, lagUntil: 0, modeBands: 0,
    table: { columns: [], numeric: [], rows: [], total: 0 }, sortBy: "BYTES", sortDesc: true, filter: "",
    selected: new Set(), charted: [], chartKey: "",
    scenario: {}, runs: [], algColors: {},
  };
  window.ccscopeLive = state;

  const $ = (id) => document.getElementById(id);
  const body = document.body;
  let charts = {};            // name -> uPlot
  let scenarioCharts = {};    // profile -> {plot, key}
  let dirty = false;

  // --- the stream ---------------------------------------------------------------------------------------

  const source = new EventSource("events");
  source.onopen = () => setStatus("live", "live");
  source.onerror = () => { if (body.dataset.state !== "stopped") setStatus("reconnecting", "reconnecting…"); };
  on("hello", (d) => {
    state.mode = d.mode; state.ringPoints = d.ring_points; state.bloat = d.bloat; state.point = d.point;
    state.flows = {};
    for (const info of d.flows) addPoints(info.id, info, d.history[info.id] || []);
    setTable(d.table);
    state.scenario = d.scenario || {}; state.runs = d.runs || [];
    $("mode").textContent = d.mode === "scenario" ? "scenario (live)" : "daemon (live)";
    $("bloat-qd").textContent = (d.bloat.queueing_delay_s * 1e3).toFixed(0);
    $("bloat-ratio").textContent = d.bloat.ratio;
    $("bloat-for").textContent = d.bloat.for_s;
    renderScenario(); markDirty();
  });
  on("points", (d) => {
    state.pushTimes.push(performance.now());
    if (state.pushTimes.length > 100) state.pushTimes.shift();
    for (const [id, f] of Object.entries(d)) addPoints(id, f.info, f.points);
    markDirty();
  });
  on("table", (d) => setTable(d));
  on("scenario", (d) => { state.scenario = d; renderScenario(); markDirty(); });
  on("run", (d) => { state.runs.push(d); renderScenario(); markDirty(); });
  on("lag", (d) => {
    state.dropped = d.dropped_total; state.lagUntil = Date.now() + LAG_SHOWN_MS;
    $("lagging").hidden = false; body.dataset.lagging = "true";
    $("lagging").textContent = `lagging: ${d.dropped_total} updates dropped`;
  });
  on("bye", () => {
    source.close(); setStatus("stopped", "ccscope stopped");
  });

  function on(name, handler) {
    source.addEventListener(name, (e) => { state.messages++; handler(JSON.parse(e.data)); });
  }

  function setStatus(key, text) { body.dataset.state = key; $("status").textContent = text; }

  function addPoints(id, info, points) {
    let f = state.flows[id];
    const { fields, divisors } = state.point;
    if (!f) f = state.flows[id] = { info: {}, cols: Object.fromEntries(fields.map((n) => [n, []])), received: 0 };
    Object.assign(f.info, info);
    // the wire has integers as the kernel keeps them (µs, kbit/s); the charts ms and Mbit/s
    for (const p of points) {
      for (let i = 0; i < fields.length; i++) f.cols[fields[i]].push(p[i] === null ? null : p[i] / divisors[i]);
    }
    const excess = f.cols.t.length - state.ringPoints;
    if (excess > 0) for (const c of Object.values(f.cols)) c.splice(0, excess);
    f.received += points.length;
    state.pointsReceived += points.length;
    body.dataset.pointsReceived = state.pointsReceived;
  }

  function markDirty() {
    if (!dirty) { dirty = true; requestAnimationFrame(render); }
  }

  function render() {
    dirty = false;
    if (state.lagUntil && Date.now() > state.lagUntil) {
      $("lagging").hidden = true; body.dataset.lagging = "false"; state.lagUntil = 0;
    }
    renderCharts();
    renderScenarioCharts();
    const n = Object.keys(state.flows).length;
    $("summary").textContent = `${n} flows with samples, ${state.pointsReceived} points received`;
  }

  // --- flow charts --------------------------------------------------------------------------------------

  const CHARTS = [
    { name: "cwnd", title: "cwnd (segments); CUBIC's W_max dashed; BBR's mode behind: startup orange, drain " +
      "purple, probe_bw green, probe_rtt red", cols: [[P.cwnd, ""], [P.wmax, " W_max", true]], bands: true },
    { name: "rtt", title: "srtt (solid) and min_rtt (dashed), ms", cols: [[P.srtt, " srtt"], [P.minrtt, " min_rtt"]] },
    { name: "throughput", title: "throughput (Mbit/s, 200 ms window)", cols: [[P.mbps, ""]] },
    { name: "retransmits", title: "retransmits (cumulative segments)", cols: [[P.retrans, ""]] },
  ];

  function chartedFlows() {
    const ids = Object.keys(state.flows);
    const picked = [...state.selected].filter((id) => state.flows[id]);
    if (picked.length) return picked.slice(0, MAX_CHARTED);
    const bytes = (id) => state.flows[id].info.bytes || 0;
    // never the pages' own streams to this daemon (info.own): they are busy only because a page is open
    const candidates = ids.filter((id) => !state.flows[id].info.closed && !state.flows[id].info.own);
    return candidates.sort((a, b) => bytes(b) - bytes(a)).slice(0, AUTO_FLOWS);
  }

  function renderCharts() {
    const ids = chartedFlows();
    $("selection-note").textContent = state.selected.size ? "(selected in the table)"
      : `(the ${AUTO_FLOWS} busiest; tick flows in the table to choose)`;
    // the legends name each flow by its algorithm too, which may change (setsockopt, or the page learning that
    // ccscope's BPF program runs it): then the charts are made again
    const key = ids.map((id) => `${id} ${shortName(state.flows[id].info)} ${hasData(id, P.wmax)}`).join(",");
    if (key !== state.chartKey) {
      for (const c of Object.values(charts)) c.destroy();
      charts = {};
      $("charts").replaceChildren();
      state.charted = ids;
      state.chartKey = key;
      if (!ids.length) return;
      for (const spec of CHARTS) charts[spec.name] = makeFlowChart(spec, ids);
    }
    if (!ids.length) return;
    for (const spec of CHARTS) {
      const tables = ids.map((id) => [state.flows[id].cols[P.t], ...colsOf(spec, id).map((i) => state.flows[id].cols[i])]);
      charts[spec.name].setData(uPlot.join(tables));
    }
    state.chartUpdates++;
    body.dataset.chartUpdates = state.chartUpdates;
    body.dataset.chartPoints = charts.cwnd.data[0].length;
  }

  function makeFlowChart(spec, ids) {
    const series = [{}];
    ids.forEach((id, n) => {
      const name = shortName(state.flows[id].info);
      for (const [i, suffix] of spec.cols.filter(([i]) => colsOf(spec, id).includes(i))) {
        series.push({ label: name + suffix, stroke: PALETTE[n % PALETTE.length], width: 1.5, spanGaps: true,
                      dash: i === P.minrtt || i === P.wmax ? [6, 4] : undefined, points: { show: false } });
      }
    });
    const hooks = spec.bands ? { drawClear: [(u) => drawModeBands(u, ids)] } : {};
    return newChart($("charts"), spec.title, series, { time: true, hooks });
  }

  // a flow's columns in a chart: those it has data for, where a column is only drawn then (W_max: CUBIC's)
  function colsOf(spec, id) {
    return spec.cols.filter(([i, , ifData]) => !ifData || hasData(id, i)).map(([i]) => i);
  }

  function hasData(id, name) {
    const col = state.flows[id].cols[name];
    return Boolean(col && col.some((v) => v !== null));
  }

  // each run of one BBR mode of a charted flow, as a band the height of the plot, under the lines
  function drawModeBands(u, ids) {
    const { ctx } = u;
    const { left, top, width, height } = u.bbox;
    let drawn = 0;
    ctx.save();
    ctx.beginPath();
    ctx.rect(left, top, width, height);
    ctx.clip();
    for (const id of ids) {
      const t = state.flows[id].cols[P.t], mode = state.flows[id].cols[P.mode];
      if (!mode) continue;
      for (let i = 0; i < t.length; i++) {
        const m = mode[i];
        if (m === null || MODE_FILLS[m] === undefined) continue;
        let j = i;
        while (j + 1 < t.length && mode[j + 1] === m) j++;
        const x0 = u.valToPos(t[i], "x", true), x1 = u.valToPos(t[Math.min(j + 1, t.length - 1)], "x", true);
        ctx.fillStyle = MODE_FILLS[m];
        ctx.fillRect(x0, top, Math.max(1, x1 - x0), height);
        drawn++;
        i = j;
      }
    }
    ctx.restore();
    state.modeBands = Math.max(state.modeBands, drawn);  // the most bands one drawing had (tests read it)
    body.dataset.modeBands = state.modeBands;
  }

  function newChart(parent, title, series, { time, hooks = {} }) {
    const box = document.createElement("div");
    box.className = "chart";
    const h = document.createElement("h3");
    h.textContent = title;
    box.append(h);
    parent.append(box);
    const width = Math.max(360, box.clientWidth - 10);
    const opts = { width, height: 220, series, scales: { x: { time } }, legend: { live: false }, hooks,
                   cursor: { drag: { x: true, y: false } }, axes: [{}, { size: 60 }] };
    return new uPlot(opts, series.map(() => []), box);
  }

  function shortName(info) { return `${info.cc || "?"} ${info.flow || info.id}`; }

  // --- flows table --------------------------------------------------------------------------------------

  function setTable(table) {
    state.table = table && table.columns ? table : { columns: [], numeric: [], rows: [], total: 0 };
    renderTable();
  }

  function bloatState(row) {
    const ring = state.flows[row.id];
    if (ring && ring.info.bloat_alert) return ["alert", `ALERT (over for ${ring.info.bloat_for_s.toFixed(0)} s)`];
    const over = row.ratio !== null && row.queueing_delay_ms > state.bloat.queueing_delay_s * 1e3
      && row.ratio > state.bloat.ratio;
    if (over) return ["over", `over${ring && ring.info.bloat_for_s ? ` for ${ring.info.bloat_for_s.toFixed(0)} s` : ""}`];
    return ["ok", row.ratio === null ? "-" : `ok (${row.queueing_delay_ms.toFixed(1)} ms, ×${row.ratio.toFixed(1)})`];
  }

  function renderTable() {
    // columns come and go (COMM and CGROUP/POD while some flow has them): sorting follows a column by its title
    const { columns, numeric, rows, total } = state.table;
    const thead = $("flows").tHead;
    if (thead.dataset.columns !== columns.join(",")) {
      thead.dataset.columns = columns.join(",");
      const tr = document.createElement("tr");
      tr.append(document.createElement("th"));
      columns.forEach((title, i) => {
        const th = document.createElement("th");
        th.textContent = title;
        th.dataset.col = title;
        th.addEventListener("click", () => {
          state.sortDesc = state.sortBy === title ? !state.sortDesc : numeric[i];  // numbers: largest first
          state.sortBy = title;
          renderTable();
        });
        tr.append(th);
      });
      const th = document.createElement("th");
      th.textContent = "BUFFERBLOAT";
      tr.append(th);
      thead.replaceChildren(tr);
    }
    for (const th of thead.querySelectorAll("th[data-col]")) {
      th.dataset.sort = th.dataset.col === state.sortBy ? (state.sortDesc ? "desc" : "asc") : "";
    }
    const needle = state.filter.toLowerCase();
    const shown = rows.filter((r) => !needle || r.cells.join(" ").toLowerCase().includes(needle));
    const c = columns.indexOf(state.sortBy);
    if (c >= 0) {
      shown.sort((a, b) => {
        const x = a.keys[c], y = b.keys[c];
        const order = typeof x === "string" ? x.localeCompare(y) : x - y;
        return state.sortDesc ? -order : order;
      });
    }
    const tbody = $("flows").tBodies[0];
    tbody.replaceChildren(...shown.map(renderRow));
    $("flows-count").textContent = `${shown.length} shown of ${total}${total > rows.length ? ` (busiest ${rows.length} listed)` : ""}`;
  }

  function renderRow(row) {
    const tr = document.createElement("tr");
    tr.dataset.id = row.id;
    const ring = state.flows[row.id];
    tr.dataset.points = ring ? ring.received : 0;
    if (row.closed) tr.classList.add("closed");
    if (state.selected.has(row.id)) tr.classList.add("selected");
    const pick = document.createElement("td");
    const box = document.createElement("input");
    box.type = "checkbox";
    box.checked = state.selected.has(row.id);
    box.title = ring ? "chart this flow" : "no samples yet for this flow";
    box.addEventListener("change", () => {
      if (box.checked) state.selected.add(row.id); else state.selected.delete(row.id);
      renderTable(); markDirty();
    });
    pick.append(box);
    tr.append(pick);
    const { columns, numeric } = state.table;
    row.cells.forEach((text, i) => {
      const td = document.createElement("td");
      td.textContent = text;
      td.dataset.col = columns[i];
      if (numeric[i]) td.className = "n";
      tr.append(td);
    });
    const [kind, text] = bloatState(row);
    const td = document.createElement("td");
    td.className = `bloat-${kind}`;
    td.dataset.bloat = kind;
    td.textContent = text;
    tr.append(td);
    return tr;
  }

  $("filter").addEventListener("input", (e) => { state.filter = e.target.value; renderTable(); });
  setInterval(() => { if (state.lagUntil && Date.now() > state.lagUntil) markDirty(); }, 1000);

  // --- scenario -----------------------------------------------------------------------------------------

  function algColor(alg) {
    if (!(alg in state.algColors)) {
      state.algColors[alg] = PALETTE[Object.keys(state.algColors).length % PALETTE.length];
    }
    return state.algColors[alg];
  }

  function renderScenario() {
    const sc = state.scenario;
    if (!sc.phase) return;
    $("scenario").hidden = false;
    $("sc-name").textContent = sc.scenario || "";
    (sc.algorithms || []).forEach(algColor);
    if (sc.phase === "note" || !sc.label) {
      $("sc-label").textContent = sc.note || "starting…";
    } else {
      $("sc-label").textContent = `run ${sc.position}/${sc.total}: profile ${sc.profile}, ${sc.algorithm}, `
        + `repetition ${sc.repetition}${sc.phase === "done" ? " (finished)" : ""}`;
    }
    const fraction = sc.planned_s ? Math.min(1, (sc.elapsed_s || 0) / sc.planned_s) : 0;
    $("sc-progress").value = fraction;
    body.dataset.scenarioProgress = fraction.toFixed(3);
    body.dataset.scenarioRun = sc.position || 0;
    $("sc-elapsed").textContent = sc.planned_s ? `${(sc.elapsed_s || 0).toFixed(1)} / ${sc.planned_s.toFixed(0)} s` : "";
    $("sc-count").textContent = state.runs.length;
    body.dataset.runsFinished = state.runs.length;
    $("sc-runs").replaceChildren(...state.runs.map((r) => {
      const li = document.createElement("li");
      li.textContent = `${r.label}: ${r.summary || ""}`;
      return li;
    }));
    if (sc.report) {
      const p = $("sc-report");
      p.hidden = false;
      const a = document.createElement("a");
      a.href = sc.report_url;
      a.textContent = "report.html";
      a.id = "report-link";
      p.replaceChildren("Report written: ", a, ` (${sc.report}; served until ccscope exits)`);
    }
  }

  function currentRunCurves(profile) {
    const sc = state.scenario;
    if (!sc.label || sc.profile !== profile || !["run", "progress"].includes(sc.phase)) return [];
    const flows = Object.values(state.flows).filter((f) => f.info.run === sc.label);
    const most = Math.max(0, ...flows.map((f) => f.info.bytes || 0));
    return flows.filter((f) => (f.info.bytes || 0) >= 0.1 * most && f.cols.t.length).map((f) => ({
      alg: f.info.cc, label: `${f.info.cc} now`, t: f.cols[P.t].map((t) => t - sc.t0), cwnd: f.cols[P.cwnd], width: 2.5,
    }));
  }

  function renderScenarioCharts() {
    const profiles = state.scenario.profiles || [];
    for (const profile of profiles) {
      const finished = state.runs.filter((r) => r.profile === profile).flatMap((r) => r.flows.map((f) => ({
        alg: f.cc, label: `${f.cc} #${r.repetition}`, t: f.t, cwnd: f.cwnd, width: 1.2,
      })));
      const curves = [...finished, ...currentRunCurves(profile)];
      const key = curves.map((c) => c.label).join(",");
      let entry = scenarioCharts[profile];
      if (!entry || entry.key !== key) {
        if (entry) { entry.plot.destroy(); entry.box.remove(); }
        if (!curves.length) { delete scenarioCharts[profile]; continue; }
        const series = [{}, ...curves.map((c) => ({
          label: c.label, stroke: algColor(c.alg), width: c.width, spanGaps: true, points: { show: false },
        }))];
        const holder = document.createElement("div");
        $("sc-charts").append(holder);
        const plot = newChart(holder, `cwnd (segments) on ${profile}, seconds since each run's start`, series,
          { time: false });
        entry = scenarioCharts[profile] = { plot, key, box: holder };
      }
      entry.plot.setData(uPlot.join(curves.map((c) => [c.t, c.cwnd])));
      const now = curves.length - finished.length;
      if (now) {  // the run in progress, drawn over this many finished curves, with this many points so far
        body.dataset.currentOverlaid = finished.length;
        body.dataset.currentPoints = curves.slice(finished.length).reduce((n, c) => n + c.t.length, 0);
      }
    }
    body.dataset.scenarioCurves = Object.values(scenarioCharts).reduce((n, e) => n + e.plot.series.length - 1, 0);
  }
})();
