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

Invariants: the helper receives only picklable plain data (route key, adapter name,
priority, body bytes, pool snapshot, the KV blocks its worker's ledger holds against that
snapshot, by endpoint: ``PoolViews.ledger``) and returns a ``BodyVerdict`` whose decode is
slim (``JudgedBody.detached``); metrics are counted by the caller. The server starts the
helper at start-up (``warm``), and a broken helper is replaced.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import replace

from ext_proc.admit.pipeline import BodyVerdict, Pipeline, RequestFacts, Route
from ext_proc.policy.load import load_policy
from ext_proc.policy.model import Priority
from ext_proc.schemas import BY_NAME, RequestFeatures
from ext_proc.signals.snapshot import PoolSnapshot

__all__ = [
    "DEFAULT_HEAVY_CONTAINERS",
    "ESCAPES_PER_CONTAINER",
    "INLINE_MEDIA_BYTES",
    "INLINE_MEDIA_PARTS",
    "Offload",
    "containers_outside_strings",
    "media_parts_hint",
]

log = logging.getLogger("ice.offload")

DEFAULT_HEAVY_CONTAINERS = 20_000
INLINE_MEDIA_PARTS = 32
# escapes (backslashes) per container the decoder handles in the same time: an escape costs
# json's C decoder ~30 ns here, a container rawjson's Python ~1 µs
ESCAPES_PER_CONTAINER = 32
INLINE_MEDIA_BYTES = 1024 * 1024
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
    verdict = helper.on_body(route, facts, body)
    if verdict is None or verdict.body is None:
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

    def warm(self) -> None:
        """Start the helper now (its imports take about a second), so that the first heavy
        body is not the one that waits for it past Envoy's message timeout."""
        self._executor().submit(_ready)

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
        self, pipeline: Pipeline, route: Route, facts: RequestFacts, body: bytes
    ) -> BodyVerdict | None:
        """``pipeline.on_body`` run in the helper process (same policy, same snapshot); the
        verdict's decode (``JudgedBody``) comes back slim, its text restored here."""
        if facts.adapter is None:
            return pipeline.on_body(route, facts, body)
        snapshot = pipeline.lookup(route.pool)
        ledger = pipeline.views.ledger(snapshot) if snapshot is not None else {}
        loop = asyncio.get_running_loop()
        args = (route.key, facts.adapter.name, facts.priority, body, snapshot, ledger)
        try:
            verdict = await loop.run_in_executor(self._executor(), _judge, *args)
        except BrokenProcessPool:
            log.error("the offload helper died; starting a new one")
            self._pool = None
            verdict = await loop.run_in_executor(self._executor(), _judge, *args)
        if verdict is None or verdict.body is None:
            return verdict
        return replace(verdict, body=verdict.body.attach(body))

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
