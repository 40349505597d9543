"""Write the SGLang and DCGM golden pages of this folder (run from the repository root).

    .venv/bin/python tests/data/signals/make_pages.py

No SGLang server or GPU runs here, so the pages are built from the sources' own definitions:
- ``sglang_metrics.txt``: written by prometheus_client (as SGLang's server does), with the
  metric names, types, label names and default buckets of SGLang's
  ``python/sglang/srt/metrics/collector.py`` (SchedulerMetricsCollector,
  TokenizerMetricsCollector): two data-parallel ranks, plus families ICE ignores.
- ``dcgm_metrics.txt``: the dcgm-exporter text format (``# HELP``/``# TYPE`` per field, label
  order gpu, UUID, pci_bus_id, device, modelName, Hostname, DCGM_FI_DRIVER_VERSION, then the
  Kubernetes container/namespace/pod when mapped) with the fields of its
  ``etc/default-counters.csv`` plus DCGM_FI_DEV_FB_RESERVED and the DCP PCIe/activity fields:
  two H100s, one serving a vLLM pod.
- ``vllm_valve_metrics.txt`` and ``vllm_asleep_metrics.txt``: the recorded vLLM 0.32 CPU pages
  (``../vllm_cpu/``) with only the values of the series vLLM 0.32 writes for its own valve
  and sleep mode changed (names, labels and order as recorded; ``vllm/v1/metrics/loggers.py``
  ``record_admission_rejection`` / ``record_sleep_state``): the valve page is
  ``metrics_preempting.txt`` after the API server answered 7 requests 503 for
  ``--max-num-queued-reqs`` and 2 for ``--max-num-queued-tokens``; the asleep page is
  ``metrics_idle.txt`` after ``POST /sleep?level=1`` (awake 0, weights_offloaded 1).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

HERE = Path(__file__).parent
MODEL = "Qwen/Qwen2.5-7B-Instruct"
SCHED = ["model_name", "engine_type", "tp_rank", "pp_rank", "dp_rank"]
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
QUEUE_BUCKETS = [0.0, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 10, 15, 20, 30, 40, 50, 60, 70, 80, 90]
QUEUE_BUCKETS += [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000, 1200, 1400, 1600, 1800]
QUEUE_BUCKETS += [2000, 2500, 3000]
ITL_BUCKETS = [0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040]
ITL_BUCKETS += [0.060, 0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.0, 2.0, 4.0, 6.0, 8.0]
E2E_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
E2E_BUCKETS += [600, 1200, 1800, 2400]


def sglang_page() -> bytes:
    r = CollectorRegistry()
    gauges: dict[str, tuple[str, list[float]]] = {
        "sglang:num_running_reqs": ("The number of running requests.", [37, 41]),
        "sglang:num_used_tokens": ("The number of used tokens.", [98_304, 131_072]),
        "sglang:token_usage": ("The token usage.", [0.6, 0.8]),
        "sglang:gen_throughput": ("The generation throughput (token/s).", [1830.5, 1790.25]),
        "sglang:num_queue_reqs": ("The number of requests in the waiting queue.", [4, 9]),
        "sglang:num_grammar_queue_reqs": (
            "The number of requests in the grammar waiting queue.",
            [0, 0],
        ),
        "sglang:cache_hit_rate": ("The prefix cache hit rate.", [0.25, 0.35]),
        "sglang:max_total_num_tokens": (
            "Maximum total number of tokens in the KV cache pool.",
            [163_840, 163_840],
        ),
        "sglang:num_retracted_reqs": ("The number of retracted requests.", [0, 1]),
    }
    for name, (doc, values) in gauges.items():
        g = Gauge(name, doc, SCHED, registry=r)
        for dp, v in enumerate(values):
            g.labels(MODEL, "unified", "0", "0", str(dp)).set(v)
    retracted = Counter(
        "sglang:num_retracted_requests_total",
        "Total number of retracted requests.",
        SCHED,
        registry=r,
    )
    retracted.labels(MODEL, "unified", "0", "0", "0").inc(3)
    retracted.labels(MODEL, "unified", "0", "0", "1").inc(4)
    queue = Histogram(
        "sglang:queue_time_seconds",
        "Histogram of queueing time in seconds.",
        SCHED,
        registry=r,
        buckets=QUEUE_BUCKETS,
    )
    per_rank = [
        [0.05] * 50 + [0.3] * 30 + [1.5] * 20,
        [0.05] * 40 + [0.3] * 30 + [2.5] * 25 + [12.0] * 5,
    ]
    for dp, observations in enumerate(per_rank):
        for v in observations:
            queue.labels(MODEL, "unified", "0", "0", str(dp)).observe(v)
    counters = {
        "sglang:prompt_tokens_total": ("Number of prefill tokens processed.", 1_250_000),
        "sglang:generation_tokens_total": ("Number of generation tokens processed.", 480_000),
        "sglang:cached_tokens_total": ("Number of cached prompt tokens.", 375_000),
        "sglang:num_requests_total": ("Number of requests processed.", 2_000),
        "sglang:num_so_requests_total": ("Number of structured output requests processed.", 0),
        "sglang:num_aborted_requests_total": ("Number of requests aborted.", 12),
    }
    for name, (doc, total) in counters.items():
        Counter(name, doc, ["model_name"], registry=r).labels(MODEL).inc(total)
    histograms = {
        "sglang:time_to_first_token_seconds": (
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
            [0.15] * 400 + [0.3] * 600 + [0.7] * 500 + [1.5] * 300 + [3.0] * 150 + [7.0] * 40
            + [15.0] * 10,
        ),
        "sglang:inter_token_latency_seconds": (
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
            [0.012] * 1000 + [0.03] * 200,
        ),
        "sglang:e2e_request_latency_seconds": (
            "Histogram of End-to-end request latency in seconds",
            E2E_BUCKETS,
            [3.0] * 1500 + [9.0] * 500,
        ),
    }  # fmt: skip
    for name, (doc, buckets, observations) in histograms.items():
        h = Histogram(name, doc, ["model_name"], registry=r, buckets=buckets)
        for v in observations:
            h.labels(MODEL).observe(v)
    return generate_latest(r)


GPUS: list[dict[str, Any]] = [
    {
        "gpu": "0",
        "UUID": "GPU-6f1b2c3d-0a1b-4c2d-8e3f-112233445566",
        "pci_bus_id": "00000000:18:00.0",
        "device": "nvidia0",
        "pod": ("inference", "vllm-llama-0"),
        "FB_FREE": 4120,
        "FB_USED": 76325,
        "GPU_UTIL": 93,
        "PCIE_TX": 812345678,
        "PCIE_RX": 95123456,
    },
    {
        "gpu": "1",
        "UUID": "GPU-7a8b9c0d-1e2f-4a3b-9c4d-aabbccddeeff",
        "pci_bus_id": "00000000:2a:00.0",
        "device": "nvidia1",
        "pod": None,
        "FB_FREE": 80441,
        "FB_USED": 4,
        "GPU_UTIL": 0,
        "PCIE_TX": 0,
        "PCIE_RX": 1024,
    },
]
# (field, type, help, value: a per-GPU key or a constant)
DCGM_FIELDS: list[tuple[str, str, str, object]] = [
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", "SM clock frequency (in MHz).", 1980),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", "Memory clock frequency (in MHz).", 2619),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", "Memory temperature (in C).", 41),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", "GPU temperature (in C).", 48),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", "Power draw (in W).", "512.337000"),
    (
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        958741236984,
    ),
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", "Total number of PCIe retries.", 0),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", "GPU utilization (in %).", "GPU_UTIL"),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", "Memory utilization (in %).", 37),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", "Encoder utilization (in %).", 0),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", "Decoder utilization (in %).", 0),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", "Value of the last XID error encountered.", 0),
    ("DCGM_FI_DEV_FB_FREE", "gauge", "Framebuffer memory free (in MiB).", "FB_FREE"),
    ("DCGM_FI_DEV_FB_USED", "gauge", "Framebuffer memory used (in MiB).", "FB_USED"),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", "Framebuffer memory reserved (in MiB).", 570),
    (
        "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
        "counter",
        "Total number of NVLink bandwidth counters for all lanes",
        0,
    ),
    (
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        "0.912345",
    ),
    (
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        "0.412001",
    ),
    (
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        "0.701234",
    ),
    (
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
        "PCIE_TX",
    ),
    (
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
        "PCIE_RX",
    ),
]


def dcgm_page() -> str:
    out = []
    for name, typ, doc, value in DCGM_FIELDS:
        out += [f"# HELP {name} {doc}", f"# TYPE {name} {typ}"]
        for g in GPUS:
            labels = (
                f'gpu="{g["gpu"]}",UUID="{g["UUID"]}",pci_bus_id="{g["pci_bus_id"]}",'
                f'device="{g["device"]}",modelName="NVIDIA H100 80GB HBM3",Hostname="gpu-node-07",'
                'DCGM_FI_DRIVER_VERSION="550.127.05"'
            )
            pod = g["pod"]
            if isinstance(pod, tuple):
                labels += f',container="vllm",namespace="{pod[0]}",pod="{pod[1]}"'
            v = g[value] if isinstance(value, str) and value in g else value
            out.append(f"{name}{{{labels}}} {v}")
    return "\n".join(out) + "\n"


VLLM_CPU = HERE.parent / "vllm_cpu"


def _edited(page: str, values: dict[str, str]) -> str:
    """A recorded vLLM page with the samples named in ``values`` (the line up to its value)
    set to new values; every such line must be on the page."""
    lines = (VLLM_CPU / page).read_text().split("\n")
    for head, value in values.items():
        hits = [i for i, line in enumerate(lines) if line.startswith(head + " ")]
        assert len(hits) == 1, head
        lines[hits[0]] = f"{head} {value}"
    return "\n".join(lines)


def vllm_valve_page() -> str:
    rejections = 'vllm:admission_rejections_total{model_name="tiny",reason="%s"}'
    return _edited(
        "metrics_preempting.txt",
        {rejections % "max_num_queued_reqs": "7.0", rejections % "max_num_queued_tokens": "2.0"},
    )


def vllm_asleep_page() -> str:
    state = 'vllm:engine_sleep_state{engine="0",model_name="tiny",sleep_state="%s"}'
    return _edited(
        "metrics_idle.txt",
        {state % "awake": "0.0", state % "weights_offloaded": "1.0", state % "discard_all": "0.0"},
    )


if __name__ == "__main__":
    (HERE / "sglang_metrics.txt").write_bytes(sglang_page())
    (HERE / "dcgm_metrics.txt").write_text(dcgm_page())
    (HERE / "vllm_valve_metrics.txt").write_text(vllm_valve_page())
    (HERE / "vllm_asleep_metrics.txt").write_text(vllm_asleep_page())
