"""One ext_proc stream's bookkeeping: what it holds while its request is in ICE and upstream,
and the one place it lets go.

A stream takes, at most once each:

- ``ticket``: its body's place in the worker's backlog (``ext_proc.admit.backlog``), from
  the headers phase until its body is answered (``answered``: the bytes leave the backlog)
  and released (``let_ticket_go``);
- ``hold``: its KV reservation in the in-flight ledger (``ext_proc.placement.poolview``),
  from the verdict that sends it on until the stream ends;
- ``slot``: its count among its tenant's requests in flight (``ext_proc.admit.queue``),
  likewise;
- ``committed``: its verdict was committed (counted, held, shared, its slot counted: once,
  ``ext_proc.admit.admission.Admission.commit``);
- ``need_tokens``: what the response phase needs of the verdict (the tokens it asks of its
  pool: the Retry-After of a backend's overload 503, ``ext_proc.admit.overload_answer``).

Invariant: ``close`` (the stream's end, however it ends) releases whatever is still held,
exactly once; request facts (``ext_proc.admit.verdict.RequestFacts``) are not kept here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from ext_proc import telemetry
from ext_proc.admit.backlog import Backlog, Ticket
from ext_proc.placement.inflight import Hold
from ext_proc.placement.poolview import PoolViews

__all__ = ["SlotCounter", "Stream"]


class SlotCounter(Protocol):
    """What counts a tenant's requests in flight (the worker's admission queue)."""

    def ended(self, pool: str, tenant: str) -> None: ...


def _nothing(_ticket: Ticket) -> None:
    return None


class Stream:
    """The tickets, holds and slots of one stream (see the module docstring)."""

    __slots__ = (
        "_backlog",
        "_on_release",
        "_slots",
        "_views",
        "committed",
        "hold",
        "need_tokens",
        "slot",
        "ticket",
    )

    def __init__(
        self,
        backlog: Backlog,
        views: PoolViews,
        slots: SlotCounter,
        on_release: Callable[[Ticket], None] = _nothing,
    ) -> None:
        """``views``: the in-flight ledger of the pipeline the stream started with;
        ``on_release``: called with a ticket when it is released (the worker's trimmer)."""
        self._backlog = backlog
        self._views = views
        self._slots = slots
        self._on_release = on_release
        self.ticket: Ticket | None = None
        self.hold: Hold | None = None
        self.slot: tuple[str, str] | None = None
        self.need_tokens: int | None = None
        self.committed = False  # its verdict was committed (``ext_proc.admit.admission``)

    def answered(self) -> None:
        """The body was answered: its bytes leave the backlog's queue."""
        if self.ticket is not None:
            self._backlog.answered(self.ticket)

    def let_ticket_go(self) -> None:
        """Release the body's place in the backlog (once)."""
        ticket = self.ticket
        if ticket is None or ticket.released:
            return
        self._backlog.release(ticket)
        telemetry.BACKLOG_BYTES.set(self._backlog.inflight_bytes)
        telemetry.BACKLOG_WINDOW.set(self._backlog.window)
        self._on_release(ticket)

    def abandoned(self) -> bool:
        """Envoy closed the stream before its body was answered (its message timeout): the
        backlog admits less from now on. True when a body ICE had received was dropped."""
        ticket = self.ticket
        if ticket is None or ticket.released:
            return False
        self._backlog.lost()
        if ticket.received:
            telemetry.BODIES_DROPPED.labels(reason="stream_closed").inc()
        return ticket.received

    def close(self) -> None:
        """The stream is over: its ticket, its KV blocks and its slot are free again."""
        self.let_ticket_go()
        if self.hold is not None:
            self._views.release(self.hold)
            self.hold = None
        if self.slot is not None:
            self._slots.ended(*self.slot)
            self.slot = None
