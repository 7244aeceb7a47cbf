"""The `ccscope` command line. Every failure is one line on stderr and a non-zero exit."""

from __future__ import annotations

import argparse
import gc
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from prometheus_client import CollectorRegistry

from . import __version__, check
from .attribution import Attribution, Attributor, LabelOptions
from .bpf_types import EVENT_NAMES, Counter
from .errors import CcscopeError, PrerequisiteError, UsageError
from .exporter import FlowCollector
from .flows import FlowFilter, FlowRecord, FlowSelection, FlowTable, decode, monotonic_ns
from .loader import ProbeOptions, TelemetryProbe
from .server import MetricsServer, load_basic_auth
from .units import DEFAULT_LISTEN, parse_duration, parse_listen

SORT_KEYS: dict[str, Callable[[FlowRecord], float]] = {
    "bytes": lambda f: f.bytes_total,
    "cwnd": lambda f: f.cwnd_segments,
    "srtt": lambda f: f.srtt_s,
    "retrans": lambda f: f.retransmits,
    "rate": lambda f: f.delivery_rate_Bps,
}


class _Parser(argparse.ArgumentParser):
    """argparse, but bad flags raise UsageError (one line, exit 2) instead of printing usage."""

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


def _attributor(args: argparse.Namespace, required: bool, cgroup_depth: int = 0) -> Attributor | None:
    """cgroup/container/pod attribution; best effort (None) for display unless labels or filters need it."""
    try:
        return Attributor.open(args.cgroup_root, args.pod_logs, cgroup_depth)
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


def cmd_daemon(args: argparse.Namespace) -> int:
    host, port = parse_listen(args.listen)
    selection = FlowSelection.parse(args.flows)
    grace = parse_duration(args.grace, "--grace", 0.0, 3600.0)
    if bool(args.tls_cert) != bool(args.tls_key):
        raise UsageError("--tls-cert and --tls-key go together")
    tls = (Path(args.tls_cert), Path(args.tls_key)) if args.tls_cert else None
    users = load_basic_auth(Path(args.basic_auth_file)) if args.basic_auth_file else None
    labels = LabelOptions.parse(args.labels, args.cgroup_depth)
    if not 1 <= args.max_cgroups <= 100_000:
        raise UsageError(f"--max-cgroups {args.max_cgroups} is out of range 1..100000")
    attributor = _attributor(args, labels.needs_cgroups, labels.cgroup_depth) \
        if labels.needs_cgroups or args.cgroup else None
    flow_filter = _filter(args, attributor)
    options = _probe_options(args, emit_samples=False)
    options.cgroup_stats, options.max_cgroups = labels.needs_cgroups, args.max_cgroups
    stop = _stop_event()
    with TelemetryProbe(options) as probe:
        table = FlowTable(probe, grace_s=grace)
        collector = FlowCollector(table, selection, flow_filter, labels,
                                  attributor if labels.needs_cgroups else None)
        registry = CollectorRegistry()
        registry.register(collector)
        server = MetricsServer(registry, host, port, tls=tls, basic_auth=users)
        scheme = "https" if tls else "http"
        print(f"ccscope {__version__}: serving {scheme}://{args.listen}/metrics "
              f"(flows {args.flows}); Ctrl-C to stop", file=sys.stderr, flush=True)
        try:
            while not stop.wait(max(0.5, min(grace / 2, 5.0))):
                collector.maintain()  # expires closed flows and deleted cgroups even when nobody scrapes
        finally:
            server.close()
    print("ccscope: detached", file=sys.stderr)
    return 0


# --- flows -----------------------------------------------------------------------------------------


def _rate(bytes_per_s: float | None) -> str:
    if bytes_per_s is None:
        return "-"
    bits = bytes_per_s * 8
    for unit, scale in (("Gb", 1e9), ("Mb", 1e6), ("kb", 1e3)):
        if bits >= scale:
            return f"{bits / scale:.1f}{unit}"
    return f"{bits:.0f}b"


def _bytes(count: int) -> str:
    for unit, scale in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f}{unit}"
    return str(count)


def _fit(text: str, width: int) -> str:
    """Long cgroup paths keep their informative end."""
    return text if len(text) <= width else "…" + text[-(width - 1):]


def _workload(attribution: Attribution) -> str:
    if attribution.pod:
        return _fit(f"{attribution.namespace}/{attribution.pod}", 36)
    return _fit(attribution.cgroup, 36) if attribution.cgroup else "-"


FLOW_COLUMNS: tuple[tuple[str, str, Callable[[FlowRecord], str]], ...] = (
    ("FLOW", "<44", lambda f: f.name),
    ("NETNS", ">10", lambda f: str(f.netns)),
    ("CC", "<7", lambda f: f.cc),
    ("STATE", "<9", lambda f: f.ca_state),
    ("CWND", ">6", lambda f: str(f.cwnd_segments)),
    ("SSTHR", ">6", lambda f: "-" if f.ssthresh_segments is None else str(f.ssthresh_segments)),
    ("SRTT", ">8", lambda f: f"{f.srtt_s * 1e3:.2f}ms"),
    ("MINRTT", ">8", lambda f: "-" if f.min_rtt_s is None else f"{f.min_rtt_s * 1e3:.2f}ms"),
    ("DELIVERY", ">9", lambda f: _rate(f.delivery_rate_Bps)),
    ("PACING", ">9", lambda f: _rate(f.pacing_rate_Bps)),
    ("BYTES", ">7", lambda f: _bytes(f.bytes_total)),
    ("RETRANS", ">7", lambda f: str(f.retransmits)),
    ("COMM", "<15", lambda f: f.comm or "-"),
)


def format_flows(flows: list[FlowRecord], attributor: Attributor | None = None) -> str:
    def workload(flow: FlowRecord) -> str:
        return _workload(attributor(flow.cgroup_id)) if attributor else "-"

    columns = (*FLOW_COLUMNS, ("CGROUP/POD", "<36", workload))
    header = "  ".join(f"{title:{spec}}" for title, spec, _ in columns).rstrip()
    rows = ["  ".join(f"{get(f):{spec}}" for _, spec, get in columns).rstrip() for f in flows]
    return "\n".join([header, *rows])


def _attributed(flow: FlowRecord, attributor: Attributor | None) -> dict:
    """as_dict() plus the cgroup path, container and pod (empty where unknown)."""
    data = flow.as_dict()
    found = attributor(flow.cgroup_id) if attributor else Attribution()
    data.update(cgroup=found.cgroup, container=found.container, pod=found.pod, namespace=found.namespace,
                pod_uid=found.pod_uid)
    return data


def cmd_flows(args: argparse.Namespace) -> int:
    interval = parse_duration(args.interval, "--interval", 0.1, 3600.0)
    attributor = _attributor(args, required=False)
    flow_filter = _filter(args, attributor)
    stop = _stop_event()
    live = sys.stdout.isatty() and not args.once
    with TelemetryProbe(_probe_options(args, emit_samples=False)) as probe:
        table = FlowTable(probe, grace_s=2.0)
        if args.once:
            stop.wait(interval)  # let tcp_probe see the flows first
        while True:
            flows = [f for f in table.snapshot() if flow_filter.matches(f) and not f.closed_ns]
            flows.sort(key=SORT_KEYS[args.sort], reverse=True)
            shown = flows[: args.limit]
            if attributor:
                attributor.refresh()
            if args.json:
                print(json.dumps([_attributed(f, attributor) for f in shown]), flush=True)
            else:
                if live:
                    print("\033[H\033[2J", end="")
                print(f"{len(flows)} flows, sorted by {args.sort} "
                      f"({time.strftime('%H:%M:%S')})\n{format_flows(shown, attributor)}", flush=True)
            if args.once or stop.wait(interval):
                return 0


# --- trace -----------------------------------------------------------------------------------------


def _trace_line(flow: FlowRecord, wall_offset: float, as_json: bool, attributor: Attributor | None = None) -> str:
    wall = flow.last_ns / 1e9 + wall_offset
    if as_json:
        data = _attributed(flow, attributor)
        data["time"] = round(wall, 6)
        data["event"] = EVENT_NAMES.get(flow.event, str(flow.event))
        return json.dumps(data)
    return (f"{time.strftime('%H:%M:%S', time.localtime(wall))}.{int(wall % 1 * 1e3):03d} {flow.name} "
            f"{flow.cc} cwnd={flow.cwnd_segments} srtt={flow.srtt_s * 1e3:.2f}ms "
            f"retrans={flow.retransmits} {flow.ca_state}{' CLOSED' if flow.closed_ns else ''}")


def cmd_trace(args: argparse.Namespace) -> int:
    duration = parse_duration(args.duration, "--duration", 0.0, 30 * 86400) if args.duration else None
    if args.count is not None and args.count < 1:
        raise UsageError("--count must be at least 1")
    attributor = _attributor(args, required=False)
    flow_filter = _filter(args, attributor)
    stop = _stop_event()
    wall_offset = time.time() - monotonic_ns() / 1e9
    emitted = 0
    pending: list[str] = []  # written once per poll: one write per batch, not per sample

    def on_sample(raw) -> None:
        nonlocal emitted
        flow = decode(raw)
        if not flow_filter.matches(flow) or stop.is_set():
            return
        pending.append(_trace_line(flow, wall_offset, args.json, attributor))
        emitted += 1
        if args.count is not None and emitted >= args.count:
            stop.set()

    deadline = time.monotonic() + duration if duration else None
    gc.freeze()  # per-sample objects die by refcount; spare the collector walking everything imported at start
    with TelemetryProbe(_probe_options(args, emit_samples=True)) as probe:
        ring = probe.ring_buffer(on_sample)
        try:
            while not stop.is_set() and (deadline is None or time.monotonic() < deadline):
                ring.poll(100)
                if attributor:
                    attributor.refresh()
                if pending and not _write_lines(pending):
                    break
                pending.clear()
        finally:
            ring.close()
            lost = probe.counters()
    if lost[Counter.SAMPLES_LOST]:
        print(f"ccscope: {lost[Counter.SAMPLES_LOST]} samples lost (ring buffer full)", file=sys.stderr)
    _quiet_stdout_close()
    return 0


def _write_lines(lines: list[str]) -> bool:
    """Write every byte, also across partial writes a signal causes on a full pipe; False once the reader is
    gone (`ccscope trace | head`)."""
    sys.stdout.flush()
    view = memoryview(("\n".join(lines) + "\n").encode())
    while view:
        try:
            view = view[os.write(sys.stdout.fileno(), view):]
        except BrokenPipeError:
            return False
    return True


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
    daemon.add_argument("--listen", default=DEFAULT_LISTEN, help=f"HOST:PORT (default {DEFAULT_LISTEN})")
    daemon.add_argument("--flows", default="top:50",
                        help="per-flow series for top:N flows by bytes, all, or none (default top:50)")
    daemon.add_argument("--grace", default="10s", help="keep closed flows' series this long (default 10s)")
    daemon.add_argument("--tls-cert", help="serve HTTPS with this certificate (PEM)")
    daemon.add_argument("--tls-key", help="private key for --tls-cert (PEM)")
    daemon.add_argument("--basic-auth-file", help="require basic auth; file of user:sha256(password) lines")
    daemon.add_argument("--labels", metavar="LIST",
                        help="attribution labels on per-flow series, any of comm,cgroup,container,pod "
                             "(default none); cgroup, container and pod also add host aggregates by cgroup")
    daemon.add_argument("--cgroup-depth", type=int, default=0, metavar="N",
                        help="keep the first N components of cgroup paths in the cgroup label (default 0: all)")
    daemon.add_argument("--max-cgroups", type=int, default=ProbeOptions.max_cgroups, metavar="N",
                        help="cgroups with their own host aggregates; the rest are counted as \"other\" "
                             f"(default {ProbeOptions.max_cgroups})")
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
    trace.add_argument("--duration", help="stop after this long (e.g. 30s)")
    trace.add_argument("--count", type=int, help="stop after this many samples")
    _add_probe_flags(trace)
    _add_filters(trace)
    trace.set_defaults(func=cmd_trace)

    checker = sub.add_parser("check", help="can this kernel run ccscope? what is missing, and the fix")
    checker.set_defaults(func=cmd_check)

    from .scenario.cli import register as register_scenario

    register_scenario(sub)
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
