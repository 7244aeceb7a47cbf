"""One OTLP/HTTP export request, bounded in time and memory, for `ccscope daemon --otlp`.

The SDK's exporter (requests underneath) let a collector decide too much. A hostile probe found that it took a
307 answer for a delivery, though nothing was delivered; that a response body trickled a byte at a time held a
push for about 60 s despite --otlp-timeout 1s (the timeout bounds each read, not the request); and that a 200 MB
response body took the daemon from 51 to 459 MB. Here one POST goes over http.client: a 2xx status alone is
a delivery (redirects are not followed: a push is never sent elsewhere), the whole exchange keeps one deadline,
and at most MAX_RESPONSE_BYTES of the answer are read (OTLP's answer is a small protobuf; nothing of it is
used). Credentials in the URL become a Basic Authorization header and are never shown: `shown` is the URL
without them, for every line ccscope prints.
"""

from __future__ import annotations

import base64
import http.client
import ssl
import time
import urllib.parse
from dataclasses import dataclass

from .errors import UsageError

MAX_RESPONSE_BYTES = 64 << 10
READ_CHUNK = 16 << 10


class ExportFailed(Exception):
    """Why one export did not deliver, in a few words for the warning line."""


@dataclass(frozen=True)
class Endpoint:
    tls: bool
    host: str
    port: int
    path: str
    authorization: str | None  # from the URL's user:password, never printed
    shown: str  # the URL without credentials

    @classmethod
    def parse(cls, url: str) -> Endpoint:
        parts = urllib.parse.urlsplit(url)
        try:
            port = parts.port
        except ValueError:
            port = -1
        if parts.scheme not in ("http", "https") or not parts.hostname or port == -1:
            raise UsageError(f"--otlp {redact(url)!r}: give the collector's OTLP/HTTP metrics URL, e.g. "
                             "http://127.0.0.1:4318/v1/metrics")
        tls = parts.scheme == "https"
        authorization = None
        if parts.username is not None:
            secret = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
            authorization = "Basic " + base64.b64encode(secret.encode()).decode()
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        return cls(tls, parts.hostname, port or (443 if tls else 80), path, authorization, redact(url))


def redact(url: str) -> str:
    """The URL with any user:password@ taken out."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=host))


def tls_context(ca: str | None, cert: str | None, key: str | None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=ca)
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


def post(endpoint: Endpoint, body: bytes, headers: dict[str, str], timeout_s: float,
         tls: ssl.SSLContext | None = None) -> None:
    """Sends one protobuf export; raises ExportFailed unless the collector answered 2xx within timeout_s."""
    deadline = time.monotonic() + timeout_s
    if endpoint.tls:
        conn: http.client.HTTPConnection = http.client.HTTPSConnection(
            endpoint.host, endpoint.port, timeout=timeout_s, context=tls or ssl.create_default_context())
    else:
        conn = http.client.HTTPConnection(endpoint.host, endpoint.port, timeout=timeout_s)
    sent = {"Content-Type": "application/x-protobuf", **headers}
    if endpoint.authorization and not any(name.lower() == "authorization" for name in headers):
        sent["Authorization"] = endpoint.authorization
    try:
        conn.request("POST", endpoint.path, body=body, headers=sent)
        _remaining(conn, deadline)
        response = conn.getresponse()
        _read_bounded(conn, response, deadline)
    except TimeoutError:
        raise ExportFailed(f"no complete answer within {timeout_s:g} s") from None
    except (OSError, http.client.HTTPException) as exc:
        raise ExportFailed(str(exc) or type(exc).__name__) from None
    finally:
        conn.close()
    if not 200 <= response.status < 300:
        raise ExportFailed(f"the collector answered {response.status} {response.reason}".rstrip())


def _remaining(conn: http.client.HTTPConnection, deadline: float) -> None:
    """What is left of the deadline becomes the socket's timeout for the next read."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise TimeoutError
    if conn.sock is not None:
        conn.sock.settimeout(left)


def _read_bounded(conn: http.client.HTTPConnection, response: http.client.HTTPResponse, deadline: float) -> None:
    """Reads the answer's body up to MAX_RESPONSE_BYTES, each read within what is left of the deadline."""
    read = 0
    while read < MAX_RESPONSE_BYTES:
        _remaining(conn, deadline)
        chunk = response.read1(min(READ_CHUNK, MAX_RESPONSE_BYTES - read))
        if not chunk:
            return
        read += len(chunk)
