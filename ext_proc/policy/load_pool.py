"""Policy loading for backend pools: a ``pools.<name>`` block → ``Pool`` (see load.py for
the file as a whole). Every problem raises ``PolicyError`` naming the field."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from ext_proc._pb import policy_pb2
from ext_proc.policy.errors import PolicyError
from ext_proc.policy.load_fields import opt
from ext_proc.signals.pool import Pool

__all__ = ["pool_spec", "positive"]

log = logging.getLogger("ice.policy")


def positive(msg: Any, name: str, default: float, where: str) -> float:
    value = float(opt(msg, name, default))
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
    _check_http_urls(msg.metrics_urls, f"{where}.metrics_urls")
    interval = positive(msg, "scrape_interval_s", d.scrape_interval_s, where)
    choices = _choices(msg, d, where)
    several = len(msg.metrics_urls) > 1 or msg.HasField("dns") or msg.HasField("prometheus")
    if choices.endpoint_pick == "none" and several:
        log.warning(
            "pool %s has several endpoints and endpoint_pick: none: Envoy's load balancer may "
            "send a request to any of them, so ICE judges each against the endpoint with the "
            "least room; set endpoint_pick: ice to place requests where they fit",
            name,
        )
    pool = _pool(name, msg, d, interval, choices)
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


def _check_http_urls(urls: Iterable[str], where: str) -> None:
    for i, url in enumerate(urls):
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PolicyError(f"{where}[{i}]: not an http(s) URL: {url!r}")


def _one_of(value: str, where: str, choices: tuple[str, ...]) -> str:
    """``value`` when it is one of ``choices``; else a ``PolicyError`` naming them."""
    if value not in choices:
        allowed = f"{', '.join(choices[:-1])} or {choices[-1]}"
        raise PolicyError(f"{where}: must be {allowed}, got {value!r}")
    return value


@dataclass(frozen=True, slots=True)
class _Choices:
    """A pool's checked one-of-a-few settings and its backends' pod names and addresses."""

    kind: str
    stale: str
    gpu_join: str
    endpoint_pick: str
    kv_hold: str
    backend_pods: dict[str, tuple[str, str]]
    backend_endpoints: dict[str, str]


def _choices(msg: policy_pb2.Pool, d: Pool, where: str) -> _Choices:
    kind = _one_of(msg.kind or d.kind, f"{where}.kind", ("vllm", "sglang"))
    stale = _one_of(msg.stale or d.stale, f"{where}.stale", ("ignore", "last_known", "saturated"))
    gpu_join = _one_of(msg.gpu_join or d.gpu_join, f"{where}.gpu_join", ("pool", "host", "pod"))
    backend_pods = _backend_pods(msg, where)
    _check_sources(msg, where, gpu_join, backend_pods)
    pick = _one_of(
        msg.endpoint_pick or d.endpoint_pick, f"{where}.endpoint_pick", ("none", "ice", "header")
    )
    kv_hold = _one_of(msg.kv_hold or d.kv_hold, f"{where}.kv_hold", ("done", "seen"))
    return _Choices(
        kind=kind,
        stale=stale,
        gpu_join=gpu_join,
        endpoint_pick=pick,
        kv_hold=kv_hold,
        backend_pods=backend_pods,
        backend_endpoints=_backend_endpoints(msg, where),
    )


def _check_sources(
    msg: policy_pb2.Pool, where: str, gpu_join: str, backend_pods: dict[str, tuple[str, str]]
) -> None:
    """The GPU and backend sources: pod names for ``gpu_join: pod``, URLs, the DNS name."""
    if gpu_join == "pod" and not backend_pods and not msg.HasField("prometheus"):
        raise PolicyError(
            f"{where}.gpu_join: pod needs the backends' pod names: backend_pods for "
            "metrics_urls, or a prometheus source (its series' pod labels); DNS backends are "
            "addresses without pod names"
        )
    if msg.local_gpus not in ("", "nvml"):
        raise PolicyError(f"{where}.local_gpus: must be nvml or empty, got {msg.local_gpus!r}")
    _check_http_urls(msg.gpu_metrics_urls, f"{where}.gpu_metrics_urls")
    if msg.HasField("prometheus"):
        parts = urlsplit(msg.prometheus.url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PolicyError(f"{where}.prometheus.url: not an http(s) URL: {msg.prometheus.url!r}")
    if msg.HasField("dns") and not msg.dns.name:
        raise PolicyError(f"{where}.dns.name: required")


def _backend_endpoints(msg: policy_pb2.Pool, where: str) -> dict[str, str]:
    """``backend_endpoints``: metrics URL → "ip:port", each URL one of metrics_urls."""
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
    return endpoints


def _pool(name: str, msg: policy_pb2.Pool, d: Pool, interval: float, c: _Choices) -> Pool:
    """The ``Pool`` of checked settings ``c`` and the rest of ``msg`` (defaults from ``d``)."""
    dns, prom, has_dns = msg.dns, msg.prometheus, msg.HasField("dns")
    return Pool(
        name=name,
        metrics_urls=tuple(msg.metrics_urls),
        scrape_interval_s=interval,
        scrape_timeout_s=opt(msg, "scrape_timeout_s", d.scrape_timeout_s),
        max_age_s=opt(msg, "max_age_s", d.max_age_s),
        kind=c.kind,
        stale="ignore"
        if c.stale == "ignore"
        else "last_known"
        if c.stale == "last_known"
        else "saturated",
        stale_after_s=opt(msg, "stale_after_s", 1.5 * interval),
        window_s=opt(msg, "window_s", d.window_s),
        dns_name=dns.name,
        dns_port=opt(dns, "port", d.dns_port) if has_dns else d.dns_port,
        dns_path=dns.path or d.dns_path,
        dns_scheme=dns.scheme or d.dns_scheme,
        gpu_metrics_urls=tuple(msg.gpu_metrics_urls),
        prometheus_url=prom.url.rstrip("/"),
        prometheus_matchers=prom.matchers,
        prometheus_group_by=prom.group_by or d.prometheus_group_by,
        gpu_join=c.gpu_join,
        backend_pods=MappingProxyType(c.backend_pods),
        local_gpus=msg.local_gpus,
        endpoint_pick="ice"
        if c.endpoint_pick == "ice"
        else "header"
        if c.endpoint_pick == "header"
        else "none",
        backend_endpoints=MappingProxyType(c.backend_endpoints),
        kv_hold="seen" if c.kv_hold == "seen" else "done",
        pcie_bandwidth_bytes_s=positive(
            msg, "pcie_bandwidth_bytes_s", d.pcie_bandwidth_bytes_s, where=f"pools.{name}"
        ),
        dns_refresh_s=opt(dns, "refresh_s", d.dns_refresh_s) if has_dns else d.dns_refresh_s,
    )
