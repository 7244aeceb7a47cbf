"""`.ci/run`, the CI entry point: it runs the README's test command with CI=true, also through sudo.

sudo resets the environment (env_reset, its default) but for the names --preserve-env gives: a stand-in sudo
that does the same shows which names reach tools/run-tests. Without CI there, every missing prerequisite of
the suite would skip instead of failing (ccscope_testkit.prereqs)."""

from __future__ import annotations

import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from ccscope_testkit.prereqs import ROOT

FAKE_SUDO = """#!/bin/sh
# env_reset as sudo does it: a fresh environment with PATH, plus what --preserve-env=A,B names
keep="PATH=$PATH"
while [ "${1#--preserve-env=}" != "$1" ]; do
  for name in $(echo "${1#--preserve-env=}" | tr , ' '); do
    keep="$keep $name=$(printenv "$name")"
  done
  shift
done
exec env -i $keep "$@"
"""


def _executable(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)


@pytest.mark.parametrize(("uid", "given", "seen"), [("1000", None, "true"), ("1000", "false", "false"),
                                                      ("0", None, "true")])
def test_ci_reaches_the_test_command(tmp_path: Path, uid: str, given: str | None, seen: str) -> None:
    checkout = tmp_path / "checkout"
    shutil.copytree(ROOT / ".ci", checkout / ".ci")
    _executable(checkout / "tools" / "run-tests", '#!/bin/sh\necho "CI=${CI:-unset}"\n')
    bin_dir = tmp_path / "bin"
    _executable(bin_dir / "sudo", FAKE_SUDO)
    _executable(bin_dir / "id", f"#!/bin/sh\necho {uid}\n")
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", **({"CI": given} if given is not None else {})}
    ran = subprocess.run(["bash", str(checkout / ".ci" / "run")], env=env, capture_output=True, text=True,
                         timeout=30)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.strip() == f"CI={seen}"
