"""Shrink a hold taken at the estimate's upper bound to the exact count, off the request path.

Under ``exact_count: needed`` a request the estimate decided (``ext_proc.admit.counting``) is
judged and held at the estimate's upper bound, which the tokenizer's bounds put up to 7.5×
above its real prompt on byte-fallback vocabularies and up to 33× with an NFKC normaliser
(``ext_proc.tokencount.calibration``, ``ext_proc.tokencount.derived``). The verdict does not
change with the exact count (both bounds gave it), but the hold does: every request judged
after it would see those blocks taken. So once the request has its answer, ``Recounter``
counts it exactly, in a task of its own that starts after the reply is handed to gRPC:

- a body decoded on the event loop (at most ``exact_count_inline_bytes``, 32 KiB by
  default: a few milliseconds) is counted there, on the decode it was judged with;
- a body judged in the helper process (its decode came back slim) is counted there again
  (``Offload.count``), so the event loop never counts a long prompt;

and ``PoolViews.shrink`` gives back what the exact count does not need
(``ext_proc.placement.holding``). Counted in ``ice_hold_recounts_total{outcome}``: ``shrunk``,
``unchanged`` (the exact figure needs as many blocks), ``ended`` (the request's stream ended
first: nothing to shrink), ``skipped`` (a body over ``exact_count_inline_bytes`` with no
helper process: it keeps its bound rather than hold the event loop), ``failed`` (the
tokenizer could not count it, or the count raised, logged once per error type; the hold
stays at its bound).

Invariants: the recount runs on the event loop's thread (the counters are never used from
two threads); a fault here never reaches the request, whose answer has gone; a hold is only
ever made smaller.
"""

from __future__ import annotations

import asyncio
import logging

from ext_proc import telemetry
from ext_proc.admit.counting import exact_count
from ext_proc.admit.pipeline import BodyVerdict, Pipeline
from ext_proc.admit.routing import Route
from ext_proc.admit.verdict import RequestFacts
from ext_proc.placement.inflight import Hold
from ext_proc.schemas import RequestFeatures
from ext_proc.serve.offload import Offload

__all__ = ["Recounter", "recountable"]

log = logging.getLogger("ice.recount")


def recountable(pipeline: Pipeline, verdict: BodyVerdict | None, hold: Hold | None) -> bool:
    """Whether ``verdict``'s hold was taken at the estimate's bound and can be counted."""
    if hold is None or verdict is None or verdict.body is None or pipeline.counters is None:
        return False
    f = verdict.features
    if f is None or f.input_tokens_source != "estimate":
        return False
    return pipeline.counters.counter_for(f.model) is not None


class Recounter:
    """The recount tasks of one servicer (kept referenced until they end)."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        self._said: set[str] = set()

    def later(
        self,
        pipeline: Pipeline,
        offload: Offload | None,
        route: Route,
        facts: RequestFacts,
        verdict: BodyVerdict | None,
        hold: Hold | None,
        raw: bytes,
    ) -> None:
        """Count ``verdict``'s request exactly after its answer and shrink ``hold`` (no-op
        unless ``recountable``); ``raw``: the body as Envoy sent it; ``offload``: the helper
        process that judged it, if any."""
        if not recountable(pipeline, verdict, hold):
            return
        assert verdict is not None and hold is not None
        task = asyncio.get_running_loop().create_task(
            self._recount(pipeline, offload, route, facts, verdict, hold, raw)
        )
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _recount(
        self,
        pipeline: Pipeline,
        offload: Offload | None,
        route: Route,
        facts: RequestFacts,
        verdict: BodyVerdict,
        hold: Hold,
        raw: bytes,
    ) -> None:
        await asyncio.sleep(0)  # the answer goes out first
        outcome = "failed"
        try:
            exact = await _exact(pipeline, offload, route, facts, verdict, raw)
            if exact is None:
                outcome = "skipped"
            elif exact.input_tokens_source != "exact":
                outcome = "failed"
            elif hold.released:
                outcome = "ended"
            else:
                seen, shape, output, _ = pipeline.recorder.hold_terms(route, verdict, exact)
                freed = pipeline.views.shrink(hold, route.profile, seen, shape, output)
                outcome = "shrunk" if freed > 0 else "unchanged"
                log.debug(
                    "recount %s: %d tokens counted %d exactly, %d blocks given back",
                    route.name,
                    verdict.features.input_tokens if verdict.features else 0,
                    exact.input_tokens,
                    freed,
                )
        except Exception as e:  # the answer has gone: a fault only keeps the bound
            kind = type(e).__name__
            if kind not in self._said:
                self._said.add(kind)
                log.warning(
                    "recounting a held request failed (%s: %s); it keeps its bound", kind, e
                )
        telemetry.HOLD_RECOUNTS.labels(outcome=outcome).inc()

    async def aclose(self) -> None:
        """Wait for the recounts in flight (tests, shutdown)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)


async def _exact(
    pipeline: Pipeline,
    offload: Offload | None,
    route: Route,
    facts: RequestFacts,
    verdict: BodyVerdict,
    raw: bytes,
) -> RequestFeatures | None:
    body, f = verdict.body, verdict.features
    assert body is not None and f is not None and pipeline.counters is not None
    small = len(body.raw) <= pipeline.policy.exact_count_inline_bytes
    if not body.slim and small:  # decoded here: count on that decode
        return exact_count(pipeline.counters, f, body.doc.values, len(body.raw))
    if offload is None:  # a long prompt is never counted on the event loop
        return None
    return await offload.count(route, facts, raw)
