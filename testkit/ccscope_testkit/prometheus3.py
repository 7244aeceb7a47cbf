"""A current Prometheus (3.x) for the tests: built once from the Go module proxy, cached outside the checkout.

`go install` refuses prometheus's module (its go.mod has replace directives), so the module is downloaded
and ./cmd/prometheus built inside it, as its own Makefile does. The first build takes about 5 minutes and
1.9 GB of modules (in GOPATH under the cache); afterwards the cached binary is used as it is. The cache is
keyed by version: /var/cache/ccscope/prometheus/<version>/prometheus (CCSCOPE_PROMETHEUS_CACHE moves it).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from .net import free_port, stop_process
from .prereqs import require

VERSION = "v0.316.0"  # Prometheus 3.x (module versions are 0.<minor><patch>.x)
CACHE = Path(os.environ.get("CCSCOPE_PROMETHEUS_CACHE", "/var/cache/ccscope/prometheus"))
BUILD_TIMEOUT_S = 1800


def binary(version: str = VERSION) -> Path:
    """The cached binary, built first if missing; skips (fails under CI) without a Go toolchain."""
    target = CACHE / version / "prometheus"
    if target.is_file():
        return target
    go = shutil.which("go")
    require(go is not None, f"Prometheus {version} is not cached at {target} and there is no Go toolchain to build it")
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / "lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build at a time; a second test run waits and then finds it
        if not target.is_file():
            _build(go, version, target)
    return target


def _build(go: str, version: str, target: Path) -> None:
    env = {**os.environ, "GOPATH": str(CACHE / "gopath"), "GOWORK": "off", "GOFLAGS": "-mod=mod",
           "GOTOOLCHAIN": "local"}
    module = f"github.com/prometheus/prometheus@{version}"
    info = json.loads(subprocess.run([go, "mod", "download", "-json", module], env=env, capture_output=True,
                                     text=True, check=True, timeout=BUILD_TIMEOUT_S).stdout)
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(".prometheus.partial")
    subprocess.run([go, "build", "-o", str(partial), "./cmd/prometheus"], cwd=info["Dir"], env=env, check=True,
                   capture_output=True, timeout=BUILD_TIMEOUT_S)
    partial.replace(target)


class Prometheus:
    """A running Prometheus on a free loopback port with its own storage, queried over its HTTP API."""

    def __init__(self, exe: Path, config: str, *flags: str) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="ccscope-prom-"))
        (self.dir / "prometheus.yml").write_text(config)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([str(exe), f"--config.file={self.dir / 'prometheus.yml'}",
                                      f"--storage.tsdb.path={self.dir / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn", *flags],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while not self._ready():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.close()
                raise RuntimeError(f"prometheus did not start: {self.proc.stderr.read()[-2000:]}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        with contextlib.suppress(OSError), urllib.request.urlopen(self.url + "/-/ready", timeout=2) as resp:
            return resp.status == 200
        return False

    def api(self, path: str, **params: str) -> dict:
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as resp:
            body = json.load(resp)
        if body.get("status") != "success":
            raise AssertionError(f"{path} {params}: {body}")
        return body["data"]

    def query(self, promql: str) -> list[dict]:
        return self.api("query", query=promql)["result"]

    def close(self) -> None:
        stop_process(self.proc)
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def running(exe: Path, config: str, *flags: str) -> Iterator[Prometheus]:
    prom = Prometheus(exe, config, *flags)
    try:
        yield prom
    finally:
        prom.close()
