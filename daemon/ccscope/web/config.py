"""Credentials the Prometheus way: the exporter-toolkit web config file (`--web.config.file`).

The format is the one node_exporter and every exporter built on prometheus/exporter-toolkit read
(its web-configuration document): `tls_server_config` with cert_file/key_file, optional client
certificates and TLS versions; `basic_auth_users` mapping user names to bcrypt hashes;
`http_server_config.headers`. Keys ccscope does not implement are refused by name rather than ignored,
since each of them restricts access and silently dropping one would weaken what the user asked for.

The older `--basic-auth-file` (user:sha256hex lines, unsalted and fast to brute-force) still loads, with a
deprecation warning.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import re
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import bcrypt

from .. import safe_input
from ..errors import UsageError
from .http import Authenticator

FLAG = "--web.config.file"
BCRYPT_HASH = re.compile(r"^\$2[aby]\$\d\d\$[./A-Za-z0-9]{53}$")
TLS_VERSIONS = {"TLS10": ssl.TLSVersion.TLSv1, "TLS11": ssl.TLSVersion.TLSv1_1,
                "TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
# exporter-toolkit's client_auth_type values that Python's ssl module can express.
CLIENT_AUTH = {"NoClientCert": ssl.CERT_NONE, "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
               "RequireAndVerifyClientCert": ssl.CERT_REQUIRED}
UNSUPPORTED_TLS_KEYS = ("cert", "key", "client_ca", "client_allowed_sans", "cipher_suites", "curve_preferences")
HEADERS = ("Content-Security-Policy", "X-Frame-Options", "X-Content-Type-Options", "X-XSS-Protection",
           "Strict-Transport-Security")


@dataclass(frozen=True)
class TlsConfig:
    cert_file: Path
    key_file: Path
    client_auth_type: str = "NoClientCert"
    client_ca_file: Path | None = None
    min_version: str = "TLS12"
    max_version: str = "TLS13"

    def context(self, source: str) -> ssl.SSLContext:
        """The server-side SSLContext; `source` names the flag or file in the one-line error."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = TLS_VERSIONS[self.min_version]
        context.maximum_version = TLS_VERSIONS[self.max_version]
        try:
            context.load_cert_chain(str(self.cert_file), str(self.key_file))
            if self.client_ca_file:
                context.load_verify_locations(cafile=str(self.client_ca_file))
        except (OSError, ssl.SSLError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            raise UsageError(f"{source}: cannot load the TLS certificate/key: {reason}") from None
        context.verify_mode = CLIENT_AUTH[self.client_auth_type]
        return context


@dataclass(frozen=True)
class WebConfig:
    tls: TlsConfig | None = None
    users: dict[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: list[tuple[str, str]] = field(default_factory=list)


class BasicAuth(Authenticator):
    """HTTP basic auth against a table of user -> hash, checked by `verify(password, hash)`.

    Successful checks are cached (keyed by a digest of user, password and hash), as exporter-toolkit does:
    bcrypt costs ~100 ms a check by design, and Prometheus sends the same credentials every scrape. Unknown
    users are checked against a dummy hash, so the time taken does not tell which users exist.
    """

    CACHE_SIZE = 1024

    def __init__(self, users: dict[str, bytes], verify: Callable[[bytes, bytes], bool], dummy: bytes) -> None:
        self.users = dict(users)
        self.verify = verify
        self.dummy = dummy
        self._cache: set[bytes] = set()
        self._lock = threading.Lock()

    def check(self, authorization: str | None) -> str | None:
        credentials = _decode_basic(authorization)
        if credentials is None:
            return None
        user, password = credentials
        stored = self.users.get(user)
        key = hashlib.sha256(b"\0".join((user.encode(), password, stored or b""))).digest()
        with self._lock:
            if stored is not None and key in self._cache:
                return user
        if not self.verify(password, stored or self.dummy) or stored is None:
            return None
        with self._lock:
            if len(self._cache) >= self.CACHE_SIZE:
                self._cache.clear()
            self._cache.add(key)
        return user


def _decode_basic(authorization: str | None) -> tuple[str, bytes] | None:
    scheme, _, token = (authorization or "").strip().partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(token.strip(), validate=True).partition(b":")
        return (user.decode(), password) if sep else None
    except (binascii.Error, UnicodeDecodeError):
        return None


def _bcrypt_verify(password: bytes, hashed: bytes) -> bool:
    try:
        return bcrypt.checkpw(password, hashed)
    except ValueError:  # bcrypt >= 5 refuses passwords over 72 bytes: such a password never matches
        return False


def bcrypt_auth(users: dict[str, bytes]) -> BasicAuth:
    cost = int(next(iter(users.values()))[4:6])
    return BasicAuth(users, _bcrypt_verify, bcrypt.hashpw(b"ccscope-dummy", bcrypt.gensalt(cost)))


# --- the web config file --------------------------------------------------------------------------------------


def _mapping(value: object, where: str, path: Path) -> dict:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise UsageError(f"{FLAG} {path}: {where} must be a mapping")
    return value


def _string(value: object, where: str, path: Path) -> str:
    if not isinstance(value, str) or not value:
        raise UsageError(f"{FLAG} {path}: {where} must be a non-empty string")
    return value


def _unknown(section: dict, known: tuple[str, ...], where: str, path: Path) -> None:
    for key in section:
        if key not in known:
            raise UsageError(f"{FLAG} {path}: unknown field {where}{safe_input.shown_key(key)} "
                             f"(fields: {', '.join(known)})")


def load_web_config(path: Path) -> WebConfig:
    """Parse and validate the file; every problem is a UsageError naming the field."""
    # the scenario files' loader: no aliases, no duplicate users, bounded depth and size
    doc = safe_input.load_yaml(safe_input.read_text(path, f"a {FLAG} file", where=f"{FLAG} {path}"), f"{FLAG} {path}")
    doc = _mapping(doc, "the file", path)
    _unknown(doc, ("tls_server_config", "http_server_config", "basic_auth_users", "rate_limit"), "", path)
    if doc.get("rate_limit") is not None:
        raise UsageError(f"{FLAG} {path}: rate_limit is not supported by ccscope",
                         "remove it; --max-connections bounds the load instead")
    return WebConfig(tls=_tls(_mapping(doc.get("tls_server_config"), "tls_server_config", path), path),
                     users=_users(_mapping(doc.get("basic_auth_users"), "basic_auth_users", path), path),
                     headers=_headers(_mapping(doc.get("http_server_config"), "http_server_config", path), path))


def _tls(section: dict, path: Path) -> TlsConfig | None:
    known = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version",
             "prefer_server_cipher_suites", *UNSUPPORTED_TLS_KEYS)
    _unknown(section, known, "tls_server_config.", path)
    for key in UNSUPPORTED_TLS_KEYS:
        if section.get(key):
            raise UsageError(f"{FLAG} {path}: tls_server_config.{key} is not supported by ccscope",
                             "use cert_file/key_file/client_ca_file" if key in ("cert", "key", "client_ca")
                             else "remove it")
    if not section.get("cert_file") and not section.get("key_file"):
        if section.get("client_ca_file") or section.get("client_auth_type", "NoClientCert") != "NoClientCert":
            raise UsageError(f"{FLAG} {path}: client certificates need cert_file and key_file in tls_server_config")
        return None  # exporter-toolkit: no certificate, no TLS
    base = path.parent  # relative file names are relative to the config file, as in exporter-toolkit

    def file(key: str) -> Path:
        return base / _string(section.get(key), f"tls_server_config.{key}", path)

    auth_type = section.get("client_auth_type") or "NoClientCert"
    if auth_type not in CLIENT_AUTH:
        raise UsageError(f"{FLAG} {path}: tls_server_config.client_auth_type {auth_type!r} is not supported",
                         f"use one of {', '.join(CLIENT_AUTH)}")
    client_ca = file("client_ca_file") if section.get("client_ca_file") else None
    if (client_ca is None) != (auth_type == "NoClientCert"):
        raise UsageError(f"{FLAG} {path}: client_auth_type {auth_type} "
                         + ("needs client_ca_file" if client_ca is None else "with client_ca_file set"),
                         "set both, e.g. RequireAndVerifyClientCert and a CA file, or neither")
    versions = {}
    for key, default in (("min_version", "TLS12"), ("max_version", "TLS13")):
        versions[key] = section.get(key) or default
        if versions[key] not in TLS_VERSIONS:
            raise UsageError(f"{FLAG} {path}: tls_server_config.{key} {versions[key]!r} is not one of "
                             f"{', '.join(TLS_VERSIONS)}")
    if TLS_VERSIONS[versions["min_version"]] > TLS_VERSIONS[versions["max_version"]]:
        raise UsageError(f"{FLAG} {path}: tls_server_config.min_version is above max_version")
    return TlsConfig(cert_file=file("cert_file"), key_file=file("key_file"), client_auth_type=auth_type,
                     client_ca_file=client_ca, **versions)


def _users(section: dict, path: Path) -> dict[str, bytes]:
    users = {}
    for user, hashed in section.items():
        if not isinstance(user, str) or not user or ":" in user:
            raise UsageError(f"{FLAG} {path}: basic_auth_users: user name {user!r} is empty, not a string or has ':'")
        if not isinstance(hashed, str) or not BCRYPT_HASH.match(hashed):
            raise UsageError(f"{FLAG} {path}: basic_auth_users.{user} is not a bcrypt hash",
                             "make one with `htpasswd -nBC 10 \"\" | tr -d ':\\n'`")
        users[user] = hashed.encode()
    return users


def _headers(section: dict, path: Path) -> list[tuple[str, str]]:
    _unknown(section, ("http2", "headers"), "http_server_config.", path)
    headers = _mapping(section.get("headers"), "http_server_config.headers", path)
    _unknown(headers, HEADERS, "http_server_config.headers.", path)
    out = []
    for name, value in headers.items():
        if value in (None, ""):
            continue
        if not isinstance(value, str) or not value.isascii() or not value.isprintable():
            raise UsageError(f"{FLAG} {path}: http_server_config.headers.{name} must be one line of ASCII text")
        out.append((name, value))
    return out


# --- the deprecated --basic-auth-file ---------------------------------------------------------------------------


def _sha256_verify(password: bytes, digest: bytes) -> bool:
    return hmac.compare_digest(hashlib.sha256(password).hexdigest().encode(), digest)


def load_basic_auth_file(path: Path) -> BasicAuth:
    """A file of `user:sha256hex` lines (the format before --web.config.file)."""
    flag = "--basic-auth-file"
    users = {}
    for number, line in enumerate(safe_input.read_text(path, f"a {flag} file", where=f"{flag} {path}").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        user, sep, digest = line.strip().partition(":")
        if not sep or not user or not re.fullmatch(r"[0-9a-fA-F]{64}", digest):
            raise UsageError(f"{flag} {path}:{number}: expected user:sha256hex")
        users[user] = digest.lower().encode()
    if not users:
        raise UsageError(f"{flag} {path}: no users")
    return BasicAuth(users, _sha256_verify, b"0" * 64)
