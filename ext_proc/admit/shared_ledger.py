"""Admission against the replicas' shared ledger (``--ledger redis://``): judge, hold, reserve.

Job: a body verdict judged with the mirror of the other replicas' figures
(``ext_proc.placement.ledger_redis``) is held in this worker's ledger at once (as without
Redis: no await between judging and holding, so this worker's own requests never race), then
reserved in Redis with the atomic check. A conflict (other replicas took the room since the
mirror was read) takes the hold back (``PoolViews.unhold``) and judges the request again
with the fresh mirror the conflict brought (``Pipeline.rejudge``: the same features, the
ladder less truncation), at most ``TRIES`` times (each conflict means the room shrank, so a
request soon fits or is refused); the last try reserves without the check.

- A verdict limited by memory (a ``kv_free_blocks`` downgrade, a ``kv_exhausted`` 429) judged
  with other replicas' blocks in the mirror is judged again after a fresh read first: the
  mirror may predate their releases, and a stale mirror must never refuse what fits.
- The check's slack is the room the request leaves (``PoolViews.room`` before its hold, less
  its blocks) at its endpoint, or the least over the pool when Envoy places it (then every
  endpoint is checked). No KV view, or a request that passed without fitting (critical
  priority, ``on_kv_shortfall: ignore``): no check.
- Paths that record without waiting (the coarse verdict of a busy worker, the admission
  queue's) reserve without a check, in the background (``share_hold``).
- A Redis fault answers as a success: the local ledger holds the request, and the ledger is
  ``local`` until its heartbeat succeeds (fail-open on Redis, never on the request).

Invariant: the hold returned (``stream.hold``) is the one reserved; the verdict returned is
not counted here: its commit (``ext_proc.admit.admission.Admission.commit``) counts it, once.
"""

from __future__ import annotations

import time

from ext_proc.admit.pipeline import BodyVerdict, Pipeline
from ext_proc.admit.routing import Route
from ext_proc.admit.stream import Stream
from ext_proc.admit.verdict import RequestFacts
from ext_proc.placement.inflight import Hold
from ext_proc.placement.ledger_redis import Reserve
from ext_proc.policy.decision import Downgrade, Pass, Reject
from ext_proc.signals.snapshot import PoolSnapshot

__all__ = ["TRIES", "admit_shared", "share_hold"]

TRIES = 8  # each conflict means others took room: judged again, a request soon fits or not


def view_age_ms(snapshot: PoolSnapshot | None) -> int:
    """Milliseconds since ``snapshot`` was taken (its ``taken_at_s`` is ``time.monotonic()``);
    no view: 0 (only entries passed from now on are unseen)."""
    if snapshot is None:
        return 0
    return max(0, int((time.monotonic() - snapshot.taken_at_s) * 1000))


def _limited(verdict: BodyVerdict) -> bool:
    d = verdict.decision
    if isinstance(d, Downgrade):
        return d.reason == "kv_free_blocks"
    return isinstance(d, Reject) and d.reason == "kv_exhausted"


def _rejudgeable(verdict: BodyVerdict, facts: RequestFacts) -> bool:
    return (
        verdict.features is not None
        and facts.adapter is not None
        and verdict.pending is None
        and verdict.shadow is None
        and isinstance(verdict.decision, Pass | Downgrade | Reject)
    )


def _reserve_of(
    pipeline: Pipeline, hold: Hold, snapshot: PoolSnapshot | None, free: int | None
) -> Reserve:
    """``hold`` as a reservation; ``free``: the room it was judged against (its blocks before
    it was held), None or less than it needs: no check (it did not pass by fitting)."""
    views = pipeline.views
    total = views.live_total(hold.pool, hold.endpoint) if hold.live else 0
    r = Reserve(hold.pool, hold.endpoint, hold.blocks, total, view_age_ms(snapshot))
    if free is not None and free >= hold.blocks and snapshot is not None:
        r.slack = free - hold.blocks
        r.checked = (hold.endpoint,) if hold.endpoint else tuple(views.addresses(snapshot))
    return r


def _room(pipeline: Pipeline, route: Route, verdict: BodyVerdict) -> int | None:
    """The free blocks ``verdict``'s request is judged against at its endpoint (the least
    over the pool when Envoy places it); None without a KV view."""
    placed = verdict.placement
    endpoint = placed.endpoint if placed is not None and placed.endpoint else None
    room = pipeline.views.room(route.profile, pipeline.lookup(route.pool), endpoint)
    return None if room is None else room.free_blocks


async def admit_shared(
    pipeline: Pipeline, route: Route, facts: RequestFacts, stream: Stream, verdict: BodyVerdict
) -> tuple[BodyVerdict, Hold | None]:
    """Hold and reserve ``verdict`` (judged again on a conflict, on its body's one decode):
    the final verdict and its hold (also ``stream.hold`` while it is on the wire), for the
    caller to commit (``Admission.commit``, which counts it)."""
    remote = pipeline.views.remote
    assert remote is not None
    again = _rejudgeable(verdict, facts)
    if again and _limited(verdict) and remote.has_others(route.pool):
        await remote.sync(route.pool, view_age_ms(pipeline.lookup(route.pool)))
        verdict = pipeline.rejudge(route, facts, verdict, can_wait=False)
    for attempt in range(TRIES):
        free = _room(pipeline, route, verdict) if again and attempt < TRIES - 1 else None
        # in the stream at once: cancelled while its reservation is on the wire, it releases it
        hold = stream.hold = pipeline.recorder.hold_of(route, verdict, facts)
        if hold is None:
            break
        snapshot = pipeline.lookup(route.pool)
        if await remote.reserve(_reserve_of(pipeline, hold, snapshot, free)):
            break
        pipeline.views.unhold(hold)
        stream.hold = None
        verdict = pipeline.rejudge(route, facts, verdict, can_wait=False)
    return verdict, stream.hold


def share_hold(pipeline: Pipeline, route: Route, hold: Hold | None) -> None:
    """Reserve a hold recorded without waiting (no check), in the background."""
    remote = pipeline.views.remote
    if hold is None or remote is None or not remote.active:
        return
    remote.reserve_later(_reserve_of(pipeline, hold, pipeline.lookup(route.pool), None))
