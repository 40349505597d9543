"""Two real vLLMs behind one Envoy: round robin alone, ICE judging (``endpoint_pick: none``) and
ICE picking the endpoint (``endpoint_pick: ice``), on an overload burst and on shared prompts.

```
burst ─┬─ rr ───► Envoy B (ice cluster → a closed port: fails open) ─round robin─┬─► vLLM A
       └─ none ─┐                                                                └─► vLLM B
         ice ───┴─► Envoy (envoy/envoy.yaml) ─ext_proc─► ICE (pool: A and B)
                      └─ override_host: ICE's pick (envoy.lb), else round robin ─► A or B
```

Two ``vllm serve`` of the tiny model (``ext_proc.lab.vllm_local``: CPU, 24 KV blocks of 128
tokens each, own ports and scratch dirs), one ICE whose pool lists both ``/metrics`` URLs
(``ext_proc/lab/vllm_tiny_policy.yaml`` rendered by ``ext_proc.lab.overload.render_policy``,
then its pools given both URLs and the run's ``endpoint_pick``), and real Envoy rendered from
``envoy/envoy.yaml`` with ``clusters={"backend": [A, B], "ice": [ICE]}``. The three configs:

- ``rr``: a second Envoy from the same file whose ``ice`` cluster is a closed port, so every
  request fails open (``unjudged`` = requests) and the backend cluster's round robin places
  it: the baseline without ICE. ICE still runs (policy ``none``) and scrapes both vLLMs, so
  vLLM serves the same /metrics load in every config.
- ``none``: Envoy's round robin places each request; ICE judges it against the endpoint with
  the least room (the safe default for a pool of several endpoints).
- ``ice``: ICE picks where the request fits (prefix affinity on system prompt + tools, then
  most room after admission, then shortest queue) and tells Envoy in ``envoy.lb``
  ``x-gateway-destination-endpoint``; the reply's ``x-ice-endpoint`` names it.

ICE is restarted before every run (no ledger, affinity table or drain history carries over),
vLLM A and B are idle before every run (``wait_idle`` on both), every run uses fresh prompt
text (seeded per workload, round and config), and the config order rotates per round.

Workloads:

1. ``overload``: ``ext_proc.lab.overload``'s burst (``plan_burst`` / ``request_body``):
   ``--requests`` streamed chats of ~``--prompt-tokens`` prompt and ``--max-tokens`` output tokens
   (``ignore_eos``), priorities from ``--mix``, open loop, once per ``--spacings`` value (ms
   between starts; 0 = all at once). On one vLLM, all at once, it preempts ~15 times unjudged
   (``bench/overload.py``).
2. ``shared``: ``--shared-requests`` chats, one every ``--shared-spacing-ms``, each with one of
   k system prompts of ~``--system-tokens`` tokens and its own ~``--question-tokens`` user
   question, ``--shared-max-tokens`` output, all ``standard``; one case per k in
   ``--system-prompts`` (default 3 and 6). Each prompt is used equally often, in a shuffled
   order that is the same in every run (``prompt_order``; ``i mod k`` would alias with round
   robin over two endpoints: an even k splits into two disjoint halves, perfect affinity by
   accident). The load is low (nothing should be shed); what differs is where the prompts
   land, and so vLLM's prefix-cache hits. ~900 prompt tokens = 7 full blocks of 128 (965
   tokens with the chat template and question): 3 prompts (21 blocks) fit one vLLM's 23
   usable blocks next to one running request, 6 prompts (42) do not.

Per run (``PoolRun``, a ``RunResult`` of ``ext_proc.lab.overload`` with per-backend deltas):
status of every request, TTFT (first streamed token) p50/p95 of the completed ones
(``send``), 429s; per vLLM, from /metrics before and after: ``vllm:num_preemptions_total``,
``vllm:request_success_total`` (where requests ran), ``vllm:prefix_cache_hits_total`` /
``vllm:prefix_cache_queries_total`` (tokens; hit rate = Σ hits / Σ queries over A and B);
sampled every ``--sample-ms``: the peak of waiting, running, KV usage; Envoy's
``failure_mode_allowed`` (requests that went through unjudged); from each reply's headers:
``x-ice-endpoint`` (ICE's pick, also on a 429; absent with ``none``) and whether ICE judged
on a stale view (``x-ice-stale``, or pressure ``unknown``). The tables show each run and
then all rounds of a config pooled (shots pooled for quantiles, counters summed).

    .venv/bin/python bench/endpoint_pick.py                       # 2 rounds, ~4.5 min
    .venv/bin/python bench/endpoint_pick.py --rounds 3 --json out.json
    .venv/bin/python bench/endpoint_pick.py --workloads shared --shared-spacing-ms 150

Needs ``.venv-vllm`` (``make vllm-install``): ~20-25 s to start each vLLM (one after the
other), ~1 s per ICE start, 2-11 s per overload run, ~12 s per shared run.

Set-up choices:
- Two vLLMs fit this 2-core, 24 GiB machine, but vLLM's CPU worker binds its OpenMP threads
  (``VLLM_CPU_OMP_THREADS_BIND=auto``) to core 0 and reserves core 1, in both servers. With
  both workers on core 0, one of the two stalled under the light shared workload: 11 of its
  12 requests waited for their first token until 1-2 s after the last of them had arrived
  (TTFT p95 10.5 s vs 0.2 s on the other; 4 of 4 runs, also with requests sent straight to
  each vLLM, no Envoy). ``--vllm-bind`` (default ``0,1``) gives each worker a core of its own
  (``VLLM_CPU_OMP_THREADS_BIND`` per server); ``auto,auto`` brings the stall back.
- ICE's policy has semantic truncation off: every request here is single-turn, so nothing
  could be dropped and the verdicts are the same; ICE then starts in ~1 s instead of ~9 s
  (no embedding worker), which lets every run have a fresh ICE.
- Envoy runs with one worker, so its round robin alternates strictly over the requests it
  forwards (with ``none`` a 429 is not forwarded and does not advance it).

Results (2 Dec 2026, 2 cores (AMD EPYC), 24 GiB, Envoy 1.40, vLLM 0.32 CPU, tiny model;
``--rounds 3``, 367 s; all rounds pooled, 72 requests per cell):

| overload burst, 24 × (887 + 200) | rr 250 ms | none 250 | ice 250 | rr 0 ms | none 0 | ice 0 |
|---|---:|---:|---:|---:|---:|---:|
| 200 completed              | 72 | 38 | 46 | 72 | 19 | 32 |
| 429                        | 0 | 34 | 26 | 0 | 53 | 40 |
| preemptions A+B (A/B)      | 25 (6/19) | 4 (3/1) | 7 (3/4) | 30 (15/15) | 4 (3/1) | 11 (5/6) |
| finished on A/B            | 36/36 | 18/20 | 24/22 | 36/36 | 9/10 | 14/18 |
| TTFT p50 of 200s (s)       | 0.60 | 0.26 | 0.36 | 1.96 | 0.98 | 0.91 |
| TTFT p95 of 200s (s)       | 5.09 | 1.15 | 1.78 | 8.60 | 1.56 | 4.63 |

| shared prompts, 500 ms spacing       | 3 prompts: none | 3: ice | 6 prompts: none | 6: ice |
|---|---:|---:|---:|---:|
| prefix-cache hit rate (A+B)          | 0.696 | 0.812 | 0.365 | 0.210 |
| finished on A/B                      | 36/36 | 72/0 | 36/36 | 72/0 |
| TTFT p50 / p95 (s)                   | 0.048/0.205 | 0.039/0.148 | 0.059/0.330 | 0.044/0.169 |

What the figures say:
- ICE in front of two vLLMs cuts preemptions from 25-30 to 4-11 per 72 requests, by shedding.
  ``none`` judges each request against the endpoint with the least room, so it admits about
  what one vLLM would (19 of 72 at once); ``ice`` places requests where they fit and
  completes 20-70 % more (46 vs 38, 32 vs 19), at more preemptions than ``none`` (7 vs 4,
  11 vs 4) and a longer TTFT tail: it fills both endpoints to the edge of what its view
  says fits, and the view lags the backends (at 250 ms spacing 13 of 72 replies with
  ``ice``, 17 with ``none``, were judged on a stale view: ICE's scrapes of two busy vLLMs on
  2 cores time out now and then).
- Affinity raised the hit rate only where the prompt set fits one vLLM. At this load the
  pool is idle whenever a request arrives, so ``picking.pick``'s tie-break (equal room,
  empty queues → the endpoint name) sends every *new* prefix to the same endpoint and
  affinity keeps it there: all 72 requests ran on one vLLM, the other idled. With 3 prompts
  that is the best case (3 cold misses instead of round robin's 6 per 24: 0.812 vs 0.696,
  the cold-miss ceilings 21/24 and 18/24 × 896/965); with 6 prompts that one vLLM's LRU
  cache thrashes (0.210) while round robin spreads the set over both caches (0.365). At 150
  ms spacing (``--shared-spacing-ms 150 --rounds 2``, same day) requests overlap, new prefixes
  spread (40/8 and 33/15) and affinity won both: 0.812 vs 0.686 (3 prompts), 0.450 vs 0.355
  (6), with 0 vs 2 and 0 vs 5 requests shed (``none`` judges against the fuller endpoint).
- The shared TTFTs are short either way: prefill of ~900 tokens on this 2-layer model costs
  tens of ms, so a cache hit saves little here; ``ice``'s lower TTFT with 6 prompts, at a
  lower hit rate, probably comes from keeping one vLLM busy (warm), not from the cache.
- Round to round the overload figures vary (round robin at 250 ms: 7, 6 and 12 preemptions);
  the shared hit rates repeat exactly, as placement and prompt order are deterministic there.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import platform
import random
import sys
import tempfile
import time
import types
import urllib.request
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import yaml

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # run as a script: import ext_proc from the checkout
    sys.path.insert(0, str(REPO))

from ext_proc.lab import vllm_local as vl  # noqa: E402
from ext_proc.lab.overload import (  # noqa: E402
    CHAT,
    MAX_TOKENS,
    MIX,
    POLICY,
    PROMPT_TOKENS,
    REQUESTS,
    RunResult,
    Sample,
    Shot,
    ext_proc_stats,
    fetch,
    metric_sum,
    plan_burst,
    render_policy,
    request_body,
    table,
    wait_idle,
)
from ext_proc.lab.overload.burst import Planned  # noqa: E402
from ext_proc.lab.overload.metrics import sample_metrics  # noqa: E402
from ext_proc.lab.overload.run import send  # noqa: E402
from ext_proc.lab.stack import (  # noqa: E402
    ENVOY_DIR,
    Stack,
    free_port,
    policy_passthrough_paths,
    render_envoy_config,
)

CONFIGS = ("rr", "none", "ice")
SHARED_CONFIGS = ("none", "ice")
WORKLOADS = ("overload", "shared")
SPACINGS = (250.0, 0.0)
LABELS = ("A", "B")
# The shared workload (module docstring: why ~900 tokens).
SHARED_REQUESTS = 24
SHARED_SPACING_MS = 500.0
SYSTEM_PROMPTS = "3,6"
SYSTEM_TOKENS = 900
QUESTION_TOKENS = 40
SHARED_MAX_TOKENS = 32
H_ENDPOINT = "x-ice-endpoint"
# Each vLLM's model worker on a core of its own (module docstring: with vLLM's ``auto``
# binding both workers share core 0 and one of them stalls).
BINDS: tuple[str | None, ...] = ("0", "1")


@dataclass
class BackendDelta:
    """One vLLM over one run: counter deltas and sampled peaks."""

    label: str
    address: str
    finished: int  # vllm:request_success_total
    preemptions: int
    prefix_queries: float  # tokens
    prefix_hits: float
    waiting_max: int = 0
    running_max: int = 0
    kv_usage_max: float = 0.0


def _rate(hits: float, queries: float) -> float | None:
    return round(hits / queries, 3) if queries else None


def _ab(values: Sequence[Any]) -> str:
    return "/".join("-" if v is None else str(v) for v in values)


@dataclass
class PoolRun(RunResult):
    """A ``RunResult`` over a pool: ``mode`` is the config, plus each backend's deltas."""

    case: str = ""  # Case.title
    workload: str = ""
    spacing_ms: float = 0.0
    backends: list[BackendDelta] = field(default_factory=list)
    endpoints: dict[str, int] = field(default_factory=dict)  # x-ice-endpoint label → replies
    stale_views: int = 0  # replies judged on a stale or no view (x-ice-stale, pressure unknown)
    timelines: dict[str, list[Sample]] = field(default_factory=dict)

    def summary(self) -> dict[str, Any]:
        s = super().summary()
        b = self.backends
        ok = [x for x in self.shots if x.status == 200 and x.error is None]
        hits = sum(x.prefix_hits for x in b)
        queries = sum(x.prefix_queries for x in b)
        s.update(
            {
                "case": self.case,
                "workload": self.workload,
                "stale_views": self.stale_views,
                "spacing_ms": self.spacing_ms,
                "preemptions_ab": _ab([x.preemptions for x in b]),
                "finished_ab": _ab([x.finished for x in b]),
                "picked_ab": _ab([self.endpoints.get(x.label, 0) for x in b])
                if self.endpoints
                else None,
                "waiting_max_ab": _ab([x.waiting_max for x in b]),
                "running_max_ab": _ab([x.running_max for x in b]),
                "kv_usage_max_ab": _ab([round(x.kv_usage_max, 2) for x in b]),
                "prefix_hit_rate": _rate(hits, queries),
                "prefix_hit_rate_ab": _ab([_rate(x.prefix_hits, x.prefix_queries) for x in b]),
                "prompt_tokens_mean": round(sum(x.prompt_tokens for x in ok) / len(ok))
                if ok
                else None,
                "prefix_hits_tokens": int(hits),
                "prefix_queries_tokens": int(queries),
            }
        )
        return s


OVERLOAD_ROWS: tuple[tuple[str, str], ...] = (
    ("requests", "requests"),
    ("ok", "200 completed"),
    ("shed_429", "429 shed"),
    ("other", "other errors"),
    ("downgraded", "downgraded by ICE"),
    ("preemptions", "vLLM preemptions (A+B)"),
    ("preemptions_ab", "vLLM preemptions A/B"),
    ("finished_ab", "finished on vLLM A/B"),
    ("picked_ab", "x-ice-endpoint A/B (all replies)"),
    ("wait_p50_s", "200 TTFT p50 (s)"),
    ("wait_p95_s", "200 TTFT p95 (s)"),
    ("wait_max_s", "200 TTFT max (s)"),
    ("ok_p95_s", "200 latency p95 (s)"),
    ("output_tokens", "completed output tokens"),
    ("wall_s", "burst wall time (s)"),
    ("shed_by_priority", "429 by priority"),
    ("shed_reasons", "429 reasons"),
    ("waiting_max_ab", "vLLM waiting max A/B"),
    ("running_max_ab", "vLLM running max A/B"),
    ("kv_usage_max_ab", "vLLM KV usage max A/B"),
    ("unjudged", "Envoy fail-open (unjudged)"),
    ("stale_views", "ICE judged on a stale view"),
)
SHARED_ROWS: tuple[tuple[str, str], ...] = (
    ("requests", "requests"),
    ("ok", "200 completed"),
    ("shed_429", "429 shed"),
    ("other", "other errors"),
    ("prefix_hit_rate", "prefix-cache hit rate (A+B)"),
    ("prefix_hit_rate_ab", "prefix-cache hit rate A/B"),
    ("prompt_tokens_mean", "prompt tokens / request (mean)"),
    ("prefix_hits_tokens", "prefix hits (tokens, A+B)"),
    ("prefix_queries_tokens", "prefix queries (tokens, A+B)"),
    ("finished_ab", "finished on vLLM A/B"),
    ("picked_ab", "x-ice-endpoint A/B (all replies)"),
    ("wait_p50_s", "200 TTFT p50 (s)"),
    ("wait_p95_s", "200 TTFT p95 (s)"),
    ("ok_p50_s", "200 latency p50 (s)"),
    ("preemptions", "vLLM preemptions (A+B)"),
    ("running_max_ab", "vLLM running max A/B"),
    ("unjudged", "Envoy fail-open (unjudged)"),
)


# ---- the stack ---------------------------------------------------------------------------


@dataclass
class Pool:
    """Two vLLMs, Envoy (through ICE), Envoy ``rr`` (ICE unreachable) and ICE's policies."""

    servers: list[vl.VllmServer]
    stack: Stack
    model: str
    ice_address: str
    ice_metrics: str
    policies: dict[str, Path]  # endpoint_pick → rendered policy
    envoy_url: str
    admin_port: int
    rr_url: str
    rr_admin_port: int
    ice_starts_s: list[float] = field(default_factory=list)

    @property
    def metrics_urls(self) -> list[str]:
        return [f"{s.base_url}/metrics" for s in self.servers]

    @property
    def addresses(self) -> list[str]:
        return [f"{s.cfg.host}:{s.cfg.port}" for s in self.servers]

    def target(self, config: str) -> tuple[str, int]:
        return (
            (self.rr_url, self.rr_admin_port)
            if config == "rr"
            else (
                self.envoy_url,
                self.admin_port,
            )
        )

    def restart_ice(self, endpoint_pick: str) -> None:
        """A fresh ICE with the policy of ``endpoint_pick``; judging through Envoy once."""
        self.stack.stop("ice")
        t0 = time.monotonic()
        self.stack.start_ice(
            self.ice_address,
            policy=self.policies[endpoint_pick],
            metrics_address=self.ice_metrics,
        )
        deadline = time.monotonic() + 30
        while not _judged_once(
            self.envoy_url, self.model, endpoint_pick == "ice"
        ):  # Envoy reconnected, ICE scraped
            if time.monotonic() > deadline:
                raise RuntimeError(f"ICE not judging after restart\n{self.stack.log_tails()}")
            time.sleep(0.2)
        self.ice_starts_s.append(round(time.monotonic() - t0, 1))
        for url in self.metrics_urls:
            wait_idle(url)


def _post(base: str, model: str, content: str) -> dict[str, str]:
    body = {"model": model, "messages": [{"role": "user", "content": content}], "max_tokens": 2}
    req = urllib.request.Request(
        base + CHAT, data=json.dumps(body).encode(), headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        resp.read()
        return {k.lower(): v for k, v in resp.headers.items()}


def _judged_once(envoy_url: str, model: str, picking: bool) -> bool:
    """One short chat through Envoy came back judged (and, ``picking``, with a pick)."""
    try:
        headers = _post(envoy_url, model, "warm up")
    except OSError:
        return False
    return bool(headers.get("x-ice-decision")) and (not picking or H_ENDPOINT in headers)


def pool_policy(template: Path, out: Path, urls: Sequence[str], mode: str, model_dir: Path) -> Path:
    """``template`` rendered by ``render_policy``, its pools scraping all ``urls`` with
    ``endpoint_pick: mode``, semantic truncation off."""
    port = int(urls[0].rsplit(":", 1)[1].split("/", 1)[0])
    render_policy(template, out, port, model_dir)
    policy: dict[str, Any] = yaml.safe_load(out.read_text())
    for pool in policy.get("pools", {}).values():
        pool["metrics_urls"] = list(urls)
        pool["endpoint_pick"] = mode
    for profile in policy.get("profiles", {}).values():
        # Single-turn requests: nothing to truncate, same verdicts; ICE starts in ~1 s, not ~9
        # s (no embedding worker), so every run can have a fresh ICE.
        if isinstance(profile.get("truncation"), dict):
            profile["truncation"]["enabled"] = False
    out.write_text(yaml.safe_dump(policy, sort_keys=False))
    return out


@contextlib.contextmanager
def _env(key: str, value: str | None) -> Iterator[None]:
    """``os.environ[key]`` = ``value`` (None: as it is) inside the block (``start_server``
    copies the environment when it starts vLLM)."""
    old = os.environ.get(key)
    if value is not None:
        os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


@contextlib.contextmanager
def pool_setup(
    workdir: Path,
    *,
    policy: Path = POLICY,
    vllm_args: Sequence[str] = (),
    binds: Sequence[str | None] = BINDS,
) -> Iterator[Pool]:
    """Two vLLMs (sequential starts), both Envoys; ICE starts with ``restart_ice``.

    ``binds``: each vLLM's ``VLLM_CPU_OMP_THREADS_BIND`` (None: vLLM's own ``auto``)."""
    workdir.mkdir(parents=True, exist_ok=True)
    vl.ensure_model(vl.DEFAULT_MODEL_DIR)
    with contextlib.ExitStack() as es:
        servers = []
        for label, bind in zip(LABELS, binds, strict=True):
            # Own scratch per server: ``close`` removes the sockets it finds in its scratch.
            cfg = vl.ServeConfig(
                port=vl.free_port(),
                scratch=vl.DEFAULT_SCRATCH.parent / f"run-ep{label.lower()}",
                extra_args=tuple(vllm_args),
            )
            log = workdir / f"vllm-{label}.log"
            with _env("VLLM_CPU_OMP_THREADS_BIND", bind):
                servers.append(es.enter_context(vl.start_server(cfg, log_path=log)))
            print(
                f"[endpoint_pick] vLLM {label} on {cfg.port} up in {servers[-1].startup_s:.1f} s",
                file=sys.stderr,
            )
        stack = es.enter_context(Stack(workdir))
        urls = [f"{s.base_url}/metrics" for s in servers]
        policies = {
            mode: pool_policy(
                policy, workdir / f"policy-{mode}.yaml", urls, mode, vl.DEFAULT_MODEL_DIR
            )
            for mode in ("none", "ice")
        }
        ice_address = f"127.0.0.1:{free_port()}"
        backends = [f"{s.cfg.host}:{s.cfg.port}" for s in servers]
        ports = {}
        for name, ice in (("envoy", ice_address), ("envoy_rr", f"127.0.0.1:{free_port()}")):
            port, admin = free_port(), free_port()
            config = render_envoy_config(
                ENVOY_DIR / "envoy.yaml",
                admin_port=admin,
                listeners={"ingress": port},
                clusters={"ice": [ice], "backend": backends},
                passthrough_paths=policy_passthrough_paths(policies["none"]),
            )
            stack.start_envoy(config, admin, name=name)
            ports[name] = (port, admin)
        pool = Pool(
            servers=servers,
            stack=stack,
            model=servers[0].cfg.served_model_name,
            ice_address=ice_address,
            ice_metrics=f"127.0.0.1:{free_port()}",
            policies=policies,
            envoy_url=f"http://127.0.0.1:{ports['envoy'][0]}",
            admin_port=ports["envoy"][1],
            rr_url=f"http://127.0.0.1:{ports['envoy_rr'][0]}",
            rr_admin_port=ports["envoy_rr"][1],
        )
        for s in servers:  # first-request costs, straight to each
            _post(s.base_url, pool.model, "warm up")
        yield pool


# ---- one run -----------------------------------------------------------------------------


def prompt_order(requests: int, prompts: int) -> list[int]:
    """Which system prompt each request gets: each equally often (± 1), in a shuffled order
    that is the same for every run (a seed of its own). Not ``i mod prompts``: that aliases
    with round robin over two endpoints (an even count of prompts splits into two disjoint
    halves, one per endpoint: perfect affinity by accident)."""
    order = [i % prompts for i in range(requests)]
    random.Random(f"prompts:{requests}:{prompts}").shuffle(order)
    return order


def shared_bodies(
    burst: Sequence[Planned],
    model: str,
    seed: int,
    *,
    prompts: int,
    system_tokens: int,
    question_tokens: int,
) -> list[dict[str, Any]]:
    """``request_body`` with messages [system prompt ``prompt_order``[i], question i]; the
    texts are fresh per ``seed``, the order of prompts is not."""
    systems = [vl.filler_text(system_tokens, seed + k) for k in range(prompts)]
    order = prompt_order(len(burst), prompts)
    bodies = []
    for p in burst:
        body = request_body(p, model, seed)
        body["messages"] = [
            {"role": "system", "content": systems[order[p.index]]},
            {"role": "user", "content": vl.filler_text(question_tokens, seed + 1000 + p.index)},
        ]
        bodies.append(body)
    return bodies


async def run_pool(
    *,
    config: str,
    case: str,
    workload: str,
    round_no: int,
    spacing_ms: float,
    target: str,
    admin_port: int,
    pool: Pool,
    burst: Sequence[Planned],
    bodies: Sequence[dict[str, Any]],
    sample_s: float,
) -> PoolRun:
    """``burst`` (with ``bodies``) sent open-loop to ``target``; both vLLMs watched."""
    labels = dict(zip(pool.addresses, LABELS, strict=True))
    seen: Counter[str] = Counter()
    views: Counter[str] = Counter()

    async def on_end(
        _s: aiohttp.ClientSession, _c: types.SimpleNamespace, params: aiohttp.TraceRequestEndParams
    ) -> None:
        headers = params.response.headers
        endpoint = headers.get(H_ENDPOINT)
        if endpoint:
            seen[labels.get(endpoint, endpoint)] += 1
        if headers.get("x-mem-pressure") == "unknown" or headers.get("x-ice-stale"):
            views["stale"] += 1  # judged without a fresh view: no pick either

    trace = aiohttp.TraceConfig()
    trace.on_request_end.append(on_end)
    urls = pool.metrics_urls
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with (
        aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=600), trace_configs=[trace]
        ) as session,
        aiohttp.ClientSession() as probe,
    ):
        before = [await fetch(probe, u) for u in urls]
        stats0 = ext_proc_stats(admin_port)
        stop = asyncio.Event()
        t0 = time.monotonic() + 0.05
        timelines: list[list[Sample]] = [[] for _ in urls]
        samplers = [
            asyncio.create_task(
                sample_metrics(
                    probe, u, t0, sample_s, stop, metric_sum(b, "vllm:num_preemptions_total"), out
                )
            )
            for u, b, out in zip(urls, before, timelines, strict=True)
        ]
        try:
            shots: list[Shot] = list(
                await asyncio.gather(
                    *(
                        send(session, target + CHAT, p, b, t0)
                        for p, b in zip(burst, bodies, strict=True)
                    )
                )
            )
            wall = time.monotonic() - t0
        finally:
            stop.set()
            await asyncio.gather(*samplers, return_exceptions=True)
        after = [await fetch(probe, u) for u in urls]
    stats1 = ext_proc_stats(admin_port)

    def delta(i: int, name: str) -> float:
        return metric_sum(after[i], name) - metric_sum(before[i], name)

    backends = [
        BackendDelta(
            label=LABELS[i],
            address=pool.addresses[i],
            finished=int(delta(i, "vllm:request_success_total")),
            preemptions=int(delta(i, "vllm:num_preemptions_total")),
            prefix_queries=delta(i, "vllm:prefix_cache_queries_total"),
            prefix_hits=delta(i, "vllm:prefix_cache_hits_total"),
            waiting_max=max((s.waiting for s in timelines[i]), default=0),
            running_max=max((s.running for s in timelines[i]), default=0),
            kv_usage_max=max((s.kv_usage for s in timelines[i]), default=0.0),
        )
        for i in range(len(urls))
    ]
    q_sum = sum(delta(i, "vllm:request_queue_time_seconds_sum") for i in range(len(urls)))
    q_count = sum(delta(i, "vllm:request_queue_time_seconds_count") for i in range(len(urls)))
    return PoolRun(
        mode=config,
        round=round_no,
        wall_s=wall,
        preemptions=sum(b.preemptions for b in backends),
        queue_time_mean_s=q_sum / q_count if q_count else None,
        vllm_requests=int(q_count),
        waiting_max=max(b.waiting_max for b in backends),
        running_max=max(b.running_max for b in backends),
        kv_usage_max=max(b.kv_usage_max for b in backends),
        ext_proc={k: stats1.get(k, 0) - stats0.get(k, 0) for k in stats1},
        shots=shots,
        case=case,
        workload=workload,
        spacing_ms=spacing_ms,
        backends=backends,
        endpoints=dict(seen),
        stale_views=views["stale"],
        timelines={LABELS[i]: t for i, t in enumerate(timelines)},
    )


def one_line(r: PoolRun) -> str:
    s = r.summary()
    return (
        f"{s['ok']} ok, {s['shed_429']} × 429, preemptions {s['preemptions_ab']}, "
        f"finished {s['finished_ab']}, picked {s['picked_ab']}, "
        f"TTFT p50/p95 {s['wait_p50_s']}/{s['wait_p95_s']} s, hit rate {s['prefix_hit_rate']}, "
        f"unjudged {s['unjudged']}, {s['wall_s']} s"
    )


def aggregate(runs: Sequence[PoolRun]) -> PoolRun:
    """All rounds of one config as one run (pooled shots, summed deltas): the totals column."""
    first = runs[0]
    backends = [
        BackendDelta(
            label=b.label,
            address=b.address,
            finished=sum(r.backends[i].finished for r in runs),
            preemptions=sum(r.backends[i].preemptions for r in runs),
            prefix_queries=sum(r.backends[i].prefix_queries for r in runs),
            prefix_hits=sum(r.backends[i].prefix_hits for r in runs),
            waiting_max=max(r.backends[i].waiting_max for r in runs),
            running_max=max(r.backends[i].running_max for r in runs),
            kv_usage_max=max(r.backends[i].kv_usage_max for r in runs),
        )
        for i, b in enumerate(first.backends)
    ]
    endpoints: Counter[str] = Counter()
    ext_proc: Counter[str] = Counter()
    for r in runs:
        endpoints.update(r.endpoints)
        ext_proc.update(r.ext_proc)
    return PoolRun(
        mode=first.mode,
        round=0,
        wall_s=sum(r.wall_s for r in runs),
        preemptions=sum(r.preemptions for r in runs),
        queue_time_mean_s=None,
        vllm_requests=sum(r.vllm_requests for r in runs),
        waiting_max=max(r.waiting_max for r in runs),
        running_max=max(r.running_max for r in runs),
        kv_usage_max=max(r.kv_usage_max for r in runs),
        ext_proc=dict(ext_proc),
        shots=[s for r in runs for s in r.shots],
        case=first.case,
        workload=first.workload,
        spacing_ms=first.spacing_ms,
        backends=backends,
        endpoints=dict(endpoints),
        stale_views=sum(r.stale_views for r in runs),
    )


# ---- the plan ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    """One workload at one setting, run ``--rounds`` times in each of ``configs``."""

    workload: str
    spacing_ms: float
    configs: tuple[str, ...]
    prompts: int = 0  # shared: how many system prompts

    @property
    def title(self) -> str:
        if self.workload == "shared":
            return f"shared, {self.prompts} system prompts, spacing {self.spacing_ms:g} ms"
        return f"overload, spacing {self.spacing_ms:g} ms"


def run_all(pool: Pool, cases: Sequence[Case], args: argparse.Namespace) -> list[PoolRun]:
    results: list[PoolRun] = []
    for ci, case in enumerate(cases):
        if case.workload == "overload":
            burst = plan_burst(
                args.requests, args.prompt_tokens, args.max_tokens, case.spacing_ms, args.mix
            )
        else:
            burst = plan_burst(
                args.shared_requests,
                args.system_tokens,
                args.shared_max_tokens,
                case.spacing_ms,
                "standard=1",
            )
        for r in range(args.rounds):
            k = r % len(case.configs)
            order = case.configs[k:] + case.configs[:k]
            for config in order:
                pool.restart_ice("none" if config == "rr" else config)
                seed = 10_000_000 * (ci + 1) + 100_000 * (r + 1) + 10_000 * CONFIGS.index(config)
                if case.workload == "overload":
                    bodies = [request_body(p, pool.model, seed + p.index) for p in burst]
                else:
                    bodies = shared_bodies(
                        burst,
                        pool.model,
                        seed,
                        prompts=case.prompts,
                        system_tokens=args.system_tokens,
                        question_tokens=args.question_tokens,
                    )
                target, admin = pool.target(config)
                result = asyncio.run(
                    run_pool(
                        config=config,
                        case=case.title,
                        workload=case.workload,
                        round_no=r + 1,
                        spacing_ms=case.spacing_ms,
                        target=target,
                        admin_port=admin,
                        pool=pool,
                        burst=burst,
                        bodies=bodies,
                        sample_s=args.sample_ms / 1000,
                    )
                )
                results.append(result)
                print(
                    f"[endpoint_pick] {case.title} r{r + 1} {config}: {one_line(result)}",
                    file=sys.stderr,
                    flush=True,
                )
    for url in pool.metrics_urls:
        wait_idle(url)
    return results


def tables(results: Sequence[PoolRun], cases: Sequence[Case]) -> str:
    out = []
    for case in cases:
        runs = [r for r in results if r.case == case.title]
        if not runs:
            continue
        rows = OVERLOAD_ROWS if case.workload == "overload" else SHARED_ROWS
        totals = [aggregate([r for r in runs if r.mode == c]) for c in case.configs]
        out.append(f"## {case.title}: per run\n\n{table(runs, rows)}\n")
        heads = [f"all {t.mode}" for t in sorted(totals, key=lambda t: (t.round, t.mode))]
        out.append(f"## {case.title}: all rounds pooled\n\n{table(totals, rows, heads)}\n")
    return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--workloads", default=",".join(WORKLOADS), help="overload,shared")
    ap.add_argument("--configs", default=",".join(CONFIGS), help="overload: rr,none,ice")
    ap.add_argument("--shared-configs", default=",".join(SHARED_CONFIGS), help="shared: none,ice")
    ap.add_argument("--requests", type=int, default=REQUESTS)
    ap.add_argument("--prompt-tokens", type=int, default=PROMPT_TOKENS, help="filler words")
    ap.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    ap.add_argument("--spacings", default=",".join(f"{s:g}" for s in SPACINGS), help="ms")
    ap.add_argument("--mix", default=MIX, help="priority weights, e.g. standard=3,sheddable=2")
    ap.add_argument("--shared-requests", type=int, default=SHARED_REQUESTS)
    ap.add_argument("--shared-spacing-ms", type=float, default=SHARED_SPACING_MS)
    ap.add_argument(
        "--system-prompts", default=SYSTEM_PROMPTS, help="shared: prompt counts, one case each"
    )
    ap.add_argument("--system-tokens", type=int, default=SYSTEM_TOKENS, help="filler words")
    ap.add_argument("--question-tokens", type=int, default=QUESTION_TOKENS, help="filler words")
    ap.add_argument("--shared-max-tokens", type=int, default=SHARED_MAX_TOKENS)
    ap.add_argument("--sample-ms", type=float, default=100.0)
    ap.add_argument("--policy", type=Path, default=POLICY)
    ap.add_argument("--workdir", type=Path, default=None, help="logs (default: a temp dir)")
    ap.add_argument("--vllm-arg", action="append", default=[], help="to both vllm serve")
    ap.add_argument(
        "--vllm-bind",
        default=",".join(b or "auto" for b in BINDS),
        help="VLLM_CPU_OMP_THREADS_BIND of A,B (auto: vLLM's own, both on core 0)",
    )
    ap.add_argument("--json", type=Path, default=None, help="write the full report here")
    args = ap.parse_args(argv)

    def configs(spec: str) -> tuple[str, ...]:
        chosen = tuple(c for c in spec.split(",") if c)
        bad = [c for c in chosen if c not in CONFIGS]
        if bad:
            ap.error(f"unknown config(s) {bad}: choose from {CONFIGS}")
        return chosen

    workloads = [w for w in args.workloads.split(",") if w]
    cases: list[Case] = []
    if "overload" in workloads:
        cases += [
            Case("overload", float(s), configs(args.configs)) for s in args.spacings.split(",")
        ]
    if "shared" in workloads:
        cases += [
            Case("shared", args.shared_spacing_ms, configs(args.shared_configs), int(k))
            for k in args.system_prompts.split(",")
        ]
    started = datetime.datetime.now(datetime.UTC)
    t0 = time.monotonic()
    with contextlib.ExitStack() as es:
        workdir = args.workdir or Path(es.enter_context(tempfile.TemporaryDirectory()))
        binds = [None if b == "auto" else b for b in args.vllm_bind.split(",")]
        if len(binds) != len(LABELS):
            ap.error(f"--vllm-bind: one value per vLLM ({len(LABELS)})")
        with pool_setup(workdir, policy=args.policy, vllm_args=args.vllm_arg, binds=binds) as pool:
            results = run_all(pool, cases, args)
            ice_starts = pool.ice_starts_s
    elapsed = time.monotonic() - t0
    text = tables(results, cases)
    print(text)
    print(
        f"{len(results)} runs in {elapsed:.0f} s (started {started:%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} CPUs, {platform.platform()}); ICE starts {ice_starts} s"
    )
    if args.json is not None:
        report = {
            "started_utc": started.isoformat(timespec="seconds"),
            "elapsed_s": round(elapsed, 1),
            "machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
            "ice_starts_s": ice_starts,
            "runs": [
                {
                    "summary": r.summary(),
                    "backends": [asdict(b) for b in r.backends],
                    "ext_proc": r.ext_proc,
                    "endpoints": r.endpoints,
                    "shots": [asdict(s) for s in r.shots],
                    "timelines": {k: [asdict(s) for s in v] for k, v in r.timelines.items()},
                }
                for r in results
            ],
        }
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
