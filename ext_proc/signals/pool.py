"""A pool's signal settings: which backends ICE reads, how, and how fresh their view must be.

Plain frozen data, validated by ``ext_proc.policy.load`` (``pools:`` in the policy file);
the collector (``ext_proc.signals.collector``) and the placement layer read it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Literal

__all__ = ["EndpointPick", "KvHold", "Pool", "StalePolicy"]

StalePolicy = Literal["ignore", "last_known", "saturated"]
EndpointPick = Literal["none", "ice", "header"]
KvHold = Literal["done", "seen"]


@dataclass(frozen=True, slots=True)
class Pool:
    """A set of backends whose ``/metrics`` ICE scrapes, and how fresh their view must be."""

    name: str
    metrics_urls: tuple[str, ...]
    scrape_interval_s: float = 0.2
    scrape_timeout_s: float = 1.0
    max_age_s: float = 5.0  # `last_known` keeps a stale source's values this long
    kind: str = "vllm"  # vllm | sglang
    stale: StalePolicy = "last_known"
    stale_after_s: float = 0.3  # default: 1.5 scrape intervals
    window_s: float = 10.0  # window of derived rates and quantiles
    dns_name: str = ""  # headless Service: one backend per address
    dns_port: int = 8000
    dns_path: str = "/metrics"
    dns_scheme: str = "http"
    dns_refresh_s: float = 5.0
    gpu_metrics_urls: tuple[str, ...] = ()  # DCGM exporters
    # pool: every GPU they report | host: GPUs on the backends' hosts | pod: GPUs of the
    # backends' pods (GPU pod label = backend pod; namespace too when the backend's is known)
    gpu_join: str = "pool"
    pcie_bandwidth_bytes_s: float = 32e9  # per direction; PCIe Gen4 x16 ≈ 32 GB/s
    prometheus_url: str = ""  # read the backends from a Prometheus server instead of scraping
    prometheus_matchers: str = ""  # e.g. 'namespace="llm",job="vllm"'
    prometheus_group_by: str = "instance"  # the label that tells backends apart
    # static backend's metrics URL → (namespace, pod); namespace "" when not given
    backend_pods: MappingProxyType[str, tuple[str, str]] = field(
        default_factory=lambda: MappingProxyType({})
    )
    local_gpus: str = ""  # "nvml": this host's GPUs through NVML (ICE as a sidecar)
    endpoint_pick: EndpointPick = "none"
    # static backend's metrics URL → serving address "ip:port" (default: the URL's host:port)
    backend_endpoints: MappingProxyType[str, str] = field(
        default_factory=lambda: MappingProxyType({})
    )
    # how long a passed request's KV blocks count in ICE's ledger: done (until its stream
    # ends: its whole need is reserved) | seen (until a view taken after it arrived)
    kv_hold: KvHold = "done"
