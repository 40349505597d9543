"""Judge heavy request bodies in a helper process, so they never stall the event loop.

Parsing JSON and walking its messages is CPU work that holds the GIL: an 8 MiB body of
hundreds of thousands of tiny objects takes a few hundred milliseconds, during which one
asyncio worker could answer nothing else (and its scraper would not run). ``is_heavy``
predicts it from what the body is, with C-level scans (``bytes.count``, ``split``; ≤ ~25 ms
on 8 MiB here, see ``containers_outside_strings``), never a Python loop over its bytes:

- **containers**: more than ``heavy_containers`` JSON objects and arrays *outside strings*
  (``containers_outside_strings``): a ``[`` or ``{`` inside a string (a document that quotes
  code, base64 never has one) does not count, so a long string cannot send a body to the
  helper lane, where its cost per byte would predict it late and leave it to the coarse
  verdict;
- **escapes**: more than ``ESCAPES_PER_CONTAINER`` × ``heavy_containers`` backslashes: a
  string dense in escapes (``\\"``, ``\\uXXXX``) is what the decoder is slow on (2.6 M of
  them: ~75 ms), so such a body is heavy by what it is, whatever its brackets; below that,
  the exact count of containers outside strings costs a bounded number of C-level passes;
- **media**: more than ``INLINE_MEDIA_PARTS`` marks of data URLs or base64 payloads
  (``media_parts_hint``: each one's header is read in bounded steps, ``ext_proc.media``, at
  most ~2 ms for the worst, but hundreds of them are still a long walk), or any in a body
  over ``INLINE_MEDIA_BYTES`` (a 6 MB image's decode, edit and copies would hold the loop
  for ~50–100 ms here).

A heavy body is judged by ``Pipeline.on_body`` in a single spawned helper process that
loaded the same policy. Ordinary requests, including long single strings (documents), stay
in-process.

A body that is heavy only by its **size** (``weigh``: over ``exact_count_inline_bytes`` with
a tokenizer configured, but not by shape) is judged in-process first when it is at most
``INLINE_ATTEMPT_BYTES``, under a bound on the new text its exact count may encode
(``tokencount.newtext.new_text_bound``, ``exact_count_inline_bytes`` characters): a next
turn whose history's pieces are in the worker's cache is counted on the event loop (a few
ms), where the hop to the helper cost 12–20 ms for 1.3 MB. When the bound trips (a cold
body), nothing was encoded and the body goes to the helper; the wasted decode, render and
digests cost about what a cached next turn does (13–22 ms for 1.3 MB on 2 loaded cores,
docs/token-counts.md; 5–7 % of the helper's cold count). Attempts take one turn of the event
loop each (``_turn``). With ``prefix_tracking`` on the worker does not try (a sampled request's
exact ids need a whole encode). The helper process teaches its worker: the (digest, count)
pairs of the pieces it counted for a body come back with the verdict
(``BodyVerdict.lessons``, at most ``newtext.MAX_LESSON_PIECES`` a tokenizer, never text) and go into
the worker's cache, so the next turn of a conversation first counted there is counted
in-process. ``judged`` counts where the bodies the helper lane took were judged.

Invariants: the helper receives only picklable plain data (route key, adapter name,
priority, body bytes, pool snapshot, the KV blocks its worker's ledger holds against that
snapshot, by endpoint: ``PoolViews.ledger``) and returns a ``BodyVerdict`` whose decode is
slim (``JudgedBody.detached``); metrics are counted by the caller. The server starts the
helper at start-up (``warm``) and reports SERVING only once it is ready (``ready``); a broken
helper is replaced. An attempt in-process counts
exactly what the helper would (the bound only decides where), and changes nothing that the
helper's judgement then repeats: the bound trips inside the count stage, before the verdict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing
from collections.abc import Awaitable
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace
from typing import Any

from ext_proc.admit.backlog import Weight
from ext_proc.admit.faults import JudgeFault
from ext_proc.admit.pipeline import BodyVerdict, Pipeline, RequestFacts, Route
from ext_proc.policy.load import load_policy
from ext_proc.policy.settings import Priority
from ext_proc.schemas import BY_NAME, RequestFeatures
from ext_proc.signals.snapshot import PoolSnapshot
from ext_proc.tokencount.newtext import NewTextOverBound, lessons, new_text_bound, noting_pieces

__all__ = [
    "DEFAULT_HEAVY_CONTAINERS",
    "ESCAPES_PER_CONTAINER",
    "INLINE_ATTEMPT_BYTES",
    "INLINE_MEDIA_BYTES",
    "INLINE_MEDIA_PARTS",
    "Offload",
    "Weight",
    "containers_outside_strings",
    "judge_in_worker",
    "media_parts_hint",
    "weigh",
]

log = logging.getLogger("ice.offload")

DEFAULT_HEAVY_CONTAINERS = 20_000
INLINE_MEDIA_PARTS = 32
# escapes (backslashes) per container the decoder handles in the same time: an escape costs
# json's C decoder ~30 ns here, a container rawjson's Python ~1 µs
ESCAPES_PER_CONTAINER = 32
INLINE_MEDIA_BYTES = 1024 * 1024
# The largest body heavy only by its size that is judged in-process first: an attempt held
# the loop 23–26 ms for 1.9 MB and 26–39 ms for 2.5 MB on 2 loaded cores (issue 30: < 50 ms).
INLINE_ATTEMPT_BYTES = 2 * 1024 * 1024
# What marks a media payload whose header ICE reads: a data: URL, base64 (Anthropic's
# ``"type": "base64"`` source) or an ``input_audio`` part; ``;base64,`` of a data URL counts
# once more, which errs towards the helper
_MEDIA_MARKS = (b"data:", b"base64", b"input_audio")


def containers_outside_strings(body: bytes, limit: int) -> int:
    """JSON containers (``{``, ``[``) of ``body`` outside its strings, exactly when the
    result is at most ``limit`` or the body has at most ``2 × limit`` strings; otherwise
    an upper bound above ``limit`` (a body with more than ``limit`` strings and more than
    ``limit`` brackets is heavy either way).

    All C-level passes: the bracket count; when it exceeds ``limit``, the quotes (less the
    escaped ones), and, for a body of few strings, the text between them: escaped
    backslashes and quotes removed, split at the quotes, every other piece (outside) joined
    and counted."""
    n = body.count(b"{") + body.count(b"[")
    if n <= limit:
        return n
    escaped = b"\\" in body
    quotes = body.count(b'"') - (body.count(b'\\"') if escaped else 0)
    if quotes == 0 or quotes > 2 * limit:
        return n
    flat = body.replace(b"\\\\", b"").replace(b'\\"', b"") if escaped else body
    outside = b"".join(flat.split(b'"')[0::2])
    return outside.count(b"{") + outside.count(b"[")


def media_parts_hint(body: bytes) -> int:
    """How many media payloads ``body`` may carry (an upper-bound hint, C-level counts)."""
    return sum(body.count(mark) for mark in _MEDIA_MARKS)


# State of the helper process (set by its initializer; unused in the ICE worker).
_HELPER: list[Pipeline] = []
_SNAPSHOT: list[PoolSnapshot | None] = [None]


def _init_helper(policy_path: str | None, max_body_bytes: int) -> None:
    _HELPER.append(Pipeline(load_policy(policy_path), lambda _pool: _SNAPSHOT[0], max_body_bytes))


def _judge(
    route_key: tuple[str, str, str, str],
    schema: str,
    priority: Priority,
    body: bytes,
    snapshot: PoolSnapshot | None,
    ledger: dict[str, int] | None = None,
) -> BodyVerdict | None:
    helper = _HELPER[0]
    _SNAPSHOT[0] = snapshot
    if snapshot is not None:
        helper.views.assume_held(snapshot, ledger or {})
    route = helper.router.route_for(route_key)
    facts = RequestFacts(adapter=BY_NAME[schema], priority=priority)
    with noting_pieces() as noted:
        verdict = helper.on_body(route, facts, body)
    if verdict is None:
        return verdict
    verdict = replace(verdict, lessons=lessons(noted))  # what the worker's cache learns
    if verdict.body is None:
        return verdict
    # its decode goes back slim: no text, no array values (pickling them costs as much as
    # the decode did); the worker restores the text from the bytes it already has
    return replace(verdict, body=verdict.body.detached(body))


def _count(
    route_key: tuple[str, str, str, str], schema: str, priority: Priority, body: bytes
) -> RequestFeatures:
    helper = _HELPER[0]
    route = helper.router.route_for(route_key)
    facts = RequestFacts(adapter=BY_NAME[schema], priority=priority)
    return helper.exact_features(route, facts, body)


def _ready() -> bool:
    return bool(_HELPER)


def weigh(offload: Offload, pipeline: Pipeline, body: bytes) -> Weight:
    """Where a body with an adapter is judged (``Weight``; the module docstring)."""
    if offload.is_heavy(body):
        return "shape"
    return "size" if pipeline.needs_helper(body) else ""


class _Tripped:
    """The in-process attempt's count would encode more than its bound: judge in the helper."""


TRIPPED = _Tripped()


def judge_in_worker(
    pipeline: Pipeline, route: Route, facts: RequestFacts, body: bytes
) -> BodyVerdict | _Tripped | None:
    """``pipeline.on_body`` with its exact count bounded to ``exact_count_inline_bytes``
    characters of new text; ``TRIPPED`` when that bound trips (nothing was encoded)."""
    with new_text_bound(pipeline.policy.exact_count_inline_bytes):
        try:
            return pipeline.on_body(route, facts, body)
        except NewTextOverBound:
            return TRIPPED
        except JudgeFault as e:  # the count stage wraps what it raises
            if isinstance(e.__cause__, NewTextOverBound):
                return TRIPPED
            raise


class Offload:
    """One helper process per ICE worker for heavy bodies."""

    def __init__(
        self,
        policy_path: str | None,
        max_body_bytes: int,
        heavy_containers: int = DEFAULT_HEAVY_CONTAINERS,
    ) -> None:
        self._policy_path = policy_path
        self._max_body_bytes = max_body_bytes
        self.heavy_containers = heavy_containers
        self._pool: ProcessPoolExecutor | None = None
        self._turn = asyncio.Lock()  # one in-process attempt per turn of the event loop
        self._warming: Future[bool] | None = None  # the helper's start (``warm``)
        # bodies the helper lane took, by where they were judged ("worker": in-process;
        # "tripped": tried in-process, then judged in the helper; "helper": sent there)
        self.judged = {"worker": 0, "tripped": 0, "helper": 0}

    def warm(self) -> None:
        """Start the helper now (its imports and the policy take 1–5 s), so that the first
        heavy body is not the one that waits for it past Envoy's message timeout."""
        self._warming = self._executor().submit(_ready)

    async def ready(self, within_s: float) -> bool:
        """Wait (at most ``within_s``) until the helper started by ``warm`` has loaded the
        policy and can judge; False when it did not (the server then serves anyway: a body
        for the helper lane gets the coarse verdict by Envoy's deadline)."""
        if self._warming is None:
            self.warm()
        assert self._warming is not None
        try:
            return await asyncio.wait_for(asyncio.wrap_future(self._warming), within_s)
        except (TimeoutError, BrokenProcessPool) as e:
            log.error("the offload helper is not ready (%s); serving without it", e)
            return False

    def weigh(self, pipeline: Pipeline, body: bytes) -> Weight:
        """Where a body with an adapter is judged (``weigh``)."""
        return weigh(self, pipeline, body)

    def is_heavy(self, body: bytes) -> bool:
        """The body's parse belongs in the helper (the module docstring)."""
        limit = self.heavy_containers
        if body.count(b"\\") > ESCAPES_PER_CONTAINER * limit:
            return True  # escape-dense strings: their decode is the long part
        if containers_outside_strings(body, limit) > limit:
            return True
        if len(body) > INLINE_MEDIA_BYTES:  # any mark sends it: the first found will do
            return any(mark in body for mark in _MEDIA_MARKS)
        return media_parts_hint(body) > INLINE_MEDIA_PARTS

    def _executor(self) -> ProcessPoolExecutor:
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_helper,
                initargs=(self._policy_path, self._max_body_bytes),
            )
        return self._pool

    async def on_body(
        self,
        pipeline: Pipeline,
        route: Route,
        facts: RequestFacts,
        body: bytes,
        weight: Weight = "shape",
    ) -> BodyVerdict | None:
        """``pipeline.on_body`` run in the helper process (same policy, same snapshot); the
        verdict's decode (``JudgedBody``) comes back slim, its text restored here, and the
        piece counts it made go into this worker's counters. A body of ``weight`` "size"
        is judged in-process first (``judge_in_worker``; the module docstring)."""
        if facts.adapter is None:
            return pipeline.on_body(route, facts, body)
        tried = weight == "size" and len(body) <= INLINE_ATTEMPT_BYTES and pipeline.prefix is None
        if tried:
            async with self._turn:
                await asyncio.sleep(0)  # a turn of the event loop of its own
                judged = judge_in_worker(pipeline, route, facts, body)
            if not isinstance(judged, _Tripped):
                self.judged["worker"] += 1
                return judged
        self.judged["tripped" if tried else "helper"] += 1
        verdict = await self._in_helper(pipeline, route, facts, body)
        if verdict is not None and verdict.lessons:  # learned already (``_submit``)
            verdict = replace(verdict, lessons=())
        if verdict is None or verdict.body is None:
            return verdict
        return replace(verdict, body=verdict.body.attach(body))

    async def _in_helper(
        self, pipeline: Pipeline, route: Route, facts: RequestFacts, body: bytes
    ) -> BodyVerdict | None:
        assert facts.adapter is not None
        snapshot = pipeline.lookup(route.pool)
        ledger = pipeline.views.ledger(snapshot) if snapshot is not None else {}
        args = (route.key, facts.adapter.name, facts.priority, body, snapshot, ledger)
        try:
            return await self._submit(pipeline, args)
        except BrokenProcessPool:
            log.error("the offload helper died; starting a new one")
            self._pool = None
            return await self._submit(pipeline, args)

    def _submit(self, pipeline: Pipeline, args: tuple[Any, ...]) -> Awaitable[BodyVerdict | None]:
        """``_judge`` in the helper. Its piece counts go into this worker's counters when it
        ends, before its waiter resumes, and also when the wait was abandoned (past
        ``exact_count_budget_ms``: the count under way finishes and still teaches)."""
        loop = asyncio.get_running_loop()
        done = self._executor().submit(_judge, *args)
        counters = pipeline.counters

        def teach(future: Future[BodyVerdict | None]) -> None:  # in the executor's thread
            if counters is None or future.cancelled() or future.exception() is not None:
                return
            verdict = future.result()
            if verdict is not None and verdict.lessons:
                with contextlib.suppress(RuntimeError):  # the loop has closed
                    loop.call_soon_threadsafe(counters.learn, verdict.lessons)

        done.add_done_callback(teach)  # first: the lesson is scheduled before the waiter
        return asyncio.wrap_future(done, loop=loop)

    async def count(self, route: Route, facts: RequestFacts, body: bytes) -> RequestFeatures | None:
        """The body's features with its exact count, made in the helper process (a hold's
        recount, ``ext_proc.serve.recount``); None: no helper process could count it."""
        if facts.adapter is None:
            return None
        loop = asyncio.get_running_loop()
        args = (route.key, facts.adapter.name, facts.priority, body)
        try:
            return await loop.run_in_executor(self._executor(), _count, *args)
        except BrokenProcessPool:
            log.error("the offload helper died; starting a new one")
            self._pool = None
            return None

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
