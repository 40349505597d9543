"""Give the memory of a flood back: glibc allocator settings and a trim after the backlog drains.

A body is a few megabytes of ``bytes`` (and a parse of it); glibc serves such blocks with
``mmap`` only while they are above its *dynamic* mmap threshold, which rises to the size of
the largest block freed (up to 32 MiB on 64-bit). After the first long body, every later one
is carved from the heap, and a heap freed in the middle is not returned: ICE's RSS stayed
at its flood peak. ``tune()`` fixes the threshold (``mallopt(M_MMAP_THRESHOLD, 256 KiB)``,
which turns the dynamic adjustment off), so body-sized blocks are unmapped when freed, and
``Trimmer`` calls ``malloc_trim(0)`` (which releases the free pages of every arena, gRPC's
threads' included) once the worker's backlog has been empty for ``delay_s`` after at least
``min_bytes`` of bodies went through it.

Not glibc (musl, macOS): both are no-ops. Invariant: nothing here runs on the request path;
the trim runs from the event loop only when the backlog is idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import logging
from collections.abc import Callable

__all__ = ["MMAP_THRESHOLD_BYTES", "Trimmer", "tune"]

log = logging.getLogger("ice.memory")

M_MMAP_THRESHOLD = -3  # glibc malloc.h
MMAP_THRESHOLD_BYTES = 256 * 1024
TRIM_DELAY_S = 1.0
TRIM_MIN_BYTES = 16 * 1024 * 1024


def _libc() -> ctypes.CDLL | None:
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
    except OSError:
        return None
    if not hasattr(libc, "mallopt") or not hasattr(libc, "malloc_trim"):
        return None
    return libc


_LIBC = _libc()


def tune() -> bool:
    """Fix glibc's mmap threshold (see the module docstring); False when not glibc."""
    if _LIBC is None:
        return False
    return bool(_LIBC.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))


def trim() -> bool:
    """``malloc_trim(0)``: True when glibc returned memory to the system."""
    if _LIBC is None:
        return False
    return bool(_LIBC.malloc_trim(0))


class Trimmer:
    """Trims once the backlog has drained after a burst of bodies (see the module docstring)."""

    def __init__(
        self,
        idle: Callable[[], bool],
        delay_s: float = TRIM_DELAY_S,
        min_bytes: int = TRIM_MIN_BYTES,
        trim_fn: Callable[[], bool] = trim,
    ) -> None:
        self._idle = idle
        self.delay_s = delay_s
        self.min_bytes = min_bytes
        self._trim = trim_fn
        self._since_trim = 0
        self._timer: asyncio.TimerHandle | None = None
        self.trims = 0

    def seen(self, nbytes: int) -> None:
        """A body of ``nbytes`` went through the worker; arm the trim when it was the last."""
        self._since_trim += nbytes
        if self._since_trim < self.min_bytes or not self._idle():
            return
        if self._timer is not None:
            self._timer.cancel()
        with contextlib.suppress(RuntimeError):  # no running loop (tests)
            loop = asyncio.get_running_loop()
            self._timer = loop.call_later(self.delay_s, self._fire)

    def _fire(self) -> None:
        self._timer = None
        if not self._idle():
            return  # busy again: the next drain re-arms it
        self._since_trim = 0
        self.trims += 1
        self._trim()
