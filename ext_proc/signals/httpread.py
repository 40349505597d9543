"""HTTP/1.x responses from bytes: the pure half of the collector's HTTP client (no I/O).

Job: ``ResponseReader.feed(data)`` → one ``Response`` once its bytes are in (``eof()`` when
the peer closed). Framing by ``Content-Length``, ``Transfer-Encoding: chunked``, or the end
of the connection; 1xx interim responses skipped; ``gzip``/``deflate`` bodies inflated (ICE
asks for ``identity``, but a server may insist). ``ext_proc.signals.httpget`` does the I/O.

Invariants:
- The only exception is ``HttpError`` (an ``OSError``): a status line or header that is not
  HTTP/1.x, a bad length or chunk size, an unsupported coding, bytes after the response, a
  head over ``MAX_HEAD_BYTES`` or a body over ``MAX_BODY_BYTES`` (a garbage source cannot
  fill ICE's memory).
- ``feed`` copies what it keeps across calls, so a caller may reuse its buffer between calls;
  the body of the returned ``Response`` may be a view of the last call's data (one call that
  held all of the body: no copy of a 50 KB page), valid until that buffer is reused.
"""

from __future__ import annotations

import re
import zlib
from dataclasses import dataclass
from typing import Final

__all__ = ["MAX_BODY_BYTES", "MAX_HEAD_BYTES", "HttpError", "Response", "ResponseReader"]

MAX_HEAD_BYTES: Final = 64 * 1024
MAX_BODY_BYTES: Final = 64 * 1024 * 1024


class HttpError(OSError):
    """The server's answer is not a usable HTTP/1.x response, or its status is not 200."""


@dataclass(frozen=True, slots=True)
class Response:
    status: int
    headers: dict[str, str]  # lower-case names; repeated headers joined with ", "
    # Not copied (50 KB a page): a view of the data ``feed`` was given when one call brought
    # the whole body, else the reader's buffer. Read it before that data's buffer is reused.
    body: bytes | bytearray | memoryview
    keep_alive: bool  # the connection may carry another request


_Data = bytes | bytearray | memoryview
_HEAD_PROBE_BYTES: Final = 4096  # where a response's first read is searched for its head


class ResponseReader:
    """Reads one response from the bytes ``feed`` hands it (and ``eof`` when the peer closed).

    ``feed`` returns the ``Response`` once it is complete, else None; bytes after the response
    (there should be none: ICE sends one request at a time) are an error. What ``feed`` keeps
    across calls it copies, so the caller may reuse its buffer between calls; the body of the
    returned ``Response`` may be a view of the last call's data (see ``Response.body``)."""

    def __init__(self) -> None:
        self._buf = bytearray()  # head and chunk framing not yet read
        self._body = bytearray()
        self._whole: _Data | None = None  # the body, when one piece of data held all of it
        self._head: tuple[int, dict[str, str], bool] | None = None  # status, headers, keep
        self._mode = ""  # "length" | "chunked" | "close" | "none"
        self._remaining = 0  # body bytes still expected ("length"), or of the current chunk
        self._chunk_state = "size"  # "size" | "data" | "crlf" | "trailer"
        self.received = False  # any byte arrived

    def feed(self, data: _Data) -> Response | None:
        if not data:
            return None
        self.received = True
        if self._mode == "length":  # the common case: straight into the body
            return self._read_length(data)
        if self._head is None and not self._buf:
            # A response's first read: usually its head and all of its body. Read the head from
            # a small copy and leave the body where it is.
            head_end = bytes(data[:_HEAD_PROBE_BYTES]).find(b"\r\n\r\n")
            if head_end >= 0:
                self._buf += data[: head_end + 4]
                if self._read_head() and self._mode == "length":
                    return self._read_length(data[head_end + 4 :])
                data = data[head_end + 4 :]  # an interim response, or other framing
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
    def _append(self, data: _Data) -> None:
        if len(self._body) + len(data) > MAX_BODY_BYTES:
            raise HttpError(f"response body larger than {MAX_BODY_BYTES} bytes")
        self._body += data

    def _read_length(self, data: _Data) -> Response | None:
        if len(data) > self._remaining:
            raise HttpError("bytes after the end of the response")
        self._remaining -= len(data)  # the declared length was checked against MAX_BODY_BYTES
        if self._remaining == 0 and not self._body:
            self._whole = data  # all of the body in one piece: no copy
            return self._finish()
        self._body += data
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
        body: _Data = self._body if self._whole is None else self._whole
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
