"""Sweeps on many machines: `--shard K/N`, `ccscope merge`, and the Kubernetes Indexed Job that runs them.

The shards are produced the way a cluster would: the Job's own shell command from
deploy/kubernetes/sweep/job.yaml, run here once per JOB_COMPLETION_INDEX on a tiny scenario (one profile,
two algorithms, --runs 2: four 3 s runs over 3 shards), one after another, the first one interrupted after
its first run and retried (the Job's retry resumes the shard). The merge Job's command combines them, and the
result is compared with the unsharded plan computed independently by the runner.
"""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from ccscope.errors import UsageError
from ccscope.scenario import results, runner, shard, spec
from ccscope.scenario.store import JOURNAL
from ccscope_testkit.net import free_port
from ccscope_testkit.prereqs import ROOT, require_bpf_object, require_root, require_tools
from emulation_helpers import HostSnapshot

SWEEP = ROOT / "deploy" / "kubernetes" / "sweep"
KUBERNETES = "1.33"  # backoffLimitPerIndex is GA from 1.33; every schema kubernetes-validate bundles from there on
TINY = """
name: tiny
algorithms: [cubic, reno]
duration: 3s
warmup: 1s
profiles:
  ten: {rate: 10mbit, delay: 5ms}
"""
FLAGS = "--runs 2 --no-verify --listen off"


def _docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((SWEEP / name).read_text()) if d]


def _anti_affinity(job: dict) -> dict:
    terms = job["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"]
    return terms["requiredDuringSchedulingIgnoredDuringExecution"][0]


def _container(doc: dict) -> dict:
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    return container


# --- --shard K/N ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, environ, expected", [
    ("0/3", {}, (0, 3)), ("2/3", {}, (2, 3)), ("0/1", {}, (0, 1)),
    ("env/4", {"JOB_COMPLETION_INDEX": "3"}, (3, 4)),
    ("env/4", {"SLURM_ARRAY_TASK_ID": "1"}, (1, 4)),
    ("env/4", {"JOB_COMPLETION_INDEX": "2", "SLURM_ARRAY_TASK_ID": "2"}, (2, 4)),
])
def test_shard_forms(text, environ, expected):
    part = shard.parse(text, environ)
    assert (part.index, part.count) == expected


@pytest.mark.parametrize("text, environ, needle", [
    ("3/3", {}, "shard 3 does not exist in 3 shards"),
    ("0/0", {}, "N must be 1..10000"),
    ("1", {}, "expected K/N"), ("a/b", {}, "expected K/N"), ("-1/3", {}, "expected K/N"), ("1/3/4", {}, "expected K/N"),
    ("env/3", {}, "neither JOB_COMPLETION_INDEX nor SLURM_ARRAY_TASK_ID is set"),
    ("env/3", {"JOB_COMPLETION_INDEX": "x"}, "JOB_COMPLETION_INDEX='x' is not a shard index"),
    ("env/3", {"SLURM_ARRAY_TASK_ID": "3"}, "shard 3 does not exist in 3 shards"),
    ("env/3", {"JOB_COMPLETION_INDEX": "0", "SLURM_ARRAY_TASK_ID": "1"}, "disagree"),
])
def test_shard_refusals(text, environ, needle):
    with pytest.raises(UsageError) as caught:
        shard.parse(text, environ)
    assert needle in caught.value.line()


@pytest.mark.parametrize("argv, env", [
    (["bufferbloat", "--shard", "3/3"], {}),
    (["bufferbloat", "--shard", "0/0"], {}),
    (["bufferbloat", "--shard", "half"], {}),
    (["bufferbloat", "--shard", "env/3"], {"JOB_COMPLETION_INDEX": "", "SLURM_ARRAY_TASK_ID": ""}),
])
def test_bad_shard_is_one_line_and_exit_2(argv, env, tmp_path):
    res = subprocess.run([sys.executable, "-m", "ccscope.cli", "scenario", *argv, "--out", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=60, env={**os.environ, **env})
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("ccscope: error: --shard") and res.stderr.count("\n") == 1, res.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("total", [1, 2, 5, 12, 97])
def test_shards_partition_the_plan(total):
    for count in range(1, total + 1):
        slices = [shard.positions(total, shard.Shard(k, count)) for k in range(count)]
        flat = sorted(p for s in slices for p in s)
        assert flat == list(range(1, total + 1))  # every position once
        assert max(map(len, slices)) - min(map(len, slices)) <= 1  # balanced
    with pytest.raises(UsageError, match="fewer than"):
        shard.positions(total, shard.Shard(0, total + 1))


def _tiny(tmp_path: Path, text: str = TINY) -> Path:
    path = tmp_path / "tiny.yaml"
    path.write_text(text)
    return path


def _fresh(path: Path, runs: int = 2) -> dict:
    scenario = spec.load(path, runs=runs)
    return results.new_document(scenario, runner.plan(scenario), [], False)


def test_plan_hash_is_the_plan_not_the_host(tmp_path):
    first = _fresh(_tiny(tmp_path))
    other = tmp_path / "elsewhere"
    other.mkdir()
    moved = _fresh(_tiny(other))
    assert moved["scenario"]["source"] != first["scenario"]["source"]
    moved["environment"]["kernel"] = "4.19.0-other"
    assert shard.plan_hash(moved) == shard.plan_hash(first)
    assert shard.plan_hash(_fresh(_tiny(tmp_path), runs=3)) != shard.plan_hash(first)
    assert shard.plan_hash(_fresh(_tiny(tmp_path, TINY + "seed: 2\n"))) != shard.plan_hash(first)
    assert shard.plan_hash(_fresh(_tiny(tmp_path, TINY.replace("3s", "4s")))) != shard.plan_hash(first)
    assert shard.plan_hash({**first, "tool": {"name": "ccscope", "version": "9.9"}}) != shard.plan_hash(first)


def _cluster_paths(tmp_path: Path) -> Path:
    """The real-path scenario realpath.yaml's ConfigMap mounts into the shards' pods."""
    (text,) = _realpath("ConfigMap")["data"].values()
    return _tiny(tmp_path, text)


def test_a_real_paths_far_end_is_where_not_what(tmp_path):
    """Each shard of a Kubernetes sweep measures to its own `ccscope serve` pod: one plan, flagged by merge;
    a --resume, though, must keep its far end (store.py compares the whole identity)."""
    path = _cluster_paths(tmp_path)

    def fresh(target: str) -> dict:
        scenario = spec.load(path, target=target)
        return results.new_document(scenario, runner.plan(scenario), [], False)

    first, second = fresh("ccscope-serve-0.ccscope-serve:5201"), fresh("ccscope-serve-1.ccscope-serve:5201")
    assert shard.plan_hash(first) == shard.plan_hash(second)
    assert shard.far_ends(first) == ["ccscope-serve-0.ccscope-serve:5201"]
    assert "ccscope-serve-0" not in json.dumps(shard.without_far_ends(first))
    assert "target" in results.identity_mismatch(first, second)
    moved = spec.load(path, target="ccscope-serve-0.ccscope-serve:5201", via=["up=eth1"])
    assert shard.plan_hash(results.new_document(moved, runner.plan(moved), [], False)) != shard.plan_hash(first)


# --- the Kubernetes manifests ---------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["pvc.yaml", "job.yaml", "merge-job.yaml", "realpath.yaml"])
def test_manifests_match_the_kubernetes_schema(name):
    for doc in _docs(name):
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


@pytest.mark.parametrize("mutate", [
    lambda job: job["spec"].__setitem__("completionmode", job["spec"].pop("completionMode")),
    lambda job: _container(job).__setitem__("volumeMount", _container(job).pop("volumeMounts")),
    lambda job: _anti_affinity(job).__setitem__("topologykey", _anti_affinity(job).pop("topologyKey")),
])
def test_schema_check_catches_a_misspelt_field(mutate):
    job = copy.deepcopy(_docs("job.yaml")[0])
    mutate(job)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(job, KUBERNETES, strict=True)


def test_sweep_job_runs_one_shard_per_node_with_only_what_scenarios_need():
    job = _docs("job.yaml")[0]
    spec_ = job["spec"]
    assert spec_["completionMode"] == "Indexed" and 1 <= spec_["parallelism"] <= spec_["completions"]
    container = _container(job)
    script = container["args"][0]
    assert f"--shard env/{spec_['completions']} " in script  # N is the Job's completions
    pod = spec_["template"]["spec"]
    assert len(pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]) == 1
    term = _anti_affinity(job)
    assert term["topologyKey"] == "kubernetes.io/hostname"
    assert term["labelSelector"]["matchLabels"].items() <= spec_["template"]["metadata"]["labels"].items()
    sc = container["securityContext"]
    assert sc["capabilities"] == {"drop": ["ALL"], "add": ["BPF", "NET_ADMIN", "PERFMON", "SYS_ADMIN"]}
    assert sc["privileged"] is False and sc["allowPrivilegeEscalation"] is False
    # the same set the compose override grants the scenario service
    compose = yaml.safe_load((ROOT / "deploy/compose/compose.scenario.yaml").read_text())["services"]["scenario"]
    assert sorted(compose["cap_add"]) == sc["capabilities"]["add"]
    (pvc,) = _docs("pvc.yaml")
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"]
    merge = _docs("merge-job.yaml")[0]
    for doc in (job, merge):
        claims = [v["persistentVolumeClaim"]["claimName"] for v in doc["spec"]["template"]["spec"]["volumes"]
                  if "persistentVolumeClaim" in v]
        assert claims == [pvc["metadata"]["name"]]
    assert _container(merge)["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    results_dir = {e["name"]: e["value"] for e in container["env"]}["RESULTS"]
    assert {e["name"]: e["value"] for e in _container(merge)["env"]}["RESULTS"] == results_dir


def _realpath(kind: str) -> dict:
    (doc,) = [d for d in _docs("realpath.yaml") if d["kind"] == kind]
    return doc


@pytest.mark.parametrize(("kind", "mutate"), [
    ("Service", lambda svc: svc["spec"].__setitem__("clusterIp", svc["spec"].pop("clusterIP"))),
    ("StatefulSet", lambda sts: sts["spec"].__setitem__("servicename", sts["spec"].pop("serviceName"))),
    ("Job", lambda job: job["spec"]["template"]["spec"]["securityContext"].__setitem__("sysctl", [])),
])
def test_schema_check_catches_a_misspelt_field_in_the_real_path_sweep(kind, mutate):
    doc = copy.deepcopy(_realpath(kind))
    mutate(doc)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, KUBERNETES, strict=True)


def test_real_path_sweep_pairs_each_shard_with_a_serve_pod_on_another_node():
    service, serve, job = _realpath("Service"), _realpath("StatefulSet"), _realpath("Job")
    count = job["spec"]["completions"]
    assert serve["spec"]["replicas"] == count and f"--shard env/{count} " in _container(job)["args"][0]
    assert service["spec"]["clusterIP"] == "None" and serve["spec"]["serviceName"] == service["metadata"]["name"]
    assert service["spec"]["selector"].items() <= serve["spec"]["template"]["metadata"]["labels"].items()
    env = {e["name"]: e["value"] for e in _container(job)["env"] if "value" in e}
    # shard K's far end is the DNS name the headless Service gives serve pod K, at its control port
    control = service["spec"]["ports"][0]["port"]
    assert (env["SERVE_PREFIX"], env["SERVE_SUFFIX"]) == (f"{serve['metadata']['name']}-",
                                                           f".{service['metadata']['name']}:{control}")
    assert f"--ports={control}-" in " ".join(_container(serve)["args"])
    # no two of the pods on one node: every flow crosses the network between two nodes
    components = {doc["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] for doc in (serve, job)}
    for doc in (serve, job):
        (term,) = doc["spec"]["template"]["spec"]["affinity"]["podAntiAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]
        assert term["topologyKey"] == "kubernetes.io/hostname"
        (expression,) = term["labelSelector"]["matchExpressions"]
        assert expression["operator"] == "In" and set(expression["values"]) == components
    # a real path emulates nothing: no namespaces, mounts or the node's network
    for doc, caps in ((serve, ["BPF", "NET_ADMIN", "PERFMON", "SETGID", "SETUID"]),
                      (job, ["BPF", "NET_ADMIN", "PERFMON"])):
        sc = _container(doc)["securityContext"]
        assert sc["capabilities"] == {"drop": ["ALL"], "add": caps}  # serve drops to nobody: SETUID, SETGID
        assert sc["allowPrivilegeEscalation"] is False and not doc["spec"]["template"]["spec"].get("hostNetwork")
    # one token, from one Secret: serve's --token-file, the shards' CCSCOPE_SERVE_TOKEN
    (mount,) = [m for m in _container(serve)["volumeMounts"] if m["name"] == "token"]
    (volume,) = [v for v in serve["spec"]["template"]["spec"]["volumes"] if v["name"] == "token"]
    assert f"--token-file={mount['mountPath']}/token" in _container(serve)["args"]
    (token_env,) = [e for e in _container(job)["env"] if e["name"] == "CCSCOPE_SERVE_TOKEN"]
    assert token_env["valueFrom"]["secretKeyRef"] == {"name": volume["secret"]["secretName"], "key": "token"}
    (pvc,) = _docs("pvc.yaml")
    assert [v["persistentVolumeClaim"]["claimName"] for v in job["spec"]["template"]["spec"]["volumes"]
            if "persistentVolumeClaim" in v] == [pvc["metadata"]["name"]]


# --- shards run by the Job's command, merged by the merge Job's command ------------------------------------


def _job_command(name: str, env: dict[str, str]) -> tuple[list[str], dict[str, str]]:
    """The container's command line and environment, as the kubelet starts it, with `env` overriding."""
    (job,) = [doc for doc in _docs(name) if doc["kind"] == "Job"]
    container = _container(job)
    environ = {**os.environ, **{e["name"]: e["value"] for e in container["env"] if "value" in e}, **env}
    environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{environ['PATH']}"  # this checkout's ccscope
    return [*container["command"], *container["args"]], environ


def _wait_for_runs(journal: Path, runs: int, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if journal.is_file() and journal.read_text().count("\n") >= 1 + runs:
            return
        time.sleep(0.2)
    raise AssertionError(f"{journal}: no {runs} completed runs in {timeout} s (exit {proc.poll()})")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    require_root()
    require_tools("iperf3", "ping", "ip", "tc", "ethtool", "ss", "iptables")
    require_bpf_object()
    base = tmp_path_factory.mktemp("sweep")
    path = _tiny(base)
    env = {"SCENARIO": f"run {path}", "SCENARIO_FLAGS": FLAGS, "RESULTS": str(base / "results")}
    snapshot = HostSnapshot.take()
    logs = {}
    for index in range(3):
        argv, environ = _job_command("job.yaml", {**env, "JOB_COMPLETION_INDEX": str(index)})
        if index == 0:  # the pod is stopped after its first run, and the Job's retry finishes the shard
            proc = subprocess.Popen(argv, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            _wait_for_runs(base / "results" / "shard-0" / JOURNAL, 1, proc, 120)
            proc.send_signal(signal.SIGTERM)
            _, logs["interrupted"] = proc.communicate(timeout=60)
            assert proc.returncode == 128 + signal.SIGTERM, logs["interrupted"]
        res = subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=180)
        assert res.returncode == 0, res.stderr
        logs[index] = res.stderr
    argv, environ = _job_command("merge-job.yaml", env)
    merged = subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=120)
    assert merged.returncode == 0, merged.stderr
    snapshot.assert_unchanged()
    return {"dir": base / "results", "scenario": path, "logs": logs, "merge": merged}


def test_shards_merge_into_the_unsharded_plan(sweep):
    shards = [results.load(sweep["dir"] / f"shard-{k}") for k in range(3)]
    (out,) = sweep["dir"].glob("merged-*")
    doc = results.load(out)
    fresh = _fresh(sweep["scenario"])  # the unsharded plan, from the runner itself
    assert results.identity_mismatch(doc, fresh) is None
    plan = list(enumerate(fresh["run_order"], 1))
    assert [(r["position"], r["label"]) for r in doc["runs"]] == plan
    assert doc["seed"] == fresh["seed"]  # each run's emulation is seeded with seed + position
    assert doc["complete"] and doc["missing_runs"] == [] and "shard" not in doc
    # each shard ran exactly its slice, at the plan's positions, and said which shard of which plan it is
    hashes = {s["shard"]["plan_hash"] for s in shards}
    assert hashes == {shard.plan_hash(fresh)} == {doc["merged"]["plan_hash"]}
    for k, part in enumerate(shards):
        assert part["shard"]["index"] == k and part["shard"]["count"] == 3
        assert [r["position"] for r in part["runs"]] == [p for p, _ in plan if (p - 1) % 3 == k]
    # the shard interrupted after its first run resumed it and ran only the other one
    assert "resuming" in sweep["logs"][0] and "1 of 2 runs done, 1 to run" in sweep["logs"][0]
    # summary rows: one per profile x algorithm, each over both repetitions, as the unsharded run has them
    expected = {("ten", "cubic", "cubic"): 2, ("ten", "reno", "reno"): 2}
    assert {(r["profile"], r["algorithms"], r["algorithm"]): r["runs"] for r in doc["summary"]} == expected
    assert {tuple(sorted(r)) for r in doc["summary"]} == {tuple(sorted(r)) for s in shards for r in s["summary"]}
    for run in doc["runs"]:
        for flow in run["flows"]:
            assert (out / flow["csv"]).is_file(), flow["csv"]
            assert flow["goodput_bps"] > 5e6  # a 10 Mbit/s link, one flow
    html = (out / "report.html").read_text()
    assert "Hosts" in html and "Incomplete" not in html and "Uneven" not in html
    assert "merged 3 of 3 shards" in sweep["merge"].stdout


def _merge(out: Path, *dirs: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ccscope.cli", "merge", str(out), *map(str, dirs)],
                          capture_output=True, text=True, timeout=120)


def _copy(sweep, k: int, dest: Path) -> Path:
    return Path(shutil.copytree(sweep["dir"] / f"shard-{k}", dest / f"shard-{k}", symlinks=True))


def _edit(directory: Path, change) -> None:
    """Changes results.json (and the journal's header to agree)."""
    doc = json.loads((directory / "results.json").read_text())
    change(doc)
    (directory / "results.json").write_text(json.dumps(doc))
    lines = (directory / JOURNAL).read_text().splitlines()
    header = json.loads(lines[0])
    change(header["document"])
    (directory / JOURNAL).write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")


def _rehashed(change):
    def apply(doc):
        change(doc)
        doc["shard"]["plan_hash"] = shard.plan_hash({**doc, "shard": None})
    return apply


def _refused(res: subprocess.CompletedProcess, out: Path, *needles: str) -> None:
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("ccscope: error: ") and res.stderr.count("\n") == 1, res.stderr
    assert "Traceback" not in res.stderr
    for needle in needles:
        assert needle in res.stderr, (needle, res.stderr)
    assert not out.exists()


def test_merge_refusals(sweep, tmp_path):
    s = [sweep["dir"] / f"shard-{k}" for k in range(3)]
    out = tmp_path / "out"
    _refused(_merge(out, s[0], s[1], s[0]), out, "are both shard 0/3")
    seeded = _copy(sweep, 1, tmp_path / "seed")
    _edit(seeded, _rehashed(lambda d: d.__setitem__("seed", 7)))
    _refused(_merge(out, s[0], seeded, s[2]), out, "different plans", "seed: 1 in", "7 in")
    newer = _copy(sweep, 2, tmp_path / "version")
    _edit(newer, _rehashed(lambda d: d["tool"].__setitem__("version", "0.2.0")))
    _refused(_merge(out, s[0], s[1], newer), out, "different plans", "ccscope 0.1.0 in", "0.2.0 in")
    forged = _copy(sweep, 2, tmp_path / "forged")
    _edit(forged, lambda d: d.__setitem__("seed", 7))
    _refused(_merge(out, s[0], s[1], forged), out, "does not match its own plan hash")
    stolen = _copy(sweep, 0, tmp_path / "stolen")
    other = json.loads((s[1] / "results.json").read_text())["runs"][0]
    _edit(stolen, lambda d: d["runs"].append(other))
    _refused(_merge(out, stolen, s[1], s[2]), out, f"run {other['label']} belongs to shard 1/3")
    corrupt = _copy(sweep, 2, tmp_path / "corrupt")
    (corrupt / "results.json").write_text('{"schema_version": 2, "runs": [')
    _refused(_merge(out, s[0], s[1], corrupt), out, "results.json: not valid JSON")
    unsharded = _copy(sweep, 2, tmp_path / "unsharded")
    _edit(unsharded, lambda d: d.pop("shard"))
    _refused(_merge(out, s[0], s[1], unsharded), out, "not a shard")
    _refused(_merge(out, s[0], tmp_path / "nowhere"), out, "no such results directory")
    # the serve probe's two: a run copied into the shard (5 runs for a 4-run plan), and a device node in raw/,
    # which merge read without end (383 MB of /dev/urandom in 2 s)
    doubled = _copy(sweep, 1, tmp_path / "doubled")
    _edit(doubled, lambda d: d["runs"].append(d["runs"][0]) if d.get("runs") else None)
    first = json.loads((s[1] / "results.json").read_text())["runs"][0]["label"]
    _refused(_merge(out, s[0], doubled, s[2]), out, f"run {first!r}", "is there twice")
    for kind, make in (("device", lambda p: os.mknod(p, stat.S_IFCHR | 0o600, os.makedev(1, 9))),
                       ("fifo", os.mkfifo)):
        special = _copy(sweep, 2, tmp_path / kind)
        run_dir = next(d for d in sorted((special / "raw").iterdir()) if d.is_dir())
        make(run_dir / "z")
        _refused(_merge(out, s[0], s[1], special), out, f"{run_dir / 'z'}: not a regular file")
    full = tmp_path / "full"
    full.mkdir()
    (full / "notes.txt").write_text("mine")
    res = _merge(full, *s)
    assert res.returncode == 2 and "OUT" in res.stderr and "is not empty" in res.stderr, res.stderr
    assert [p.name for p in full.iterdir()] == ["notes.txt"]


def test_a_missing_shard_is_an_incomplete_report_that_names_its_runs(sweep, tmp_path):
    out = tmp_path / "out"
    res = _merge(out, sweep["dir"] / "shard-0", sweep["dir"] / "shard-2")
    assert res.returncode == 0, res.stderr
    doc = results.load(out)
    lost = results.load(sweep["dir"] / "shard-1")["shard"]["runs"]
    assert doc["complete"] is False and doc["missing_runs"] == lost and doc["merged"]["missing_shards"] == [1]
    assert len(doc["runs"]) == 4 - len(lost)
    html = (out / "report.html").read_text()
    assert "Incomplete: 3 of 4 runs" in html and all(label in html for label in lost)
    assert "missing shards 1/3" in res.stderr and lost[0] in res.stderr


def test_mixed_kernels_are_merged_and_flagged(sweep, tmp_path):
    other = _copy(sweep, 2, tmp_path / "other")
    _edit(other, lambda d: d["environment"].__setitem__("kernel", "6.1.0-25-amd64"))
    out = tmp_path / "out"
    res = _merge(out, sweep["dir"] / "shard-0", sweep["dir"] / "shard-1", other)
    assert res.returncode == 0, res.stderr
    assert "uneven comparison: mixed kernels" in res.stderr
    doc = results.load(out)
    assert doc["complete"] and [h["kernel"] for h in doc["merged"]["shards"]][2] == "6.1.0-25-amd64"
    html = (out / "report.html").read_text()
    assert html.index("Uneven comparison") < html.index("<h2>Summary")  # at the top, before any number
    assert "6.1.0-25-amd64" in html and os.uname().release in html


def test_resume_takes_only_the_same_shard(sweep):
    """A shard's directory is resumed by that shard of that plan only; a finished one has nothing to run."""
    directory = sweep["dir"] / "shard-1"
    before = (directory / JOURNAL).read_text()

    def resume(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "ccscope.cli", "scenario", "run", str(sweep["scenario"]),
                               *FLAGS.split(), *flags, "--resume", str(directory)],
                              capture_output=True, text=True, timeout=120)

    for flags, needle in [(["--shard", "2/3"], "shard index: 1 there, 2 now"), ([], "shard: "),
                          (["--shard", "1/2"], "shard count: 3 there, 2 now")]:
        res = resume(*flags)
        assert res.returncode == 2 and needle in res.stderr and res.stderr.count("\n") == 1, (flags, res.stderr)
    res = resume("--shard", "1/3")
    assert res.returncode == 0 and "0 to run" in res.stderr, res.stderr
    assert (directory / JOURNAL).read_text() == before


# --- the real-path sweep's Job, each shard against the StatefulSet's `ccscope serve` ----------------------


@pytest.fixture(scope="module")
def real_sweep(tmp_path_factory):
    """realpath.yaml's shard command once per index, here: serve pod K is `ccscope serve` with the
    StatefulSet's arguments on this host, reached as 127.0.0.1K (SERVE_PREFIX 127.0.0.1: all of 127/8 is
    loopback), so each shard has a far end of its own, as in the cluster."""
    require_root()
    require_tools("iperf3", "ping", "ss")
    require_bpf_object()
    base = tmp_path_factory.mktemp("real-sweep")
    control = free_port()
    token = base / "token"  # the Secret's file, here
    token.write_text("sweep-test-token\n")
    token.chmod(0o600)
    rewrite = {"--ports=": f"--ports={control}-{control + 3}", "--token-file=": f"--token-file={token}"}
    args = [next((v for k, v in rewrite.items() if a.startswith(k)), a)
            for a in _container(_realpath("StatefulSet"))["args"]]
    log = base / "serve.log"
    with log.open("wb") as out:
        serve = subprocess.Popen([sys.executable, "-m", "ccscope.cli", *args], stdout=out, stderr=out,
                                 start_new_session=True)
    try:
        deadline = time.monotonic() + 30
        while "listening on" not in log.read_text():
            assert serve.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        env = {"SCENARIO_FILE": str(_cluster_paths(base)), "SERVE_PREFIX": "127.0.0.1", "SERVE_SUFFIX": f":{control}",
               "SCENARIO_FLAGS": "--listen off --quick --algorithms cubic,reno,bbr --duration 4s",
               "RESULTS": str(base / "results"), "CCSCOPE_SERVE_TOKEN": "sweep-test-token"}
        for index in range(3):
            argv, environ = _job_command("realpath.yaml", {**env, "JOB_COMPLETION_INDEX": str(index)})
            res = subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=180)
            assert res.returncode == 0, res.stderr
        argv, environ = _job_command("merge-job.yaml", env)
        merged = subprocess.run(argv, env=environ, capture_output=True, text=True, timeout=120)
        assert merged.returncode == 0, merged.stderr
    finally:
        os.killpg(serve.pid, signal.SIGINT)
        serve.wait(timeout=30)
    return base / "results", merged


def test_real_path_shards_merge_with_their_far_ends_flagged(real_sweep):
    directory, merged = real_sweep
    (out,) = directory.glob("merged-*")
    doc = results.load(out)
    assert doc["complete"] and len(doc["runs"]) == 3 and not doc["errors"], doc["errors"]
    assert [r["position"] for r in doc["runs"]] == [1, 2, 3]
    shards = {s["index"]: s for s in doc["merged"]["shards"]}
    assert {k: s["far_ends"] for k, s in shards.items()} == {k: [f"127.0.0.1{k}:{_port(doc)}"] for k in range(3)}
    (mixed,) = doc["merged"]["mixed"]
    assert mixed.startswith("mixed far ends of the real paths (shard 0: 127.0.0.10:")
    for run in doc["runs"]:
        [flow] = run["flows"]
        assert flow["algorithm"] == run["algorithms"] and flow["goodput_bps"] > 0
        assert flow["samples"] > 0 and flow["view"] == "sender"  # this host's series: it sends (up)
    html = (out / "report.html").read_text()
    assert "far end" in html and "127.0.0.12:" in html and "mixed far ends" in html
    assert "merged 3 of 3 shards" in merged.stdout


def _port(doc: dict) -> str:
    return doc["merged"]["shards"][0]["far_ends"][0].rsplit(":", 1)[1]
