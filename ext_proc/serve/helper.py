"""Judge heavy request bodies in a helper process, so they never stall the event loop.

Parsing JSON and walking its messages is CPU work that holds the GIL: an 8 MiB body of
hundreds of thousands of tiny objects takes a few hundred milliseconds, during which one
asyncio worker could answer nothing else (and its scraper would not run). ``is_heavy`` counts
the body's JSON containers with two C-level scans (``{`` and ``[``, strings included, which
only errs towards offloading); a body over ``heavy_containers`` is judged by
``Pipeline.on_body`` in a single spawned helper process that loaded the same policy. Ordinary
requests, including long single strings (documents, base64 images), stay in-process.

Invariants: the helper receives only picklable plain data (route key, adapter name,
priority, body bytes, pool snapshot, the KV blocks its worker's ledger holds against that
snapshot, by endpoint: ``PoolViews.ledger``) and returns a ``BodyVerdict`` whose decode is
slim (``JudgedBody.detached``); metrics are
counted by the caller. The server starts the helper at start-up (``warm``), and a broken
helper is replaced.
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
from ext_proc.schemas import BY_NAME
from ext_proc.signals.snapshot import PoolSnapshot

__all__ = ["DEFAULT_HEAVY_CONTAINERS", "Offload"]

log = logging.getLogger("ice.offload")

DEFAULT_HEAVY_CONTAINERS = 20_000

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
        return body.count(b"{") + body.count(b"[") > self.heavy_containers

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

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None
