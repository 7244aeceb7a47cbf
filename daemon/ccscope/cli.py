"""The `ccscope` command line. Every failure is one line on stderr and a non-zero exit."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import gc
import json
import os
import re
import signal
import ssl
import sys
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from prometheus_client import CollectorRegistry

from . import __version__, check
from . import bpf_types as bt
from .attribution import UNATTRIBUTED, Attributor, LabelOptions
from .bpf_types import Counter
from .cc.provide import shown_names
from .ccstate.decoders import AlgorithmState
from .ccstate.trace_lines import TracedFlows
from .errors import CcscopeError, PrerequisiteError, UsageError
from .exporter import FlowCollector
from .flows import (
    FLOW_COLUMNS,
    FlowFilter,
    FlowRecord,
    FlowSelection,
    attribution_columns,
    decode,
    monotonic_ns,
)
from .linewriter import MAX_QUEUED_BYTES, LineWriter
from .live.app import LiveApp, serve_page, table_rows, table_source
from .live.feed import POLL_MS, SampleFeed
from .live.hub import Hub
from .loader import ProbeOptions
from .metrics_endpoint import MetricsServer
from .otlp import OtlpOptions, OtlpPush
from .telemetry.session import Session
from .tracejson import TraceEncoder
from .units import DEFAULT_LISTEN, parse_duration, parse_listen
from .web import config as webconfig
from .web.http import Authenticator, Limits, serve_promptly

MAX_LIMIT = 1_000_000  # rows of `flows`; more than any flow map holds
SORT_KEYS: dict[str, Callable[[FlowRecord], float]] = {
    "bytes": lambda f: f.bytes_total,
    "cwnd": lambda f: f.cwnd_segments,
    "srtt": lambda f: f.srtt_s,
    "retrans": lambda f: f.retransmits,
    "rate": lambda f: f.delivery_rate_Bps,
}


_NEGATIVE_VALUE = re.compile(r"^-\.?[0-9]")


class _Parser(argparse.ArgumentParser):
    """argparse, but bad flags raise UsageError (one line, exit 2) instead of printing usage."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # A value such as -5s or -1 is a (bad) value, for the flag's own check to refuse by name; stock
        # argparse takes "-5s" for an unknown flag and reports "expected one argument".
        self._negative_number_matcher = _NEGATIVE_VALUE

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _stop_event() -> threading.Event:
    """SIGINT and SIGTERM set the event so the main loop exits and BPF links detach cleanly."""
    stop = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        stop.set()

    signal.signal(signal.SIGINT, handler)
    signal.signal(signal.SIGTERM, handler)
    return stop


def _add_filters(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--netns", action="append", default=[], metavar="INODE",
                        help="only flows in this network namespace (inode, as in `ls -iL /run/netns`)")
    parser.add_argument("--port", action="append", default=[], metavar="PORT",
                        help="only flows with this local or remote port")
    parser.add_argument("--cidr", action="append", default=[], metavar="CIDR",
                        help="only flows with an address in this network")
    parser.add_argument("--comm", action="append", default=[], metavar="NAME",
                        help="only flows of processes with this name (at connect, or at listen if accepted)")
    parser.add_argument("--cgroup", action="append", default=[], metavar="PREFIX",
                        help="only flows of sockets in this cgroup or below (path as in /proc/PID/cgroup)")
    parser.add_argument("--cgroup-root", metavar="DIR",
                        help="cgroup v2 mount to resolve cgroup ids in (default: from /proc/mounts)")
    parser.add_argument("--pod-logs", metavar="DIR",
                        help="kubelet pod log directory, for pod names and namespaces (default /var/log/pods)")


def _filter(args: argparse.Namespace, attributor: Attributor | None = None) -> FlowFilter:
    flow_filter = FlowFilter.parse(args.netns, args.port, args.cidr, args.comm, args.cgroup)
    if flow_filter.cgroups:
        if attributor is None:
            raise PrerequisiteError("--cgroup needs the cgroup v2 hierarchy, and none is mounted",
                                    "mount cgroup2, or point --cgroup-root at it")
        flow_filter.cgroup_path = attributor.resolver.path
    return flow_filter


def _attributor(args: argparse.Namespace, required: bool, cgroup_depth: int = 0,
                follow: bool = True) -> Attributor | None:
    """cgroup/container/pod attribution; best effort (None) for display unless labels or filters need it."""
    try:
        return Attributor.open(args.cgroup_root, args.pod_logs, cgroup_depth, follow=follow)
    except PrerequisiteError:
        if required or args.cgroup:
            raise
        return None


def _probe_options(args: argparse.Namespace, emit_samples: bool) -> ProbeOptions:
    interval = parse_duration(args.sample_interval, "--sample-interval", 0.0001, 10.0)
    if not 64 <= args.max_flows <= 4_000_000:
        raise UsageError(f"--max-flows {args.max_flows} is out of range 64..4000000")
    return ProbeOptions(max_flows=args.max_flows, sample_interval_ns=int(interval * 1e9),
                        emit_samples=emit_samples)


def _add_probe_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sample-interval", default="10ms",
                        help="per-flow minimum spacing of samples (default 10ms)")
    parser.add_argument("--max-flows", type=int, default=16384,
                        help="size of the kernel flow map (default 16384)")


# --- daemon ----------------------------------------------------------------------------------------


def _endpoint_security(args: argparse.Namespace) -> tuple[ssl.SSLContext | None, Authenticator | None,
                                                         list[tuple[str, str]]]:
    """TLS context, authenticator and extra response headers from --web.config.file or the older flags."""
    if args.web_config_file and (args.tls_cert or args.tls_key or args.basic_auth_file):
        raise UsageError("--web.config.file replaces --tls-cert/--tls-key/--basic-auth-file: use one or the other")
    if args.web_config_file:
        path = Path(args.web_config_file)
        config = webconfig.load_web_config(path)
        tls = config.tls.context(f"{webconfig.FLAG} {path}") if config.tls else None
        return tls, webconfig.bcrypt_auth(config.users) if config.users else None, config.headers
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    tls = None
    if args.tls_cert:
        tls = webconfig.TlsConfig(Path(args.tls_cert), Path(args.tls_key)).context("--tls-cert/--tls-key")
    auth = None
    if args.basic_auth_file:
        auth = webconfig.load_basic_auth_file(Path(args.basic_auth_file))
        print("ccscope: warning: --basic-auth-file (unsalted SHA-256) is deprecated; move to --web.config.file "
              "with bcrypt hashes (see README, \"Security defaults\")", file=sys.stderr, flush=True)
    return tls, auth, []


def _otlp_options(args: argparse.Namespace) -> OtlpOptions | None:
    if args.otlp is None:
        if args.listen == "off":
            raise UsageError("--listen off leaves nothing to export: give --otlp URL as well")
        return None
    return OtlpOptions.parse(args.otlp, args.otlp_header, parse_duration(args.otlp_interval, "--otlp-interval", 0.1,
                                                                        3600.0),
                             parse_duration(args.otlp_timeout, "--otlp-timeout", 0.05, 600.0), args.otlp_ca,
                             args.otlp_client_cert, args.otlp_client_key)


def cmd_daemon(args: argparse.Namespace) -> int:
    otlp_options = _otlp_options(args)
    host, port = parse_listen(args.listen) if args.listen != "off" else (None, None)
    selection = FlowSelection.parse(args.flows)
    grace = parse_duration(args.grace, "--grace", 0.0, 3600.0)
    if not 1 <= args.max_connections <= 10_000:
        raise UsageError(f"--max-connections {args.max_connections} is out of range 1..10000")
    tls, auth, headers = _endpoint_security(args)
    labels = LabelOptions.parse(args.labels, args.cgroup_depth)
    if not 1 <= args.max_cgroups <= 100_000:
        raise UsageError(f"--max-cgroups {args.max_cgroups} is out of range 1..100000")
    attributor = _attributor(args, labels.needs_cgroups, labels.cgroup_depth) \
        if labels.needs_cgroups or args.cgroup else None
    flow_filter = _filter(args, attributor)
    options = _probe_options(args, emit_samples=False)
    options.cgroup_stats, options.max_cgroups = labels.needs_cgroups, args.max_cgroups
    stop = _stop_event()
    with Session(options, grace_s=grace) as session:
        collector = FlowCollector(session.table, selection, flow_filter, labels,
                                  attributor if labels.needs_cgroups else None,
                                  states=session.state.states if session.state else None)
        registry = CollectorRegistry()
        registry.register(collector)
        push = OtlpPush(otlp_options, collector.collect) if otlp_options else None
        if push:
            registry.register(push.stats)
        live = None
        if not args.no_live and port is not None:
            # the page's table names the process and the pod or cgroup as `ccscope flows` does: with the daemon's
            # cgroup resolver, else with one of its own where cgroup v2 is there, which takes no inotify watches
            # (the labels were not asked for; a display can rescan on a miss)
            page_attributor = attributor or _attributor(args, False, follow=False)
            live = _live_page(session, flow_filter, options.sample_interval_ns, page_attributor,
                              own_attributor=attributor is None, grace_s=grace)
            live[0].hub.set_states(session.state.states if session.state else None)
            session.start(POLL_MS)
        try:
            server = _metrics_server(args, registry, live, host, port, tls, auth, headers)
        except BaseException:
            _close_live(live)
            if push:
                push.close()
            raise
        scheme = "https" if tls else "http"
        page = f"live page {scheme}://{args.listen}/, " if live else ""
        serving = [f"{page}{scheme}://{args.listen}/metrics"] if server else []
        serving += [f"OTLP to {otlp_options.shown} every {args.otlp_interval}"] if otlp_options else []
        print(f"ccscope {__version__}: serving {' and '.join(serving)} (flows {args.flows}); Ctrl-C to stop",
              file=sys.stderr, flush=True)
        # Everything alive now (the imported libraries, the probe, the server) lives as long as the daemon: out of
        # the collector's sight, a full collection walks only what scrapes leave behind. Without this, one took
        # ~16 ms every ~2 s under scraping, the tail of the endpoint's latency.
        gc.freeze()
        serve_promptly()  # the daemon's threads are the endpoint's: GIL handoffs every 0.5 ms, not 5 (web/http.py)
        expire_every = max(0.5, min(grace / 2, 5.0))
        next_expiry = time.monotonic() + expire_every
        try:
            # Short waits: a signal handler cannot cut an Event.wait short (PEP 475 resumes it), so a long wait
            # would delay the exit on SIGTERM by up to its whole length.
            while not stop.wait(0.2):
                if time.monotonic() >= next_expiry:
                    collector.maintain()  # expires closed flows and deleted cgroups even when nobody scrapes
                    next_expiry = time.monotonic() + expire_every
        finally:
            if live:
                live[0].hub.close()  # the pages' last updates and bye, which the server's close lets them write
            if server:
                server.close()  # stops accepting; a scrape already running may still be reading the probe
            if push:
                push.close()  # one last push, bounded by --otlp-timeout
            collector.close()
            _close_live(live)
    print("ccscope: detached", file=sys.stderr)
    return 0


def _metrics_server(args: argparse.Namespace, registry: CollectorRegistry, live, host: str | None, port: int | None,
                    tls, auth, headers):
    """The page and /metrics, /metrics alone (--no-live), or nothing (--listen off, OTLP only)."""
    if port is None:
        return None
    limits = Limits(max_connections=args.max_connections)
    if live:
        return serve_page(live[0], registry, host, port, limits=limits, tls=tls, auth=auth, extra_headers=headers)
    return MetricsServer(registry, host, port, tls=tls, auth=auth, limits=limits, extra_headers=headers)


def _live_page(session: Session, flow_filter: FlowFilter, sample_interval_ns: int, attributor: Attributor | None,
               own_attributor: bool, grace_s: float):
    """The page's app and sample feed, and the cgroup resolver it owns (None when it shares the daemon's)."""
    own = attributor if own_attributor else None
    hub = Hub(flow_filter=flow_filter, table_rows=functools.partial(table_rows, attributor=attributor),
              table_source=table_source(session.probe, lambda: flow_filter, own, grace_s), cc_names=shown_names)
    try:
        app = LiveApp(hub)
    except Exception:
        hub.close()
        if own:
            own.close()
        raise
    feed = SampleFeed(session, hub, sample_interval_ns)
    hub.on_clients = feed.clients_changed
    return app, feed, own


def _close_live(live) -> None:
    if live:
        app, _, own = live
        app.hub.close()  # returns once no table read is in progress
        if own:
            own.close()


# --- flows -----------------------------------------------------------------------------------------


RetransmitCauses = Mapping[int, Mapping[bt.RetransCause, int]]  # loader.retransmit_causes(): cookie -> counts


def format_flows(flows: list[FlowRecord], attributor: Attributor | None = None,
                 states: Mapping[int, AlgorithmState] | None = None, causes: RetransmitCauses | None = None) -> str:
    """The table; with `causes`, a column of why each flow retransmitted; with `states`, a last column of each
    algorithm's own state as `ss -i` words it."""
    columns = (*FLOW_COLUMNS, *attribution_columns(attributor))
    header = ("  ".join(f"{c.title:{c.spec}}" for c in columns) +
              (f"  {'WHY RETRANS':<{CAUSES_WIDTH}}" if causes is not None else "") +
              ("  ALGORITHM STATE" if states is not None else ""))
    rows = ["  ".join(f"{c.text(f):{c.spec}}" for c in columns) +
            (f"  {_causes_cell(causes.get(f.cookie)):<{CAUSES_WIDTH}}" if causes is not None else "") +
            (f"  {states[f.cookie].summary()}" if states and f.cookie in states else "") for f in flows]
    return "\n".join(line.rstrip() for line in [header, *rows])


CAUSES_WIDTH = 24


def _causes_cell(counts: Mapping[bt.RetransCause, int] | None) -> str:
    """The causes a flow retransmitted for since ccscope met it, e.g. fast:12,tlp:3; - for none."""
    return ",".join(f"{cause.name.lower()}:{n}" for cause, n in (counts or {}).items() if n) or "-"


def _causes_dict(counts: Mapping[bt.RetransCause, int] | None) -> dict[str, int]:
    """`ccscope flows --json`'s retransmits_by_cause: every cause, 0 where the flow had none."""
    return {cause.name.lower(): (counts or {}).get(cause, 0) for cause in bt.RetransCause}


def _attributed(data: dict, attributor: Attributor | None) -> dict:
    """A flow's as_dict() keys plus the cgroup path, container and pod (empty where unknown)."""
    data.update(dataclasses.asdict(attributor(data["cgroup_id"]) if attributor else UNATTRIBUTED))
    return data


def _with_state(data: dict, states: Mapping[int, AlgorithmState] | None) -> dict:
    """A flow's as_dict() keys plus `state`: its algorithm's own (ccstate), or null."""
    state = states.get(data["cookie"]) if states else None
    data["state"] = state.as_dict() if state else None
    return data


def cmd_flows(args: argparse.Namespace) -> int:
    interval = parse_duration(args.interval, "--interval", 0.1, 3600.0)
    if not 1 <= args.limit <= MAX_LIMIT:
        raise UsageError(f"--limit {args.limit} is out of range 1..{MAX_LIMIT}")
    attributor = _attributor(args, required=False)
    flow_filter = _filter(args, attributor)
    stop = _stop_event()
    live = sys.stdout.isatty() and not args.once
    options = _probe_options(args, emit_samples=False)
    with Session(options, grace_s=2.0) as session:
        table, state_probe = session.table, session.state
        if args.once:
            stop.wait(interval)  # let tcp_probe see the flows first
        while True:
            flows = [f for f in table.snapshot() if flow_filter.matches(f) and not f.closed_ns]
            flows.sort(key=SORT_KEYS[args.sort], reverse=True)
            shown = flows[: args.limit]
            if attributor:
                attributor.refresh()
            states = state_probe.states([f.cookie for f in shown]) if state_probe else None
            causes = session.probe.retransmit_causes([f.cookie for f in shown])
            if args.json:
                print(json.dumps([_attributed(_with_state(f.as_dict(), states), attributor) |
                                  {"retransmits_by_cause": _causes_dict(causes.get(f.cookie))} for f in shown]),
                      flush=True)
            else:
                if live:
                    print("\033[H\033[2J", end="")
                print(f"{len(flows)} flows, sorted by {args.sort} ({time.strftime('%H:%M:%S')})\n"
                      f"{format_flows(shown, attributor, states, causes)}", flush=True)
            if args.once or stop.wait(interval):
                return 0


# --- trace -----------------------------------------------------------------------------------------


def _trace_text(flow: FlowRecord, wall_offset: float) -> bytes:
    """One sample as `ccscope trace`'s text line (--json: tracejson.py)."""
    wall = flow.last_ns / 1e9 + wall_offset
    return (f"{time.strftime('%H:%M:%S', time.localtime(wall))}.{int(wall % 1 * 1e3):03d} {flow.name} "
            f"{flow.cc} cwnd={flow.cwnd_segments} srtt={flow.srtt_s * 1e3:.2f}ms "
            f"retrans={flow.retransmits} {flow.ca_state}{' CLOSED' if flow.closed_ns else ''}").encode()


# A trace's lines go out in batches this far apart. Each poll is a wakeup, about 0.1-0.2 ms of CPU on this VM, and
# its first records meet cold caches: at 100 ms `ccscope trace --json` took 1.0-1.2 % of a core for 855 samples/s
# (40 sockets at 10 ms), at 200 ms 0.7-0.8 % (bench/telemetry.py measure 5).
TRACE_POLL_MS = 200


def _trace_duration(raw: str | None) -> float | None:
    """Seconds to trace, None for until stopped. 0 is refused, as `timeout 0` style "no limit" would surprise
    someone who typed a length; leaving the flag out is how to trace until Ctrl-C (or --count)."""
    if raw is None:
        return None
    return parse_duration(raw, "--duration", 0.001, 30 * 86400,
                          too_low="is shorter than {low} (leave --duration out to trace until Ctrl-C)")


def cmd_trace(args: argparse.Namespace) -> int:
    duration = _trace_duration(args.duration)
    if args.count is not None and args.count < 1:
        raise UsageError("--count must be at least 1")
    attributor = _attributor(args, required=False)
    flow_filter = _filter(args, attributor)
    stop = _stop_event()
    wall_offset = time.time() - monotonic_ns() / 1e9
    emitted = 0
    pending: list[bytes] = []  # written once per poll: one write per batch, not per sample
    names = TracedFlows()  # the flows this trace shows, for their state changes

    encoder = TraceEncoder(wall_offset, attributor)

    # Per sample, names bound once: at ~850 samples/s each attribute lookup in this loop is CPU that measure 5
    # (bench/telemetry.py: ss -tin polling / ccscope trace) counts.
    count, as_json, decoded = args.count, args.json, flow_filter.beyond_ids or not args.json
    matches_ids, matches, knows, line, append = (flow_filter.matches_ids, flow_filter.matches, names.knows,
                                                 encoder.line, pending.append)

    def on_samples(flows: list[bt.FlowTuple]) -> None:
        nonlocal emitted
        for flow in flows:
            if count is not None and emitted >= count:
                return
            if not matches_ids(flow):  # netns and ports, before paying for a decode
                continue
            record = decode(flow) if decoded else None
            if record is not None and not matches(record):
                continue
            if not knows(flow.cookie):
                names.saw(flow.cookie, (record or decode(flow)).name)
            append(line(flow) if as_json else _trace_text(record, wall_offset))
            emitted += 1
            if count is not None and emitted >= count:
                stop.set()

    deadline = time.monotonic() + duration if duration else None
    gc.freeze()  # per-sample objects die by refcount; spare the collector walking everything imported at start
    sys.stdout.flush()
    # Never a blocking write here: a reader that stalls must not stop --duration or the signals (linewriter.py).
    writer = LineWriter(sys.stdout.fileno())
    options = _probe_options(args, emit_samples=True)
    with Session(options, state=args.state) as session:
        changed: list[bytes] = []
        session.on_samples(on_samples)
        session.on_changes(changed.extend)

        def drain_changes() -> None:  # every poll: a change may wait one poll for its flow's first sample
            if changed:
                pending.extend(names.state_lines(changed, wall_offset, args.json))
                changed.clear()

        try:
            while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                session.poll(TRACE_POLL_MS if deadline is None else
                             max(0, min(TRACE_POLL_MS, round((deadline - time.monotonic()) * 1000))))
                drain_changes()
                if attributor:
                    attributor.refresh()
                encoder.refresh()
                if pending and not writer.put(pending):
                    break
                pending.clear()
            else:
                # Ctrl-C, --duration or --count ended it: what the kernel wrote before that still goes out (the
                # records wait in the ring up to TRACE_POLL_MS for the next drain, and a signal cuts that wait short)
                session.poll(0)
                drain_changes()
                writer.put(pending)
        finally:
            lost = session.probe.counters()
    writer.finish(_signalled_again())
    if writer.error is not None:  # `> /dev/full`: said, where it used to end in silence
        raise CcscopeError(f"cannot write the samples: {writer.error.strerror or writer.error}")
    if lost[Counter.SAMPLES_LOST]:
        print(f"ccscope: {lost[Counter.SAMPLES_LOST]} samples lost (ring buffer full)", file=sys.stderr)
    if writer.dropped and not writer.reader_gone:
        print(f"ccscope: {writer.dropped} samples not written: the reader of the output fell more than "
              f"{MAX_QUEUED_BYTES >> 20} MiB behind, or stopped reading", file=sys.stderr)
    _quiet_stdout_close()
    return 0


def _signalled_again() -> Callable[[], bool]:
    """From now on SIGINT or SIGTERM only end the wait for the output to drain: true once one came."""
    again = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda _signum, _frame: again.set())
    return again.is_set


def _quiet_stdout_close() -> None:
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


# --- check -----------------------------------------------------------------------------------------


def cmd_check(args: argparse.Namespace) -> int:
    results = check.run_checks()
    print(check.format_table(results))
    failed = [r.name for r in results if r.failed]
    if failed:
        print(f"ccscope: cannot run here: {', '.join(failed)} (see the table above)", file=sys.stderr)
        return 3
    return 0


# --- parser ----------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="ccscope", description="Live TCP congestion telemetry from eBPF.")
    parser.add_argument("--version", action="version", version=f"ccscope {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    daemon = sub.add_parser("daemon", help="export per-flow and host TCP telemetry to Prometheus")
    daemon.add_argument("--listen", default=DEFAULT_LISTEN,
                        help=f"HOST:PORT (default {DEFAULT_LISTEN}), or off to push over --otlp only")
    daemon.add_argument("--flows", default="top:50",
                        help="per-flow series for top:N flows by bytes, all, or none (default top:50)")
    daemon.add_argument("--grace", default="10s", help="keep closed flows' series this long (default 10s)")
    daemon.add_argument("--web.config.file", dest="web_config_file", metavar="FILE",
                        help="TLS and basic auth (bcrypt) from a Prometheus exporter-toolkit web config file")
    daemon.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    daemon.add_argument("--tls-key", help="private key for --tls-cert (PEM)")
    daemon.add_argument("--basic-auth-file", help="deprecated: user:sha256(password) lines; use --web.config.file")
    daemon.add_argument("--max-connections", type=int, default=Limits.max_connections,
                        help=f"open client connections served at once (default {Limits.max_connections})")
    daemon.add_argument("--no-live", action="store_true",
                        help="serve /metrics only, without the live page at /")
    daemon.add_argument("--labels", metavar="LIST",
                        help="attribution labels on per-flow series, any of comm,cgroup,container,pod "
                             "(default none); cgroup, container and pod also add host aggregates by cgroup")
    daemon.add_argument("--cgroup-depth", type=int, default=0, metavar="N",
                        help="keep the first N components of cgroup paths in the cgroup label (default 0: all)")
    daemon.add_argument("--max-cgroups", type=int, default=ProbeOptions.max_cgroups, metavar="N",
                        help="cgroups with their own host aggregates; the rest are counted as \"other\" "
                             f"(default {ProbeOptions.max_cgroups})")
    otlp = daemon.add_argument_group("OTLP push (needs the otlp extra: pip install 'ccscope[otlp]')")
    otlp.add_argument("--otlp", metavar="URL",
                      help="also push the series over OTLP/HTTP to this metrics URL, e.g. "
                           "http://127.0.0.1:4318/v1/metrics or Prometheus 3's .../api/v1/otlp/v1/metrics")
    otlp.add_argument("--otlp-header", action="append", metavar="NAME=VALUE",
                      help="a request header, e.g. Authorization=Bearer ... (repeatable)")
    otlp.add_argument("--otlp-interval", default="10s", help="push interval (default 10s)")
    otlp.add_argument("--otlp-timeout", default="5s", help="give up on one push after this (default 5s)")
    otlp.add_argument("--otlp-ca", metavar="FILE", help="CA certificates (PEM) to trust for an https URL")
    otlp.add_argument("--otlp-client-cert", metavar="FILE", help="client certificate (PEM) for mutual TLS")
    otlp.add_argument("--otlp-client-key", metavar="FILE", help="its private key (PEM)")
    _add_probe_flags(daemon)
    _add_filters(daemon)
    daemon.set_defaults(func=cmd_daemon)

    flows = sub.add_parser("flows", help="live table of TCP flows, like `ss -ti` but streaming and sorted")
    flows.add_argument("--sort", choices=sorted(SORT_KEYS), default="bytes")
    flows.add_argument("--limit", type=int, default=30, help="rows to show (default 30)")
    flows.add_argument("--interval", default="1s", help="refresh interval (default 1s)")
    flows.add_argument("--once", action="store_true", help="print one table and exit")
    flows.add_argument("--json", action="store_true", help="one JSON array per refresh")
    _add_probe_flags(flows)
    _add_filters(flows)
    flows.set_defaults(func=cmd_flows)

    trace = sub.add_parser("trace", help="stream per-flow samples (JSON lines with --json)")
    trace.add_argument("--json", action="store_true", help="JSON lines instead of text")
    trace.add_argument("--duration", help="stop after this long (e.g. 30s; without it, until Ctrl-C or --count)")
    trace.add_argument("--count", type=int, help="stop after this many samples")
    trace.add_argument("--state", action="store_true",
                       help="also a line at each change of a flow's algorithm state (BBR's mode; CUBIC's W_max, "
                            "its epoch): the whole state after it")
    _add_probe_flags(trace)
    _add_filters(trace)
    trace.set_defaults(func=cmd_trace)

    checker = sub.add_parser("check", help="can this kernel run ccscope? what is missing, and the fix")
    checker.set_defaults(func=cmd_check)

    from .cc.cli import register as register_cc
    from .scenario.cli import register as register_scenario
    from .serve.cli import register as register_serve

    register_scenario(sub)
    register_serve(sub)
    register_cc(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
        if not getattr(args, "func", None):
            raise UsageError("missing COMMAND (see `ccscope --help`)")
        return args.func(args)
    except CcscopeError as exc:
        print(f"ccscope: error: {exc.line()}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("ccscope: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
