"""Two ICE replicas (separate ``ice serve`` processes) behind one real Envoy's round robin:
alone, each admits what the pool's free blocks allow and together they admit twice what fits;
on one shared ledger in a real Redis (``--ledger``) they admit what one ICE would.

The dev backend reports 101 blocks of 16 tokens, none used: 100 usable. Each request is 57
prompt tokens + 263 output = 320 tokens = 20 blocks (``on_kv_shortfall: shed``: one that does
not fit is a 429), and streams for a few seconds, so all of them are in flight at once and
``kv_hold: done`` reserves each whole need: at most 5 fit.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from ext_proc.lab.redis_local import RedisServer
from ext_proc.lab.stack import Stack, free_port, render_envoy_config

from .harness import CHAT, ENVOY_TEMPLATE, free_ports, request, write_policy

REQUESTS = 12
FIT = 5  # 100 usable blocks // 20 per request
BODY = {
    "model": "dev-model",
    "messages": [{"role": "user", "content": "x" * 200}],
    "max_tokens": 263,
    "stream": True,
}


def burst(workdir: Path, ice_extra: list[str], workers: int = 1) -> list[int]:
    """REQUESTS streamed requests at once through Envoy over two ICE replicas (each with
    ``workers`` workers): their status."""
    with Stack(workdir) as stack:
        backend = free_port()
        stack.start_backend(backend)
        policy = write_policy(workdir / "policy.yaml", backend, "    on_kv_shortfall: shed\n")
        replicas = []
        for i in range(2):
            address = f"127.0.0.1:{free_ports(workers)}"
            replicas += stack.start_ice(
                address, policy=policy, workers=workers, extra=ice_extra, name=f"ice{i}"
            )
        envoy, admin = free_port(), free_port()
        config = render_envoy_config(
            ENVOY_TEMPLATE,
            admin_port=admin,
            listeners={"ingress": envoy},
            clusters={"ice": replicas, "backend": [f"127.0.0.1:{backend}"]},
        )
        stack.start_envoy(config, admin)
        state = {"kv_cache_usage_perc": 0.0, "num_gpu_blocks": 101, "block_size": 16}
        got = request(backend, "PUT", "/_dev/state", json.dumps(state).encode())
        assert got.status == 200, got
        time.sleep(1.0)  # both replicas' views show the pool
        body = json.dumps(BODY).encode()
        headers = {"content-type": "application/json", "x-dev-stream-delay-ms": "150"}

        def send(_: int) -> int:
            return request(envoy, "POST", CHAT, body, headers, timeout_s=60).status

        with ThreadPoolExecutor(REQUESTS) as pool:
            return list(pool.map(send, range(REQUESTS)))


def test_two_replicas_without_a_shared_ledger_admit_twice_what_fits(tmp_path: Path) -> None:
    statuses = burst(tmp_path, [])
    assert sorted(set(statuses)) == [200, 429], statuses
    assert statuses.count(200) > FIT  # the problem the shared ledger solves


def test_two_replicas_on_a_shared_redis_ledger_admit_what_fits(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    redis_server.client().flushdb()
    # a deadline for a loaded 2-core test machine (the default, 5 ms, is for a real host):
    # past it a request goes on with its replica's local hold only
    statuses = burst(tmp_path, ["--ledger", redis_server.url, "--ledger-deadline-ms", "100"])
    assert statuses.count(200) == FIT, statuses
    assert statuses.count(429) == REQUESTS - FIT


def test_replicas_with_several_workers_each_on_a_shared_ledger_admit_what_fits(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    # 2 × 2 workers: each worker is a replica in Redis (the host's shared memory is the
    # fallback only)
    redis_server.client().flushdb()
    extra = ["--ledger", redis_server.url, "--ledger-deadline-ms", "100"]
    statuses = burst(tmp_path, extra, workers=2)
    assert statuses.count(200) == FIT, statuses
