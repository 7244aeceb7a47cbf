"""`ccscope serve`: run on the far host of a real-path scenario."""

from __future__ import annotations

import argparse
import os

from ccscope.errors import PrerequisiteError, UsageError
from ccscope.units import parse_duration

from .protocol import DEFAULT_PORTS

MAX_TESTS = 4
MAX_SECONDS = 120.0


def register(sub) -> None:
    sv = sub.add_parser("serve", help="the far end of real-path scenarios: iperf3 server, downloads, telemetry",
                        description="Answer real-path scenarios from another host: iperf3 and download servers "
                                    "on demand, and this host's BPF telemetry of their flows (the sender's "
                                    "cwnd/srtt when this host sends). Runs nothing but those tests.")
    sv.add_argument("--listen", default="0.0.0.0", help="address to listen on (default 0.0.0.0; :: for IPv6)")
    sv.add_argument("--ports", default=f"{DEFAULT_PORTS[0]}-{DEFAULT_PORTS[1]}",
                    help=f"TCP port range (default {DEFAULT_PORTS[0]}-{DEFAULT_PORTS[1]}): control on the first, "
                         "one test on each of the others")
    sv.add_argument("--max-tests", type=int,
                    help=f"tests at once; more are refused as busy (default {MAX_TESTS}, at most the test ports)")
    sv.add_argument("--max-seconds", default=f"{MAX_SECONDS:g}s",
                    help=f"longest test a client may ask for (default {MAX_SECONDS:g}s)")
    sv.add_argument("--algorithms", help="offer only these congestion controls (comma-separated; default: all "
                                         "this kernel has); others are refused")
    sv.add_argument("--no-telemetry", action="store_true", help="do not load the BPF probe")
    sv.add_argument("--sample-interval", default="10ms", help="telemetry sample interval (default 10ms)")
    sv.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from ccscope.hosttools import need

    from . import server

    ports = server.parse_ports(args.ports)
    if args.max_tests is None:
        args.max_tests = min(MAX_TESTS, ports[1] - ports[0])
    if not 1 <= args.max_tests <= ports[1] - ports[0]:
        raise UsageError(f"--max-tests {args.max_tests}: between 1 and {ports[1] - ports[0]} (the test ports "
                         f"of --ports {args.ports})")
    max_seconds = parse_duration(args.max_seconds, "--max-seconds", 1.0, 3600.0)
    interval = parse_duration(args.sample_interval, "--sample-interval", 0.001, 1.0)
    need("iperf3")
    if not args.no_telemetry and os.geteuid() != 0:
        raise PrerequisiteError("telemetry needs root (BPF)", "run with sudo, or add --no-telemetry")
    algorithms = None
    if args.algorithms is not None:
        algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
        if not algorithms:
            raise UsageError("--algorithms: give names such as reno,cubic")
    return server.run(args.listen, ports, args.max_tests, max_seconds, not args.no_telemetry, interval, algorithms)
