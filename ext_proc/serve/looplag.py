"""How late the worker's event loop runs what is ready: the signal that headers are waiting.

Envoy gives each of ICE's answers ``message_timeout`` (1 s). A request's headers cost ICE a
millisecond or two, a long body's parse tens of milliseconds; under a flood (hundreds of
streams opening at once) the headers wait in the loop behind the bodies, and a header that
waits past the timeout lets its request through unjudged. The backlog (``ext_proc.admit.
backlog``) bounds the bodies' own wait, but not what they make the others wait; the loop's
lag measures exactly that.

``LoopLag`` is a task that asks to wake every ``every_s`` (10 ms) and records how late it
woke. ``lag()`` is the larger of

- the most it was late over the last ``window_s`` (0.1 s), and
- how overdue its next wake-up is now (read from inside a long turn of the loop, e.g. a
  header being judged after a body's parse, it is the wait that turn is causing),

in seconds. The gauge ``ice_event_loop_lag_seconds`` shows the most it was late over the
last second.

Invariants: read and written on the loop's thread only; ``lag()`` is 0 until ``start``;
the task does nothing but sleep and compare clocks (``time.monotonic``).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque

from ext_proc import telemetry

__all__ = ["EVERY_S", "WINDOW_S", "LoopLag"]

EVERY_S = 0.01
WINDOW_S = 0.1
GAUGE_WINDOW_S = 1.0


class LoopLag:
    """The event loop's lag (see the module docstring)."""

    def __init__(self, every_s: float = EVERY_S, window_s: float = WINDOW_S) -> None:
        self.every_s = every_s
        self.window_s = window_s
        self._due = 0.0  # when the monitor should wake next (0: not running)
        self._late: deque[tuple[float, float]] = deque()  # (woke at, seconds late)
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start measuring on the running loop (idempotent)."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="loop-lag")

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            self._task = None
        self._due = 0.0

    def lag(self) -> float:
        """Seconds: the most the loop was late in the last ``window_s``, or how overdue its
        next wake-up is now, whichever is larger."""
        if not self._due:
            return 0.0
        now = time.monotonic()
        overdue = max(0.0, now - self._due)
        recent = max((late for at, late in self._late if now - at <= self.window_s), default=0.0)
        return max(overdue, recent)

    def record(self, woke_s: float, late_s: float) -> None:
        """A wake-up at ``woke_s``, ``late_s`` late (the monitor's, and tests')."""
        late = self._late
        late.append((woke_s, late_s))
        while late and woke_s - late[0][0] > GAUGE_WINDOW_S:
            late.popleft()

    async def _run(self) -> None:
        gauge_at = 0.0
        while True:
            self._due = time.monotonic() + self.every_s
            await asyncio.sleep(self.every_s)
            woke = time.monotonic()
            self.record(woke, max(0.0, woke - self._due))
            if woke - gauge_at >= GAUGE_WINDOW_S / 4:
                gauge_at = woke
                telemetry.LOOP_LAG.set(max(late for _, late in self._late))
