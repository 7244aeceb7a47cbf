"""`ccscope scenario ...`, `ccscope report DIR`, `ccscope cleanup`.

Every ccscope command builds this parser, so the heavy modules are imported by the command that needs
them: the emulation stack (spec, runner, cleanup: pyroute2, ~0.25 s) and matplotlib (report, ~0.5 s).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from ccscope.errors import PrerequisiteError, UsageError
from ccscope.units import DEFAULT_LISTEN, parse_listen


def register(sub) -> None:
    sc = sub.add_parser("scenario", help="run a congestion-control experiment: list | run FILE | NAME",
                        description="Run a scenario: every profile x algorithm x run on an emulated path, "
                                    "then write results.json, per-flow CSVs and report.html.")
    sc.add_argument("target", metavar="list|run|NAME|FILE", help="`list`, `run FILE.yaml`, or a built-in name")
    sc.add_argument("file", nargs="?", help="scenario YAML (after `run`)")
    sc.add_argument("--quick", action="store_true", help="the scenario's short variant (a first look in minutes)")
    sc.add_argument("--runs", type=int, help="repetitions of every profile x algorithm (randomized order)")
    sc.add_argument("--duration", help="bulk flow duration, whole seconds (e.g. 20s)")
    sc.add_argument("--algorithms", help="comma-separated, replaces the scenario's list (e.g. cubic,bbr; "
                                           "cubic+bbr for a competing set in one run)")
    sc.add_argument("--target", dest="far_end", metavar="HOST[:PORT]",
                    help="the far end of every real-path profile (scenarios/templates/real-wired-vs-wireless.yaml)")
    sc.add_argument("--via", metavar="PROFILE=IFACE", action="append",
                    help="the interface (or source address) a real-path profile goes out through; repeatable")
    sc.add_argument("--skip-unavailable", action="store_true",
                    help="run without algorithms this kernel lacks instead of failing")
    sc.add_argument("--out", help="output directory (default ./results/<scenario>-<timestamp>)")
    sc.add_argument("--listen", help=f"live page and Prometheus endpoint HOST:PORT (default {DEFAULT_LISTEN}, "
                                     "skipped with a note if busy); 'off' to disable")
    sc.add_argument("--backend", choices=("auto", "netem", "userspace"), default="auto",
                    help="link emulation backend (default auto: netem when the kernel has it)")
    sc.add_argument("--no-verify", action="store_true", help="skip the RTT/rate check of each emulated path")
    sc.add_argument("--no-report", action="store_true",
                    help="write results.json and the CSVs only; `ccscope report DIR` renders report.html later "
                         "(for shards, slow machines and scripts)")
    sc.add_argument("--resume", metavar="DIR",
                    help="finish an interrupted scenario: run only the runs missing from DIR, same seed and order "
                         "(give the same scenario and flags as the first time)")
    sc.add_argument("--shard", metavar="K/N",
                    help="run only shard K of N (from 0) of the seeded plan, for sweeps on many machines; env/N "
                         "takes K from JOB_COMPLETION_INDEX or SLURM_ARRAY_TASK_ID; combine with `ccscope merge`")
    sc.add_argument("--cleanup-stale", action="store_true",
                    help="remove what killed runs left behind (as `ccscope cleanup` does) instead of refusing to start")
    sc.set_defaults(func=cmd_scenario)

    rp = sub.add_parser("report", help="re-render report.html and plots from a results directory")
    rp.add_argument("directory", help="a directory written by `ccscope scenario`")
    rp.set_defaults(func=cmd_report)

    mg = sub.add_parser("merge", help="combine the results directories of a sweep's shards into one",
                        description="Combine the results directories of `ccscope scenario ... --shard K/N` runs "
                                    "into one results.json, CSVs and report.html, as if one machine had run the "
                                    "whole plan. Missing shards give a report marked incomplete.")
    mg.add_argument("out", metavar="OUT", help="output directory (new or empty)")
    mg.add_argument("directories", metavar="DIR", nargs="+", help="a shard's results directory")
    mg.set_defaults(func=cmd_merge)

    ex = sub.add_parser("export", help="a results directory as tables (samples, runs, summary) for pandas, "
                                       "Polars or DuckDB",
                        description="Write a results directory as three tidy tables: every flow's samples, one "
                                    "row per flow of every run, and the summary (docs/scenarios.md).")
    ex.add_argument("directory", help="a directory written by `ccscope scenario` or `ccscope merge`")
    ex.add_argument("--format", default="parquet", choices=("parquet", "csv"),
                    help="parquet (needs the export extra: pip install 'ccscope[export]') or csv (default: parquet)")
    ex.add_argument("--out", metavar="DIR", help="where the tables go (default: DIRECTORY/tables)")
    ex.set_defaults(func=cmd_export)

    cl = sub.add_parser("cleanup", help="remove namespaces, qdiscs, rules, sysctls and BPF congestion "
                                        "controls a killed run left behind")
    cl.add_argument("--all", action="store_true",
                    help="also tear down runs whose ccscope process is still alive (default: only dead ones)")
    cl.set_defaults(func=cmd_cleanup)


def cmd_export(args: argparse.Namespace) -> int:
    from . import export

    directory = Path(args.directory)
    written = export.export(directory, args.format, Path(args.out) if args.out else directory / "tables")
    for name, path in written.items():
        print(f"{name}: {path}")
    return 0


def cmd_scenario(args: argparse.Namespace) -> int:
    from . import spec

    if args.target == "list":
        if args.file:
            raise UsageError("`ccscope scenario list` takes no file")
        return _list()
    if args.target == "run":
        if not args.file:
            raise UsageError("`ccscope scenario run` needs a scenario file: ccscope scenario run FILE.yaml")
        path = Path(args.file)
        spec.check_file(path)
    else:
        if args.file:
            raise UsageError(f"unexpected {args.file!r} after {args.target!r} (did you mean `run FILE`?)")
        path = spec.resolve(args.target)
    part = _shard(args.shard)
    if args.runs is not None and not 1 <= args.runs <= spec.MAX_RUNS:
        raise UsageError(f"--runs {args.runs} is out of range 1..{spec.MAX_RUNS}")
    scenario = spec.load(path, quick=args.quick, duration=args.duration, runs=args.runs, algorithms=args.algorithms,
                         target=args.far_end, via=args.via)
    return _run(scenario, args, part)


def _shard(text: str | None):
    if text is None:
        return None
    from . import shard

    return shard.parse(text)


def _run(scenario, args: argparse.Namespace, part=None) -> int:
    from . import runner

    listen = None if args.listen == "off" else (args.listen or DEFAULT_LISTEN)
    if listen:
        parse_listen(listen)  # bad --listen is a usage error before anything starts
    resume = Path(args.resume) if args.resume else None
    if resume is not None:
        if not resume.is_dir():
            raise UsageError(f"--resume {args.resume}: no such results directory")
        if args.out and Path(args.out).resolve() != resume.resolve():
            raise UsageError("--resume DIR writes into DIR: leave out --out, or give the same directory")
    options = runner.Options(out=Path(args.out) if args.out else None, listen=listen,
                             listen_explicit=args.listen is not None, skip_unavailable=args.skip_unavailable,
                             backend=args.backend, quick=args.quick, verify=not args.no_verify, resume=resume,
                             cleanup_stale=args.cleanup_stale, shard=part)
    out, doc = runner.run(scenario, options, finish=None if args.no_report else _render)
    from .summary import summary_table  # not report: --no-report must never import matplotlib
    print(summary_table(doc))
    for warning in doc["warnings"]:
        print(f"ccscope: warning: {warning}", file=sys.stderr)
    for error in doc["errors"]:
        print(f"ccscope: error in results: {error}", file=sys.stderr)
    shown = f"`ccscope report {out}` renders it" if args.no_report else out / "report.html"
    print(f"\nresults: {out}/results.json\nreport:  {shown}")
    return 1 if doc["errors"] else 0


def _render(out: Path, doc: dict) -> Path:
    from . import report  # matplotlib (~0.5 s) only once there is something to plot, never before the checks

    return report.write(out, doc)


def _list() -> int:
    from . import spec

    builtins = spec.builtin_scenarios()
    if not builtins:
        print(f"no built-in scenarios found in {spec.builtin_dir()}", file=sys.stderr)
        return 1
    width = max(len(n) for n in builtins)
    for name, path in builtins.items():
        try:
            s = spec.load(path)
            profiles = ", ".join(s.profiles)
            algs = ", ".join("+".join(m) for m in s.algorithms)
            print(f"{name:<{width}}  profiles {profiles}; algorithms {algs}")
        except UsageError as exc:  # a broken built-in is shown, not fatal to the listing
            print(f"{name:<{width}}  (invalid: {exc.line()})")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from . import report, results, series, store
    from .summary import summary_table

    directory = Path(args.directory)
    if not directory.is_dir():
        raise UsageError(f"{args.directory}: no such results directory")
    doc = store.load(directory)
    plotted = series.load_series(directory, doc)  # everything is read and checked before anything is written
    if store.rebuilt(directory, doc):
        print(f"ccscope: rebuilt {directory}/results.json from {store.JOURNAL} ({len(doc['runs'])} runs)",
              file=sys.stderr)
    html = report.render(directory, doc, plotted)
    print(summary_table(doc))
    if not doc["complete"]:
        fix = ("run or resume the missing shards and merge again" if doc.get("merged") else
               f"finish with the scenario's command and --resume {directory}")
        print(f"ccscope: incomplete: {len(doc['runs'])} of {len(results.planned(doc))} runs ({fix})", file=sys.stderr)
    print(f"\nreport: {html}")
    return 0


def cmd_merge(args: argparse.Namespace) -> int:
    from . import merge, report
    from .summary import summary_table

    out = Path(args.out)
    doc = merge.merge(out, [Path(d) for d in args.directories])
    html = report.write(out, doc)
    print(summary_table(doc))
    for mixed in doc["merged"]["mixed"]:
        print(f"ccscope: warning: uneven comparison: {mixed}", file=sys.stderr)
    if not doc["complete"]:
        absent = ", ".join(f"{i}/{doc['merged']['count']}" for i in doc["merged"]["missing_shards"])
        print(f"ccscope: incomplete: {len(doc['runs'])} of {len(doc['run_order'])} runs"
              f"{f'; missing shards {absent}' if absent else ''}; missing runs: {', '.join(doc['missing_runs'])}",
              file=sys.stderr)
    print(f"\nmerged {len(doc['merged']['shards'])} of {doc['merged']['count']} shards\nresults: {out}/results.json"
          f"\nreport:  {html}")
    return 0


def cmd_cleanup(args: argparse.Namespace) -> int:
    if os.geteuid() != 0:
        raise PrerequisiteError("cleanup needs root (it removes network namespaces and restores sysctls)",
                                "run with sudo")
    from ccscope.cc import registry
    from ccscope.host.state import cleanup_all

    removed = cleanup_all(include_live=args.all) + registry.cleanup(include_live=args.all)
    for item in removed:
        print(f"removed {item}")
    if not removed:
        print("nothing to clean up")
    return 0
