"""The host's one embedding worker, as ``ice serve`` runs it.

``EmbeddingService.start`` spawns the worker (``ext_proc.truncate.worker``) and waits for it
to load the model, so the first request does not pay for it; a thread then supervises it
(restart with backoff when it dies). When the worker cannot start (no torch, a bad model
path), ICE still serves: truncation falls back to recency and says so
(``x-ice-truncated: …;fallback=unavailable``, ``ice_truncation_fallbacks_total``).

Invariant: imports nothing heavy; the model lives only in the worker process.
"""

from __future__ import annotations

import asyncio
import logging
import os
import tempfile
import threading

from ext_proc.policy.settings import EmbeddingSpec
from ext_proc.truncate.process import EmbeddingWorkerProcess

__all__ = ["EmbeddingService"]

log = logging.getLogger("ice.embedding")


class EmbeddingService:
    """Start, supervise and stop the embedding worker for one ``ice serve``."""

    def __init__(self, spec: EmbeddingSpec) -> None:
        self._tmpdir: tempfile.TemporaryDirectory[str] | None = None
        if spec.socket:
            self.socket_path = spec.socket
        else:
            self._tmpdir = tempfile.TemporaryDirectory(prefix="ice-embed-")
            self.socket_path = os.path.join(self._tmpdir.name, "embed.sock")
        self.process = EmbeddingWorkerProcess(
            self.socket_path,
            spec.model or None,
            spec.cache_bytes,
            spec.threads,
            spec.max_seq_length,
            spec.quantize,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread: threading.Thread | None = None

    def start(self, ready_timeout_s: float = 180.0) -> bool:
        """Start the worker and wait until it serves; False (logged) when it could not."""
        ok = True
        try:
            self.process.start()
            self.process.wait_ready(ready_timeout_s)
            log.info("embedding worker pid %s ready on %s", self.process.pid, self.socket_path)
        except (OSError, RuntimeError) as e:
            ok = False
            log.error("embedding worker did not start (truncation falls back to recency): %s", e)
        self._loop = asyncio.new_event_loop()
        self._stop = asyncio.Event()
        self._thread = threading.Thread(target=self._supervise, name="embedding", daemon=True)
        self._thread.start()
        return ok

    def _supervise(self) -> None:
        assert self._loop is not None and self._stop is not None
        try:
            self._loop.run_until_complete(self.process.supervise(self._stop))
        finally:
            self._loop.close()

    def stop(self) -> None:
        """Stop supervising and stop the worker."""
        if self._loop is not None and self._stop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)
        self.process.stop()
        if self._tmpdir is not None:
            self._tmpdir.cleanup()
