"""The production checklist's items the doctor cannot check from outside, as MANUAL checks.

Job: one ``Check`` per checklist item (``/work/shared/PRODUCT.md``'s production checklist,
numbered as there) that needs the host, the cluster or a load test, with how to check it.
Items the doctor does check say where (``backend.kv_metrics`` for item 2, the
``envoy.failure_mode_allow`` and ``envoy.ice_hosts`` checks for part of item 12).

Invariants: pure, fixed text; every status is MANUAL.
"""

from __future__ import annotations

from ext_proc.tools.doctor.checks import Check

__all__ = ["manual_checks"]

ITEMS: tuple[tuple[str, str, str], ...] = (
    (
        "manual.dcgm_vs_nvml",
        "1. DCGM's total GPU memory within 5 % of NVML / nvidia-smi",
        "compare DCGM_FI_DEV_FB_USED+FREE (ice signals DCGM_URL) with nvidia-smi on the node",
    ),
    (
        "manual.ice_resources",
        "3. ICE's memory capped (limit 256 Mi) and its budget (< 120 MB, < 0.3 core) held",
        "kubectl get pod -o jsonpath='{..resources}' (envoy/k8s), kubectl top pod",
    ),
    (
        "manual.kernel",
        "4. kernel ≥ 5.10 where an eBPF collector runs (ICE itself needs no eBPF)",
        "uname -r on nodes that run an eBPF-based exporter",
    ),
    (
        "manual.tokenizer_memory",
        "5. tokenizer caches released: ICE's memory does not creep under load",
        "watch process_resident_memory_bytes of ICE during a soak (tests/e2e/test_soak.py)",
    ),
    (
        "manual.prefix_stability",
        "6. prefix-caching stability computed correctly on 1,000 prompts with dynamic variables",
        "replay a sample of production prompts and compare vLLM's prefix-cache hits",
    ),
    (
        "manual.throttle",
        "7. a forced pressure of 0.9 gives 429s within 5 s, and ICE logs the throttle",
        "on staging: make a backend report kv_cache_usage 0.9+ and watch ice_decisions_total",
    ),
    (
        "manual.gpu_mapping",
        "8. multi-GPU hosts: ICE's GPU metrics are the GPUs the engine uses",
        "check the pool's gpu_join (pod / host) against the engine's CUDA_VISIBLE_DEVICES",
    ),
    (
        "manual.timestamps",
        "9. timestamps monotonic and fine-grained",
        "ICE times everything with time.monotonic(); check the exporters' scrape timestamps",
    ),
    (
        "manual.config_reload",
        "10. a policy change is in force within 30 s without a restart",
        "change the policy ConfigMap and watch ice_policy_info{sha256} change",
    ),
    (
        "manual.scale_out",
        "11. sustained load (100 QPS, 50 connections, 10 min) scales out within 2 min",
        "load-test staging and watch the HPA/KEDA scaler on ice_mem_pressure_score",
    ),
    (
        "manual.bypass_latency",
        "12. with ICE down the gateway serves directly with < 15 % added latency",
        "stop ICE on staging and compare latency (envoy.failure_mode_allow checks the setting)",
    ),
)


def manual_checks() -> list[Check]:
    return [Check("MANUAL", name, detail, fix) for name, detail, fix in ITEMS]
