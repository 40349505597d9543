"""``pool``: a GPU-shaped vLLM pool on this CPU: which model, which GPU, how many KV blocks.

A ``PoolSpec`` names a real model (its ``config.json`` is stored in ``configs/`` as data), a
tensor-parallel size, a GPU (``timing.GpuSpec``) and vLLM's serving options. Its KV block count
is ICE's own arithmetic (``ext_proc.kv``, what ``ice plan`` prints), per rank:

    available = floor(gpu.memory_bytes × gpu_memory_utilization)
                − weights / tp − activation_bytes          (or ``kv_memory_bytes`` as given)
    num_blocks = available // (block_size × kv_bytes_per_token)

or, with ``num_blocks_override``, exactly that many blocks (the CPU tiny model's 24: ``cpu_tiny``),
with weights = params × dtype bytes (``timing.ModelCost``) and ``activation_bytes`` = 4 GiB for
the activation peak, CUDA graphs and non-torch memory (an assumption: vLLM's start-up logs on
an H100 show a few GiB for them). The block count goes to ``--num-gpu-blocks-override`` and to
the fake executor, which reports the same per-layer spec, so vLLM's own ``cache_config_info``
shows it.

What ``vllm serve`` loads (``write_served_model``): the real ``config.json`` (layers, heads,
context length, rope) with the tiny offline model's tokenizer and its vocabulary size, BOS,
EOS and pad ids, and no weights: the fake executor never loads any. Prompts are therefore
tokenized by the tiny tokenizer (≈ 1 token per filler word, as in the CPU benches), while
the KV spec, the block count and the step times are the real model's.

``cpu_tiny`` is the pool of the faithfulness check (docs/gpu-pool.md): the CPU tiny model's
geometry (``configs/cpu-tiny.json``), 24 blocks of 128, ``max_model_len`` 2,048, vLLM's CPU
defaults of 2,048 batched tokens and 128 sequences, and the step time fitted to the real CPU
vLLM (``timing.CPU_TINY``) instead of the GPU roofline; ``burn``: the executor computes each
step's time on one core instead of sleeping it, as the real CPU forward pass loads the machine.

``executor_spec`` is the JSON the executor reads from ``ICE_GPUPOOL_SPEC``; ``serve_config``
the ``vllm_local.ServeConfig`` that starts it. Invariant: importing needs ICE's venv or the
vLLM venv (stdlib, ``ext_proc.kv``, ``ext_proc.lab.vllm_local``); every number is derived from
the spec, nothing from the machine.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ext_proc.kv import (
    CapacityPlan,
    available_kv_bytes,
    build_geometry,
    plan_capacity,
    shape_from_config,
)
from ext_proc.lab import vllm_local as vl
from ext_proc.lab.gpupool.timing import CPU_TINY, H100_SXM, FittedStep, GpuSpec, ModelCost

__all__ = [
    "ACTIVATION_BYTES",
    "CONFIG_DIR",
    "EXECUTOR",
    "MODELS",
    "SPEC_ENV",
    "PoolSpec",
    "cpu_tiny",
    "load_config",
    "serve_config",
    "write_served_model",
]

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
MODELS = {
    "llama-3.1-8b": 1,
    "llama-3.1-70b": 4,
    "cpu-tiny": 1,
}  # name → default tensor-parallel size
ACTIVATION_BYTES = 4 * 2**30
SPEC_ENV = "ICE_GPUPOOL_SPEC"
EXECUTOR = "ext_proc.lab.gpupool.executor.FakeGPUExecutor"
_TOKENIZER_FIELDS = ("vocab_size", "bos_token_id", "eos_token_id", "pad_token_id")


def load_config(model: str) -> dict[str, Any]:
    """The stored ``config.json`` of ``model`` (a ``MODELS`` key), less its ``_source`` note."""
    if model not in MODELS:
        raise ValueError(f"unknown model {model!r}; known: {', '.join(MODELS)}")
    data: dict[str, Any] = json.loads((CONFIG_DIR / f"{model}.json").read_text())
    data.pop("_source", None)
    return data


@dataclass(frozen=True)
class PoolSpec:
    """One GPU-shaped pool (module docstring); ``dilation`` = k: each modelled step sleeps k×."""

    model: str = "llama-3.1-8b"
    tp: int = 1
    gpu: GpuSpec = H100_SXM
    gpu_memory_utilization: str = "0.9"
    activation_bytes: int = ACTIVATION_BYTES
    kv_memory_bytes: int | None = None
    block_size: int = 16
    max_model_len: int = 32_768
    max_num_batched_tokens: int = 8192  # vLLM 0.32's `vllm serve` default on an H100
    max_num_seqs: int = 1024  # the same
    dilation: float = 1.0
    extra_args: tuple[str, ...] = field(default=())
    num_blocks_override: int | None = None  # this many blocks, not the memory arithmetic
    step: FittedStep | None = None  # a fitted step time instead of ``gpu``'s roofline
    burn: bool = False  # compute the step time on one core instead of sleeping it (executor)

    @property
    def config(self) -> dict[str, Any]:
        return load_config(self.model)

    @property
    def cost(self) -> ModelCost:
        return ModelCost.from_config(self.config, tp=self.tp)

    def available_bytes(self) -> int:
        """KV bytes per rank (module docstring)."""
        if self.num_blocks_override is not None:
            block_bytes = self.block_size * self.cost.kv_bytes_per_token
            return available_kv_bytes(kv_memory=self.num_blocks_override * block_bytes)
        if self.kv_memory_bytes is not None:
            return available_kv_bytes(kv_memory=self.kv_memory_bytes)
        cost = self.cost
        return available_kv_bytes(
            gpu_memory=self.gpu.memory_bytes,
            gpu_memory_utilization=self.gpu_memory_utilization,
            non_kv_memory=int(cost.params * cost.weight_bytes_per_param // self.tp)
            + self.activation_bytes,
        )

    def plan(self) -> CapacityPlan:
        """``ext_proc.kv``'s plan for this pool: what ``ice plan`` prints for it."""
        geometry = build_geometry(
            shape_from_config(self.config),
            tp=self.tp,
            block_size=self.block_size,
            max_num_batched_tokens=self.max_num_batched_tokens,
        )
        return plan_capacity(
            geometry, max_model_len=self.max_model_len, available_bytes=self.available_bytes()
        )

    @property
    def num_blocks(self) -> int:
        return self.plan().num_blocks

    def executor_spec(self) -> dict[str, Any]:
        """What ``executor.FakeGPUExecutor`` reads (``SPEC_ENV`` names the file)."""
        return {
            "model": self.model,
            "config": self.config,
            "tp": self.tp,
            "gpu": dataclasses.asdict(self.gpu),
            "num_blocks": self.num_blocks,
            "block_size": self.block_size,
            "dilation": self.dilation,
            "step": None if self.step is None else dataclasses.asdict(self.step),
            "burn": self.burn,
        }


def cpu_tiny(dilation: float = 1.0, *, burn: bool = False) -> PoolSpec:
    """The fake pool at the CPU tiny model's geometry and fitted step time (module docstring)."""
    return PoolSpec(
        model="cpu-tiny",
        block_size=128,
        num_blocks_override=24,
        max_model_len=2048,
        max_num_batched_tokens=2048,
        max_num_seqs=128,
        dilation=dilation,
        step=CPU_TINY,
        burn=burn,
    )


def write_served_model(
    spec: PoolSpec, out_dir: Path, tiny_dir: Path = vl.DEFAULT_MODEL_DIR
) -> Path:
    """A model folder for ``vllm serve``: the real config with the tiny tokenizer, no weights."""
    vl.ensure_model(tiny_dir)
    tiny = json.loads((tiny_dir / "config.json").read_text())
    config = spec.config
    for key in _TOKENIZER_FIELDS:
        config[key] = tiny[key]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    for name in (
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
    ):
        if (tiny_dir / name).exists():
            shutil.copyfile(tiny_dir / name, out_dir / name)
    (out_dir / "ice-model.json").write_text(json.dumps({"gpupool": spec.model}) + "\n")
    return out_dir


def serve_config(
    spec: PoolSpec,
    workdir: Path,
    *,
    port: int | None = None,
    tiny_dir: Path = vl.DEFAULT_MODEL_DIR,
) -> vl.ServeConfig:
    """The ``vllm serve`` of ``spec``: served model and executor spec written under ``workdir``;
    ValueError when one ``max_model_len`` request does not fit the blocks (vLLM would refuse to
    start, after half a minute)."""
    plan = spec.plan()
    if plan.fits_max_model_len is False:
        raise ValueError(
            f"max_model_len {spec.max_model_len} does not fit {plan.num_blocks} blocks of "
            f"{spec.block_size} (one is vLLM's null block): at most {plan.estimated_max_model_len}"
        )
    workdir = workdir.resolve()  # vLLM, ICE and the policy file read these paths from elsewhere
    model_dir = write_served_model(spec, workdir / "model", tiny_dir)
    spec_path = workdir / "executor.json"
    spec_path.write_text(json.dumps(spec.executor_spec(), indent=2) + "\n")
    return vl.ServeConfig(
        model_dir=model_dir,
        port=port or vl.free_port(),
        max_model_len=spec.max_model_len,
        num_gpu_blocks=spec.num_blocks,
        block_size=spec.block_size,
        kv_cache_memory_bytes=None,
        extra_args=(
            "--distributed-executor-backend",
            EXECUTOR,
            "--max-num-batched-tokens",
            str(spec.max_num_batched_tokens),
            "--max-num-seqs",
            str(spec.max_num_seqs),
            *spec.extra_args,
        ),
        env=((SPEC_ENV, str(spec_path)), ("PYTHONPATH", str(vl.REPO_ROOT))),
    )
