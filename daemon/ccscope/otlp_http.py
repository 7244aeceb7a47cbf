"""One OTLP/HTTP export request, bounded in time and memory, for `ccscope daemon --otlp`.

The SDK's exporter (requests underneath) let a collector decide too much. A hostile probe found that it took a
307 answer for a delivery, though nothing was delivered; that an answer trickled a byte at a time held a push
for about 60 s despite --otlp-timeout 1s (a socket timeout bounds each read, not the exchange); and that a
200 MB answer took the daemon from 51 to 459 MB. Here one POST goes over http.client:
- a 2xx status alone is a delivery; a redirect is a failure, never followed (a push is not sent elsewhere);
- the exchange has one deadline: a timer shuts the socket down when it passes, wherever the exchange is
  (sending, the status line, headers, `100 Continue`s). Name resolution is the one step it does not cover;
- the answer's body is never read (nothing of it is used), and its headers are read within http.client's
  own bounds (100 lines of at most 64 KiB);
- credentials in the URL become a Basic Authorization header and are never shown: `shown` is the URL
  without them, for every line ccscope prints, and what a collector says is cut to a short printable line.
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import socket
import ssl
import threading
import urllib.parse
from dataclasses import dataclass, field

from .errors import UsageError

SAID_CHARS = 80  # of a collector's own words (its reason phrase, an error) in a warning line


class ExportFailed(Exception):
    """Why one export did not deliver, in a few words for the warning line."""


@dataclass(frozen=True)
class Endpoint:
    tls: bool
    host: str
    port: int
    path: str
    shown: str  # the URL without credentials
    authorization: str | None = field(default=None, repr=False)  # from the URL's user:password

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        bad = UsageError(f"--otlp {redact(url)!r}: give the collector's OTLP/HTTP metrics URL, e.g. "
                         "http://127.0.0.1:4318/v1/metrics")
        try:
            parts = urllib.parse.urlsplit(url)
            port = parts.port
        except ValueError:
            raise bad from None
        if parts.scheme not in ("http", "https") or not parts.hostname or port == 0:
            raise bad
        tls = parts.scheme == "https"
        authorization = None
        if parts.username is not None:
            secret = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            authorization = "Basic " + base64.b64encode(secret.encode()).decode()
        path = urllib.parse.quote(parts.path or "/", safe="/%:@&=+$,;~!*'()") + \
            (f"?{urllib.parse.quote(parts.query, safe='/%:@&=+$,;~!*()?')}" if parts.query else "")
        return cls(tls, parts.hostname, port or (443 if tls else 80), path, redact(url), authorization)


def redact(url: str) -> str:
    """The URL with any user:password@ taken out."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    netloc, slash, tail = rest.partition("/")
    return f"{scheme}://{netloc.rpartition('@')[2]}{slash}{tail}"


def check_header(name: str, value: str) -> None:
    """A header http.client can send: no line break, Latin-1 only (the value is never quoted back)."""
    for part in (name, value):
        if any(c in part for c in "\r\n\0") or not _latin1(part):
            raise UsageError(f"--otlp-header {name.strip()[:40]!r}: a header name or value may not hold line breaks "
                             "or characters outside Latin-1")


def _latin1(text: str) -> bool:
    try:
        text.encode("latin-1")
    except UnicodeEncodeError:
        return False
    return True


def tls_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext:
    """The client's TLS settings; a file that cannot be used is one line, said before anything starts."""
    try:
        context = ssl.create_default_context(cafile=ca)
        if cert is not None:
            context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise UsageError(f"--otlp-ca/--otlp-client-cert/--otlp-client-key: {exc.strerror or exc}") from None
    return context


def post(endpoint: Endpoint, body: bytes, headers: dict[str, str], timeout_s: float,
         tls: ssl.SSLContext | None = None) -> None:
    """Sends one protobuf export; raises ExportFailed unless the collector answered 2xx within timeout_s."""
    if endpoint.tls:
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            endpoint.host, endpoint.port, timeout=timeout_s, context=tls or ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout_s)
    sent = {"Content-Type": "application/x-protobuf", **headers}
    if endpoint.authorization and not any(name.lower() == "authorization" for name in headers):
        sent["Authorization"] = endpoint.authorization
    expired = threading.Event()
    timer = threading.Timer(timeout_s, _cut, (conn, expired))
    timer.start()
    try:
        conn.request("POST", endpoint.path, body=body, headers=sent)
        response = conn.getresponse()
        status, reason = response.status, response.reason
    except (OSError, ValueError, http.client.HTTPException) as exc:
        if expired.is_set() or isinstance(exc, TimeoutError):
            raise ExportFailed(f"no answer within {timeout_s:g} s") from None
        raise ExportFailed(said(str(exc) or type(exc).__name__)) from None
    finally:
        timer.cancel()
        conn.close()
    if expired.is_set():  # cut short: what was read may look complete (headers end at the shutdown's EOF)
        raise ExportFailed(f"no answer within {timeout_s:g} s")
    if not 200 <= status < 300:
        raise ExportFailed(f"the collector answered {status} {said(reason)}".rstrip())


def _cut(conn: http.client.HTTPConnection, expired: threading.Event) -> None:
    """At the deadline: whatever the exchange is waiting for ends now."""
    expired.set()
    sock = conn.sock
    if sock is not None:
        with contextlib.suppress(OSError):  # closed meanwhile
            sock.shutdown(socket.SHUT_RDWR)


def said(text: str) -> str:
    """A collector's words, as one short printable line."""
    return "".join(c for c in text if c.isprintable())[:SAID_CHARS]
