"""The GPU-shaped pool (docs/gpu-pool.md) in CI: vLLM's own server over the fake executor.

Starts ``vllm serve`` with ``ext_proc.lab.gpupool.executor.FakeGPUExecutor`` at
Llama-3.1-8B's geometry on a modelled H100 with a small KV budget (512 MiB: 256 blocks of 16,
so that a dozen requests over-subscribe it), and checks the plumbing and vLLM's own counters,
not a figure:

- ``vllm:cache_config_info``: ``num_gpu_blocks`` is ICE's arithmetic (``PoolSpec.num_blocks``),
  ``block_size`` 16, prefix caching on (the CPU platform keeps both for a Llama);
- generated tokens are the requests' own limits: ``min_tokens`` 37 with an EOS ``logit_bias``
  gives 38 (finish ``stop``), ``ignore_eos`` with ``max_tokens`` 50 gives 50 (``length``),
  and ``vllm:generation_tokens_total`` rises by exactly their sum;
- 12 concurrent requests of ~600 prompt + 200 output tokens (600 blocks of demand for 255)
  all finish, and vLLM counts preemptions.

Needs ``.venv-vllm`` (``make vllm-install``) and ``ICE_VLLM=1``; about 40 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from ext_proc.lab import vllm_local as vl
from ext_proc.lab.gpupool import PoolSpec, serve_config

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(300),
    pytest.mark.skipif(
        os.environ.get("ICE_VLLM") != "1" or not vl.venv_ready(vl.DEFAULT_VENV),
        reason="needs ICE_VLLM=1 and .venv-vllm (make vllm-install)",
    ),
]

SPEC = PoolSpec(kv_memory_bytes=512 * 2**20, max_model_len=2048)
EOS_ID = 1  # the tiny tokenizer's (served config.json's eos_token_id)


def _post(base: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(
        base + path,
        json.dumps({"model": "tiny", **body}).encode(),
        {"content-type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=120) as resp:
        out: dict[str, Any] = json.loads(resp.read())
    return out


def _metrics(base: str) -> str:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        return resp.read().decode()


def _counter(base: str, name: str) -> float:
    return sum(vl.metric_values(_metrics(base), name))


def test_fake_gpu_pool(tmp_path: Path) -> None:
    cfg = serve_config(SPEC, tmp_path)
    with vl.start_server(cfg, log_path=tmp_path / "vllm.log") as server:
        base = server.base_url
        labels = vl.metric_labels(_metrics(base), "vllm:cache_config_info")
        assert labels["num_gpu_blocks"] == str(SPEC.num_blocks) == "256"
        assert labels["block_size"] == "16"
        assert labels["enable_prefix_caching"] == "True"
        generated0 = _counter(base, "vllm:generation_tokens_total")
        preempted0 = _counter(base, "vllm:num_preemptions_total")

        chat = _post(
            base,
            "/v1/chat/completions",
            {
                "messages": [{"role": "user", "content": vl.filler_text(60, 1)}],
                "max_tokens": 1024,
                "min_tokens": 37,
                "logit_bias": {str(EOS_ID): 100},
            },
        )
        assert chat["usage"]["completion_tokens"] == 38
        assert chat["choices"][0]["finish_reason"] == "stop"
        plain = _post(
            base,
            "/v1/completions",
            {"prompt": vl.filler_text(80, 2), "max_tokens": 50, "ignore_eos": True},
        )
        assert plain["usage"]["completion_tokens"] == 50
        assert plain["choices"][0]["finish_reason"] == "length"

        def long(seed: int) -> dict[str, Any]:
            body = {"prompt": vl.filler_text(600, seed), "max_tokens": 200, "ignore_eos": True}
            return _post(base, "/v1/completions", body)

        with ThreadPoolExecutor(12) as pool:
            outs = list(pool.map(long, range(10, 22)))
        assert [o["usage"]["completion_tokens"] for o in outs] == [200] * 12
        assert _counter(base, "vllm:generation_tokens_total") - generated0 == 38 + 50 + 12 * 200
        assert _counter(base, "vllm:num_preemptions_total") - preempted0 > 0
