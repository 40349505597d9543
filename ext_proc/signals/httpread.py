"""HTTP/1.x responses from bytes: the pure half of the collector's HTTP client (no I/O).

Job: ``ResponseReader.feed(data)`` → one ``Response`` once its bytes are in (``eof()`` when
the peer closed). The parsing is llhttp's (``httptools``): framing by ``Content-Length`` or
``Transfer-Encoding: chunked``, 1xx interim responses skipped; this module adds the end of
a close-delimited body, ``gzip``/``deflate`` inflation (ICE asks for ``identity``, but a
server may insist) and the size limits. ``ext_proc.signals.httpget`` does the I/O.

Invariants:
- The only exception is ``HttpError`` (an ``OSError``): a status line or header that is not
  HTTP/1.x, a bad length or chunk size, an unsupported coding, bytes after the response, a
  head over ``MAX_HEAD_BYTES`` or a body over ``MAX_BODY_BYTES`` (a garbage source cannot
  fill ICE's memory).
- ``feed`` copies what it keeps across calls, so a caller may reuse its buffer between calls.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Final

import httptools

__all__ = ["MAX_BODY_BYTES", "MAX_HEAD_BYTES", "HttpError", "Response", "ResponseReader"]

MAX_HEAD_BYTES: Final = 64 * 1024
MAX_BODY_BYTES: Final = 64 * 1024 * 1024


class HttpError(OSError):
    """The server's answer is not a usable HTTP/1.x response, or its status is not 200."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    body: bytes | bytearray | memoryview
    keep_alive: bool  # the connection may carry another request


_Data = bytes | bytearray | memoryview


class ResponseReader:
    """Reads one response from the bytes ``feed`` hands it (and ``eof`` when the peer closed).

    The HTTP/1.x parsing is llhttp's (the ``httptools`` binding, as uvicorn uses it): status
    line, headers, ``Content-Length`` / chunked framing and interim 1xx responses. This class
    adds ICE's limits, the close-delimited end of a body, and the content coding.
    ``feed`` returns the ``Response`` once it is complete, else None; bytes after the response
    (there should be none: ICE sends one request at a time) are an error."""

    def __init__(self) -> None:
        self._parser = httptools.HttpResponseParser(self)
        self._headers: dict[str, str] = {}
        self._head_bytes = 0
        self._pre_bytes = 0  # bytes fed before the head was complete
        self._headers_done = False
        self._parts: list[bytes] = []
        self._body_bytes = 0
        self._done: Response | None = None
        self.received = False  # any byte arrived

    # -- llhttp callbacks ------------------------------------------------------------------
    def on_header(self, name: bytes, value: bytes) -> None:
        self._head_bytes += len(name) + len(value) + 4
        if self._head_bytes > MAX_HEAD_BYTES:
            raise HttpError(f"response head larger than {MAX_HEAD_BYTES} bytes")
        key, text = name.decode("latin-1").lower(), value.decode("latin-1").strip()
        self._headers[key] = f"{self._headers[key]}, {text}" if key in self._headers else text

    def on_headers_complete(self) -> None:
        coding = self._headers.get("transfer-encoding", "")
        if coding and coding.rsplit(",", 1)[-1].strip().lower() != "chunked":
            raise HttpError(f"unsupported transfer-encoding {coding!r}")
        length = self._headers.get("content-length")
        if length is not None and length.strip().isdigit() and int(length) > MAX_BODY_BYTES:
            raise HttpError(f"response body larger than {MAX_BODY_BYTES} bytes")
        self._headers_done = True

    def on_body(self, body: bytes) -> None:
        self._body_bytes += len(body)
        if self._body_bytes > MAX_BODY_BYTES:
            raise HttpError(f"response body larger than {MAX_BODY_BYTES} bytes")
        self._parts.append(body)

    def on_message_complete(self) -> None:
        status = self._parser.get_status_code()
        if 100 <= status < 200:  # interim (100 Continue, 103 Early Hints): skip
            self._headers, self._head_bytes, self._headers_done = {}, 0, False
            self._pre_bytes = 0
            return
        if self._done is not None:
            raise HttpError("bytes after the end of the response")
        self._done = self._finish(self._parser.should_keep_alive())

    # -- the reader --------------------------------------------------------------------------
    def feed(self, data: _Data) -> Response | None:
        if not data:
            return None
        self.received = True
        if self._done is not None:
            raise HttpError("bytes after the end of the response")
        if not self._headers_done:
            self._pre_bytes += len(data)
        try:
            self._parser.feed_data(bytes(data) if not isinstance(data, bytes) else data)
        except httptools.HttpParserCallbackError as e:
            cause = e.__context__ or e.__cause__
            raise (cause if isinstance(cause, HttpError) else HttpError(str(e))) from None
        except httptools.HttpParserError as e:
            if self._done is not None:  # a complete response, then more bytes
                raise HttpError("bytes after the end of the response") from None
            raise HttpError(f"not a usable HTTP/1.x response: {e}") from None
        if not self._headers_done and self._pre_bytes > MAX_HEAD_BYTES:  # llhttp would wait
            raise HttpError(f"response head larger than {MAX_HEAD_BYTES} bytes")
        return self._done

    def eof(self) -> Response:
        """The peer closed the connection: the response, if that completes it."""
        if self._done is not None:
            return self._done
        framed = "content-length" in self._headers or "transfer-encoding" in self._headers
        if self._headers_done and not framed:  # delimited by the end of the connection
            return self._finish(keep_alive=False)
        what = "the body" if self._headers_done else "a response"
        raise HttpError(f"connection closed before the end of {what}")

    def _finish(self, keep_alive: bool) -> Response:
        status = self._parser.get_status_code()
        body: _Data = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        coding = self._headers.get("content-encoding", "identity").lower().strip()
        if coding in ("gzip", "x-gzip", "deflate"):
            body = _inflate(body, coding)
        elif coding not in ("identity", ""):
            raise HttpError(f"unsupported content-encoding {coding!r}")
        return Response(status, self._headers, body, keep_alive)


def _inflate(body: _Data, coding: str) -> bytes:
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
