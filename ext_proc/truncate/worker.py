"""The embedding worker process: one per host, serving every ext_proc worker over a Unix socket.

    python -m ext_proc.truncate.worker --socket PATH [--model PATH] [--cache-bytes N]
                                       [--threads N] [--max-seq-length N] [--quantize]
                                       [--parent-pid PID]

Start-up, in order: load the ``Embedder`` (model + cache), claim the socket path (a stale
socket file is removed; a live worker's is not touched: exit 1), listen, print one line
``READY <socket path>`` to stdout. After that stdout is pointed at stderr, so nothing else
ever reaches the pipe ``EmbeddingWorkerProcess`` read READY from. SIGTERM or SIGINT: stop
listening, close the connections, remove the socket file, exit 0. With ``--parent-pid`` the
worker also exits when that process is no longer its parent (the supervisor died).

The wire protocol is ``ext_proc.truncate.client``'s (4-byte length + JSON frames, requests
multiplexed by ``id``).

Invariants:
- the event loop never runs the model: a ``similarities`` request whose query and texts are
  all cached is answered on the loop at once (a cache lookup and dot products), whatever the
  compute thread is doing; any other goes, in arrival order, to one dedicated compute thread
  (one encode at a time), while the loop keeps reading frames from every connection; answers
  go out as they are ready, in any order;
- a request whose ``deadline`` has passed on arrival, or when its turn in the compute thread
  comes, is answered ``code: "deadline"`` without computing; one whose turn comes in time is
  computed to the end even if its deadline passes meanwhile (its vectors then warm the cache
  for the conversation's next request);
- a connection's end cancels its requests still waiting for the compute thread;
- a bad request is answered (``bad_request``) and a failure (``internal``); a frame without a
  readable ``id`` (not JSON, not an object, no integer ``id``) or over ``MAX_FRAME_BYTES``
  closes that connection only. Nothing a client sends stops the worker.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import math
import os
import resource
import signal
import socket
import stat
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

from ext_proc.truncate.client import MAX_FRAME_BYTES, FrameTooLarge, encode_frame, read_frame
from ext_proc.truncate.embed import DEFAULT_CACHE_BYTES, Embedder, ModelNotFound

__all__ = ["EmbeddingServer", "SimilarityModel", "WorkerStartError", "main", "rss_bytes"]

log = logging.getLogger("ext_proc.truncate.worker")

_MAX_UNIX_PATH_BYTES = 107  # sun_path is 108 bytes on Linux, NUL included


class SimilarityModel(Protocol):
    """What the server needs of an ``Embedder``."""

    def similarities(self, query: str, texts: Sequence[str]) -> list[float]: ...

    def cached_similarities(self, query: str, texts: Sequence[str]) -> list[float] | None: ...

    def stats(self) -> Mapping[str, int | float | str]: ...


class WorkerStartError(RuntimeError):
    """The worker cannot take its socket path."""


class _RequestError(Exception):
    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code


def rss_bytes() -> int:
    """This process's resident set size (Linux ``/proc``; elsewhere the peak)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


class EmbeddingServer:
    """Answers the protocol's requests on any number of connections; see the module doc."""

    def __init__(self, model: SimilarityModel, *, max_frame_bytes: int = MAX_FRAME_BYTES) -> None:
        self.model = model
        self.max_frame_bytes = max_frame_bytes
        self._compute = ThreadPoolExecutor(max_workers=1, thread_name_prefix="embedding")
        self._writers: set[asyncio.StreamWriter] = set()
        self._started = time.monotonic()
        self.counters = {
            "requests": 0,
            "answered": 0,
            "deadline_drops": 0,
            "bad_requests": 0,
            "internal_errors": 0,
            "bad_frames": 0,
            "answered_from_cache": 0,
            "connections_total": 0,
        }
        self.queued = 0

    def stats(self) -> dict[str, Any]:
        """The model's stats plus the server's counters, ``rss_bytes`` and ``pid``."""
        return {
            **self.model.stats(),
            **self.counters,
            "queued": self.queued,
            "connections_open": len(self._writers),
            "rss_bytes": rss_bytes(),
            "pid": os.getpid(),
            "uptime_s": round(time.monotonic() - self._started, 3),
        }

    async def serve(
        self, socket_path: str, stop: asyncio.Event, on_ready: Callable[[], None]
    ) -> None:
        """Listen on ``socket_path`` until ``stop`` is set; ``on_ready`` once listening."""
        _claim_socket_path(socket_path)
        server = await asyncio.start_unix_server(self.handle, path=socket_path)
        inode = os.stat(socket_path).st_ino
        try:
            os.chmod(socket_path, 0o600)
            on_ready()
            await stop.wait()
        finally:
            server.close()
            for writer in list(self._writers):
                writer.close()
            await server.wait_closed()
            self._compute.shutdown(wait=False, cancel_futures=True)
            with contextlib.suppress(OSError):
                if os.stat(socket_path).st_ino == inode:  # still ours, not a successor's
                    os.unlink(socket_path)

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """One connection: read frames, answer each in its own task, until it ends."""
        self._writers.add(writer)
        self.counters["connections_total"] += 1
        write_lock = asyncio.Lock()
        tasks: set[asyncio.Task[None]] = set()
        try:
            while True:
                try:
                    body = await read_frame(reader, self.max_frame_bytes)
                except asyncio.IncompleteReadError:
                    break
                except FrameTooLarge as exc:
                    self._bad_frame(f"{exc}: closing the connection")
                    break
                except OSError:
                    break
                request = _parse(body)
                if request is None:
                    self._bad_frame("frame without a readable id: closing the connection")
                    break
                task = asyncio.create_task(self._answer(request, writer, write_lock))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            for task in tasks:
                task.cancel()
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    def _bad_frame(self, message: str) -> None:
        self.counters["bad_frames"] += 1
        log.warning("%s", message)

    async def _answer(
        self, request: dict[str, Any], writer: asyncio.StreamWriter, write_lock: asyncio.Lock
    ) -> None:
        request_id = request["id"]
        self.counters["requests"] += 1
        try:
            reply = {"id": request_id, **await self._dispatch(request)}
        except _RequestError as exc:
            counter = "deadline_drops" if exc.code == "deadline" else "bad_requests"
            self.counters[counter] += 1
            reply = {"id": request_id, "error": str(exc), "code": exc.code}
        except Exception as exc:
            self.counters["internal_errors"] += 1
            log.exception("request %d failed", request_id)
            reply = {"id": request_id, "error": f"{type(exc).__name__}: {exc}", "code": "internal"}
        self.counters["answered"] += 1
        frame = encode_frame(reply, max_bytes=2**31)  # answers are small: sims or counters
        if writer.is_closing():
            return
        with contextlib.suppress(OSError):
            async with write_lock:
                writer.write(frame)
                await writer.drain()

    async def _dispatch(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "stats":
            return {"stats": self.stats()}
        if op != "similarities":
            raise _RequestError("bad_request", f"unknown op {op!r}")
        query = request.get("query")
        texts = request.get("texts")
        deadline = request.get("deadline")
        if not isinstance(query, str):
            raise _RequestError("bad_request", "query must be a string")
        if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
            raise _RequestError("bad_request", "texts must be a list of strings")
        if (
            not isinstance(deadline, int | float)
            or isinstance(deadline, bool)
            or not math.isfinite(deadline)
        ):
            raise _RequestError("bad_request", "deadline must be a number (time.time())")
        _check_deadline(deadline)
        sims = self.model.cached_similarities(query, texts)
        if sims is not None:
            self.counters["answered_from_cache"] += 1
            return {"sims": sims}
        self.queued += 1
        try:
            loop = asyncio.get_running_loop()
            sims = await loop.run_in_executor(
                self._compute, self._similarities, query, texts, float(deadline)
            )
        finally:
            self.queued -= 1
        return {"sims": sims}

    def _similarities(self, query: str, texts: list[str], deadline: float) -> list[float]:
        """In the compute thread, when the request's turn comes."""
        _check_deadline(deadline)
        return self.model.similarities(query, texts)


def _check_deadline(deadline: float) -> None:
    late_s = time.time() - deadline
    if late_s >= 0:
        raise _RequestError("deadline", f"deadline passed {late_s * 1000:.1f} ms ago")


def _parse(body: bytes) -> dict[str, Any] | None:
    """The request, or None when it has no readable integer ``id``."""
    try:
        request = json.loads(body)
    except (ValueError, RecursionError):
        return None
    if not isinstance(request, dict):
        return None
    request_id = request.get("id")
    if not isinstance(request_id, int) or isinstance(request_id, bool):
        return None
    return request


def _check_socket_path(socket_path: str) -> None:
    if len(os.fsencode(socket_path)) > _MAX_UNIX_PATH_BYTES:
        raise WorkerStartError(
            f"socket path {socket_path!r} is longer than {_MAX_UNIX_PATH_BYTES} bytes"
        )


def _claim_socket_path(socket_path: str) -> None:
    """Remove a stale socket file at ``socket_path``; refuse a live one or a non-socket."""
    _check_socket_path(socket_path)
    try:
        mode = os.lstat(socket_path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise WorkerStartError(f"{socket_path} exists and is not a socket: not removing it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(1.0)
    try:
        probe.connect(socket_path)
    except OSError:
        log.info("removing stale socket %s", socket_path)
        os.unlink(socket_path)
        return
    finally:
        probe.close()
    raise WorkerStartError(f"another embedding worker is listening on {socket_path}")


async def _watch_parent(parent_pid: int, stop: asyncio.Event, interval_s: float = 0.5) -> None:
    while not stop.is_set():
        if os.getppid() != parent_pid:
            log.warning("parent process %d is gone: exiting", parent_pid)
            stop.set()
            return
        await asyncio.sleep(interval_s)


async def _run(model: SimilarityModel, socket_path: str, parent_pid: int | None) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)

    def ready() -> None:
        sys.stdout.write(f"READY {socket_path}\n")
        sys.stdout.flush()
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # stdout's pipe carries READY only
        log.info("listening on %s", socket_path)

    watcher = None
    if parent_pid is not None:
        watcher = asyncio.create_task(_watch_parent(parent_pid, stop))
    try:
        await EmbeddingServer(model).serve(socket_path, stop, ready)
    finally:
        if watcher is not None:
            watcher.cancel()


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m ext_proc.truncate.worker",
        description="The embedding worker: sentence similarities over a Unix socket.",
    )
    parser.add_argument("--socket", required=True, help="Unix socket path to listen on")
    parser.add_argument(
        "--model", default=None, help="sentence-transformers model folder (default: packaged)"
    )
    parser.add_argument("--cache-bytes", type=int, default=DEFAULT_CACHE_BYTES)
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    parser.add_argument(
        "--max-seq-length", type=int, default=None, help="word pieces embedded per text"
    )
    parser.add_argument("--quantize", action="store_true", help="int8 Linear layers (faster)")
    parser.add_argument(
        "--parent-pid", type=int, default=None, help="exit when this process is not the parent"
    )
    return parser


def _exit_now(signum: int, frame: object) -> None:
    # The model load may be inside torch's C++ initialisation: SystemExit there ran the
    # interpreter's finalisers over a half-initialised torch, which sometimes aborted
    # (SIGABRT, exit -6, seen in CI). Nothing is open yet that needs closing (the socket is
    # only bound after the load), so leave at once.
    sys.stderr.flush()
    os._exit(0)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s embedding-worker[%(process)d] %(levelname)s %(message)s",
    )
    # Until the event loop takes over, a stop signal simply ends the process, cleanly.
    signal.signal(signal.SIGTERM, _exit_now)
    signal.signal(signal.SIGINT, _exit_now)
    try:
        _claim_socket_path(args.socket)  # fail fast, before the model load; again when listening
        log.info("loading the embedding model (%s)", args.model or "default")
        model = Embedder(
            args.model, args.cache_bytes, args.threads, args.max_seq_length, args.quantize
        )
    except (ModelNotFound, WorkerStartError, ValueError) as exc:
        log.error("%s", exc)
        return 2
    log.info(
        "model %s loaded in %.2f s (%d threads, rss %.0f MiB)",
        model.model_path,
        model.load_s,
        model.threads,
        rss_bytes() / 2**20,
    )
    try:
        asyncio.run(_run(model, args.socket, args.parent_pid))
    except WorkerStartError as exc:
        log.error("%s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
