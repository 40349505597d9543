"""What the replicas bench reads between its steps, and the two chores around them.

- ``_preemptions``: vLLM's preemption counter (None on the dev backend, whose counter never
  moves).
- ``passes``: each replica's ICE passes (``ice_decisions_total{decision="pass"}``);
  ``LEDGER_ERRORS``: the shared ledger's failed or late calls; ``_delta`` / ``_total``: their
  differences and sums, None when a reading is missing.
- ``settle``: wait until the backend is idle; ``_flush``: empty the shared ledger's Redis.

Invariants: a metric page that does not answer (a replica gone) reads None, never a zero,
and a delta or total over a None is None (``_total``: over the replicas that answered);
ICE's own metrics only say which replica passed what and how its shared ledger fared.
"""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Sequence

from ext_proc.lab.replicas.setup import Backend, Replicas, metric_sum

__all__ = ["LEDGER_ERRORS", "PASS", "PREEMPTIONS", "passes", "settle"]

PREEMPTIONS = "vllm:num_preemptions_total"


def _preemptions(backend: Backend) -> float | None:
    """vLLM's preemption counter now (None on the dev backend, whose counter never moves)."""
    if backend.kind != "vllm":
        return None
    from ext_proc.lab.overload.metrics import metric_sum

    with urllib.request.urlopen(backend.metrics_url, timeout=5) as resp:
        return metric_sum(resp.read().decode(), PREEMPTIONS)


def settle(backend: Backend) -> None:
    """Until the backend is idle: vLLM with nothing running or waiting; the dev backend (whose
    gauges never move) 0.5 s, past the replicas' next scrape (ICE's unseen ledger clears)."""
    if backend.kind == "vllm":
        from ext_proc.lab.overload.metrics import wait_idle

        wait_idle(backend.metrics_url)
    time.sleep(0.5)


PASS = ("ice_decisions_total", {"decision": "pass"})
LEDGER_ERRORS = "ice_ledger_errors_total"


def passes(replicas: Replicas) -> list[float | None]:
    """Each replica's ``ice_decisions_total{decision="pass"}`` now (None: gone)."""
    name, labels = PASS
    return [metric_sum(url, name, **labels) for url in replicas.metrics_urls]


def _delta(before: float | None, after: float | None) -> int | None:
    return None if before is None or after is None else int(after - before)


def _total(values: Sequence[float | None]) -> float | None:
    have = [v for v in values if v is not None]
    return sum(have) if have else None


def _flush(ledger_url: str) -> None:
    """Empty the shared ledger's Redis database; RuntimeError when it does not answer."""
    import redis

    try:
        with redis.Redis.from_url(ledger_url, socket_timeout=5) as client:
            client.flushdb()
    except redis.RedisError as e:
        raise RuntimeError(f"cannot flush the ledger's Redis at {ledger_url}: {e}") from e
