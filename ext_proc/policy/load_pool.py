"""Policy loading for backend pools: a ``pools.<name>`` block → ``Pool`` (see load.py for
the file as a whole). Every problem raises ``PolicyError`` naming the field."""

from __future__ import annotations

import logging
import math
import re
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from ext_proc._pb import policy_pb2
from ext_proc.policy.errors import PolicyError
from ext_proc.signals.pool import Pool

__all__ = ["pool_spec", "positive"]

log = logging.getLogger("ice.policy")


def _opt(msg: Any, name: str, default: Any) -> Any:
    return getattr(msg, name) if msg.HasField(name) else default


def positive(msg: Any, name: str, default: float, where: str) -> float:
    value = float(_opt(msg, name, default))
    if not (math.isfinite(value) and value > 0):
        raise PolicyError(f"{where}.{name}: must be a number > 0, got {value}")
    return value


_K8S_NAME = re.compile(r"[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?")


def _backend_pods(msg: policy_pb2.Pool, where: str) -> dict[str, tuple[str, str]]:
    """``backend_pods``: metrics URL → (namespace or "", pod), each URL one of metrics_urls."""
    out: dict[str, tuple[str, str]] = {}
    for url, ref in sorted(msg.backend_pods.items()):
        if url not in msg.metrics_urls:
            raise PolicyError(f"{where}.backend_pods: {url!r} is not one of metrics_urls")
        namespace, _, pod = ref.rpartition("/")
        if not _K8S_NAME.fullmatch(pod) or (namespace and not _K8S_NAME.fullmatch(namespace)):
            raise PolicyError(
                f"{where}.backend_pods[{url!r}]: must be 'namespace/pod' or 'pod' "
                f"(Kubernetes names), got {ref!r}"
            )
        out[url] = (namespace, pod)
    return out


def pool_spec(name: str, msg: policy_pb2.Pool) -> Pool:
    where = f"pools.{name}"
    d = Pool(name=name, metrics_urls=())
    for i, url in enumerate(msg.metrics_urls):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PolicyError(f"{where}.metrics_urls[{i}]: not an http(s) URL: {url!r}")
    interval = positive(msg, "scrape_interval_s", d.scrape_interval_s, where)
    kind = msg.kind or d.kind
    if kind not in ("vllm", "sglang"):
        raise PolicyError(f"{where}.kind: must be vllm or sglang, got {kind!r}")
    stale = msg.stale or d.stale
    if stale not in ("ignore", "last_known", "saturated"):
        raise PolicyError(f"{where}.stale: must be ignore, last_known or saturated, got {stale!r}")
    gpu_join = msg.gpu_join or d.gpu_join
    if gpu_join not in ("pool", "host", "pod"):
        raise PolicyError(f"{where}.gpu_join: must be pool, host or pod, got {gpu_join!r}")
    backend_pods = _backend_pods(msg, where)
    if gpu_join == "pod" and not backend_pods and not msg.HasField("prometheus"):
        raise PolicyError(
            f"{where}.gpu_join: pod needs the backends' pod names: backend_pods for "
            "metrics_urls, or a prometheus source (its series' pod labels); DNS backends are "
            "addresses without pod names"
        )
    if msg.local_gpus not in ("", "nvml"):
        raise PolicyError(f"{where}.local_gpus: must be nvml or empty, got {msg.local_gpus!r}")
    for i, url in enumerate(msg.gpu_metrics_urls):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PolicyError(f"{where}.gpu_metrics_urls[{i}]: not an http(s) URL: {url!r}")
    prom = msg.prometheus
    if msg.HasField("prometheus"):
        parts = urlsplit(prom.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PolicyError(f"{where}.prometheus.url: not an http(s) URL: {prom.url!r}")
    dns = msg.dns
    if msg.HasField("dns") and not dns.name:
        raise PolicyError(f"{where}.dns.name: required")
    pick = msg.endpoint_pick or d.endpoint_pick
    if pick not in ("none", "ice", "header"):
        raise PolicyError(f"{where}.endpoint_pick: must be none, ice or header, got {pick!r}")
    kv_hold = msg.kv_hold or d.kv_hold
    if kv_hold not in ("done", "seen"):
        raise PolicyError(f"{where}.kv_hold: must be done or seen, got {kv_hold!r}")
    endpoints: dict[str, str] = {}
    for url, address in sorted(msg.backend_endpoints.items()):
        if url not in msg.metrics_urls:
            raise PolicyError(f"{where}.backend_endpoints: {url!r} is not one of metrics_urls")
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():
            raise PolicyError(
                f"{where}.backend_endpoints[{url!r}]: must be 'ip:port', got {address!r}"
            )
        endpoints[url] = address
    several = len(msg.metrics_urls) > 1 or msg.HasField("dns") or msg.HasField("prometheus")
    if pick == "none" and several:
        log.warning(
            "pool %s has several endpoints and endpoint_pick: none: Envoy's load balancer may "
            "send a request to any of them, so ICE judges each against the endpoint with the "
            "least room; set endpoint_pick: ice to place requests where they fit",
            name,
        )
    pool = Pool(
        name=name,
        metrics_urls=tuple(msg.metrics_urls),
        scrape_interval_s=interval,
        scrape_timeout_s=_opt(msg, "scrape_timeout_s", d.scrape_timeout_s),
        max_age_s=_opt(msg, "max_age_s", d.max_age_s),
        kind=kind,
        stale="ignore"
        if stale == "ignore"
        else "last_known"
        if stale == "last_known"
        else "saturated",
        stale_after_s=_opt(msg, "stale_after_s", 1.5 * interval),
        window_s=_opt(msg, "window_s", d.window_s),
        dns_name=dns.name,
        dns_port=_opt(dns, "port", d.dns_port) if msg.HasField("dns") else d.dns_port,
        dns_path=dns.path or d.dns_path,
        dns_scheme=dns.scheme or d.dns_scheme,
        gpu_metrics_urls=tuple(msg.gpu_metrics_urls),
        prometheus_url=prom.url.rstrip("/"),
        prometheus_matchers=prom.matchers,
        prometheus_group_by=prom.group_by or d.prometheus_group_by,
        gpu_join=gpu_join,
        backend_pods=MappingProxyType(backend_pods),
        local_gpus=msg.local_gpus,
        endpoint_pick="ice" if pick == "ice" else "header" if pick == "header" else "none",
        backend_endpoints=MappingProxyType(endpoints),
        kv_hold="seen" if kv_hold == "seen" else "done",
        pcie_bandwidth_bytes_s=positive(
            msg, "pcie_bandwidth_bytes_s", d.pcie_bandwidth_bytes_s, where
        ),
        dns_refresh_s=_opt(dns, "refresh_s", d.dns_refresh_s)
        if msg.HasField("dns")
        else d.dns_refresh_s,
    )
    for field in (
        "scrape_interval_s",
        "scrape_timeout_s",
        "max_age_s",
        "stale_after_s",
        "window_s",
        "dns_refresh_s",
    ):
        value = getattr(pool, field)
        if not (math.isfinite(value) and value > 0):
            raise PolicyError(f"{where}.{field}: must be a number > 0, got {value}")
    return pool
