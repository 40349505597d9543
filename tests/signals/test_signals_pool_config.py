"""The pool's GPU options in a policy file: gpu_join: pod with backend_pods, local_gpus."""

from __future__ import annotations

import pytest

from ext_proc.policy.load import PolicyError, parse_policy

A, B = "http://10.0.0.1:8000/metrics", "http://10.0.0.2:8000/metrics"


def test_backend_pods_name_each_static_backend_with_or_without_a_namespace() -> None:
    policy = parse_policy(
        f"pools: {{p: {{metrics_urls: ['{A}', '{B}'], gpu_join: pod, "
        f"gpu_metrics_urls: ['http://dcgm:9400/metrics'], "
        f"backend_pods: {{'{A}': llm/vllm-0, '{B}': vllm-1}}}}}}"
    )
    pool = policy.pools["p"]
    assert pool.gpu_join == "pod"
    assert dict(pool.backend_pods) == {A: ("llm", "vllm-0"), B: ("", "vllm-1")}


def test_local_gpus_and_the_defaults() -> None:
    pool = parse_policy(f"pools: {{p: {{metrics_urls: ['{A}'], local_gpus: nvml}}}}").pools["p"]
    assert (pool.local_gpus, pool.gpu_join, dict(pool.backend_pods)) == ("nvml", "pool", {})
    default = parse_policy("").pools["default"]
    assert (default.local_gpus, default.gpu_join) == ("", "pool")


def test_a_prometheus_pool_may_join_by_pod_without_backend_pods() -> None:
    text = "pools: {p: {gpu_join: pod, prometheus: {url: 'http://prom:9090', group_by: pod}}}"
    assert parse_policy(text).pools["p"].gpu_join == "pod"


@pytest.mark.parametrize(
    ("pool", "fragment"),
    [
        ("{gpu_join: rack}", "pools.p.gpu_join: must be pool, host or pod, got 'rack'"),
        (f"{{metrics_urls: ['{A}'], gpu_join: pod}}", "pools.p.gpu_join: pod needs"),
        ("{dns: {name: vllm.llm.svc}, gpu_join: pod}", "DNS backends are addresses"),
        (f"{{metrics_urls: ['{A}'], backend_pods: {{'{B}': x}}}}", "is not one of metrics_urls"),
        (f"{{metrics_urls: ['{A}'], backend_pods: {{'{A}': a/b/c}}}}", "'namespace/pod' or 'pod'"),
        (f"{{metrics_urls: ['{A}'], backend_pods: {{'{A}': Vllm_0}}}}", "got 'Vllm_0'"),
        (f"{{metrics_urls: ['{A}'], backend_pods: {{'{A}': 'llm/'}}}}", "got 'llm/'"),
        ("{local_gpus: dcgm}", "pools.p.local_gpus: must be nvml or empty, got 'dcgm'"),
    ],
    ids=[
        "unknown-join",
        "pod-without-names",
        "pod-with-dns",
        "pod-of-an-unknown-url",
        "two-slashes",
        "not-a-kubernetes-name",
        "empty-pod",
        "unknown-local-gpus",
    ],
)
def test_bad_gpu_options_name_the_field(pool: str, fragment: str) -> None:
    with pytest.raises(PolicyError) as info:
        parse_policy(f"pools: {{p: {pool}}}", source="p.yaml")
    assert fragment in str(info.value)
