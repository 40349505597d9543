"""A worker's body backlog, and when a request is judged from its headers instead.

ICE answers a request's headers at once; its body then costs the worker its transfer from
Envoy, the parse and the judgement, and Envoy waits ``message_timeout`` for the answer before
it lets the request through unjudged (fail-open). Under a flood the bodies would queue past
that timeout, so ICE keeps account of what it has asked for and, when a body could not be
judged in time or would hold too much memory, decides from the headers instead
(``ext_proc.policy.coarse``).

Accounting (one ``Backlog`` per worker; called from the event loop's thread only):

- A request is **admitted** to the body phase at its headers with a promise of L bytes: its
  ``content-length``. One without (chunked) is admitted when its body arrives (Envoy buffers
  it whole), with L its size: at its headers it could be anything up to ``max_body_bytes``,
  and promising that much would turn it, beside any other upload, into a coarse verdict. The
  promise counts in ``inflight_bytes`` (and in its lane's bytes) until the body is answered,
  dropped or its stream ends (``release``).
- **Lanes**: ``inline`` (judged on the event loop) and ``helper`` (exact token counts of
  bodies over ``exact_count_inline_bytes``, in the offload process); each judges one body at
  a time, in arrival order, at a cost of c seconds per byte.
- ``admit(L, lane)`` returns a ticket (send the body) or why the headers decide instead:
  - ``bytes``: inflight_bytes + L > limit, with limit = window for bodies of at most
    ``SMALL_BODY_BYTES`` and window × (1 − SMALL_RESERVE) for larger ones (the rest is kept
    for short requests, so that a flood of long bodies does not turn every chat turn into a
    coarse verdict). A worker with nothing in flight admits any body (up to
    ``max_body_bytes``, the largest Envoy sends), so it always makes progress;
  - ``lag``: a body over ``SMALL_BODY_BYTES`` while something is in flight and the event
    loop runs late by more than ``LAG_FRACTION`` × message_timeout (20 ms at 1 s;
    ``ext_proc.serve.looplag``): the ready work waiting in the loop is other requests'
    headers, which a long body's parse would make wait longer (under a flood of long
    bodies, headers that waited past Envoy's timeout were let through unjudged);
  - ``time``: (lane_bytes + L) × c_lane > budget_s, with budget_s = BUDGET_FRACTION ×
    message_timeout: the body would wait behind the lane's admitted bodies and be judged
    after Envoy's deadline. The fraction leaves room for the transfer from Envoy, which ICE
    does not see. In an empty lane the whole message_timeout is the budget: a body that
    could not be judged in time even alone (exact counting of a very long prompt with a slow
    tokenizer) gets the coarse verdict rather than Envoy's fail-open.
- ``late(L, lane, waited_s)`` at the body phase: waited_s (since Envoy's timer started, as
  ICE can know it: ``timer_started`` below; plus the answer's margin, ``ANSWER_MARGIN_
  FRACTION`` × message_timeout: ``late_by``) + (queued bytes of the lane ahead of it + L) ×
  c_lane > budget_s (the whole message_timeout when nothing is ahead of it, as at
  admission): judged from its size instead (the body is not parsed).
- ``expired(waited_s)``: waited_s > message_timeout. Envoy sent the body before ICE received
  it, so by then Envoy has certainly given up: the verdict is not recorded (no metrics, no
  KV blocks held) and the body is dropped.
- **When Envoy's timer started** (``timer_started``). Envoy's ext_proc filter starts a
  message's timer when it *sends* the message (``Filter::sendBodyChunk`` →
  ``ProcessorState::onStartProcessorCall``, envoyproxy/envoy
  ``source/extensions/filters/http/ext_proc/ext_proc.cc``). In BUFFERED mode it sends the
  body once the whole body is buffered *and* ICE's answer to the headers is back (body data
  that arrives while the headers message is out is held), so the body's timer runs from
  B = max(the end of the client's upload, Envoy's receipt of ICE's headers answer), and it
  covers the transfer from Envoy to ICE (0.15–0.9 s for 6.4 MB under load), which ICE does
  not see: a body reaches ICE at A > B. ICE takes as B the latest moment it can vouch for:
  T = max(H, A − lag − L × ``TRANSFER_S_PER_BYTE``), with H the moment ICE handed gRPC its
  answer to the headers (B ≥ H always), lag the event loop's lag when the body was read
  (the message may have waited in the loop) and ``TRANSFER_S_PER_BYTE`` (150 ns/B, i.e.
  6.7 MB/s) a slow bound on the transfer (the slowest seen: 0.9 s for 6.4 MB, 141 ns/B).
  A client that uploaded before ICE answered its headers (a flood, any fast client) gets
  T = H, exact up to the answer's way back; a slow upload's body gets the transfer bound.
  Every lane judges against T: the waits above are counted from T, the helper's wait ends
  by T + message_timeout × (1 − ``ANSWER_MARGIN_FRACTION``) (``answer_by``; then the coarse
  verdict answers), and ``expired`` alone is counted from A (dropping a verdict Envoy still
  waits for would let the request through unjudged).
- **Window** (bytes, ≤ max_inflight_bytes, starting there): what ICE cannot see is the time
  a body spends in Envoy and on the wire before it reaches ICE, and under a flood that is
  where the time goes (Envoy's worker thread also reads every client's upload). Envoy's
  verdict on it is the stream it closes at its message timeout: an admitted body whose stream
  is closed before the body was answered (``lost``) halves the window (at most once per
  message_timeout, so that one burst of timeouts halves it once; never below
  ``MIN_WINDOW_BYTES``), and each body answered in time grows it by max(L, SMALL_BODY_BYTES)
  / 4, back up to max_inflight_bytes (additive increase, multiplicative decrease, as TCP
  does for the same reason).
- **Cost** c_lane (s/byte): an exponentially weighted mean (weight ``COST_WEIGHT`` for the
  newest) of judge time / body bytes over bodies of at least ``SMALL_BODY_BYTES``, starting
  from ``DEFAULT_COST_S_PER_BYTE`` (measured on a 2-core machine: ~3.5 ns/byte inline for a
  2.76 MB chat body, taken 3× higher to err towards the headers verdict before the first
  measurement; the helper, 100 ns/byte: exact counting there measured ~70 ns/byte, and a
  body sent there for its media parts ~10 ns/byte, so that a 6 MB image body alone in the
  lane is not predicted late before the first measurement).

Invariants: inflight_bytes = Σ promises not yet released ≥ 0; every admitted ticket is
released exactly once (``release`` is idempotent per ticket).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "ANSWER_MARGIN_FRACTION",
    "BUDGET_FRACTION",
    "DEFAULT_COST_S_PER_BYTE",
    "DEFAULT_MAX_INFLIGHT_BYTES",
    "DEFAULT_MESSAGE_TIMEOUT_S",
    "LAG_FRACTION",
    "SMALL_BODY_BYTES",
    "TRANSFER_S_PER_BYTE",
    "Backlog",
    "BodyClock",
    "Lane",
    "Ticket",
    "Weight",
    "timer_started",
]

Lane = Literal["inline", "helper"]
# Where a body with an adapter is judged (``ext_proc.serve.offload``'s ``weigh``): ""
# in-process; "shape": in the helper; "size": in-process first when little of its text is
# new, else in the helper.
Weight = Literal["", "shape", "size"]
Why = Literal["bytes", "lag", "time"]

DEFAULT_MAX_INFLIGHT_BYTES = 16 * 1024 * 1024
DEFAULT_MESSAGE_TIMEOUT_S = 1.0  # envoy/envoy.yaml's ext_proc message_timeout
BUDGET_FRACTION = 0.5
LAG_FRACTION = 0.02
SMALL_BODY_BYTES = 64 * 1024
SMALL_RESERVE = 0.125
COST_WEIGHT = 0.2
# A slow bound on the transfer of a body from Envoy to ICE (s/byte; ``timer_started``)
TRANSFER_S_PER_BYTE = 150e-9
# What ICE keeps of Envoy's message_timeout for its answer's way back to Envoy (100 ms at 1 s)
ANSWER_MARGIN_FRACTION = 0.1
MIN_WINDOW_BYTES = 4 * 1024 * 1024
DEFAULT_COST_S_PER_BYTE: dict[Lane, float] = {"inline": 10e-9, "helper": 100e-9}


def timer_started(headers_answered_s: float, arrived_s: float, nbytes: int, lag_s: float) -> float:
    """When Envoy's timer for a body message started, as late as ICE can vouch for it
    (seconds on ICE's clock): max(H, A − lag − L × ``TRANSFER_S_PER_BYTE``), never after
    the body's arrival A (the module docstring)."""
    bound = arrived_s - max(0.0, lag_s) - nbytes * TRANSFER_S_PER_BYTE
    return min(arrived_s, max(headers_answered_s, bound))


@dataclass(frozen=True, slots=True)
class BodyClock:
    """A body message's clock (seconds, the caller's clock): when it reached ICE, and when
    Envoy's timer for it started as near as ICE can know (``timer_started``)."""

    arrived_s: float
    timer_from_s: float


@dataclass(slots=True)
class Ticket:
    """One admitted body: its promised bytes and lane; ``received`` once it has arrived."""

    nbytes: int
    lane: Lane
    received: bool = False
    released: bool = False


class Backlog:
    """Bodies a worker has asked Envoy for and not yet answered (see the module docstring)."""

    def __init__(
        self,
        max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
        message_timeout_s: float = DEFAULT_MESSAGE_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        lag: Callable[[], float] = lambda: 0.0,
    ) -> None:
        """``lag``: the event loop's lag in seconds (``LoopLag.lag``; default none)."""
        if max_inflight_bytes <= 0:
            raise ValueError("max_inflight_bytes must be positive")
        if message_timeout_s <= 0:
            raise ValueError("message_timeout_s must be positive")
        self.max_inflight_bytes = max_inflight_bytes
        self.message_timeout_s = message_timeout_s
        self.budget_s = BUDGET_FRACTION * message_timeout_s
        self.answer_margin_s = ANSWER_MARGIN_FRACTION * message_timeout_s
        self.inflight_bytes = 0
        self.lane_bytes: dict[Lane, int] = {"inline": 0, "helper": 0}
        self.queued_bytes: dict[Lane, int] = {"inline": 0, "helper": 0}  # received, unanswered
        self.cost: dict[Lane, float] = dict(DEFAULT_COST_S_PER_BYTE)
        self.window = float(max_inflight_bytes)
        self._clock = clock
        self.lag = lag
        self.lag_limit_s = LAG_FRACTION * message_timeout_s
        self._last_cut = -float("inf")

    def admit(self, nbytes: int, lane: Lane) -> Ticket | Why:
        """A ticket for a body of ``nbytes`` (its promise), or why the headers decide."""
        limit = self.window
        if nbytes > SMALL_BODY_BYTES:
            limit *= 1 - SMALL_RESERVE
        if self.inflight_bytes and self.inflight_bytes + nbytes > limit:
            return "bytes"
        if nbytes > SMALL_BODY_BYTES and self.inflight_bytes and self.lag() > self.lag_limit_s:
            self.window = min(self.window, self._floor())  # one long body at a time
            return "lag"
        queued = self.lane_bytes[lane]
        budget = self.budget_s if queued else self.message_timeout_s
        if (queued + nbytes) * self.cost[lane] > budget:
            return "time"
        self.inflight_bytes += nbytes
        self.lane_bytes[lane] += nbytes
        return Ticket(nbytes, lane)

    def clock(self, headers_answered_s: float, arrived_s: float, nbytes: int) -> BodyClock:
        """A body's clock: ``timer_started`` with the event loop's lag now."""
        return BodyClock(
            arrived_s, timer_started(headers_answered_s, arrived_s, nbytes, self.lag())
        )

    def answer_by(self, clock: BodyClock) -> float:
        """The latest moment ICE answers a body in (Envoy's deadline less the margin)."""
        return clock.timer_from_s + self.message_timeout_s - self.answer_margin_s

    def arrived(self, ticket: Ticket, nbytes: int, lane: Lane) -> None:
        """The body is here (``nbytes``, judged in ``lane``): the promise becomes the size."""
        if ticket.released or ticket.received:
            return
        self.inflight_bytes += nbytes - ticket.nbytes
        self.lane_bytes[ticket.lane] -= ticket.nbytes
        self.lane_bytes[lane] += nbytes
        self.queued_bytes[lane] += nbytes
        ticket.nbytes, ticket.lane, ticket.received = nbytes, lane, True

    def late(self, ticket: Ticket, waited_s: float) -> bool:
        """True when the body, with the lane's queued bodies ahead of it, would be answered
        after the budget: judge it from its size instead."""
        ahead = self.queued_bytes[ticket.lane] - ticket.nbytes
        budget = self.budget_s if ahead > 0 else self.message_timeout_s
        return waited_s + (ahead + ticket.nbytes) * self.cost[ticket.lane] > budget

    def late_by(self, ticket: Ticket, clock: BodyClock, now_s: float) -> bool:
        """``late``, counted from when Envoy's timer started (``clock``), with the answer's
        margin."""
        return self.late(ticket, now_s - clock.timer_from_s + self.answer_margin_s)

    def expired(self, waited_s: float) -> bool:
        """Envoy has certainly given up on a body that reached ICE ``waited_s`` ago."""
        return waited_s > self.message_timeout_s

    def observe(self, lane: Lane, nbytes: int, seconds: float) -> None:
        """A body of ``nbytes`` took ``seconds`` to judge in ``lane`` (small bodies are
        dominated by fixed costs and are not counted)."""
        if nbytes < SMALL_BODY_BYTES or seconds < 0:
            return
        c = seconds / nbytes
        self.cost[lane] = (1 - COST_WEIGHT) * self.cost[lane] + COST_WEIGHT * c

    def answered(self, ticket: Ticket) -> None:
        """The body was answered in time: the window grows (see the module docstring)."""
        grow = max(ticket.nbytes, SMALL_BODY_BYTES) / 4
        self.window = min(float(self.max_inflight_bytes), self.window + grow)

    def lost(self) -> None:
        """Envoy gave up on an admitted body: the window halves, once per message timeout."""
        now = self._clock()
        if now - self._last_cut < self.message_timeout_s:
            return
        self._last_cut = now
        self.window = max(self._floor(), self.window / 2)

    def _floor(self) -> float:
        return min(float(MIN_WINDOW_BYTES), float(self.max_inflight_bytes))

    def release(self, ticket: Ticket | None) -> None:
        """The body is answered, dropped or its stream ended."""
        if ticket is None or ticket.released:
            return
        ticket.released = True
        self.inflight_bytes -= ticket.nbytes
        self.lane_bytes[ticket.lane] -= ticket.nbytes
        if ticket.received:
            self.queued_bytes[ticket.lane] -= ticket.nbytes

    @property
    def idle(self) -> bool:
        return self.inflight_bytes == 0
