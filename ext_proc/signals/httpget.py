"""The collector's HTTP client: GET over kept-alive HTTP/1.1 connections, nothing else.

Why not aiohttp's ``ClientSession``: the collector fetches 64 pages of ~50 KB every 200 ms,
and a ``ClientSession.get`` costs ~200 µs of CPU per request even on a reused connection
(cookies, tracing, header multidicts, response objects, a 256 KiB buffer per read); this
client ~100 µs, decoding included (``bench/collector_cost.py --http aiohttp|ice``).

``HttpGetter`` keeps, per origin (scheme, host, port), a stack of idle connections;
``get(url, timeout_s)`` takes one (or opens one), writes the request, and reads the answer
with ``ext_proc.signals.httpread.ResponseReader`` (the pure half). Every connection receives
into one shared buffer (``BufferedProtocol``: no allocation per read) and decodes a complete
body before returning. ``https`` uses the default TLS context; ``http://user:pass@host/``
sends basic auth.

Invariants:
- ``get`` raises only ``OSError`` (``HttpError`` for a bad response or a status other than
  200, ``ConnectionError``, ...) and ``TimeoutError``; it returns the body decoded as UTF-8
  (invalid bytes replaced), which both the exposition format and JSON mandate.
- A connection is reused only after a whole response that neither side asked to close; a
  failed, timed-out or cancelled request closes its connection. A kept-alive connection the
  server closed while idle is retried once on a fresh one (no byte of an answer came back).
"""

from __future__ import annotations

import asyncio
import base64
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from typing import Final
from urllib.parse import unquote, urlsplit

from ext_proc.signals.httpread import HttpError, Response, ResponseReader

__all__ = ["HttpError", "HttpGetter"]

MAX_IDLE_PER_ORIGIN: Final = 256
RECV_BUFFER_BYTES: Final = 256 * 1024  # one per getter, shared by its connections


@dataclass(frozen=True, slots=True)
class _Reply:
    status: int
    keep_alive: bool
    text: str  # the body decoded as UTF-8, invalid bytes replaced


def _reply(response: Response) -> _Reply:
    """Decode now: the body may be a view of the receive buffer the next read overwrites."""
    return _Reply(response.status, response.keep_alive, str(response.body, "utf-8", "replace"))


class _Connection(asyncio.BufferedProtocol):
    """One TCP (or TLS) connection carrying one request at a time. It receives into the
    getter's shared buffer (``recv_into``: no allocation per read) and decodes a complete
    body before returning, as the next read may overwrite that buffer."""

    def __init__(self, buffer: memoryview) -> None:
        self.transport: asyncio.Transport | None = None
        self.reader: ResponseReader | None = None
        self.waiter: asyncio.Future[_Reply] | None = None
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
            self.waiter.set_result(_reply(response))

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
            waiter.set_result(_reply(reader.eof()))
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
    request = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")  # else UnicodeEncodeError
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
            reply = await self._exchange(target)
        if reply.status != 200:
            raise HttpError(f"HTTP {reply.status}")
        return reply.text

    async def _exchange(self, target: _Target) -> _Reply:
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

    async def _send(self, conn: _Connection, target: _Target) -> _Reply:
        assert conn.transport is not None
        loop = asyncio.get_running_loop()
        conn.reader = ResponseReader()
        conn.waiter = loop.create_future()
        self._busy.add(conn)
        try:
            conn.transport.write(target.request)
            reply = await conn.waiter
        except BaseException:
            conn.close()  # a half-read answer would poison the next request
            raise
        finally:
            self._busy.discard(conn)
            conn.waiter = None
        if reply.keep_alive and not conn.closed:
            idle = self._idle.setdefault(target.origin, [])
            if len(idle) < MAX_IDLE_PER_ORIGIN:
                idle.append(conn)
                return reply
        conn.close()
        return reply

    async def close(self) -> None:
        """Close every connection (idle and in use)."""
        for idle in self._idle.values():
            for conn in idle:
                conn.close()
        self._idle.clear()
        for conn in list(self._busy):
            conn.close()
        self._busy.clear()
