"""The collector's HTTP client: GET over kept-alive HTTP/1.1 connections, nothing else.

Why not aiohttp's ``ClientSession``: the collector fetches 64 pages of ~50 KB every 200 ms,
and a ``ClientSession.get`` costs ~200–300 µs of CPU per request even on a reused
connection (cookies, tracing, header multidicts, response objects); this client costs
~60 µs (``bench/collector_cost.py --http aiohttp|ice`` compares them).

Two parts, after h11's habit:
- ``ResponseReader`` (pure, no I/O): bytes in, one ``Response`` out. Framing by
  ``Content-Length``, ``Transfer-Encoding: chunked``, or the end of the connection; 1xx
  interim responses skipped; ``gzip``/``deflate`` bodies inflated (ICE asks for
  ``identity``, but a server may insist).
- ``HttpGetter`` (the I/O): per origin (scheme, host, port) a stack of idle connections;
  ``get(url, timeout_s)`` takes one (or opens one), writes the request, awaits the response.
  ``https`` uses the default TLS context. ``http://user:pass@host/`` sends basic auth.

Invariants:
- ``get`` raises only ``OSError`` (``HttpError`` for a bad response or a status other than
  200, ``ConnectionError``, ...) and ``TimeoutError``; it returns the body decoded as UTF-8
  (invalid bytes replaced), which both the exposition format and JSON mandate.
- A connection is reused only after a whole response that neither side asked to close; a
  failed, timed-out or cancelled request closes its connection. A kept-alive connection the
  server closed while idle is retried once on a fresh one (no byte of an answer came back).
- Heads over ``MAX_HEAD_BYTES`` and bodies over ``MAX_BODY_BYTES`` fail: a garbage source
  cannot fill ICE's memory.
"""

from __future__ import annotations

import asyncio
import base64
import re
import ssl
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Final
from urllib.parse import unquote, urlsplit

__all__ = [
    "MAX_BODY_BYTES",
    "MAX_HEAD_BYTES",
    "HttpError",
    "HttpGetter",
    "Response",
    "ResponseReader",
]

MAX_HEAD_BYTES: Final = 64 * 1024
MAX_BODY_BYTES: Final = 64 * 1024 * 1024
MAX_IDLE_PER_ORIGIN: Final = 256
RECV_BUFFER_BYTES: Final = 256 * 1024  # one per getter, shared by its connections


class HttpError(OSError):
    """The server's answer is not a usable HTTP/1.x response, or its status is not 200."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes | bytearray  # not copied into bytes (50 KB a page): do not mutate
    keep_alive: bool  # the connection may carry another request


class ResponseReader:
    """Reads one response from the bytes ``feed`` hands it (and ``eof`` when the peer closed).

    ``feed`` returns the ``Response`` once it is complete, else None; bytes after the response
    (there should be none: ICE sends one request at a time) are an error. ``feed`` copies what
    it keeps, so the caller may reuse its buffer."""

    def __init__(self) -> None:
        self._buf = bytearray()  # head and chunk framing not yet read
        self._body = bytearray()
        self._head: tuple[int, dict[str, str], bool] | None = None  # status, headers, keep
        self._mode = ""  # "length" | "chunked" | "close" | "none"
        self._remaining = 0  # body bytes still expected ("length"), or of the current chunk
        self._chunk_state = "size"  # "size" | "data" | "crlf" | "trailer"
        self.received = False  # any byte arrived

    def feed(self, data: bytes | bytearray | memoryview) -> Response | None:
        if not data:
            return None
        self.received = True
        if self._mode == "length":  # the common case: straight into the body
            return self._read_length(data)
        self._buf += data
        if self._head is None:
            if not self._read_head():
                return None
            if self._mode == "length":
                rest, self._buf = self._buf, bytearray()
                return self._read_length(rest)
        if self._mode == "chunked":
            return self._read_chunked()
        if self._mode == "none":
            return self._finish()
        self._append(self._buf)  # "close": everything until the end of the connection
        self._buf.clear()
        return None

    def eof(self) -> Response:
        """The peer closed the connection: the response, if that completes it."""
        if self._head is not None and self._mode == "close":
            return self._finish(keep_alive=False)
        what = "a response" if self._head is None else "the body"
        raise HttpError(f"connection closed before the end of {what}")

    # -- head --------------------------------------------------------------------------------
    def _read_head(self) -> bool:
        while True:
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_HEAD_BYTES:
                    raise HttpError(f"response head larger than {MAX_HEAD_BYTES} bytes")
                return False
            lines = self._buf[:end].decode("latin-1").split("\r\n")
            del self._buf[: end + 4]
            status, version = _status_line(lines[0])
            if 100 <= status < 200:  # interim (100 Continue, 103 Early Hints): skip
                continue
            headers = _headers(lines[1:])
            connection = headers.get("connection", "").lower()
            keep = "close" not in connection and (version == "1.1" or "keep-alive" in connection)
            encoding = headers.get("transfer-encoding", "").lower()
            length = headers.get("content-length")
            if status in (204, 304):
                self._mode = "none"
            elif encoding:
                if encoding.rsplit(",", 1)[-1].strip() != "chunked":
                    raise HttpError(f"unsupported transfer-encoding {encoding!r}")
                self._mode = "chunked"
            elif length is not None:
                self._mode = "length"
                self._remaining = _content_length(length)
            else:
                self._mode, keep = "close", False
            self._head = (status, headers, keep)
            return True

    # -- body --------------------------------------------------------------------------------
    def _append(self, data: bytes | bytearray | memoryview) -> None:
        if len(self._body) + len(data) > MAX_BODY_BYTES:
            raise HttpError(f"response body larger than {MAX_BODY_BYTES} bytes")
        self._body += data

    def _read_length(self, data: bytes | bytearray | memoryview) -> Response | None:
        if len(data) > self._remaining:
            raise HttpError("bytes after the end of the response")
        self._body += data  # within the declared length, checked against MAX_BODY_BYTES
        self._remaining -= len(data)
        return self._finish() if self._remaining == 0 else None

    def _read_chunked(self) -> Response | None:
        buf = self._buf
        while True:
            if self._chunk_state == "data":
                n = min(self._remaining, len(buf))
                self._append(memoryview(buf)[:n])
                del buf[:n]
                self._remaining -= n
                if self._remaining:
                    return None
                self._chunk_state = "crlf"
            line_end = buf.find(b"\r\n")
            if line_end < 0:
                if len(buf) > MAX_HEAD_BYTES:
                    raise HttpError("chunk framing line too long")
                return None
            line = bytes(buf[:line_end])
            del buf[: line_end + 2]
            if self._chunk_state == "crlf":
                if line:
                    raise HttpError("chunk not followed by CRLF")
                self._chunk_state = "size"
            elif self._chunk_state == "size":
                size_text = line.split(b";", 1)[0].strip()
                if _HEX.fullmatch(size_text) is None:
                    raise HttpError(f"bad chunk size {size_text[:20]!r}")
                self._remaining = int(size_text, 16)
                self._chunk_state = "data" if self._remaining else "trailer"
            elif not line:  # "trailer": an empty line ends the trailers and the body
                return self._finish()

    def _finish(self, *, keep_alive: bool = True) -> Response:
        assert self._head is not None
        if self._buf:
            raise HttpError("bytes after the end of the response")
        status, headers, keep = self._head
        body: bytes | bytearray = self._body
        coding = headers.get("content-encoding", "identity").lower().strip()
        if coding in ("gzip", "x-gzip", "deflate"):
            body = _inflate(body, coding)
        elif coding not in ("identity", ""):
            raise HttpError(f"unsupported content-encoding {coding!r}")
        return Response(status, headers, body, keep and keep_alive)


_HEX: Final = re.compile(rb"[0-9a-fA-F]{1,16}")


def _status_line(line: str) -> tuple[int, str]:
    parts = line.split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1.") or len(parts[1]) != 3:
        raise HttpError(f"not an HTTP/1.x status line: {line[:80]!r}")
    try:
        return int(parts[1]), parts[0][5:]
    except ValueError:
        raise HttpError(f"bad status code in {line[:80]!r}") from None


def _headers(lines: list[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(":")
        if not colon or not name or name != name.strip():
            raise HttpError(f"malformed header line {line[:80]!r}")
        key = name.lower()
        value = value.strip()
        out[key] = f"{out[key]}, {value}" if key in out else value
    return out


def _content_length(text: str) -> int:
    values = {v.strip() for v in text.split(",")}  # repeated equal values are allowed
    if len(values) != 1 or not (value := values.pop()).isdigit():
        raise HttpError(f"bad content-length {text[:40]!r}")
    length = int(value)
    if length > MAX_BODY_BYTES:
        raise HttpError(f"response body larger than {MAX_BODY_BYTES} bytes")
    return length


def _inflate(body: bytes | bytearray, coding: str) -> bytes:
    wbits = 16 + zlib.MAX_WBITS if coding in ("gzip", "x-gzip") else zlib.MAX_WBITS
    try:
        d = zlib.decompressobj(wbits)
        out = d.decompress(body, MAX_BODY_BYTES + 1)
    except zlib.error:
        if coding != "deflate":
            raise HttpError("corrupt gzip body") from None
        try:  # "deflate" sent as a raw stream, as some servers do
            d = zlib.decompressobj(-zlib.MAX_WBITS)
            out = d.decompress(body, MAX_BODY_BYTES + 1)
        except zlib.error:
            raise HttpError("corrupt deflate body") from None
    if len(out) > MAX_BODY_BYTES:
        raise HttpError(f"response body larger than {MAX_BODY_BYTES} bytes")
    return out


# -- I/O -------------------------------------------------------------------------------------


class _Connection(asyncio.BufferedProtocol):
    """One TCP (or TLS) connection carrying one request at a time. It receives into the
    getter's shared buffer (``recv_into``: no allocation per read; the reader copies what it
    keeps before the next read can happen)."""

    def __init__(self, buffer: memoryview) -> None:
        self.transport: asyncio.Transport | None = None
        self.reader: ResponseReader | None = None
        self.waiter: asyncio.Future[Response] | None = None
        self.closed = False
        self._buffer = buffer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._buffer

    def buffer_updated(self, nbytes: int) -> None:
        if self.reader is None or self.waiter is None or self.waiter.done():
            self.close()  # nobody asked: a confused server
            return
        try:
            response = self.reader.feed(self._buffer[:nbytes])
        except HttpError as e:
            self.waiter.set_exception(e)
            self.close()
            return
        if response is not None:
            self.reader = None
            self.waiter.set_result(response)

    def eof_received(self) -> bool:
        self._end(None)
        return False  # close our side too

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._end(exc)

    def _end(self, exc: Exception | None) -> None:
        self.closed = True
        waiter, reader = self.waiter, self.reader
        if waiter is None or waiter.done() or reader is None:
            return
        self.reader = None
        try:
            waiter.set_result(reader.eof())
        except HttpError as e:
            if not reader.received:
                waiter.set_exception(
                    _Unanswered(f"connection closed before a response{_because(exc)}")
                )
            elif exc is not None:
                waiter.set_exception(ConnectionError(f"{e}: {exc}"))
            else:
                waiter.set_exception(e)

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()


class _Unanswered(ConnectionError):
    """The connection ended before any byte of a response (retried once if it was idle)."""


def _because(exc: Exception | None) -> str:
    return f": {exc}" if exc else ""


@dataclass(frozen=True, slots=True)
class _Target:
    origin: tuple[str, str, int]  # scheme, host, port
    request: bytes


@lru_cache(maxsize=4096)
def _target(url: str) -> _Target:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("http", "https") or not parts.hostname:
        raise HttpError(f"not an http(s) URL: {url[:200]!r}")
    try:
        port = parts.port or (443 if scheme == "https" else 80)
    except ValueError:
        raise HttpError(f"bad port in {url[:200]!r}") from None
    host = parts.hostname
    host_header = f"[{host}]" if ":" in host else host
    if parts.port:
        host_header += f":{parts.port}"
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    lines = [
        f"GET {path} HTTP/1.1",
        f"Host: {host_header}",
        "User-Agent: ice-collector",
        "Accept: text/plain, application/json, */*",
        "Accept-Encoding: identity",
    ]
    if parts.username is not None:
        cred = f"{unquote(parts.username)}:{unquote(parts.password or '')}"
        lines.append(f"Authorization: Basic {base64.b64encode(cred.encode()).decode()}")
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1", errors="strict")
    return _Target((scheme, host, port), request)


class HttpGetter:
    """GET with kept-alive connections; ``close`` closes them. One per event loop."""

    def __init__(self, *, ssl_context: Callable[[], ssl.SSLContext] | None = None) -> None:
        self._idle: dict[tuple[str, str, int], list[_Connection]] = {}
        self._busy: set[_Connection] = set()
        self._ssl_context = ssl_context or ssl.create_default_context
        self._ssl: ssl.SSLContext | None = None
        self._buffer = memoryview(bytearray(RECV_BUFFER_BYTES))

    async def get(self, url: str, timeout_s: float) -> str:
        """The body of ``url`` (status 200 only), decoded as UTF-8; see the module's
        invariants for what it raises."""
        try:
            target = _target(url)
        except UnicodeEncodeError:
            raise HttpError(f"URL is not ASCII: {url[:200]!r}") from None
        async with asyncio.timeout(timeout_s):
            response = await self._exchange(target)
        if response.status != 200:
            raise HttpError(f"HTTP {response.status}")
        return response.body.decode("utf-8", errors="replace")

    async def _exchange(self, target: _Target) -> Response:
        idle = self._idle.get(target.origin)
        while idle:
            conn = idle.pop()
            if conn.closed:
                continue
            try:
                return await self._send(conn, target)
            except _Unanswered:
                continue  # the server closed it while idle: try the next, then a new one
        conn = await self._connect(target.origin)
        return await self._send(conn, target)

    async def _connect(self, origin: tuple[str, str, int]) -> _Connection:
        scheme, host, port = origin
        loop = asyncio.get_running_loop()
        context: ssl.SSLContext | None = None
        if scheme == "https":
            if self._ssl is None:
                self._ssl = self._ssl_context()
            context = self._ssl
        _, conn = await loop.create_connection(
            lambda: _Connection(self._buffer), host, port, ssl=context
        )
        return conn

    async def _send(self, conn: _Connection, target: _Target) -> Response:
        assert conn.transport is not None
        loop = asyncio.get_running_loop()
        conn.reader = ResponseReader()
        conn.waiter = loop.create_future()
        self._busy.add(conn)
        try:
            conn.transport.write(target.request)
            response = await conn.waiter
        except BaseException:
            conn.close()  # a half-read answer would poison the next request
            raise
        finally:
            self._busy.discard(conn)
            conn.waiter = None
        if response.keep_alive and not conn.closed:
            idle = self._idle.setdefault(target.origin, [])
            if len(idle) < MAX_IDLE_PER_ORIGIN:
                idle.append(conn)
                return response
        conn.close()
        return response

    async def close(self) -> None:
        """Close every connection (idle and in use)."""
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
        for conn in list(self._busy):
            conn.close()
        self._busy.clear()
