"""The ext_proc side of the embedding worker: the wire protocol, a client, the process handle.

Imports only the standard library: ext_proc workers import this module and must never load
torch, numpy or sentence-transformers (a test checks it). The worker
(``ext_proc.truncate.worker``) runs the model; one serves every ext_proc worker on a host.

Wire protocol (both sides use ``encode_frame`` / ``read_frame`` from here), over a Unix
stream socket: frames of a 4-byte big-endian length and that many bytes of UTF-8 JSON, at
most ``MAX_FRAME_BYTES``; a connection carries many requests at once, told apart by ``id``,
answered in any order::

    {"id": 1, "op": "similarities", "query": "...", "texts": ["..."], "deadline": 1.7e9}
        → {"id": 1, "sims": [0.41, ...]}
    {"id": 2, "op": "stats"}  → {"id": 2, "stats": {...}}
    any error                 → {"id": 3, "error": "message", "code": CODE}

    CODE: "bad_request" | "deadline" | "internal"

``deadline`` is an absolute ``time.time()``: a request still queued at its deadline is dropped
by the worker (``code: "deadline"``). A frame the worker cannot read an ``id`` from closes
that connection.

- ``EmbeddingClient``: one lazily opened, persistent connection; concurrent calls share it
  (a reader task hands each answer to its caller's future). Every call has a timeout
  (``EmbeddingTimeout``); an unreachable worker or an error answer is
  ``EmbeddingUnavailable``. After a failed connect the next attempt waits
  ``reconnect_backoff_s`` (0.5 s): meanwhile calls fail at once, without a syscall.
- ``EmbeddingWorkerProcess`` (``ext_proc.truncate.process``, re-exported here): the
  worker process's handle.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import struct
import time
from collections.abc import Mapping, Sequence
from typing import Any

from ext_proc.truncate.process import DEFAULT_CACHE_BYTES, EmbeddingWorkerProcess

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "MAX_FRAME_BYTES",
    "EmbeddingClient",
    "EmbeddingTimeout",
    "EmbeddingUnavailable",
    "EmbeddingWorkerProcess",
    "FrameTooLarge",
    "encode_frame",
    "read_frame",
]

log = logging.getLogger(__name__)

MAX_FRAME_BYTES = 16 * 1024 * 1024
"""The largest frame either side sends or accepts (the length prefix excluded)."""


_HEADER = struct.Struct(">I")


class EmbeddingUnavailable(Exception):
    """The embedding worker cannot be reached, or it answered an error."""


class EmbeddingTimeout(Exception):
    """The answer did not come within the call's timeout (or the worker dropped it late)."""


class FrameTooLarge(ValueError):
    """A frame longer than ``MAX_FRAME_BYTES``."""


def encode_frame(message: Mapping[str, Any], max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """``message`` as one frame: length prefix + compact JSON (non-ASCII escaped)."""
    body = json.dumps(message, separators=(",", ":")).encode("ascii")
    if len(body) > max_bytes:
        raise FrameTooLarge(f"frame of {len(body)} bytes exceeds {max_bytes}")
    return _HEADER.pack(len(body)) + body


async def read_frame(reader: asyncio.StreamReader, max_bytes: int = MAX_FRAME_BYTES) -> bytes:
    """The next frame's body; ``asyncio.IncompleteReadError`` at end of stream (``partial``
    empty when the stream ended cleanly between frames), ``FrameTooLarge`` (body unread)."""
    header = await reader.readexactly(_HEADER.size)
    (length,) = _HEADER.unpack(header)
    if length > max_bytes:
        raise FrameTooLarge(f"frame of {length} bytes exceeds {max_bytes}")
    return await reader.readexactly(length)


class _Connection:
    """One open connection: its writer, its reader task and the calls awaiting answers."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.closed = False
        self.write_lock = asyncio.Lock()
        self.reader_task = asyncio.get_running_loop().create_task(self._read_loop())

    async def _read_loop(self) -> None:
        reason = "connection closed by the embedding worker"
        try:
            while True:
                body = await read_frame(self.reader)
                answer = json.loads(body)
                if not isinstance(answer, dict) or not isinstance(answer.get("id"), int):
                    raise ValueError("answer without an integer id")
                future = self.pending.pop(answer["id"], None)
                if future is not None and not future.done():
                    future.set_result(answer)
        except asyncio.CancelledError:
            reason = "client closed"
            raise
        except asyncio.IncompleteReadError:
            pass
        except Exception as exc:  # OSError, malformed JSON, FrameTooLarge, ...
            reason = f"connection to the embedding worker failed: {exc}"
        finally:
            self.fail(reason)

    def fail(self, reason: str) -> None:
        """Close the connection and fail every call still waiting on it."""
        self.closed = True
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(EmbeddingUnavailable(reason))
        self.writer.close()

    async def send(self, frame: bytes) -> None:
        async with self.write_lock:
            self.writer.write(frame)  # whole frame at once: a cancelled drain never splits it
            await self.writer.drain()


class EmbeddingClient:
    """Calls one embedding worker over its Unix socket; use from one event loop."""

    def __init__(self, socket_path: str, *, reconnect_backoff_s: float = 0.5) -> None:
        self.socket_path = socket_path
        self.reconnect_backoff_s = reconnect_backoff_s
        self._conn: _Connection | None = None
        self._connect_lock: asyncio.Lock | None = None
        self._ids = itertools.count(1)
        self._retry_at = 0.0  # time.monotonic() before which no connect is attempted
        self._last_error = ""

    async def similarities(self, query: str, texts: Sequence[str], timeout_s: float) -> list[float]:
        """The cosine similarity of each text to ``query`` (0.0 for blank texts)."""
        if not texts:
            return []
        deadline = time.time() + timeout_s
        answer = await self._call(
            {"op": "similarities", "query": query, "texts": list(texts), "deadline": deadline},
            timeout_s,
        )
        sims = answer.get("sims")
        if (
            not isinstance(sims, list)
            or len(sims) != len(texts)
            or not all(isinstance(sim, int | float) for sim in sims)
        ):
            raise EmbeddingUnavailable(f"malformed answer from the embedding worker: {answer!r}")
        return [float(sim) for sim in sims]

    async def stats(self, timeout_s: float) -> dict[str, Any]:
        """The worker's counters (embedder stats, ``rss_bytes``, request counts)."""
        answer = await self._call({"op": "stats"}, timeout_s)
        stats = answer.get("stats")
        if not isinstance(stats, dict):
            raise EmbeddingUnavailable(f"malformed answer from the embedding worker: {answer!r}")
        return stats

    async def close(self) -> None:
        """Close the connection (calls still waiting fail); the client may be used again."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        conn.reader_task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await conn.reader_task
        with contextlib.suppress(OSError):
            await conn.writer.wait_closed()

    async def _call(self, message: dict[str, Any], timeout_s: float) -> dict[str, Any]:
        if timeout_s <= 0:
            raise EmbeddingTimeout("timeout_s <= 0: no time to ask the embedding worker")
        request_id = next(self._ids)
        message["id"] = request_id
        try:
            frame = encode_frame(message)
        except FrameTooLarge as exc:
            raise EmbeddingUnavailable(
                f"request too large for the embedding worker: {exc}"
            ) from None
        try:
            async with asyncio.timeout(timeout_s):
                conn = await self._connected()
                future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
                conn.pending[request_id] = future
                try:
                    await conn.send(frame)
                    answer = await future
                except OSError as exc:  # the worker dropped the connection under our send
                    conn.fail(f"send failed: {exc}")
                    raise EmbeddingUnavailable(
                        f"embedding worker connection failed: {exc}"
                    ) from exc
                finally:
                    conn.pending.pop(request_id, None)
        except TimeoutError:
            raise EmbeddingTimeout(
                f"no answer from the embedding worker within {timeout_s:.3f} s"
            ) from None
        error = answer.get("error")
        if error is not None:
            code = answer.get("code")
            if code == "deadline":
                raise EmbeddingTimeout(f"embedding worker dropped the request: {error}")
            raise EmbeddingUnavailable(f"embedding worker error ({code}): {error}")
        return answer

    async def _connected(self) -> _Connection:
        conn = self._conn
        if conn is not None and not conn.closed:
            return conn
        if self._connect_lock is None:
            self._connect_lock = asyncio.Lock()
        async with self._connect_lock:
            conn = self._conn
            if conn is not None and not conn.closed:
                return conn
            now = time.monotonic()
            if now < self._retry_at:
                raise EmbeddingUnavailable(
                    f"embedding worker at {self.socket_path} unreachable ({self._last_error}); "
                    f"next attempt in {self._retry_at - now:.2f} s"
                )
            try:
                reader, writer = await asyncio.open_unix_connection(self.socket_path)
            except OSError as exc:
                self._last_error = f"{type(exc).__name__}: {exc.strerror or exc}"
                self._retry_at = time.monotonic() + self.reconnect_backoff_s
                raise EmbeddingUnavailable(
                    f"embedding worker at {self.socket_path} unreachable ({self._last_error})"
                ) from exc
            self._conn = _Connection(reader, writer)
            return self._conn
