"""`ccscope serve`: run on the far host of a real-path scenario."""

from __future__ import annotations

import argparse
import os
import shutil
from pathlib import Path

from ccscope.errors import PrerequisiteError, UsageError
from ccscope.units import parse_duration, parse_rate

from .protocol import DEFAULT_PORTS

MAX_TESTS = 4
MAX_SECONDS = 120.0
DEFAULT_USER = "nobody"


def register(sub) -> None:
    from .access import DEFAULT_TOKEN_FILE

    sv = sub.add_parser("serve", help="the far end of real-path scenarios: iperf3 server, downloads, telemetry",
                        description="Answer real-path scenarios from another host: iperf3 and download servers "
                                    "on demand, and this host's BPF telemetry of their flows (the sender's "
                                    "cwnd/srtt when this host sends). Runs nothing but those tests, for clients "
                                    "that prove its token (docs/scenarios.md: running serve on a real network).")
    sv.add_argument("--listen", default="0.0.0.0", help="address to listen on (default 0.0.0.0; :: for IPv6)")
    sv.add_argument("--ports", default=f"{DEFAULT_PORTS[0]}-{DEFAULT_PORTS[1]}",
                    help=f"TCP port range (default {DEFAULT_PORTS[0]}-{DEFAULT_PORTS[1]}): control on the first, "
                         "one test on each of the others")
    sv.add_argument("--token-file", default=str(DEFAULT_TOKEN_FILE),
                    help=f"the token clients must prove; made (0600) and printed on first start (default "
                         f"{DEFAULT_TOKEN_FILE})")
    sv.add_argument("--open", action="store_true",
                    help="no token: anyone who reaches the port may run tests (an isolated lab network only)")
    sv.add_argument("--allow", help="only these networks may connect (comma-separated, e.g. 10.0.0.0/8,192.0.2.7)")
    sv.add_argument("--max-tests", type=int,
                    help=f"tests at once; more are refused as busy (default {MAX_TESTS}, at most the test ports)")
    sv.add_argument("--max-tests-per-source", type=int,
                    help="tests at once from one address (default: one fewer than --max-tests, so one address "
                         "never holds them all)")
    sv.add_argument("--max-seconds", default=f"{MAX_SECONDS:g}s",
                    help=f"longest test a client may ask for (default {MAX_SECONDS:g}s)")
    sv.add_argument("--max-rate", help="a test sending faster than this is stopped (iperf3 "
                                       "--server-bitrate-limit; default: no limit)")
    sv.add_argument("--algorithms", help="offer only these congestion controls (comma-separated; default: all "
                                         "this kernel has); others are refused, and a test running another is "
                                         "stopped")
    sv.add_argument("--user", default=DEFAULT_USER,
                    help=f"when started as root: the user serve and its tests run as once the BPF probe is "
                         f"loaded (default {DEFAULT_USER}; they keep CAP_NET_ADMIN alone, which setting an "
                         "algorithm outside net.ipv4.tcp_allowed_congestion_control needs)")
    sv.add_argument("--no-telemetry", action="store_true", help="do not load the BPF probe")
    sv.add_argument("--sample-interval", default="10ms", help="telemetry sample interval (default 10ms)")
    sv.set_defaults(func=cmd_serve)


def cmd_serve(args: argparse.Namespace) -> int:
    from ccscope.host import privileges
    from ccscope.hosttools import need

    from . import access, server
    from .credentials import iperf3_has_authentication

    ports = server.parse_ports(args.ports)
    test_ports = ports[1] - ports[0]
    if args.max_tests is None:
        args.max_tests = min(MAX_TESTS, test_ports)
    if not 1 <= args.max_tests <= test_ports:
        raise UsageError(f"--max-tests {args.max_tests}: between 1 and {test_ports} (the test ports "
                         f"of --ports {args.ports})")
    per_source = args.max_tests_per_source or max(1, args.max_tests - 1)
    if not 1 <= per_source <= args.max_tests:
        raise UsageError(f"--max-tests-per-source {per_source}: between 1 and --max-tests ({args.max_tests})")
    max_seconds = parse_duration(args.max_seconds, "--max-seconds", 1.0, 3600.0)
    interval = parse_duration(args.sample_interval, "--sample-interval", 0.001, 1.0)
    max_rate = parse_rate(args.max_rate, "--max-rate") if args.max_rate else None
    need("iperf3", "ss")
    root = os.geteuid() == 0
    if not args.no_telemetry and not root:
        raise PrerequisiteError("telemetry needs root (BPF)", "run with sudo, or add --no-telemetry")
    algorithms = None
    if args.algorithms is not None:
        algorithms = [a.strip() for a in args.algorithms.split(",") if a.strip()]
        if not algorithms:
            raise UsageError("--algorithms: give names such as reno,cubic")
    allow = access.parse_networks(args.allow) if args.allow is not None else None
    user = privileges.identity(args.user) if root else None  # before the token file: bad input leaves nothing
    token = None if args.open else _token(Path(args.token_file))
    gate = access.Access(token, allow, server.MAX_CONNECTIONS, server.MAX_CONNECTIONS_PER_SOURCE, per_source)
    policy = server.Policy(args.listen, ports, args.max_tests, max_seconds, algorithms, max_rate)
    users = iperf3_has_authentication() and shutil.which("openssl") is not None
    startup = server.Startup(not args.no_telemetry, interval, users, user)
    return server.run(policy, gate, startup)


def _token(path: Path) -> str:
    from .access import load_or_create_token
    from .server import log

    token, created = load_or_create_token(path)
    if created:
        log(f"token: {token}")
        log(f"(made now and kept in {path}; give it to the runner: `token_file: PATH` in the real-path profile "
            f"with a copy of that file, or CCSCOPE_SERVE_TOKEN)")
    else:
        log(f"token: in {path} (clients must prove it; --open to run without)")
    return token
