#!/usr/bin/env python3
"""Generates the Grafana dashboards (Grafana 11.6, schemaVersion 41) with Grafana's typed builder.

The committed JSON next to this file is what Grafana provisions; edit this file, then run
`python3 dashboards/generate.py` to rewrite it (`--check` fails when the JSON is out of date; the tests
run that). Panels, queries and variables come from grafana-foundation-sdk (Apache-2.0, a dev dependency,
pinned in pyproject.toml), so a misspelt option is an AttributeError here, not a panel Grafana silently
ignores. tests/test_dashboards.py holds every panel and query to tests/data/dashboard-inventory.json.

Conventions every panel follows (tests/test_dashboards.py checks them):
- the datasource is the `${datasource}` variable, on the panel and on each query;
- every query carries `job=~"$job",instance=~"$instance"`; rates use `$__rate_interval`;
- a unit and a description are set; uids are fixed, so links and provisioning stay stable.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

try:
    from grafana_foundation_sdk.builders import bargauge, common, prometheus, stat, statetimeline, table, timeseries
    from grafana_foundation_sdk.builders import dashboard as db
    from grafana_foundation_sdk.cog import builder as cogbuilder
    from grafana_foundation_sdk.cog.encoder import JSONEncoder
    from grafana_foundation_sdk.models import common as cm
    from grafana_foundation_sdk.models import dashboard as dm
    from grafana_foundation_sdk.models import prometheus as pm
except ImportError:
    sys.exit("generate.py: needs grafana-foundation-sdk: run it with .venv/bin/python after tools/bootstrap --dev")

HERE = Path(__file__).resolve().parent
DS = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")
TARGET = 'job=~"$job",instance=~"$instance"'
# Workload labels exist with `ccscope daemon --labels ...pod,container`; without them "All" (.*) also matches
# series that lack the label, so the dashboard works either way.
WORKLOAD_SEL = 'namespace=~"$namespace",pod=~"$pod",container=~"$container"'
FLOW_SEL = TARGET + ',' + WORKLOAD_SEL + ',netns=~"$netns",cc=~"$cc",flow=~"$flow"'
RUN_SEL = TARGET + ',scenario=~"$scenario",run=~"$run"'
CA_STATES = ("open", "disorder", "cwr", "recovery", "loss")
BBR_MODES = (("startup", "orange"), ("drain", "blue"), ("probe_bw", "green"), ("probe_rtt", "red"))  # enum bbr_mode

Panel = timeseries.Panel | stat.Panel | bargauge.Panel | statetimeline.Panel | table.Panel


# --- building blocks ---------------------------------------------------------------------------------


def target(expr: str, legend: str = "", instant: bool = False) -> prometheus.Dataquery:
    query = prometheus.Dataquery().expr(expr).legend_format(legend or "__auto").datasource(DS)
    query = query.editor_mode(pm.QueryEditorMode.CODE)
    return query.instant() if instant else query.range()


def thresholds(steps: list[tuple[float, str]]) -> db.ThresholdsConfig:
    base = [dm.Threshold(value=None, color="green")]
    return db.ThresholdsConfig().mode(dm.ThresholdsMode.ABSOLUTE).steps(
        base + [dm.Threshold(value=value, color=color) for value, color in steps])


def common_panel(panel: Panel, title: str, description: str, unit: str, targets: list[prometheus.Dataquery],
                 steps: list[tuple[float, str]]) -> Panel:
    for letter, query in zip("ABCDEFGH", targets, strict=False):
        query.ref_id(letter)
    return (panel.title(title).description(description).datasource(DS).unit(unit).targets(targets)
            .thresholds(thresholds(steps)))


def ts(title: str, description: str, unit: str, *targets: prometheus.Dataquery,
       steps: list[tuple[float, str]] | None = None) -> timeseries.Panel:
    panel = (timeseries.Panel().draw_style(cm.GraphDrawStyle.LINE).line_width(1).fill_opacity(0)
             .show_points(cm.VisibilityMode.NEVER).span_nulls(False)
             .legend(common.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST)
                     .placement(cm.LegendPlacement.BOTTOM).show_legend(True))
             .tooltip(common.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI).sort(cm.SortOrder.DESCENDING)))
    if steps:
        panel = panel.thresholds_style(common.GraphThresholdsStyleConfig().mode(cm.GraphThresholdsStyleMode.DASHED))
    return common_panel(panel, title, description, unit, list(targets), steps or [])


def last_value() -> common.ReduceDataOptions:
    return common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False)


def bar_summary(title: str, description: str, unit: str, query: prometheus.Dataquery) -> bargauge.Panel:
    panel = (bargauge.Panel().reduce_options(last_value()).orientation(cm.VizOrientation.HORIZONTAL)
             .display_mode(cm.BarGaugeDisplayMode.GRADIENT).show_unfilled(True))
    return common_panel(panel, title, description, unit, [query], [])


class Layout:
    """Collects rows and panels in order, sized on Grafana's 24-column grid, and hands out panel ids.

    The dashboard builder places them left to right; ids count rows and panels from 1, as before."""

    def __init__(self) -> None:
        self.items: list[db.Row | Panel] = []

    def row(self, title: str) -> None:
        self.items.append(db.Row(title).collapsed(False).id(len(self.items) + 1))

    def add(self, panel: Panel, w: int = 12, h: int = 8) -> None:
        self.items.append(panel.id(len(self.items) + 1).span(w).height(h))

    def place(self, dashboard: db.Dashboard) -> db.Dashboard:
        for item in self.items:
            dashboard = dashboard.with_row(item) if isinstance(item, db.Row) else dashboard.with_panel(item)
        return dashboard


def query_var(name: str, label: str, query: str, *, multi: bool = True, include_all: bool = True,
              all_value: str | None = ".*", sort: dm.VariableSort = dm.VariableSort.ALPHABETICAL_ASC
              ) -> db.QueryVariable:
    var = (db.QueryVariable(name).label(label).datasource(DS)
           .query({"query": query, "refId": f"PrometheusVariableQueryEditor-{name}"})
           .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED).regex("").sort(sort).multi(multi)
           .include_all(include_all).hide(dm.VariableHide.DONT_HIDE))
    if include_all and all_value is not None:
        var = var.all_value(all_value)
    return var


def datasource_var() -> db.DatasourceVariable:
    return (db.DatasourceVariable("datasource").label("Data source").type("prometheus").regex("").multi(False)
            .include_all(False).hide(dm.VariableHide.DONT_HIDE))


def job_instance_vars() -> list[db.QueryVariable]:
    return [
        query_var("job", "Job", "label_values(ccscope_build_info, job)"),
        query_var("instance", "Instance", 'label_values(ccscope_build_info{job=~"$job"}, instance)'),
    ]


def dashboard(uid: str, title: str, description: str, tags: list[str], time_from: str) -> db.Dashboard:
    builtin = (db.AnnotationQuery().name("Annotations & Alerts").built_in(1).enable(True).hide(True)
               .datasource(dm.DataSourceRef(type_val="grafana", uid="-- Grafana --"))
               .icon_color("rgba(0, 211, 255, 1)").type("dashboard"))
    link = (db.DashboardLink("ccscope").type(dm.DashboardLinkType.DASHBOARDS).tags(["ccscope"]).as_dropdown(False)
            .include_vars(True).keep_time(True))
    return (db.Dashboard(title).uid(uid).description(description).tags(tags).editable().version(1)
            .tooltip(dm.DashboardCursorSync.CROSSHAIR).refresh("5s").timezone("browser").time(time_from, "now")
            .fiscal_year_start_month(0).live_now(False).week_start("").link(link).annotation(builtin))


def render(build: Callable[[], db.Dashboard]) -> str:
    return json.dumps(build().build(), cls=JSONEncoder, indent=2, ensure_ascii=False) + "\n"


# --- ccscope — live flows ------------------------------------------------------------------------------


def live_flows() -> db.Dashboard:
    lay = Layout()
    _host_panels(lay)
    _per_flow_panels(lay)
    _pod_panels(lay)
    _daemon_health_panels(lay)
    _state_panels(lay)
    variables = [datasource_var(), *job_instance_vars(),
                 query_var("namespace", "Kubernetes namespace",
                           f'label_values(ccscope_flow_cwnd_segments{{{TARGET}}}, namespace)'),
                 query_var("pod", "Pod",
                           f'label_values(ccscope_flow_cwnd_segments{{{TARGET},namespace=~"$namespace"}}, pod)'),
                 query_var("container", "Container ID",
                           f'label_values(ccscope_flow_cwnd_segments{{{TARGET},namespace=~"$namespace",'
                           f'pod=~"$pod"}}, container)'),
                 query_var("netns", "Network namespace",
                           f'label_values(ccscope_flow_cwnd_segments{{{TARGET},{WORKLOAD_SEL}}}, netns)'),
                 query_var("cc", "Algorithm", f'label_values(ccscope_tcp_flows{{{TARGET}}}, cc)'),
                 query_var("flow", "Flow",
                           f'label_values(ccscope_flow_cwnd_segments{{{TARGET},{WORKLOAD_SEL},netns=~"$netns",'
                           f'cc=~"$cc"}}, flow)')]
    dash = dashboard("ccscope-live-flows", "ccscope — live flows",
                     "Per-flow TCP congestion telemetry (cwnd, ssthresh, RTT, queueing delay, retransmits, rates) "
                     "from ccscope's eBPF exporter.", ["ccscope", "tcp"], "now-15m")
    return lay.place(dash.variables(variables))


def _host_panels(lay: Layout) -> None:
    host = TARGET + ',cc=~"$cc"'
    lay.row("Host (all flows, from in-kernel aggregates)")
    open_flows = (stat.Panel().reduce_options(last_value()).color_mode(cm.BigValueColorMode.VALUE)
                  .graph_mode(cm.BigValueGraphMode.AREA).text_mode(cm.BigValueTextMode.AUTO))
    lay.add(common_panel(open_flows, "Open flows", "TCP flows the kernel side tracks as open, all algorithms "
                         "selected.", "short", [target(f"sum(ccscope_tcp_flows{{{host}}})", "open flows",
                                                       instant=True)], []), w=4, h=8)
    lay.add(ts("Flows by algorithm", "Open TCP flows per congestion control algorithm (ccscope_tcp_flows).",
               "short", target(f"sum by (cc) (ccscope_tcp_flows{{{host}}})", "{{cc}}")), w=10)
    lay.add(ts("New flows by algorithm", "Rate at which ccscope first sees TCP flows, per algorithm.",
               "cps", target(f"sum by (cc) (rate(ccscope_tcp_flows_started_total{{{host}}}[$__rate_interval]))",
                             "{{cc}}")), w=10)
    lay.add(ts("Host queueing delay (quantiles)",
               "Quantiles of srtt - min_rtt over all flows, from the log2-bucket histogram "
               "ccscope_tcp_queueing_delay_seconds; bucket bounds double, so values are coarse.",
               "s", *(target(
                   f"histogram_quantile({q}, sum by (le) (rate(ccscope_tcp_queueing_delay_seconds_bucket{{{host}}}"
                   f"[$__rate_interval])))", f"p{int(q * 100)}") for q in (0.5, 0.9, 0.99)),
               steps=[(0.1, "red")]))
    lay.add(ts("Host smoothed RTT (quantiles)",
               "Quantiles of srtt over all flows, from the histogram ccscope_tcp_srtt_seconds.", "s",
               *(target(f"histogram_quantile({q}, sum by (le) (rate(ccscope_tcp_srtt_seconds_bucket{{{host}}}"
                        f"[$__rate_interval])))", f"p{int(q * 100)}") for q in (0.5, 0.9, 0.99))))
    lay.add(ts("Host retransmits by algorithm",
               "Retransmitted segments per second on all flows of the host (ccscope_tcp_retransmits_total).",
               "cps", target(f"sum by (cc) (rate(ccscope_tcp_retransmits_total{{{host}}}[$__rate_interval]))",
                             "{{cc}}")))
    lay.add(ts("Retransmitted share of bytes sent (exported flows)",
               "retransmits x MSS / bytes sent over the exported (top-N) flows: the same ratio the "
               "CcscopeHighRetransmitRatio alert uses.", "percentunit",
               target(f"sum by (cc) (rate(ccscope_flow_retransmits_total{{{host}}}[$__rate_interval]) "
                      f"* ccscope_flow_mss_bytes{{{host}}}) / "
                      f"sum by (cc) (rate(ccscope_flow_bytes_sent_total{{{host}}}[$__rate_interval]))", "{{cc}}"),
               steps=[(0.05, "red")]))


def _per_flow_panels(lay: Layout) -> None:
    lay.row("Per flow (top-N flows the daemon exports)")
    fs = FLOW_SEL
    lay.add(ts("Congestion window", "snd_cwnd in segments (ccscope_flow_cwnd_segments).", "short",
               target(f"ccscope_flow_cwnd_segments{{{fs}}}", "{{flow}} {{cc}}")))
    lay.add(ts("Slow-start threshold",
               "ssthresh in segments; a flow has no series until its first loss makes it finite.", "short",
               target(f"ccscope_flow_ssthresh_segments{{{fs}}}", "{{flow}} {{cc}}")))
    lay.add(ts("Smoothed RTT against min RTT",
               "srtt (solid) next to the kernel's windowed min_rtt: the gap is delay added by queues.", "s",
               target(f"ccscope_flow_srtt_seconds{{{fs}}}", "srtt {{flow}}"),
               target(f"ccscope_flow_min_rtt_seconds{{{fs}}}", "min_rtt {{flow}}")))
    lay.add(ts("Queueing delay", "srtt - min_rtt per flow; sustained values above 100 ms are bufferbloat "
               "(the CcscopeFlowBufferbloat alert threshold).", "s",
               target(f"ccscope_flow_queueing_delay_seconds{{{fs}}}", "{{flow}}"), steps=[(0.1, "red")]))
    lay.add(ts("RTT inflation (srtt / min_rtt)", "How many times the base RTT the flow currently sees; the "
               "flow bufferbloat alert needs this above 3 together with the queueing delay.", "x",
               target(f"ccscope_flow_srtt_seconds{{{fs}}} / ccscope_flow_min_rtt_seconds{{{fs}}}", "{{flow}}"),
               steps=[(3, "red")]))
    lay.add(ts("RTT variation", "rttvar (mdev) per flow.", "s",
               target(f"ccscope_flow_rttvar_seconds{{{fs}}}", "{{flow}}")))
    lay.add(ts("Retransmit rate", "Retransmitted segments per second per flow (ccscope_flow_retransmits_total).",
               "cps", target(f"rate(ccscope_flow_retransmits_total{{{fs}}}[$__rate_interval])", "{{flow}}")))
    lay.add(ts("Lost packets rate", "Packets marked lost per second per flow.", "cps",
               target(f"rate(ccscope_flow_lost_packets_total{{{fs}}}[$__rate_interval])", "{{flow}}")))
    lay.add(ts("Delivery and pacing rate", "The kernel's latest delivery rate sample and the socket pacing rate "
               "(absent while unlimited).", "Bps",
               target(f"ccscope_flow_delivery_rate_bytes_per_second{{{fs}}}", "delivery {{flow}}"),
               target(f"ccscope_flow_pacing_rate_bytes_per_second{{{fs}}}", "pacing {{flow}}")))
    lay.add(ts("Goodput", "Bytes acknowledged per second per flow.", "Bps",
               target(f"rate(ccscope_flow_bytes_acked_total{{{fs}}}[$__rate_interval])", "{{flow}}")))
    lay.add(ts("Packets in flight", "Segments in flight per flow.", "short",
               target(f"ccscope_flow_packets_in_flight{{{fs}}}", "{{flow}}")))
    states = dm.ValueMap(options={str(i): dm.ValueMappingResult(text=s, index=i) for i, s in enumerate(CA_STATES)})
    timeline = (statetimeline.Panel().mappings([states]).show_value(cm.VisibilityMode.NEVER).merge_values(True)
                .row_height(0.9))
    lay.add(common_panel(timeline, "Congestion-avoidance state",
                         "tcp_ca_state per flow: open, disorder, cwr, recovery, loss.", "none",
                         [target(f"ccscope_flow_ca_state{{{fs}}}", "{{flow}}")],
                         [(1, "yellow"), (3, "orange"), (4, "red")]))
    lay.add(ts("MSS", "Current sending MSS per flow.", "bytes",
               target(f"ccscope_flow_mss_bytes{{{fs}}}", "{{flow}}")), w=12, h=6)
    lay.add(ts("Exported flows by algorithm", "Per-flow series by congestion control algorithm.", "short",
               target(f"count by (cc) (ccscope_flow_cwnd_segments{{{fs}}})", "{{cc}}")), w=12, h=6)


def _state_panels(lay: Layout) -> None:
    lay.row("Why: each algorithm's own state, and the cause of each retransmit")
    fs = FLOW_SEL
    modes = dm.ValueMap(options={str(i): dm.ValueMappingResult(text=name, color=color, index=i)
                                 for i, (name, color) in enumerate(BBR_MODES)})
    timeline = (statetimeline.Panel().mappings([modes]).show_value(cm.VisibilityMode.NEVER).merge_values(True)
                .row_height(0.9))
    lay.add(common_panel(timeline, "BBR mode", "BBR's mode per flow (ccscope_flow_bbr_mode): startup, drain, "
                         "probe_bw, probe_rtt; each change is copied on the next segment, so a 200 ms PROBE_RTT "
                         "shows.", "none", [target(f"ccscope_flow_bbr_mode{{{fs}}}", "{{flow}}")], []))
    lay.add(ts("BBR bandwidth estimate against delivery rate",
               "BBR's max-filtered bandwidth estimate (what it paces at, times pacing_gain) next to the kernel's "
               "latest delivery rate sample of the same flow.", "Bps",
               target(f"ccscope_flow_bbr_bandwidth_bytes_per_second{{{fs}}}", "estimate {{flow}}"),
               target(f'ccscope_flow_delivery_rate_bytes_per_second{{{fs},cc="bbr"}}', "delivery {{flow}}")))
    lay.add(ts("CUBIC window under its W_max",
               "cwnd of CUBIC flows and the W_max CUBIC set at the last loss (ccscope_flow_cubic_wmax_segments): "
               "the window grows back towards it, concave, then probes beyond it, convex.", "short",
               target(f'ccscope_flow_cwnd_segments{{{fs},cc="cubic"}}', "cwnd {{flow}}"),
               target(f"ccscope_flow_cubic_wmax_segments{{{fs}}}", "W_max {{flow}}")))
    lay.add(ts("Retransmits by cause",
               "Retransmitted segments per second over the exported flows, by the socket's state as the kernel "
               "retransmitted: rto (timeout), fast (recovery), tlp (tail-loss probe), other.", "cps",
               target(f"sum by (cause) (rate(ccscope_flow_retransmits_by_cause_total{{{fs}}}[$__rate_interval]))",
                      "{{cause}}")))


def _pod_panels(lay: Layout) -> None:
    lay.row("By pod (ccscope daemon --labels pod,container: host aggregates by cgroup)")
    pods = TARGET + "," + WORKLOAD_SEL
    lay.add(ts("Queueing delay p90 by pod",
               "p90 of srtt - min_rtt over each pod's flows, from ccscope_cgroup_queueing_delay_seconds "
               "(buckets 1 ms .. 4.2 s); \"other\" holds the cgroups beyond --max-cgroups.", "s",
               target(f"histogram_quantile(0.9, sum by (namespace, pod, le) "
                      f"(rate(ccscope_cgroup_queueing_delay_seconds_bucket{{{pods}}}[$__rate_interval])))",
                      "{{namespace}}/{{pod}}"), steps=[(0.1, "red")]), w=8)
    lay.add(ts("Retransmits by pod", "Retransmitted segments per second of each pod's flows "
               "(ccscope_cgroup_retransmits_total).", "cps",
               target(f"sum by (namespace, pod) (rate(ccscope_cgroup_retransmits_total{{{pods}}}"
                      f"[$__rate_interval]))", "{{namespace}}/{{pod}}")), w=8)
    lay.add(ts("Open flows by pod", "Tracked open TCP flows of each pod (ccscope_cgroup_flows).", "short",
               target(f"sum by (namespace, pod) (ccscope_cgroup_flows{{{pods}}})", "{{namespace}}/{{pod}}")),
            w=8)


def _daemon_health_panels(lay: Layout) -> None:
    lay.row("Daemon health")
    lay.add(ts("Tracked and exported flows", "Flows in the kernel map and flows with per-flow series (--flows).",
               "short", target(f"ccscope_tracked_flows{{{TARGET}}}", "tracked {{instance}}"),
               target(f"ccscope_exported_flows{{{TARGET}}}", "exported {{instance}}")), w=8)
    lay.add(ts("Flow map churn", "Closed flows expired after the grace period, and flows evicted from a full map "
               "(raise --max-flows if evictions persist).", "cps",
               target(f"rate(ccscope_flows_expired_total{{{TARGET}}}[$__rate_interval])", "expired"),
               target(f"rate(ccscope_flow_evictions_total{{{TARGET}}}[$__rate_interval])", "evicted")), w=8)
    lay.add(ts("BPF events", "Tracepoint hits and ring-buffer samples per second; lost samples mean the ring "
               "buffer was full.", "cps",
               target(f"rate(ccscope_bpf_probe_events_total{{{TARGET}}}[$__rate_interval])", "tcp_probe"),
               target(f"rate(ccscope_bpf_retransmit_events_total{{{TARGET}}}[$__rate_interval])",
                      "tcp_retransmit_skb"),
               target(f"rate(ccscope_bpf_samples_total{{{TARGET}}}[$__rate_interval])", "samples"),
               target(f"rate(ccscope_bpf_samples_lost_total{{{TARGET}}}[$__rate_interval])", "lost")), w=8)
    lay.add(ts("Scrape cost", "Time the daemon spends reading the kernel maps per scrape, and whether the "
               "target is up.", "s",
               target(f"ccscope_scrape_duration_seconds{{{TARGET}}}", "map read {{instance}}"),
               target(f"scrape_duration_seconds{{{TARGET}}}", "scrape {{instance}}")), w=12)
    daemons = target(f"ccscope_build_info{{{TARGET}}} * on (job, instance) group_left up{{{TARGET}}}", "",
                     instant=True).format(pm.PromQueryFormat.TABLE)
    lay.add(common_panel(table.Panel().show_header(True), "Daemons",
                         "ccscope version and kernel per scraped daemon, and whether it is up.", "none",
                         [daemons], []), w=12)


# --- ccscope — scenario --------------------------------------------------------------------------------

# A scenario run is the (scenario, run) label pair the runner puts on its namespaces' flows; the runner
# labels one unit (profile x algorithm mix) at a time with short gaps between units. Events are where the
# run's series appear or go stale, with 5 minutes of silence on the other side so the gaps between units do
# not count; offsetting by the query step ($__interval) makes each event true at exactly one step.
RUN_SERIES = f"ccscope_flow_cwnd_segments{{{RUN_SEL}}}"
_BY_RUN = "count by (scenario, run)"
_BY_ALGO = "count by (scenario, algorithm)"
_RECENT = f"(last_over_time({RUN_SERIES}[5m] offset $__interval))"
RUN_ANNOTATIONS = (
    ("Run start", "green",
     f"{_BY_RUN} ({RUN_SERIES}) unless on (scenario, run) {_BY_RUN} {_RECENT}",
     "Run start", "{{scenario}} run {{run}} started"),
    ("Run end", "red",
     f"{_BY_RUN} ({RUN_SERIES} offset $__interval) unless on (scenario, run) {_BY_RUN} ({RUN_SERIES}) "
     f"unless on (scenario, run) {_BY_RUN} (last_over_time({RUN_SERIES}[5m] offset -5m))",
     "Run end", "{{scenario}} run {{run}} ended"),
    ("Algorithm swap", "orange",
     f"({_BY_ALGO} ({RUN_SERIES}) unless on (scenario, algorithm) {_BY_ALGO} {_RECENT}) "
     f"and on (scenario) count by (scenario) {_RECENT}",
     "Algorithm swap", "{{scenario}} switches to {{algorithm}}"),
)


class PrometheusAnnotation(dm.AnnotationQuery, cogbuilder.Builder[dm.AnnotationQuery]):
    """An annotation from a PromQL query, with the Prometheus data source's own keys; its own builder.

    The SDK's AnnotationQuery types the keys every data source shares; Grafana's Prometheus plugin also reads
    step, titleFormat, textFormat, tagKeys and useValueForTime from the same object, so they are added here,
    typed, rather than patched into the JSON afterwards."""

    def __init__(self, name: str, color: str, expr: str, title: str, text: str) -> None:
        super().__init__(name=name, datasource=DS, enable=True, hide=False, icon_color=color, expr=expr,
                         built_in=None)
        self.title_format = title
        self.text_format = text

    def build(self) -> dm.AnnotationQuery:
        return self

    def to_json(self) -> dict[str, object]:
        return {**super().to_json(), "step": "5s", "titleFormat": self.title_format, "textFormat": self.text_format,
                "tagKeys": "scenario,run,algorithm", "useValueForTime": False}


def scenario() -> db.Dashboard:
    lay = Layout()
    by = "profile, algorithm"
    legend = "{{algorithm}} ({{profile}})"
    rs = RUN_SEL
    lay.row("Per-algorithm comparison")
    lay.add(ts("Goodput by algorithm", "Bytes acknowledged per second, summed over the run's flows of each "
               "algorithm.", "Bps",
               target(f"sum by ({by}) (rate(ccscope_flow_bytes_acked_total{{{rs}}}[$__rate_interval]))", legend)))
    lay.add(ts("Mean smoothed RTT by algorithm", "Average srtt of the run's flows per algorithm, with min_rtt.",
               "s", target(f"avg by ({by}) (ccscope_flow_srtt_seconds{{{rs}}})", "srtt " + legend),
               target(f"min by ({by}) (ccscope_flow_min_rtt_seconds{{{rs}}})", "min_rtt " + legend)))
    lay.add(ts("Queueing delay by algorithm", "Mean and worst srtt - min_rtt of the run's flows per algorithm.",
               "s", target(f"avg by ({by}) (ccscope_flow_queueing_delay_seconds{{{rs}}})", "mean " + legend),
               target(f"max by ({by}) (ccscope_flow_queueing_delay_seconds{{{rs}}})", "max " + legend),
               steps=[(0.1, "red")]))
    lay.add(ts("Mean congestion window by algorithm", "Average cwnd in segments per algorithm.", "short",
               target(f"avg by ({by}) (ccscope_flow_cwnd_segments{{{rs}}})", legend)))
    lay.add(ts("Retransmit rate by algorithm", "Retransmitted segments per second per algorithm.", "cps",
               target(f"sum by ({by}) (rate(ccscope_flow_retransmits_total{{{rs}}}[$__rate_interval]))", legend)))
    lay.add(ts("Delivery rate by algorithm", "Sum of the flows' latest delivery-rate samples per algorithm.",
               "Bps", target(f"sum by ({by}) (ccscope_flow_delivery_rate_bytes_per_second{{{rs}}})", legend)))
    lay.add(ts("Fairness (Jain's index) by algorithm",
               "Jain's index of the per-flow goodput within each algorithm: 1 = equal shares, 1/n = one flow "
               "takes all.", "percentunit",
               target(f"(sum by ({by}) (rate(ccscope_flow_bytes_acked_total{{{rs}}}[$__rate_interval])))^2 / "
                      f"(count by ({by}) (rate(ccscope_flow_bytes_acked_total{{{rs}}}[$__rate_interval])) * "
                      f"sum by ({by}) (rate(ccscope_flow_bytes_acked_total{{{rs}}}[$__rate_interval])^2))", legend)))
    lay.add(ts("Flows by algorithm", "Flows of the run with per-flow series, per algorithm.", "short",
               target(f"count by ({by}) (ccscope_flow_cwnd_segments{{{rs}}})", legend)))
    lay.row("Over the selected time range (each algorithm while it was running)")

    def over_range(title: str, description: str, unit: str, expr: str, fn: str = "avg_over_time") -> None:
        lay.add(bar_summary(title, description, unit,
                            target(f"{fn}(({expr})[$__range:$__interval])", legend, instant=True)), w=6)

    over_range("Mean goodput", "Goodput per algorithm averaged over the time it ran.", "Bps",
               f"sum by ({by}) (rate(ccscope_flow_bytes_acked_total{{{rs}}}[$__rate_interval]))")
    over_range("Mean smoothed RTT", "Mean srtt of the algorithm's flows over the time it ran.", "s",
               f"avg by ({by}) (ccscope_flow_srtt_seconds{{{rs}}})")
    over_range("Worst queueing delay", "Highest srtt - min_rtt of any of the algorithm's flows.", "s",
               f"max by ({by}) (ccscope_flow_queueing_delay_seconds{{{rs}}})", "max_over_time")
    lay.add(bar_summary("Retransmits", "Retransmitted segments in the time range per algorithm.", "short",
                        target(f"sum by ({by}) (increase(ccscope_flow_retransmits_total{{{rs}}}[$__range]))", legend,
                               instant=True)), w=6)
    lay.row("Flows of the run")
    lay.add(ts("Congestion window per flow", "cwnd in segments of every flow of the run.", "short",
               target(f"ccscope_flow_cwnd_segments{{{rs}}}", "{{algorithm}} {{flow}}")))
    lay.add(ts("Smoothed RTT per flow", "srtt of every flow of the run.", "s",
               target(f"ccscope_flow_srtt_seconds{{{rs}}}", "{{algorithm}} {{flow}}")))
    variables = [
        datasource_var(), *job_instance_vars(),
        query_var("scenario", "Scenario",
                  f'label_values(ccscope_flow_cwnd_segments{{{TARGET},scenario!=""}}, scenario)',
                  multi=False, include_all=False),
        # The runs in the time range; "All" (the default) compares every run of the scenario shown.
        query_var("run", "Run", f'label_values(ccscope_flow_cwnd_segments{{{TARGET},scenario=~"$scenario"}}, run)',
                  all_value=".+", sort=dm.VariableSort.NUMERICAL_DESC),
    ]
    dash = dashboard("ccscope-scenario", "ccscope — scenario",
                     "Congestion control algorithms compared within one scenario run, with annotations at run "
                     "start, run end and algorithm swaps.", ["ccscope", "tcp", "scenario"], "now-30m")
    for annotation in RUN_ANNOTATIONS:
        dash = dash.annotation(PrometheusAnnotation(*annotation))
    return lay.place(dash.variables(variables))


DASHBOARDS = {"ccscope-live-flows.json": live_flows, "ccscope-scenario.json": scenario}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed JSON is out of date")
    parser.add_argument("--out", type=Path, default=HERE, help="directory to write to (default: here)")
    args = parser.parse_args(argv)
    stale = []
    for name, build in DASHBOARDS.items():
        path = args.out / name
        text = render(build)
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
    if stale:
        print(f"generate.py: out of date: {', '.join(stale)} (run python3 dashboards/generate.py)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
