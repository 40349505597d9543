"""The backends' half of ``ice doctor``: what each pool's inference servers expose to ICE.

Job: for every static ``metrics_urls`` entry of the policy's pools, read the page as ICE's
collector would (``ext_proc.signals.parse.parse_engine``, the pool's ``kind``) and say:

- ``backend.metrics``: the page answers, parses, and within the pool's ``scrape_timeout_s``
  (slower, and ICE's view of it goes stale);
- ``backend.kv_metrics``: KV usage and capacity (vLLM's ``vllm:cache_config_info``,
  SGLang's ``max_total_num_tokens``) present, and how many KV-cache metrics the page has
  (the checklist asks at least three);
- ``backend.prefix_caching``: ``enable_prefix_caching`` of ``vllm:cache_config_info``;
- ``backend.max_model_len``: the server's context length (vLLM's ``GET /v1/models``
  ``max_model_len``, on the backend's serving address) against the ``max_model_len`` of
  every profile whose routes use the pool;
- ``backend.version``: the engine's version (``GET /version``), when it says.

Pools that find their backends by DNS or a Prometheus server are listed as MANUAL: the
doctor reads static URLs only.

Invariants: an unreadable page is a FAIL naming the reason; a server that does not expose a
fact is MANUAL, never a FAIL.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from ext_proc.signals.parse import SourceParseError, parse_engine
from ext_proc.signals.pool import Pool
from ext_proc.signals.scrapes import EngineScrape
from ext_proc.tools.doctor import expect as X
from ext_proc.tools.doctor.checks import Check, fail
from ext_proc.tools.doctor.fetch import Fetch, FetchError

__all__ = ["backend_checks", "pool_profiles"]


def pool_profiles(ex: X.Expected) -> dict[str, set[str]]:
    """Pool → the profiles whose requests it serves (route bindings, mesh overrides, and the
    defaults for unnamed routes)."""
    p = ex.policy
    out: dict[str, set[str]] = {p.default_pool: {p.default_profile}}
    for binding in p.routes.values():
        out.setdefault(binding.pool or p.default_pool, set()).add(
            binding.profile or p.default_profile
        )
    return out


def _origin(pool: Pool, url: str) -> str:
    parts = urlsplit(url)
    endpoint = pool.backend_endpoints.get(url)
    return f"{parts.scheme}://{endpoint}" if endpoint else f"{parts.scheme}://{parts.netloc}"


def _json(fetch: Fetch, url: str, timeout_s: float) -> Any:
    try:
        return json.loads(fetch(url, timeout_s))
    except (FetchError, ValueError):
        return None


def _kv_checks(s: EngineScrape, url: str) -> list[Check]:
    out = []
    present = {
        "usage": s.kv_cache_usage,
        "num_gpu_blocks": s.num_gpu_blocks,
        "block_size": s.block_size,
        "capacity_tokens": s.kv_capacity_tokens,
        "prefix_cache_queries": s.prefix_cache_queries_tokens,
        "prefix_cache_hits": s.prefix_cache_hits_tokens,
    }
    have = [k for k, v in present.items() if v is not None]
    config = "vllm:cache_config_info" if s.kind == "vllm" else "sglang:max_total_num_tokens"
    if s.kv_cache_usage is None:
        out.append(
            fail(
                "backend.kv_metrics",
                f"{url}: no KV-cache usage gauge: ICE cannot compute the pool's pressure",
                "serve vLLM's (or SGLang's) own /metrics at this URL",
            )
        )
    elif s.kv_capacity_tokens is None:
        out.append(
            Check(
                "WARN",
                "backend.kv_metrics",
                f"{url}: no {config}: ICE knows usage but not free blocks (no KV fit checks)",
                f"a server version that exports {config}",
            )
        )
    elif len(have) < 3:
        out.append(
            Check(
                "WARN",
                "backend.kv_metrics",
                f"{url}: {len(have)} KV-cache metrics ({', '.join(have)}); the checklist asks 3",
                "a server version that exports the prefix-cache counters",
            )
        )
    else:
        size = (
            f"{s.num_gpu_blocks} blocks of {s.block_size} tokens"
            if s.num_gpu_blocks
            else f"{s.kv_capacity_tokens} tokens"
        )
        out.append(
            Check(
                "PASS",
                "backend.kv_metrics",
                f"{url}: {len(have)} KV metrics ({', '.join(have)}); {size}",
            )
        )
    if s.kind != "vllm":
        return out
    if s.prefix_caching is True:
        out.append(Check("PASS", "backend.prefix_caching", f"{url}: enable_prefix_caching=True"))
    elif s.prefix_caching is False:
        out.append(
            Check(
                "WARN",
                "backend.prefix_caching",
                f"{url}: prefix caching off: repeated system prompts and n>1 samples are "
                "prefilled and stored again (ICE counts them in full)",
                "vllm serve --enable-prefix-caching (on by default in vLLM V1)",
            )
        )
    else:
        out.append(
            Check(
                "MANUAL",
                "backend.prefix_caching",
                f"{url}: the page does not say (no enable_prefix_caching label)",
                "check the server's --enable-prefix-caching",
            )
        )
    return out


def _served_lengths(models: Any) -> dict[str, int]:
    """Model id → ``max_model_len`` from vLLM's ``/v1/models`` (empty when not said)."""
    data = models.get("data") if isinstance(models, dict) else None
    out: dict[str, int] = {}
    for m in data if isinstance(data, list) else []:
        if isinstance(m, dict) and isinstance(m.get("max_model_len"), int):
            out[str(m.get("id"))] = int(m["max_model_len"])
    return out


def _context_check(ex: X.Expected, pool: str, profiles: set[str], url: str, models: Any) -> Check:
    lens = _served_lengths(models)
    wanted = {
        n: ex.policy.profiles[n].max_model_len for n in sorted(profiles) if n in ex.policy.profiles
    }
    if not lens:
        return Check(
            "MANUAL",
            "backend.max_model_len",
            f"{url}: the server does not say its max_model_len (GET /v1/models); profiles "
            f"{', '.join(f'{n}={v}' for n, v in wanted.items())}",
            "check that vllm serve --max-model-len equals the profiles' max_model_len",
        )
    served = min(lens.values())
    bigger = [f"{n} ({v})" for n, v in wanted.items() if v is not None and v > served]
    unset = [n for n, v in wanted.items() if v is None]
    smaller = [f"{n} ({v})" for n, v in wanted.items() if v is not None and v < served]
    seen = ", ".join(f"{m}={v}" for m, v in sorted(lens.items()))
    if bigger:
        return fail(
            "backend.max_model_len",
            f"{url} serves {seen}; profiles {', '.join(bigger)} of pool {pool} allow more: ICE "
            "passes requests the server refuses",
            f"max_model_len: {served} in those profiles",
        )
    if unset or smaller:
        return Check(
            "WARN",
            "backend.max_model_len",
            f"{url} serves {seen}; "
            + "; ".join(
                s
                for s in (
                    f"profiles without max_model_len (no context checks): {', '.join(unset)}"
                    if unset
                    else "",
                    f"profiles below it (requests capped early): {', '.join(smaller)}"
                    if smaller
                    else "",
                )
                if s
            ),
            f"max_model_len: {served} in the profiles of pool {pool}",
        )
    return Check("PASS", "backend.max_model_len", f"{url} serves {seen}, as the profiles")


def _version_check(url: str, doc: Any) -> Check:
    version = doc.get("version") if isinstance(doc, dict) else None
    if isinstance(version, str) and version:
        return Check("PASS", "backend.version", f"{url}: {version}")
    return Check(
        "MANUAL",
        "backend.version",
        f"{url}: the server does not say its version (GET /version)",
        "note the engine's version with the deployment",
    )


def backend_checks(
    ex: X.Expected,
    fetch: Fetch,
    timeout_s: float,
    *,
    clock: Callable[[], float] = time.monotonic,
) -> list[Check]:
    out: list[Check] = []
    served_by = pool_profiles(ex)
    for name, pool in sorted(ex.policy.pools.items()):
        if pool.dns_name or pool.prometheus_url:
            how = f"DNS {pool.dns_name}" if pool.dns_name else f"Prometheus {pool.prometheus_url}"
            out.append(
                Check(
                    "MANUAL",
                    "backend.discovery",
                    f"pool {name} finds its backends by {how}: their pages are not read here",
                    "run ice signals URL on one backend's /metrics",
                )
            )
        if not (pool.metrics_urls or pool.dns_name or pool.prometheus_url):
            out.append(
                Check(
                    "WARN",
                    "backend.metrics",
                    f"pool {name} has no metrics source: ICE judges it without signals",
                    "metrics_urls (or dns, or prometheus) in the pool",
                )
            )
        for url in pool.metrics_urls:
            started = clock()
            try:
                text = fetch(url, max(timeout_s, pool.scrape_timeout_s))
                scrape = parse_engine(pool.kind, url, text, started)
            except FetchError as e:
                out.append(
                    fail(
                        "backend.metrics",
                        f"pool {name}: cannot read {e}",
                        "start the backend, or fix the pool's metrics_urls",
                    )
                )
                continue
            except SourceParseError as e:
                out.append(
                    fail(
                        "backend.metrics",
                        f"pool {name}: {url} is not a {pool.kind} metrics page: {e}",
                        f"point metrics_urls at the server's own /metrics (kind: {pool.kind})",
                    )
                )
                continue
            took = clock() - started
            if took > pool.scrape_timeout_s:
                out.append(
                    Check(
                        "WARN",
                        "backend.metrics",
                        f"pool {name}: {url} took {took:.2f} s > scrape_timeout_s "
                        f"{pool.scrape_timeout_s:g}: ICE's view of it goes stale",
                        "a faster /metrics (fewer histograms), or a larger scrape_timeout_s",
                    )
                )
            else:
                out.append(
                    Check("PASS", "backend.metrics", f"pool {name}: {url} in {took * 1000:.0f} ms")
                )
            out += _kv_checks(scrape, url)
            origin = _origin(pool, url)
            models = _json(fetch, f"{origin}/v1/models", timeout_s)
            out.append(_context_check(ex, name, served_by.get(name, set()), origin, models))
            out.append(_version_check(origin, _json(fetch, f"{origin}/version", timeout_s)))
    return out
