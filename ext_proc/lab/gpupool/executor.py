"""``executor``: a vLLM ``Executor`` that runs no model; each step sleeps k × its modelled GPU time.

Loaded by ``vllm serve … --distributed-executor-backend
ext_proc.lab.gpupool.executor.FakeGPUExecutor`` with ``ICE_GPUPOOL_SPEC`` naming the JSON of
``pool.PoolSpec.executor_spec`` (the real model's config, TP, GPU constants, blocks, block size,
dilation k). Runs only inside the vLLM venv (it imports vllm and torch); nothing else imports it.

What vLLM's EngineCore calls and what it gets (FACTS.md, "running its scheduler without a model"):

- ``get_kv_cache_specs``: one ``FullAttentionSpec`` per layer of the real model, per rank
  (KV heads / tp, head_dim, bf16, the pool's block size); ``determine_available_memory``:
  exactly num_blocks pages of every layer, so vLLM's own arithmetic lands on the same block
  count as ``--num-gpu-blocks-override`` and ``ice plan``.
- ``execute_model(scheduler_output)``: a ``ModelRunnerOutput`` with one token for every
  request whose computed + scheduled tokens reach its prompt + the tokens it has generated
  (a decode, or the chunk that finishes a prefill, resumed requests' recompute included), ``[]``
  for a prefill chunk that does not; after sleeping until the step is due at k × its
  ``timing.step_time`` (``timing.Pacer``: while requests run through the gaps, each step is
  due k × its modelled time after the previous one was due, so host time and late wake-ups
  are repaid from the next sleeps and the pool keeps the model's pace whatever the load of
  the shared cores, up to ``MAX_DEBT_STEPS`` × k × the modelled overhead behind; after an
  idle gap, the host time since the previous step counts up to k × the modelled overhead,
  which stands for it). With a fitted step time (``spec["step"]``, ``timing.FittedStep``:
  the faithfulness pool) it sleeps k × ``timing.fitted_step_time`` in full, unpaced: that fit
  measured the forward pass and the sampling only, and the host's share runs here for real,
  before it, as on the real engine; with ``spec["burn"]`` it computes (small matrix products
  on one thread pinned to the first allowed core, as vLLM's CPU worker binds its one OpenMP
  thread) until the step is due instead of sleeping, so the fake pool loads the CPU as the
  real CPU forward pass does. Every ``STATS_EVERY`` steps a line on stderr gives the
  steps, the modelled seconds × k, the wall time the steps took (their host time included;
  idle gaps between steps counted up to one dilated step) and the pacer's resets: where the
  wall exceeds the dilated model, or resets grow, the host, not the model, set the pace, and
  k should be larger.
- the token: ``FILLER_TOKEN_ID``, or the request's EOS when it would be sampled by a model
  driven the way the bench drives it: not ``ignore_eos``, a ``logit_bias`` on EOS of at least
  ``EOS_BIAS_MIN``, and at least ``min_tokens`` generated (vLLM masks EOS below min_tokens).
  ``max_tokens`` and the context limit stop it in vLLM's own scheduler. So output lengths are
  the request's, as FACTS.md measured on the real tiny model (min_tokens k → k + 1 tokens).

Block size: ``vllm serve … --block-size 16`` is accepted by the CPU platform as it is (it
warns that its attention kernel prefers multiples of 32); the platform switches chunked prefill
and prefix caching off only for MLA models (``CpuPlatform.check_and_update_config``), which this
pool does not serve. The executor's per-layer spec carries the same 16, which is the block size
vLLM's engine then uses (``EngineCore._initialize_kv_caches``).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import torch
from vllm.v1.executor.abstract import Executor  # type: ignore[import-not-found]
from vllm.v1.kv_cache_interface import FullAttentionSpec  # type: ignore[import-not-found]
from vllm.v1.outputs import ModelRunnerOutput  # type: ignore[import-not-found]

from ext_proc.lab.gpupool.pool import SPEC_ENV
from ext_proc.lab.gpupool.timing import (
    Chunk,
    FittedStep,
    GpuSpec,
    ModelCost,
    Pacer,
    fitted_step_time,
    step_time,
)

__all__ = ["EOS_BIAS_MIN", "FILLER_TOKEN_ID", "FakeGPUExecutor"]

FILLER_TOKEN_ID = 100
STATS_EVERY = 500  # steps between the stats line on stderr (vLLM's log)
EOS_BIAS_MIN = 10.0
MAX_DEBT_STEPS = 20  # how far (× k × the modelled overhead) the pool may fall behind its pace


class _Req:
    """What the executor keeps of one request: its prompt length, outputs so far, EOS rule."""

    __slots__ = ("eos_after", "eos_id", "outputs", "prompt_tokens")

    def __init__(self, prompt_tokens: int, params: Any) -> None:
        self.prompt_tokens = prompt_tokens
        self.outputs = 0
        self.eos_id: int | None = None
        self.eos_after: int | None = None  # EOS is sampled once this many tokens exist
        eos = getattr(params, "eos_token_id", None) if params is not None else None
        bias = (getattr(params, "logit_bias", None) or {}) if params is not None else {}
        if eos is not None and not params.ignore_eos and bias.get(eos, 0.0) >= EOS_BIAS_MIN:
            self.eos_id, self.eos_after = eos, int(params.min_tokens or 0)


class FakeGPUExecutor(Executor):  # type: ignore[misc]
    """vLLM's scheduler, KV cache manager and metrics, over a modelled GPU (module docstring)."""

    uses_ray = False
    supports_pp = False

    def _init_executor(self) -> None:
        spec = json.loads(Path(os.environ[SPEC_ENV]).read_text())
        self._cost = ModelCost.from_config(spec["config"], tp=int(spec["tp"]))
        self._gpu = GpuSpec(**spec["gpu"])
        self._num_blocks = int(spec["num_blocks"])
        self._block_size = int(spec["block_size"])
        self._dilation = float(spec["dilation"])
        fitted = spec.get("step")
        self._fitted = None if fitted is None else FittedStep(**fitted)
        # Host time per step that the modelled time already stands for (the roofline's
        # overhead); a fitted step measured the forward pass alone: none.
        absorb_s = 0.0 if self._fitted is not None else self._gpu.overhead_s
        self._pacer = Pacer(
            self._dilation,
            absorb_s=absorb_s * self._dilation,
            max_debt_s=MAX_DEBT_STEPS * absorb_s * self._dilation,
            paced=self._fitted is None,
        )
        self._prev_ids: frozenset[str] = frozenset()
        # burn: the step's time computed on one core (core 0, as vLLM's CPU worker binds its
        # one OpenMP thread), not slept: the CPU testbed's forward loads the machine too
        self._burn: tuple[Any, Any] | None = None
        if spec.get("burn"):
            torch.set_num_threads(1)
            self._burn = (torch.rand(128, 128), torch.rand(128, 128))
            torch.mm(*self._burn)  # the first product sets torch up (~50 ms); later ones ~80 µs
        self._reqs: dict[str, _Req] = {}
        self._last_return = time.monotonic()
        self._since = self._last_return
        self.steps = 0
        self.modelled_s = 0.0
        self.busy_wall_s = 0.0  # wall time of steps, from the previous return (idle gaps capped)

    # --- KV cache ---------------------------------------------------------------------------
    def _layer_spec(self) -> Any:
        return FullAttentionSpec(
            block_size=self._block_size,
            num_kv_heads=self._cost.kv_heads // self._cost.tp,
            head_size=self._cost.head_dim,
            dtype=torch.bfloat16,
        )

    def get_kv_cache_specs(self) -> list[dict[str, Any]]:
        spec = self._layer_spec()
        return [{f"model.layers.{i}.self_attn.attn": spec for i in range(self._cost.layers)}]

    def determine_available_memory(self) -> list[int]:
        return [self._num_blocks * self._layer_spec().page_size_bytes * self._cost.layers]

    def get_supported_kv_cache_layouts(self) -> list[list[str]]:
        return [["NHD"]]

    def set_kv_cache_layout(self, layout_name: str) -> None:
        return None

    def initialize_from_config(self, kv_cache_configs: list[Any]) -> None:
        return None

    # --- control ----------------------------------------------------------------------------
    def collective_rpc(
        self,
        method: Any,
        timeout: float | None = None,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        non_block: bool = False,
    ) -> Any:
        answers = {"get_supported_tasks": ("generate",), "compile_or_warm_up_model": None}
        if method == "compile_or_warm_up_model":
            result: list[Any] = []
        else:
            result = [answers.get(method) if isinstance(method, str) else None]
        if non_block:
            done: Future[list[Any]] = Future()
            done.set_result(result)
            return done
        return result

    def check_health(self) -> None:
        return None

    def shutdown(self) -> None:
        return None

    def take_draft_token_ids(self) -> None:
        return None

    # --- the step ---------------------------------------------------------------------------
    def execute_model(self, scheduler_output: Any, non_block: bool = False) -> Any:
        start = time.monotonic()
        out = self._step(scheduler_output)
        n_sampled = sum(1 for tokens in out[0].sampled_token_ids if tokens)
        if self._fitted is not None:
            seconds = fitted_step_time(self._fitted, out[1])
        else:
            seconds = step_time(self._cost, self._gpu, out[1], n_sampled).seconds
        self.steps += 1
        self.modelled_s += seconds
        ids = frozenset(scheduler_output.num_scheduled_tokens)
        due = self._pacer.due(start, self._last_return, seconds, bool(ids & self._prev_ids))
        self._prev_ids = ids
        if self._burn is not None:
            self._burn_until(due)
        else:
            remaining = due - time.monotonic()
            if remaining > 0:
                time.sleep(remaining)
        now = time.monotonic()
        self.busy_wall_s += now - start + min(start - self._last_return, seconds * self._dilation)
        self._last_return = now
        if self.steps % STATS_EVERY == 0:
            print(
                f"gpupool: {self.steps} steps, modelled {self.modelled_s:.3f} s × k "
                f"{self._dilation:g} = {self.modelled_s * self._dilation:.1f} s, "
                f"busy wall {self.busy_wall_s:.1f} s, pace resets {self._pacer.resets}",
                file=sys.stderr,
                flush=True,
            )
        if non_block:
            done: Future[Any] = Future()
            done.set_result(out[0])
            return done
        return out[0]

    def _burn_until(self, due: float) -> None:
        assert self._burn is not None
        if time.monotonic() >= due:
            return
        affinity = os.sched_getaffinity(0)
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, {min(affinity)})
        a, b = self._burn
        while time.monotonic() < due:
            torch.mm(a, b)
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, affinity)

    def _step(self, so: Any) -> tuple[Any, list[Chunk]]:
        for req_id in so.finished_req_ids:
            self._reqs.pop(req_id, None)
        computed: dict[str, int] = {}
        for new in so.scheduled_new_reqs:
            self._reqs[new.req_id] = _Req(len(new.prompt_token_ids or ()), new.sampling_params)
            computed[new.req_id] = new.num_computed_tokens
        cached = so.scheduled_cached_reqs
        for req_id, done in zip(cached.req_ids, cached.num_computed_tokens, strict=True):
            computed[req_id] = done
        req_ids: list[str] = []
        sampled: list[list[int]] = []
        chunks: list[Chunk] = []
        for req_id, n in so.num_scheduled_tokens.items():
            before = computed.get(req_id, 0)
            chunks.append(Chunk(n, before))
            req = self._reqs.get(req_id)
            req_ids.append(req_id)
            if req is None or before + n < req.prompt_tokens + req.outputs:
                sampled.append([])
                continue
            eos = req.eos_after is not None and req.outputs >= req.eos_after
            sampled.append([req.eos_id if eos and req.eos_id is not None else FILLER_TOKEN_ID])
            req.outputs += 1
        output = ModelRunnerOutput(
            req_ids=req_ids,
            req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
        )
        return output, chunks
