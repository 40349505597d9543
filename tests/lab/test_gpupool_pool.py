"""``ext_proc.lab.gpupool.pool``: KV blocks from ICE's arithmetic, the served folder, the argv."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from ext_proc.kv.cli import main as ice_plan
from ext_proc.lab import vllm_local as vl
from ext_proc.lab.gpupool import (
    CONFIG_DIR,
    CPU_TINY,
    EXECUTOR,
    SPEC_ENV,
    PoolSpec,
    cpu_tiny,
    load_config,
    serve_config,
    write_served_model,
)

KV_DATA = Path(__file__).parents[1] / "data" / "kv" / "llama-3.1-8b.json"


def test_stored_config_matches_the_kv_test_data() -> None:
    ours, theirs = load_config("llama-3.1-8b"), json.loads(KV_DATA.read_text())
    assert {k: ours[k] for k in theirs} == theirs


def test_unknown_model() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        load_config("gpt-5")


@pytest.mark.parametrize(
    ("model", "tp", "blocks"),
    [
        # floor(81,559 MiB × 0.9) = 76,968,728,985 B − 16,060,522,496 (8.03e9 × 2) − 4 GiB
        # = 56,613,239,193 B; // 2 MiB a block (16 × 131,072) = 26,995 (431,920 tokens).
        ("llama-3.1-8b", 1, 26_995),
        # − 70,553,706,496 × 2 / 4 − 4 GiB = 37,396,908,441 B // (16 × 81,920) = 28,531.
        ("llama-3.1-70b", 4, 28_531),
    ],
)
def test_blocks_hand_computed(model: str, tp: int, blocks: int) -> None:
    assert PoolSpec(model=model, tp=tp).num_blocks == blocks


def test_ice_plan_agrees(capsys: pytest.CaptureFixture[str]) -> None:
    spec = PoolSpec()
    non_kv = spec.cost.params * 2 + spec.activation_bytes
    argv = ["--config", str(CONFIG_DIR / "llama-3.1-8b.json"), "--block-size", "16"]
    argv += ["--gpu-memory", str(spec.gpu.memory_bytes), "--gpu-memory-utilization", "0.9"]
    argv += ["--non-kv-memory", str(non_kv), "--max-model-len", "32768", "--json"]
    assert ice_plan(argv) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    assert out["num_blocks"] == spec.num_blocks


def test_kv_memory_given() -> None:
    assert PoolSpec(kv_memory_bytes=512 * 2**20, max_model_len=2048).num_blocks == 256


def test_serve_config(tmp_path: Path) -> None:
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "config.json").write_text(
        json.dumps({"vocab_size": 4096, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 3})
    )
    (tiny / "tokenizer.json").write_text("{}")
    (tiny / vl.MODEL_STAMP).write_text("{}")
    spec = PoolSpec(kv_memory_bytes=512 * 2**20, max_model_len=2048, dilation=4.0)
    served = write_served_model(spec, tmp_path / "w" / "model", tiny_dir=tiny)
    config = json.loads((served / "config.json").read_text())
    assert config["num_hidden_layers"] == 32 and config["eos_token_id"] == 1
    assert config["vocab_size"] == 4096 and (served / "tokenizer.json").exists()
    assert not list(served.glob("*.safetensors"))
    cfg = serve_config(spec, tmp_path / "w", tiny_dir=tiny)
    argv, env = vl.serve_command(cfg)
    joined = " ".join(argv)
    assert "--block-size 16" in joined and "--num-gpu-blocks-override 256" in joined
    assert f"--distributed-executor-backend {EXECUTOR}" in joined
    assert "--kv-cache-memory-bytes" not in joined
    executor_spec = json.loads(Path(env[SPEC_ENV]).read_text())
    assert executor_spec["num_blocks"] == 256 and executor_spec["dilation"] == 4.0
    assert env["PYTHONPATH"] == str(vl.REPO_ROOT)


def test_serve_config_refuses_a_context_that_does_not_fit(tmp_path: Path) -> None:
    # 512 blocks of 16: 511 usable → 8,176 tokens at most (vLLM's own message says so too).
    with pytest.raises(ValueError, match="at most 8176"):
        serve_config(PoolSpec(kv_memory_bytes=2**30, max_model_len=8192), tmp_path)


def test_cpu_tiny_pool_matches_the_real_cpu_pool() -> None:
    spec = cpu_tiny()
    real = vl.ServeConfig()
    assert (spec.num_blocks, spec.block_size) == (real.num_gpu_blocks, real.block_size) == (24, 128)
    assert spec.max_model_len == real.max_model_len == 2048
    # the tiny model's own config: 2 × 2 layers × 2 KV heads × 64 × 2 B = 1,024 B a token
    assert spec.cost.kv_bytes_per_token == vl.ModelGeometry().kv_bytes_per_token == 1024
    assert spec.executor_spec()["step"] == dataclasses.asdict(CPU_TINY)
    assert PoolSpec().executor_spec()["step"] is None


def test_cpu_tiny_argv(tmp_path: Path) -> None:
    argv, _ = vl.serve_command(serve_config(cpu_tiny(), tmp_path))
    joined = " ".join(argv)
    assert "--block-size 128" in joined and "--num-gpu-blocks-override 24" in joined
    # vLLM 0.32's CPU defaults for `vllm serve` (engine/arg_utils.py), what the real pool runs
    assert "--max-num-batched-tokens 2048" in joined and "--max-num-seqs 128" in joined
