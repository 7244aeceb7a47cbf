"""Per-test iperf3 users: each test's `iperf3 -s -1` admits one user, made for that test and handed only to
the client that asked for it (iperf3's own RSA authentication: --rsa-private-key-path and
--authorized-users-path on the server, --username, --rsa-public-key-path and $IPERF3_PASSWORD on the client).
Anyone else who reaches the test port first is turned away by iperf3 and does not use up the one test.

One RSA key pair per serve process (openssl genrsa, 2048 bits), in a private directory removed at exit.
The users file holds sha256("{user}password"), the format iperf3 documents.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import subprocess
import tempfile
from pathlib import Path

from ccscope.errors import PrerequisiteError

from .protocol import Iperf3Credentials

KEY_BITS = 2048
PREFIX = "ccscope-serve-"  # then the pid of the serve that made it


def _remove_dead_serves_dirs() -> None:
    """What a serve killed outright (kill -9) left in the temporary directory: its key pair and users files.
    Only directories of ours (owner) whose serve no longer runs."""
    for path in Path(tempfile.gettempdir()).glob(f"{PREFIX}*-*"):
        pid = path.name[len(PREFIX):].split("-", 1)[0]
        with contextlib.suppress(OSError):
            if pid.isdigit() and not Path(f"/proc/{pid}").exists() and path.stat().st_uid == os.geteuid() \
                    and path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)


def iperf3_has_authentication() -> bool:
    try:
        out = subprocess.run(["iperf3", "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return "authentication" in out


class Iperf3Users:
    """The key pair and the per-test users files; close() removes them."""

    def __init__(self) -> None:
        if shutil.which("openssl") is None:
            raise PrerequisiteError("per-test iperf3 users need openssl (to make serve's RSA key pair)",
                                    "install openssl")
        _remove_dead_serves_dirs()
        self.dir = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-"))  # 0700
        self.private_key = self.dir / "private.pem"
        public = self.dir / "public.pem"
        try:
            for argv in (["openssl", "genrsa", "-out", str(self.private_key), str(KEY_BITS)],
                         ["openssl", "rsa", "-in", str(self.private_key), "-pubout", "-out", str(public)]):
                subprocess.run(argv, check=True, capture_output=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as exc:
            self.close()
            raise PrerequisiteError(f"openssl could not make serve's RSA key pair: {exc}") from None
        self.public_key = public.read_text()

    def new_user(self, port: int) -> tuple[Iperf3Credentials, Path]:
        """A user for the test on `port`, and the users file that admits only it."""
        user, password = f"t{port}-{secrets.token_hex(4)}", secrets.token_urlsafe(24)
        users = self.dir / f"users-{port}.csv"
        digest = hashlib.sha256(f"{{{user}}}{password}".encode()).hexdigest()
        users.write_text(f"{user},{digest}\n")
        return Iperf3Credentials(user, password, self.public_key), users

    def server_args(self, users: Path) -> list[str]:
        return ["--rsa-private-key-path", str(self.private_key), "--authorized-users-path", str(users)]

    def close(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
