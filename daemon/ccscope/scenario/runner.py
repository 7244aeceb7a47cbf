"""Runs a scenario: profiles x algorithm sets x repetitions, in seeded random order, one fresh Testbed
per run, with the BPF recorder and the live Prometheus endpoint on for the whole scenario."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from prometheus_client import CollectorRegistry

from ccscope.cc import registry
from ccscope.cc.provide import check_forced, providable, provided
from ccscope.errors import Interrupted, PrerequisiteError, UsageError
from ccscope.exporter import FlowCollector
from ccscope.flows import FlowFilter, FlowSelection
from ccscope.host import state
from ccscope.hosttools import SCENARIO_TOOLS, need
from ccscope.live.app import LiveApp, serve_page, table_rows, table_source
from ccscope.live.hub import Hub
from ccscope.loader import ProbeOptions, preflight
from ccscope.telemetry import session as telemetry
from ccscope.units import parse_listen
from ccscope.web.http import Limits

from . import realrun, results, shard
from .emulated import EmulatedPath, resolve_aqms
from .environment import now_iso
from .lifecycle import Session, keep, run_unit
from .progress import Progress
from .recorder import POLL_MS as RECORDER_POLL_MS
from .recorder import Recorder
from .spec import Scenario, mix_label
from .store import Store, check_out_dir, signals_held
from .traffic import planned_seconds


@dataclass
class Options:
    out: Path | None = None
    listen: str | None = None
    listen_explicit: bool = False
    skip_unavailable: bool = False
    backend: str = "auto"
    quick: bool = False
    verify: bool = True
    resume: Path | None = None  # a results directory to complete
    cleanup_stale: bool = False  # remove a killed run's leftovers instead of refusing to start
    real: realrun.Context | None = None  # the scenario's real paths, checked by realrun.prepare()
    shard: shard.Shard | None = None  # --shard K/N: run only this slice of the plan (shard.py)


@dataclass(frozen=True)
class Unit:
    profile: str
    mix: tuple[str, ...]
    repetition: int

    @property
    def label(self) -> str:
        return f"{self.profile}/{mix_label(self.mix)}#{self.repetition}"


def check_prerequisites() -> None:
    if os.geteuid() != 0:
        raise PrerequisiteError("scenarios need root (network namespaces, BPF, sysctls)", "run with sudo")
    need(*SCENARIO_TOOLS)
    preflight()


def select_algorithms(scenario: Scenario, skip_unavailable: bool) -> tuple[Scenario, list[str]]:
    """Drops algorithms neither the kernel nor ccscope's BPF programs provide if optional (or with
    --skip-unavailable); else one clear error."""
    check_forced(scenario.all_algorithms)
    available = providable()
    missing = [a for a in scenario.all_algorithms if a not in available]
    required = [a for a in missing if a not in scenario.optional_algorithms]
    if required and not skip_unavailable:
        raise PrerequisiteError(f"{', '.join(required)} {'is' if len(required) == 1 else 'are'} not available "
                                f"in this kernel (available: {', '.join(sorted(available))})",
                                "use --skip-unavailable to run without it, or --algorithms")
    scenario = scenario.without(set(missing))
    if not scenario.algorithms:
        raise PrerequisiteError(f"none of the scenario's algorithms is available here "
                                f"(available: {', '.join(sorted(available))})")
    return scenario, missing


def plan(scenario: Scenario) -> list[Unit]:
    units = [Unit(p, mix, r) for r in range(1, scenario.runs + 1) for p in scenario.profiles
             for mix in scenario.algorithms]
    random.Random(scenario.seed).shuffle(units)
    return units


def default_out(scenario: Scenario, part: shard.Shard | None = None) -> Path:
    where = f"-shard{part.index}of{part.count}" if part else ""
    return Path("results") / f"{scenario.name}{where}-{datetime.now().strftime('%Y%m%d-%H%M%S')}"


def run(scenario: Scenario, options: Options, finish=None) -> tuple[Path, dict]:
    """Runs the scenario's units (only the missing ones with --resume); each completed run is saved at
    once (see store.py). SIGINT/SIGTERM/SIGHUP tear down, save what completed and raise Interrupted.
    `finish(out, doc)`, if given, writes the report (its path returned) while the live page still serves."""
    check_prerequisites()
    scenario, skipped = select_algorithms(scenario, options.skip_unavailable)
    units = plan(scenario)
    if options.shard is not None:
        shard.positions(len(units), options.shard)  # a shard with no runs is refused before anything is made
    options.real = realrun.prepare(scenario)  # real paths: reachable, far end known, before anything is made
    scenario = resolve_aqms(scenario, options.backend)  # the kernel's qdisc or ccscope's, before anything is made
    fresh = results.new_document(scenario, units, skipped, options.quick, options.backend)
    if options.shard is not None:
        shard.apply(fresh, options.shard)
    out = options.resume or options.out or default_out(scenario, options.shard)
    if options.resume is None:
        check_out_dir(out)
    store, doc = _open(out, fresh, options)
    for name in skipped:
        print(f"ccscope: {name} is not available in this kernel; running without it", file=sys.stderr)
    with contextlib.ExitStack() as stack:
        stack.callback(store.close)  # also when the endpoint cannot start
        endpoint = stack.enter_context(_endpoint(options))
        if endpoint:
            endpoint.hub.scenario.plan(scenario.name, list(scenario.profiles),
                                       [mix_label(m) for m in scenario.algorithms], len(units))
        old_handlers = _raise_on_signals()
        try:
            ran = _run_missing(scenario, units, doc, store, out, options, endpoint)
        except (KeyboardInterrupt, SystemExit) as exc:
            signum = signal.SIGINT if isinstance(exc, KeyboardInterrupt) else _signal_of(exc)
            if signum is None:
                raise
            with signals_held():
                doc["interrupted"] = signal.Signals(signum).name
                store.write(doc)
            raise Interrupted(signum, f"interrupted by {signal.Signals(signum).name} after {len(doc['runs'])} of "
                                      f"{len(units)} runs; they are saved in {out}/results.json",
                              f"finish with the same command and --resume {out}") from None
        except BaseException:
            if doc["runs"]:
                print(f"ccscope: {len(doc['runs'])} of {len(units)} runs are saved in {out}/results.json "
                      f"(finish with the same command and --resume {out})", file=sys.stderr)
            raise
        finally:
            _restore_signals(old_handlers)
            store.close()
        if ran or doc["finished_at"] is None:
            doc["finished_at"] = now_iso()
        doc["interrupted"] = None
        store.write(doc)
        if finish:
            report = finish(out, doc)
            if endpoint:
                endpoint.show_report(out, report)
    return out, doc


def _run_missing(scenario: Scenario, units: list[Unit], doc: dict, store: Store, out: Path,
                 options: Options, endpoint: Endpoint | None) -> int:
    """Runs the units not in the document yet, saving each as it completes; how many it ran."""
    todo = [(position, unit) for position, unit in enumerate(units, 1) if unit.label in doc["missing_runs"]]
    if not todo:
        return 0
    with provided(scenario.all_algorithms, f"scenario {scenario.name}") as implementations, \
            _telemetry(scenario, endpoint) as (recorder, collector):
        doc["implementations"] = {name: impl.as_dict() for name, impl in implementations.items()}
        names = {name: impl.display for name, impl in implementations.items()}  # as the report names them
        if endpoint:
            endpoint.hub.set_cc_names(names)
        progress = Progress(len(units), planned_seconds(scenario), listener=endpoint and endpoint.hub.scenario.on_event,
                            names=names)
        session = Session(scenario, out, recorder, collector, progress)
        verified: set[str] = set(doc["emulation_checks"])
        for position, unit in todo:
            path = (options.real and options.real.path_for(unit.profile)) or \
                EmulatedPath(doc, options.backend, verify=options.verify and unit.profile not in verified)
            record = run_unit(session, unit, position, path)
            verified.add(unit.profile)
            progress.done(keep(doc, store, record.document()))
    return len(todo)


def _open(out: Path, fresh: dict, options: Options) -> tuple[Store, dict]:
    """A new results directory, or the one to resume if `fresh` (this invocation's plan) is the scenario
    that wrote it; a dead run's leftovers are refused (or removed) before anything is written."""
    if options.resume is None:
        _refuse_stale(options.cleanup_stale)
        try:
            (out / "flows").mkdir(parents=True, exist_ok=True)
            return Store.create(out, fresh), fresh
        except OSError as exc:
            raise UsageError(f"--out {out}: cannot create: {exc.strerror}") from None
    store, doc = Store.resume(out, fresh)
    try:
        _refuse_stale(options.cleanup_stale)
    except BaseException:
        store.close()
        raise
    print(f"ccscope: resuming {out}: {len(doc['runs'])} of {len(results.planned(doc))} runs done, "
          f"{len(doc['missing_runs'])} to run", file=sys.stderr)
    doc["resumed_at"].append(now_iso())
    doc["interrupted"] = None
    return store, doc


def _refuse_stale(cleanup: bool) -> None:
    """A killed run's namespaces, delay lines and iperf3 would compete with this run for the CPU, and its BPF
    congestion controls would stay registered (and allowed host-wide) with nobody using them."""
    leftovers = state.dead_leftovers()
    abandoned = registry.abandoned()
    if not leftovers and not abandoned:
        return
    what = ", ".join(filter(None, [leftovers.describe(),
                                   f"BPF congestion control{'s' if len(abandoned) > 1 else ''} "
                                   f"{', '.join(abandoned)} still registered" if abandoned else ""]))
    if not cleanup:
        raise PrerequisiteError(f"a killed run left {what} behind", "run `ccscope cleanup`, or add --cleanup-stale")
    state.cleanup_all(include_live=False)
    registry.cleanup()
    print(f"ccscope: removed what a killed run left behind: {what}", file=sys.stderr)


def _signal_of(exc: SystemExit) -> int | None:
    """Testbed (and _raise_on_signals) turn SIGTERM/SIGHUP into SystemExit(128 + signal number)."""
    code = exc.code if isinstance(exc.code, int) else None
    return code - 128 if code in (128 + signal.SIGTERM, 128 + signal.SIGHUP) else None


def _raise_on_signals() -> dict:
    """Outside a Testbed too, SIGTERM/SIGHUP unwind like Ctrl-C, so the runs so far are saved."""
    def stop(signum, frame):
        raise SystemExit(128 + signum)

    old = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError):  # not the main thread
            old[sig] = signal.signal(sig, stop)
    return old


def _restore_signals(old: dict) -> None:
    for sig, handler in old.items():
        signal.signal(sig, handler)


@dataclass
class Endpoint:
    """The live page and /metrics on one listener, up for the whole invocation (the report link included)."""

    registry: CollectorRegistry
    app: LiveApp
    hub: Hub

    def show_report(self, out: Path, report: Path) -> None:
        self.hub.scenario.report(str(report), self.app.show_report(out, report))


@contextlib.contextmanager
def _endpoint(options: Options) -> Iterator[Endpoint | None]:
    if not options.listen:
        yield None
        return
    host, port = parse_listen(options.listen)
    registry = CollectorRegistry()
    hub = Hub(mode="scenario", table_rows=table_rows)
    try:
        endpoint = Endpoint(registry, LiveApp(hub), hub)
        try:
            server = serve_page(endpoint.app, registry, host, port, limits=Limits())
        except PrerequisiteError as exc:
            if options.listen_explicit:
                raise
            # the default port is taken (a `ccscope daemon` on this host, say): any free port will do
            print(f"ccscope: {exc.line()}; the live page takes a free port instead", file=sys.stderr)
            server = serve_page(endpoint.app, registry, host, 0, limits=Limits())
    except BaseException:
        hub.close()
        raise
    where = f"[{host}]:{server.port}" if ":" in host else f"{host}:{server.port}"
    print(f"ccscope: live page http://{where}/ (Prometheus: http://{where}/metrics)", file=sys.stderr, flush=True)
    try:
        yield endpoint
    finally:
        hub.close()
        server.close()


@contextlib.contextmanager
def _telemetry(scenario: Scenario, endpoint: Endpoint | None):
    """The BPF probe and recorder for the runs (with each flow's algorithm state, where this kernel loads its
    program: else one warning line); their flows on the endpoint while it is open."""
    probe_options = ProbeOptions(emit_samples=True, sample_interval_ns=int(scenario.sample_interval_s * 1e9))
    with telemetry.Session(probe_options, grace_s=5.0, state_where=" in the results") as session:
        collector = FlowCollector(session.table, FlowSelection("all"), FlowFilter(netns={0}),
                                  states=session.state.states if session.state else None)
        if endpoint:
            endpoint.registry.register(collector)
            endpoint.hub.set_table_source(table_source(session.probe, lambda: collector.filter))
            endpoint.hub.set_states(session.state.states if session.state else None)
        recorder = Recorder(session, listener=endpoint.hub.on_sample if endpoint else None)
        session.start(RECORDER_POLL_MS)
        try:
            yield recorder, collector
        finally:
            if endpoint:  # nothing reads the probe once it is closed: waits for a table read in progress
                endpoint.hub.set_table_source(None)
                endpoint.hub.set_states(None)
                endpoint.registry.unregister(collector)
            collector.close()
