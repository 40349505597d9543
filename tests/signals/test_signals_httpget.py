"""httpread.py fed bytes (the pure response reader); httpget.py against a scripted server."""

from __future__ import annotations

import asyncio
import gzip
import socket
import zlib
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import pytest

from ext_proc.signals.httpget import HttpGetter
from ext_proc.signals.httpread import (
    MAX_BODY_BYTES,
    MAX_HEAD_BYTES,
    HttpError,
    Response,
    ResponseReader,
)

PAGE = b"vllm:num_requests_waiting 3\n" * 40


def read(raw: bytes, *, step: int | None = None, eof: bool = False) -> Response | None:
    """Feed ``raw`` whole, or ``step`` bytes at a time; then the end of the connection."""
    reader = ResponseReader()
    response = None
    pieces = [raw] if step is None else [raw[i : i + step] for i in range(0, len(raw), step)]
    for piece in pieces:
        assert response is None, "bytes after the response"
        response = reader.feed(piece)
    if eof and response is None:
        response = reader.eof()
    return response


LENGTH = b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\nContent-Type: text/plain\r\n\r\n%s" % (
    len(PAGE),
    PAGE,
)
CHUNKED = (
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    b"1a;ext=1\r\n" + PAGE[:26] + b"\r\n"
    b"%x\r\n%s\r\n" % (len(PAGE) - 26, PAGE[26:]) + b"0\r\nX-Trailer: t\r\n\r\n"
)
CLOSE = b"HTTP/1.0 200 OK\r\n\r\n" + PAGE
INTERIM = b"HTTP/1.1 100 Continue\r\n\r\n" + LENGTH
GZIP = b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: %d\r\n\r\n%s" % (
    len(gzip.compress(PAGE)),
    gzip.compress(PAGE),
)
_RAW_DEFLATE = zlib.compressobj(wbits=-zlib.MAX_WBITS)
RAW_DEFLATE_BODY = _RAW_DEFLATE.compress(PAGE) + _RAW_DEFLATE.flush()
DEFLATE = b"HTTP/1.1 200 OK\r\nContent-Encoding: deflate\r\nContent-Length: %d\r\n\r\n%s" % (
    len(RAW_DEFLATE_BODY),
    RAW_DEFLATE_BODY,
)


@pytest.mark.parametrize(
    ("raw", "keep_alive"),
    [
        (LENGTH, True),
        (CHUNKED, True),
        (CLOSE, False),
        (INTERIM, True),
        (GZIP, True),
        (DEFLATE, True),
    ],
    ids=["content-length", "chunked", "until-close", "100-continue", "gzip", "raw-deflate"],
)
@pytest.mark.parametrize("step", [None, 1, 7, 1000], ids=["whole", "1", "7", "1000"])
def test_every_framing_gives_the_body_however_the_bytes_arrive(
    raw: bytes, keep_alive: bool, step: int | None
) -> None:
    response = read(raw, step=step, eof=raw is CLOSE)
    assert response is not None
    assert (response.status, bytes(response.body), response.keep_alive) == (200, PAGE, keep_alive)


@pytest.mark.parametrize(
    ("head", "keep_alive"),
    [
        (b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nContent-Length: 0\r\n\r\n", False),
        (b"HTTP/1.0 200 OK\r\nConnection: Keep-Alive\r\nContent-Length: 0\r\n\r\n", True),
        (b"HTTP/1.1 204 No Content\r\n\r\n", True),
    ],
    ids=["1.1", "1.1-close", "1.0", "1.0-keep-alive", "204-no-body"],
)
def test_keep_alive_follows_the_version_and_connection_header(
    head: bytes, keep_alive: bool
) -> None:
    response = read(head)
    assert response is not None and response.keep_alive is keep_alive and response.body == b""


def test_headers_are_lower_case_and_repeats_joined() -> None:
    response = read(b"HTTP/1.1 503 Busy\r\nX-A: 1\r\nx-a: 2\r\nContent-Length: 0\r\n\r\n")
    assert response is not None
    assert (response.status, response.headers["x-a"]) == (503, "1, 2")


def test_the_reader_copies_what_it_keeps() -> None:
    """The getter hands in views of one reused receive buffer."""
    buffer = bytearray(LENGTH)
    reader = ResponseReader()
    assert reader.feed(memoryview(buffer)[:100]) is None
    buffer[:100] = b"x" * 100  # the next read overwrites the buffer
    response = reader.feed(memoryview(bytearray(LENGTH))[100:])
    assert response is not None and bytes(response.body) == PAGE


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (b"SSH-2.0-OpenSSH\r\n\r\n", "not a usable HTTP/1.x response"),
        (b"HTTP/1.1 2x0 OK\r\n\r\n", "not a usable HTTP/1.x response"),
        (b"HTTP/1.1 200 OK\r\nno colon\r\n\r\n", "not a usable HTTP/1.x response"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "not a usable HTTP/1.x response"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1, 2\r\n\r\n", "not a usable HTTP/1.x response"),
        (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", "unsupported transfer-encoding"),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1_0\r\n",
            "not a usable HTTP/1.x response",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n0x1\r\n",
            "not a usable HTTP/1.x response",
        ),
        (
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n1\r\nab\r\n",
            "not a usable HTTP/1.x response",
        ),
        (b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nab", "bytes after the end"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: br\r\nContent-Length: 0\r\n\r\n", "br"),
        (b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nContent-Length: 2\r\n\r\nab", "gzip"),
        (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % (MAX_BODY_BYTES + 1), "larger"),
        (b"HTTP/1.1 200 OK\r\nX: " + b"a" * MAX_HEAD_BYTES, "head larger"),
    ],
    ids=[
        "not-http",
        "status",
        "header",
        "negative-length",
        "conflicting-lengths",
        "transfer-encoding",
        "chunk-size-underscore",
        "chunk-size-0x",
        "chunk-crlf",
        "trailing-bytes",
        "content-encoding",
        "corrupt-gzip",
        "body-too-large",
        "head-too-large",
    ],
)
def test_bad_responses_raise_http_error(raw: bytes, message: str) -> None:
    with pytest.raises(HttpError, match=message):
        read(raw)


@pytest.mark.parametrize(
    ("raw", "message"),
    [(b"", "before the end of a response"), (LENGTH[:-5], "before the end of the body")],
    ids=["nothing", "cut-body"],
)
def test_a_connection_closed_early_is_an_error(raw: bytes, message: str) -> None:
    reader = ResponseReader()
    reader.feed(raw)
    with pytest.raises(HttpError, match=message):
        reader.eof()


# -- the getter, against a server that answers what each test scripts -----------------------

Answer = Callable[[bytes, int], Awaitable[bytes | None]]  # request head, connection no. → reply


class Scripted:
    """A server that reads each request head and writes ``answer``'s bytes (None: close)."""

    def __init__(self, answer: Answer) -> None:
        self.answer = answer
        self.requests: list[bytes] = []
        self.connections = 0
        self.port = 0
        self._server: asyncio.Server | None = None
        self._writers: list[asyncio.StreamWriter] = []

    async def start(self) -> Scripted:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        number = self.connections
        self._writers.append(writer)
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                self.requests.append(head)
                reply = await self.answer(head, number)
                if reply is None:
                    break
                writer.write(reply)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        writer.close()

    async def close(self) -> None:
        assert self._server is not None
        self._server.close()
        for writer in self._writers:
            writer.close()
        await self._server.wait_closed()
        await asyncio.sleep(0)  # let the handlers finish closing


def run(test: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(test())


def test_successive_gets_reuse_one_connection_and_send_a_plain_request() -> None:
    async def answer(head: bytes, connection: int) -> bytes:
        return LENGTH

    async def test() -> None:
        server = await Scripted(answer).start()
        port, requests = server.port, server.requests
        getter = HttpGetter()
        for _ in range(3):
            assert await getter.get(f"http://127.0.0.1:{port}/metrics?x=1", 2.0) == PAGE.decode()
        await getter.close()
        await server.close()
        assert len(requests) == 3
        first = requests[0].decode()
        assert first.startswith("GET /metrics?x=1 HTTP/1.1\r\n")
        assert f"Host: 127.0.0.1:{port}\r\n" in first and "Accept-Encoding: identity" in first

    run(test)


def test_a_connection_the_server_closed_while_idle_is_replaced() -> None:
    async def answer(head: bytes, connection: int) -> bytes | None:
        # the first connection answers once, then closes without answering the next request
        seen[connection] = seen.get(connection, 0) + 1
        return LENGTH if seen[connection] == 1 else None

    seen: dict[int, int] = {}

    async def test() -> None:
        server = await Scripted(answer).start()
        port = server.port
        getter = HttpGetter()
        url = f"http://127.0.0.1:{port}/"
        assert await getter.get(url, 2.0) == PAGE.decode()
        assert await getter.get(url, 2.0) == PAGE.decode()
        await getter.close()
        await server.close()
        assert seen == {1: 2, 2: 1}

    run(test)


def test_a_status_other_than_200_is_an_error_and_the_connection_stays_usable() -> None:
    statuses = [b"HTTP/1.1 503 Busy\r\nContent-Length: 4\r\n\r\nbusy", LENGTH]

    async def answer(head: bytes, connection: int) -> bytes:
        assert connection == 1
        return statuses.pop(0)

    async def test() -> None:
        server = await Scripted(answer).start()
        port = server.port
        getter = HttpGetter()
        with pytest.raises(HttpError, match="HTTP 503"):
            await getter.get(f"http://127.0.0.1:{port}/", 2.0)
        assert await getter.get(f"http://127.0.0.1:{port}/", 2.0) == PAGE.decode()
        await getter.close()
        await server.close()

    run(test)


def test_a_hanging_server_times_out_and_its_connection_is_not_reused() -> None:
    async def answer(head: bytes, connection: int) -> bytes:
        if connection == 1:
            await asyncio.sleep(30)
        return LENGTH

    async def test() -> None:
        server = await Scripted(answer).start()
        port, requests = server.port, server.requests
        getter = HttpGetter()
        with pytest.raises(TimeoutError):
            await getter.get(f"http://127.0.0.1:{port}/", 0.05)
        assert await getter.get(f"http://127.0.0.1:{port}/", 2.0) == PAGE.decode()
        await getter.close()
        await server.close()
        assert len(requests) == 2

    run(test)


def test_userinfo_becomes_basic_auth() -> None:
    async def answer(head: bytes, connection: int) -> bytes:
        return LENGTH

    async def test() -> None:
        server = await Scripted(answer).start()
        port, requests = server.port, server.requests
        getter = HttpGetter()
        await getter.get(f"http://ice:s%40cret@127.0.0.1:{port}/", 2.0)
        await getter.close()
        await server.close()
        assert b"Authorization: Basic aWNlOnNAY3JldA==\r\n" in requests[0]  # ice:s@cret

    run(test)


@pytest.mark.parametrize("url", ["ftp://h/metrics", "http:///metrics", "http://h:99999/"])
def test_urls_it_cannot_get_are_http_errors(url: str) -> None:
    async def test() -> None:
        with pytest.raises(HttpError):
            await HttpGetter().get(url, 1.0)

    run(test)


def test_a_refused_connection_is_an_os_error() -> None:
    with socket.socket() as sock:  # a port nobody listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def test() -> None:
        with pytest.raises(OSError):
            await HttpGetter().get(f"http://127.0.0.1:{port}/", 1.0)

    run(test)


def test_concurrent_gets_each_get_their_own_body() -> None:
    """The connections share one receive buffer; each body is decoded before the next read."""

    async def answer(head: bytes, connection: int) -> bytes:
        path = head.split(b" ")[1]
        body = path * 5000  # ~30-40 KB, different for every request
        return b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)

    async def test() -> None:
        server = await Scripted(answer).start()
        getter = HttpGetter()
        paths = [f"/{i}/metrics" for i in range(20)]
        bodies = await asyncio.gather(
            *(getter.get(f"http://127.0.0.1:{server.port}{p}", 5.0) for p in paths)
        )
        await getter.close()
        await server.close()
        assert bodies == [p * 5000 for p in paths]
        assert server.connections == 20

    run(test)


def test_a_url_that_is_not_ascii_is_an_http_error() -> None:
    async def test() -> None:
        with pytest.raises(HttpError, match="not ASCII"):
            await HttpGetter().get("http://h/métriques", 1.0)

    run(test)
