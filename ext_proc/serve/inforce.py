"""A worker's policy in force, and its hot reload (``ext_proc.serve.reload`` decides whether a
file may be taken; this module builds what the new policy needs and swaps it in).

``InForce.reload``: the new pipeline (carrying what is unchanged, ``Pipeline(carry=...)``)
and a new offload helper are built aside, the snapshot store's ages and the in-process
collector's pools are updated, then the servicer swaps both in one assignment
(``ExtProcServicer.swap``: a stream keeps the pipeline it opened with). The old helper is
closed after the grace period, so heavy bodies already in it finish there. A failure at any
step before the swap leaves the old policy in force, counted as refused.

Invariants: one reload at a time per worker (``reload_on`` awaits each); a reload never
stops the worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from ext_proc.admit.pipeline import Pipeline
from ext_proc.policy.settings import Policy
from ext_proc.serve.offload import Offload
from ext_proc.serve.reload import (
    POLL_S,
    FileWatch,
    candidate,
    policy_sha256,
    record_in_force,
    refused,
    reloaded,
)
from ext_proc.serve.servicer import ExtProcServicer
from ext_proc.signals.collector import Collector
from ext_proc.signals.store import SharedSnapshotStore, SnapshotStore

__all__ = ["InForce", "max_ages", "reload_on"]

log = logging.getLogger("ice.server")


def max_ages(policy: Policy) -> dict[str, float]:
    return {name: pool.max_age_s for name, pool in policy.pools.items()}


class InForce:
    """A worker's policy in force and what was built from it; ``reload`` replaces them all
    or nothing."""

    def __init__(
        self,
        policy_path: str | None,
        max_body_bytes: int,
        heavy_containers: int,
        grace_s: float,
        policy: Policy,
    ) -> None:
        self.policy_path = policy_path
        self.max_body_bytes = max_body_bytes
        self.heavy_containers = heavy_containers
        self.grace_s = grace_s
        self.policy = policy
        self.sha = policy_sha256(policy_path)
        record_in_force(self.sha)
        self.servicer: ExtProcServicer | None = None
        self.collector: Collector | None = None
        self.store: SnapshotStore | SharedSnapshotStore | None = None

    async def reload(self) -> None:
        got = candidate(self.policy_path, self.policy, self.sha)
        if got is None or self.servicer is None:
            return
        if isinstance(got, str):
            refused(got, self.sha)
            return
        old = self.servicer.pipeline
        try:
            pipeline = Pipeline(got.policy, old.lookup, self.max_body_bytes, carry=old)
        except Exception as e:  # a tokenizer file that does not load, for one
            refused(f"{self.policy_path}: {e}", self.sha)
            return
        offload = Offload(self.policy_path, self.max_body_bytes, self.heavy_containers)
        await asyncio.get_running_loop().run_in_executor(None, offload.warm)
        if self.store is not None:
            self.store.set_max_ages(max_ages(got.policy))
        if self.collector is not None:
            await self.collector.update(got.policy.pools)
        previous, stale = self.sha, self.servicer.offload
        self.policy, self.sha = got.policy, got.sha256
        self.servicer.swap(pipeline, offload)  # the swap: one assignment, between two messages
        if stale is not None:  # heavy bodies already in its helper finish there first
            asyncio.get_running_loop().call_later(self.grace_s, stale.close)
        reloaded(got.sha256, previous)


async def reload_on(event: asyncio.Event, in_force: InForce, watch: FileWatch | None) -> None:
    """Reload when ``event`` is set (SIGHUP) or, with ``watch``, when the file changes."""
    while True:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), POLL_S)
        if event.is_set() or (watch is not None and watch.changed()):
            event.clear()
            try:
                await in_force.reload()
            except Exception:  # a reload never stops the worker
                log.exception("policy reload failed; still serving policy %s", in_force.sha[:12])
