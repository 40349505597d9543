"""``timing``: how long one vLLM engine step would take on a GPU, from what the scheduler scheduled.

A roofline per tensor-parallel rank, plus a fixed step overhead and (TP > 1) the all-reduces:

    t_step = overhead_s + max(t_mem, t_compute) + t_comm
    t_mem     = (weight_bytes + kv_bytes) / (hbm_bytes_per_s × mem_efficiency)
    t_compute = flops / (peak_flops × compute_efficiency)
    t_comm    = 2 × layers × T × hidden × act_bytes × 2 (tp − 1) / tp
                / (link_bytes_per_s × mem_efficiency)          (0 when tp = 1)

Inputs of one step: the scheduled chunks, each ``Chunk(new_tokens, context_tokens)`` (a decode is
a chunk of 1 token on top of its context; a prefill chunk under ``max_num_batched_tokens`` is n
prompt tokens on top of the ones already computed), and ``sampled`` (the sequences that produce
a token this step: decodes and the chunks that finish a prefill). T = Σ new_tokens.

Per rank (``ModelCost``, from a Hugging Face ``config.json``; d = hidden, h = heads, g = KV heads,
e = head_dim, f = intermediate, V = vocab, L = layers):

- layer_params = L × (d·h·e + 2·d·g·e + h·e·d + 3·d·f + 2·d); lm_head = V·d; embed = V·d
  (Llama-3.1-8B: 6,979,584,000 + 525,336,576 + 525,336,576 + 4,096 final norm = 8,030,261,248;
  a model with tied embeddings has one V·d matrix, read as the head).
- weight_bytes = (layer_params + lm_head) / tp × weight_bytes_per_param: every step reads
  every layer's weights once (the embedding is a gather of T rows: not counted).
- kv_bytes = kv_bytes_per_token × Σ (context_tokens + new_tokens): attention reads each
  sequence's cached K and V and writes the new ones; kv_bytes_per_token =
  2 × L × (g / tp) × e × kv_dtype_bytes (``ext_proc.kv``'s formula, per rank).
- flops = 2 × layer_params / tp × T + 2 × lm_head / tp × sampled
  + 4 × L × (h / tp) × e × Σ (n × c + n (n + 1) / 2)    (QKᵀ and PV, causal, per chunk n on c)

Every constant is in ``GpuSpec`` and ``H100_SXM`` with its source; docs/gpu-pool.md has the
calibration and its error.

``FittedStep`` is the other kind of step time: a straight line fitted to measured steps of a
real engine (``CPU_TINY``: vLLM's CPU build with the tiny model, for the faithfulness check),

    t_step = host_s + base_s + token_s × T + seq_s × S + kv_token_s × Σ (context + new tokens)

with S = the scheduled sequences (chunks). The last four terms stand for the forward pass and
the sampling (vLLM's ``iteration elapsed time``), not the scheduler's own host time, which the
fake pool pays for real; ``host_s`` for the host time per step that the real engine pays and
the fake one does not (the round trip to vLLM's worker process: the fake runs in-process).

``Pacer`` turns modelled seconds into the wall time each step is due at under dilation k (its
docstring). Invariant: pure (stdlib only, no I/O, no clock); the same inputs give the same
seconds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CPU_TINY",
    "H100_SXM",
    "Chunk",
    "FittedStep",
    "GpuSpec",
    "ModelCost",
    "Pacer",
    "StepTime",
    "fitted_step_time",
    "step_time",
]

_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4, "fp8": 1}


@dataclass(frozen=True, slots=True)
class GpuSpec:
    """One accelerator's roofline constants (bytes/s, FLOP/s, seconds; efficiencies in (0, 1])."""

    name: str
    hbm_bytes_per_s: float
    peak_flops: float
    link_bytes_per_s: float
    memory_bytes: int
    mem_efficiency: float
    compute_efficiency: float
    overhead_s: float


# NVIDIA H100 SXM5 80 GB. Datasheet (nvidia.com/en-us/data-center/h100, "H100 SXM"): HBM3
# 3.35 TB/s; BF16 Tensor Core 1,979 TFLOPS *with sparsity*, i.e. 989.5 TFLOPS dense; NVLink
# 900 GB/s bidirectional, 450 GB/s each way. memory_bytes: 81,559 MiB, the total nvidia-smi
# and torch.cuda report for an H100 SXM5 80 GB (what vLLM's --gpu-memory-utilization scales).
# mem_efficiency 0.78 with overhead_s 1 ms: fitted to a published vLLM figure for Llama-3.1-8B
# (bf16, one request, 1,024 in / 128 out, vLLM 0.23): ~75 tok/s (13.3 ms a token) on an A100
# 40 GB (1.555 TB/s), "about 77 % of the memory-bandwidth ceiling" (johnmusgrave.com, "vLLM
# throughput-latency sweep on NVIDIA A100"): 15.01 GB of layer and head weights /
# (1.555 TB/s × 0.78) + 1 ms = 13.4 ms. Carried to the H100 on the assumption that vLLM reaches
# the same fraction of HBM bandwidth there; the model then gives 6.8 ms (147 tok/s) for one
# Llama-3.1-8B sequence at 1k context. compute_efficiency 0.6: assumed (BF16 GEMM utilisation in
# large prefills), not calibrated: no GPU was lent to this work.
H100_SXM = GpuSpec(
    name="h100-sxm",
    hbm_bytes_per_s=3.35e12,
    peak_flops=989.5e12,
    link_bytes_per_s=450e9,
    memory_bytes=81_559 * 2**20,
    mem_efficiency=0.78,
    compute_efficiency=0.6,
    overhead_s=1e-3,
)


@dataclass(frozen=True, slots=True)
class Chunk:
    """Tokens computed for one sequence in one step, on top of ``context_tokens`` already cached."""

    new_tokens: int
    context_tokens: int


@dataclass(frozen=True, slots=True)
class ModelCost:
    """What a step costs per rank for one model at one tensor-parallel size (module docstring)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    layer_params: int
    lm_head_params: int
    embed_params: int
    tied: bool
    tp: int
    weight_bytes_per_param: int
    kv_dtype_bytes: int

    @property
    def params(self) -> int:
        """The whole model's parameter count (embedding, layers, final norm, untied head)."""
        head = 0 if self.tied else self.lm_head_params
        return self.embed_params + self.layer_params + self.hidden + head

    @property
    def weight_bytes(self) -> float:
        """Weight bytes one rank reads per step (layers and head; the embedding is a gather)."""
        return (self.layer_params + self.lm_head_params) / self.tp * self.weight_bytes_per_param

    @property
    def kv_bytes_per_token(self) -> int:
        """2 × layers × KV heads per rank × head_dim × KV dtype bytes."""
        return 2 * self.layers * (self.kv_heads // self.tp) * self.head_dim * self.kv_dtype_bytes

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, tp: int = 1) -> ModelCost:
        """The cost of a dense decoder (Llama-style gated MLP) ``config.json`` at ``tp``."""
        d = int(config["hidden_size"])
        h = int(config["num_attention_heads"])
        g = int(config.get("num_key_value_heads", h))
        e = int(config.get("head_dim") or d // h)
        f = int(config["intermediate_size"])
        v = int(config["vocab_size"])
        n_layers = int(config["num_hidden_layers"])
        if tp < 1 or h % tp or g % tp:
            raise ValueError(f"tp={tp} must divide {h} heads and {g} KV heads")
        dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16")
        per_layer = d * h * e + 2 * d * g * e + h * e * d + 3 * d * f + 2 * d
        return cls(
            layers=n_layers,
            hidden=d,
            heads=h,
            kv_heads=g,
            head_dim=e,
            layer_params=n_layers * per_layer,
            lm_head_params=v * d,
            embed_params=v * d,
            tied=bool(config.get("tie_word_embeddings", False)),
            tp=tp,
            weight_bytes_per_param=_DTYPE_BYTES[dtype],
            kv_dtype_bytes=_DTYPE_BYTES[dtype],
        )


@dataclass(frozen=True, slots=True)
class StepTime:
    """One step's modelled seconds and the terms they came from."""

    seconds: float
    mem_s: float
    compute_s: float
    comm_s: float
    weight_bytes: float
    kv_bytes: float
    flops: float
    tokens: int


def step_time(cost: ModelCost, gpu: GpuSpec, chunks: Sequence[Chunk], sampled: int) -> StepTime:
    """The modelled time of one engine step (module docstring); no chunks: no step, 0 s."""
    tokens = sum(c.new_tokens for c in chunks)
    if tokens == 0:
        return StepTime(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0)
    kv_tokens = sum(c.context_tokens + c.new_tokens for c in chunks)
    kv_bytes = float(cost.kv_bytes_per_token * kv_tokens)
    weight_bytes = cost.weight_bytes
    pairs = sum(
        c.new_tokens * c.context_tokens + c.new_tokens * (c.new_tokens + 1) / 2 for c in chunks
    )
    attn_width = cost.heads // cost.tp * cost.head_dim
    flops = (
        2.0 * cost.layer_params / cost.tp * tokens
        + 2.0 * cost.lm_head_params / cost.tp * sampled
        + 4.0 * cost.layers * attn_width * pairs
    )
    mem_s = (weight_bytes + kv_bytes) / (gpu.hbm_bytes_per_s * gpu.mem_efficiency)
    compute_s = flops / (gpu.peak_flops * gpu.compute_efficiency)
    comm_s = 0.0
    if cost.tp > 1:
        ring = 2.0 * (cost.tp - 1) / cost.tp
        act_bytes = 2.0 * cost.layers * tokens * cost.hidden * cost.weight_bytes_per_param
        comm_s = act_bytes * ring / (gpu.link_bytes_per_s * gpu.mem_efficiency)
    seconds = gpu.overhead_s + max(mem_s, compute_s) + comm_s
    return StepTime(seconds, mem_s, compute_s, comm_s, weight_bytes, kv_bytes, flops, tokens)


@dataclass(frozen=True, slots=True)
class FittedStep:
    """A step time fitted to a real engine's measured steps (module docstring); seconds."""

    name: str
    base_s: float
    token_s: float
    seq_s: float
    kv_token_s: float
    host_s: float = 0.0


# vLLM 0.32's CPU build serving the tiny model (2 layers, hidden 256; ext_proc/lab/vllm_local)
# on this 2-core machine, inside bench/overload.py's mixed workload (vLLM at nice 10, Envoy,
# ICE and the client beside it). Fitted by least squares to the steps vLLM itself logged
# with --enable-logging-iteration-details (``iteration elapsed time``: the forward pass and
# the sampling) — see docs/gpu-pool.md, "Faithfulness", for the run, the fit and its error.
# Calibration run (7 Dec 23:39, seed 11, arms direct and queue with its history: 6,723 steps):
# 2.98 ms a step + 44.2 µs a token + 164 µs a sequence; the cache term is 0.0038 µs a token
# (12 µs with all 3,072 tokens cached: context does not matter at this size). Mean absolute
# error 1.8 ms a step (the steps jitter with the shared cores: decodes of one sequence took
# 2.4 ms median, 3.0 mean); Σ modelled / Σ measured = 1.00 on the steps fitted.
# host_s 0.8 ms: the real engine's steps while saturated took 1.0–2.0 ms (median 1.6) of wall
# time a step beyond vLLM's elapsed (per second of its log: (1 s − Σ elapsed) / steps, in the
# seconds with KV usage over 80 %; calibration and comparison runs); the fake pool's took
# 0.6–1.0 ms beyond its sleep (its stats lines): the difference, the worker round trip.
CPU_TINY = FittedStep(
    name="cpu-tiny",
    base_s=2.977e-3,
    token_s=44.15e-6,
    seq_s=164.4e-6,
    kv_token_s=3.845e-9,
    host_s=0.8e-3,
)


def fitted_step_time(fit: FittedStep, chunks: Sequence[Chunk]) -> float:
    """``fit``'s seconds for one step (module docstring); no chunks: no step, 0 s."""
    tokens = sum(c.new_tokens for c in chunks)
    if tokens == 0:
        return 0.0
    kv_tokens = sum(c.context_tokens + c.new_tokens for c in chunks)
    return (
        fit.host_s
        + fit.base_s
        + fit.token_s * tokens
        + fit.seq_s * len(chunks)
        + fit.kv_token_s * kv_tokens
    )


class Pacer:
    """When each step is due on the wall clock, so that the pool runs at k × the model.

    ``due(start, last_return, seconds, continuous)`` for a step that began at ``start`` (wall
    seconds) after the previous one returned at ``last_return``, modelled at ``seconds``:

    - continuous (a request scheduled now was scheduled in the previous step too, so the
      pool had work through the gap: on a GPU the step follows the last one at once), and
      the previous step's due time is at most ``max_debt_s`` behind ``start``:
      due = the previous due + k × seconds. The host time between steps and any overrun of
      the last step (the sleep woke late, the shared cores were busy) are repaid from this
      step's sleep, so over a busy stretch Σ wall = k × Σ modelled: the pace is the model's,
      not the host's load, and does not drift with it.
    - otherwise (the pool was idle, or fell more than ``max_debt_s`` behind: counted in
      ``resets``): due = start − min(start − last_return, absorb_s) + k × seconds, the
      host time since the last step counted up to ``absorb_s`` (k × the modelled overhead).

    ``paced=False`` (a fitted step, which measured the forward pass alone; the host's share
    runs for real and adds to it, as on the real engine): always the second form.
    Pure: the caller reads the clock and sleeps until the answer.
    """

    __slots__ = ("_due", "absorb_s", "k", "max_debt_s", "paced", "resets")

    def __init__(self, k: float, *, absorb_s: float, max_debt_s: float, paced: bool) -> None:
        self.k = k
        self.absorb_s = absorb_s
        self.max_debt_s = max_debt_s
        self.paced = paced
        self.resets = 0
        self._due: float | None = None

    def due(self, start: float, last_return: float, seconds: float, continuous: bool) -> float:
        """The wall time this step should end at (class docstring)."""
        prev = self._due
        if self.paced and continuous and prev is not None and start - prev <= self.max_debt_s:
            due = prev + self.k * seconds
        else:
            if self.paced and continuous and prev is not None:
                self.resets += 1
            due = start - min(start - last_return, self.absorb_s) + self.k * seconds
        self._due = due
        return due
