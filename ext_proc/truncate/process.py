"""The embedding worker as a child process: start it, wait for READY, stop it, supervise it.

``EmbeddingWorkerProcess`` starts ``python -m ext_proc.truncate.worker``, waits for its
``READY`` line, stops it (SIGTERM, then SIGKILL), and ``supervise`` restarts it when it dies
(exponential backoff, logged once per change of state). Standard library only, like the
client (ext_proc workers and ``ice serve`` import it).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_CACHE_BYTES", "EmbeddingWorkerProcess"]

log = logging.getLogger("ext_proc.truncate.client")

DEFAULT_CACHE_BYTES = 64 * 1024 * 1024
"""The worker's default cache budget (the same as ``embed.DEFAULT_CACHE_BYTES``)."""

_STDERR_TAIL_LINES = 40


class EmbeddingWorkerProcess:
    """The embedding worker as a child process: start, wait for READY, stop, supervise.

    The worker's stderr is drained by a thread: its last lines are kept for error messages
    (``stderr_tail``) and, with ``echo_stderr``, copied to this process's stderr (fd 2).
    The worker is started with ``--parent-pid``, so it exits when this process dies.
    """

    def __init__(
        self,
        socket_path: str,
        model: str | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        threads: int | None = None,
        max_seq_length: int | None = None,
        quantize: bool = False,
        *,
        echo_stderr: bool = True,
        env: Mapping[str, str] | None = None,
    ) -> None:
        self.socket_path = socket_path
        self.model = model
        self.cache_bytes = cache_bytes
        self.threads = threads
        self.max_seq_length = max_seq_length
        self.quantize = quantize
        self.echo_stderr = echo_stderr
        self.env = dict(env) if env is not None else None
        self._proc: subprocess.Popen[bytes] | None = None
        self._stdout_buffer = b""
        self._stderr_tail: collections.deque[str] = collections.deque(maxlen=_STDERR_TAIL_LINES)
        self._stderr_thread: threading.Thread | None = None

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def returncode(self) -> int | None:
        return self._proc.poll() if self._proc is not None else None

    def command(self) -> list[str]:
        """The worker's command line."""
        cmd = [sys.executable, "-m", "ext_proc.truncate.worker", "--socket", self.socket_path]
        if self.model:
            cmd += ["--model", self.model]
        cmd += ["--cache-bytes", str(self.cache_bytes), "--parent-pid", str(os.getpid())]
        if self.threads is not None:
            cmd += ["--threads", str(self.threads)]
        if self.max_seq_length is not None:
            cmd += ["--max-seq-length", str(self.max_seq_length)]
        if self.quantize:
            cmd.append("--quantize")
        return cmd

    def start(self) -> None:
        """Spawn the worker (a running one is an error: ``stop`` it first)."""
        if self.alive():
            raise RuntimeError(f"embedding worker already running (pid {self.pid})")
        self._close_pipes()
        self._stdout_buffer = b""
        self._stderr_tail.clear()
        self._proc = subprocess.Popen(
            self.command(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=self.env,
        )
        assert self._proc.stderr is not None
        self._stderr_thread = threading.Thread(
            target=self._drain_stderr,
            args=(self._proc.stderr,),
            name=f"embedding-worker-stderr-{self._proc.pid}",
            daemon=True,
        )
        self._stderr_thread.start()

    def _drain_stderr(self, stream: Any) -> None:
        for raw in iter(stream.readline, b""):
            self._stderr_tail.append(raw.decode("utf-8", "replace").rstrip("\n"))
            if self.echo_stderr:
                with contextlib.suppress(OSError):
                    os.write(2, raw)

    def stderr_tail(self) -> str:
        """The worker's last lines of stderr."""
        return "\n".join(self._stderr_tail)

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the worker prints ``READY``; RuntimeError if it exits or times out."""
        proc = self._proc
        if proc is None or proc.stdout is None:
            raise RuntimeError("embedding worker not started")
        deadline = time.monotonic() + timeout_s
        fd = proc.stdout.fileno()
        with selectors.DefaultSelector() as selector:
            selector.register(fd, selectors.EVENT_READ)
            while True:
                while b"\n" in self._stdout_buffer:
                    line, self._stdout_buffer = self._stdout_buffer.split(b"\n", 1)
                    text = line.decode("utf-8", "replace").strip()
                    if text.startswith("READY"):
                        return
                    if text:
                        log.info("embedding worker stdout: %s", text)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise RuntimeError(self._failure(f"not ready within {timeout_s:.1f} s"))
                if not selector.select(remaining):
                    continue
                chunk = os.read(fd, 65536)
                if not chunk:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        proc.wait(timeout=1.0)
                    if self._stderr_thread is not None:
                        self._stderr_thread.join(timeout=1.0)
                    raise RuntimeError(self._failure(f"exited (rc={proc.poll()}) before READY"))
                self._stdout_buffer += chunk

    def _failure(self, what: str) -> str:
        tail = self.stderr_tail()
        return f"embedding worker (pid {self.pid}) {what}" + (
            f"; its stderr ends with:\n{tail}" if tail else "; it wrote nothing to stderr"
        )

    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def stop(self, timeout_s: float = 5.0) -> int | None:
        """SIGTERM, then SIGKILL after ``timeout_s``; the exit status (None if never started)."""
        returncode = self._terminate(timeout_s)
        self._close_pipes()
        return returncode

    def _terminate(self, timeout_s: float) -> int | None:
        proc = self._proc
        if proc is None:
            return None
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("embedding worker pid %d ignored SIGTERM: killing it", proc.pid)
                proc.kill()
                proc.wait()
        return proc.returncode

    def _close_pipes(self) -> None:
        proc = self._proc
        if proc is None:
            return
        if proc.stdout is not None:
            proc.stdout.close()
        if self._stderr_thread is not None and proc.poll() is not None:
            self._stderr_thread.join(timeout=1.0)
        if proc.stderr is not None and (
            self._stderr_thread is None or not self._stderr_thread.is_alive()
        ):
            proc.stderr.close()

    async def supervise(
        self,
        stop_event: asyncio.Event,
        *,
        ready_timeout_s: float = 120.0,
        poll_interval_s: float = 0.2,
        min_backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        healthy_after_s: float = 30.0,
    ) -> None:
        """Keep the worker running until ``stop_event`` is set, then stop it.

        A worker that dies, or fails to start, is started again after a backoff that doubles
        from ``min_backoff_s`` up to ``max_backoff_s`` and resets once a worker has stayed up
        ``healthy_after_s``. Logs once per change of state (up / down), not per attempt.
        """
        backoff_s = min_backoff_s
        up_since: float | None = None
        was_up: bool | None = None
        try:
            while not stop_event.is_set():
                if self.alive():
                    if up_since is not None and time.monotonic() - up_since >= healthy_after_s:
                        backoff_s = min_backoff_s
                    await _wait(stop_event, poll_interval_s)
                    continue
                if was_up is not False and self._proc is not None:
                    log.warning(
                        "embedding worker pid %s exited (rc=%s); restarting it, backoff %.1f s",
                        self.pid,
                        self.returncode,
                        backoff_s,
                    )
                    was_up = False
                up_since = None
                if self._proc is not None:
                    if await _wait(stop_event, backoff_s):
                        break
                    backoff_s = min(max_backoff_s, backoff_s * 2)
                try:
                    self._close_pipes()
                    self.start()
                    if not await self._ready_or_stopped(stop_event, ready_timeout_s):
                        break
                except (OSError, RuntimeError) as exc:
                    if was_up is not False:
                        log.warning("embedding worker failed to start: %s", exc)
                        was_up = False
                    await asyncio.to_thread(self.stop, 2.0)
                    continue
                up_since = time.monotonic()
                if was_up is not True:
                    log.info("embedding worker ready (pid %s) at %s", self.pid, self.socket_path)
                    was_up = True
        finally:
            await asyncio.to_thread(self.stop)

    async def _ready_or_stopped(self, stop_event: asyncio.Event, timeout_s: float) -> bool:
        """Wait for READY (True) unless ``stop_event`` comes first (False: worker stopped)."""
        ready = asyncio.ensure_future(asyncio.to_thread(self.wait_ready, timeout_s))
        stopped = asyncio.ensure_future(stop_event.wait())
        try:
            await asyncio.wait({ready, stopped}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()
        if ready.done():
            ready.result()
            return True
        await asyncio.to_thread(self._terminate, 2.0)  # wait_ready then reads end of file
        with contextlib.suppress(RuntimeError):
            await ready
        self._close_pipes()
        return False


async def _wait(event: asyncio.Event, timeout_s: float) -> bool:
    """Whether ``event`` was set within ``timeout_s``."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()
    return event.is_set()
