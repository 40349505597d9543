"""``workloads``: the GPU pool's workloads, Poisson arrivals, and the pool's sustainable rate.

Kinds (``KINDS``; prompt in filler words, ≈ 1 token each for the tiny tokenizer, plus ~17 of
chat template; outputs in tokens):

- ``chat``: prompt lognormal(median 300, σ 0.8) within 20–4,000; output lognormal(median
  200, σ 0.7), ≥ 8;
- ``retrieval``: prompt uniform 4,000–16,000; output lognormal(median 150, σ 0.5), ≥ 16;
- ``reasoning``: prompt lognormal(median 500, σ 0.8) within 20–4,000; output uniform
  2,000–8,000;
- ``mix``: each request a kind drawn with weights chat 0.6, retrieval 0.25, reasoning 0.15.

Every output is clipped to ``max_model_len`` − prompt − ``MARGIN_TOKENS`` (the template and
ICE's output buffer), so vLLM never refuses a request for its length. Arrivals: exponential
gaps of mean 1 / ``rate_per_s`` (a Poisson process), in *modelled* seconds; the bench divides
by the dilation k for wall time. Priorities interleave ``mix`` by weight
(``overload.burst.interleave``); ``limits="client"`` as in ``overload.workload``: each request
sends ``max_tokens`` 1024 (at most the context's room) or none, half each, and still generates
its drawn length (``min_tokens`` + an EOS bias, honoured by the fake executor).

``sustainable_rate``: the request rate the pool serves in steady state, from the timing model
(an estimate, not a measurement). With P = mean prompt tokens, O = mean output tokens:

    N = min(max_num_seqs, (num_blocks − 1) × block_size / (P + O / 2))  sequences at once
    step = step_time(N decodes at context P + O / 2, one prefill of N × P / O tokens at P / 2)
    rate = N / O / step      (each step emits N tokens; a request needs O of them)

Invariants: pure (``random.Random(seed)``, no clock); the same arguments give the same plan.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import replace

from ext_proc.lab.gpupool.pool import PoolSpec
from ext_proc.lab.gpupool.timing import Chunk, step_time
from ext_proc.lab.overload.burst import Planned, interleave, parse_mix
from ext_proc.lab.overload.workload import CLIENT_LIMIT

__all__ = [
    "KINDS",
    "MARGIN_TOKENS",
    "MIX_WEIGHTS",
    "TEMPLATE_TOKENS",
    "plan_gpu",
    "sustainable_rate",
]

KINDS = ("chat", "retrieval", "reasoning", "mix")
MIX_WEIGHTS = {"chat": 0.6, "retrieval": 0.25, "reasoning": 0.15}
TEMPLATE_TOKENS = 17
MARGIN_TOKENS = 32 + 128


def _lognormal(rng: random.Random, median: float, sigma: float) -> float:
    return rng.lognormvariate(math.log(median), sigma)


def _draw(kind: str, rng: random.Random) -> tuple[int, int]:
    """(prompt words, output tokens) of one request of ``kind`` (before clipping)."""
    if kind == "chat":
        prompt = min(4000, max(20, round(_lognormal(rng, 300, 0.8))))
        return prompt, max(8, round(_lognormal(rng, 200, 0.7)))
    if kind == "retrieval":
        return rng.randint(4000, 16000), max(16, round(_lognormal(rng, 150, 0.5)))
    if kind == "reasoning":
        prompt = min(4000, max(20, round(_lognormal(rng, 500, 0.8))))
        return prompt, rng.randint(2000, 8000)
    raise ValueError(f"unknown kind {kind!r}: want one of {KINDS}")


def plan_gpu(
    kind: str,
    requests: int,
    rate_per_s: float,
    *,
    seed: int = 1,
    max_model_len: int = 32_768,
    mix: str = "standard=3,sheddable=2,critical=1",
    limits: str = "exact",
) -> list[Planned]:
    """``requests`` requests of ``kind`` arriving as a Poisson process of ``rate_per_s``."""
    if kind not in KINDS:
        raise ValueError(f"unknown workload {kind!r}: want one of {KINDS}")
    if rate_per_s <= 0 or requests < 1:
        raise ValueError("want rate_per_s > 0 and requests ≥ 1")
    rng = random.Random(seed)
    limit_rng = random.Random(seed * 7919 + 1)
    priorities = interleave(parse_mix(mix), requests)
    names = list(MIX_WEIGHTS)
    weights = [MIX_WEIGHTS[n] for n in names]
    plan: list[Planned] = []
    at_s = 0.0
    for i in range(requests):
        this = rng.choices(names, weights)[0] if kind == "mix" else kind
        words, output = _draw(this, rng)
        output = min(output, max_model_len - words - MARGIN_TOKENS)
        planned = Planned(i, round(at_s, 6), priorities[i], words, output, None, this)
        if limits == "client":
            room = max_model_len - words - MARGIN_TOKENS
            sent = min(CLIENT_LIMIT, room) if limit_rng.random() < 0.5 else None
            planned = replace(planned, client_like=True, sent_limit=sent)
        plan.append(planned)
        at_s += rng.expovariate(rate_per_s)
    return plan


def sustainable_rate(spec: PoolSpec, plan: Sequence[Planned]) -> float:
    """Requests per modelled second the pool sustains for ``plan``'s mean sizes (docstring)."""
    prompt = sum(p.prompt_tokens + TEMPLATE_TOKENS for p in plan) / len(plan)
    output = sum(p.max_tokens for p in plan) / len(plan)
    held = prompt + output / 2
    slots = (spec.num_blocks - 1) * spec.block_size
    n = max(1, min(spec.max_num_seqs, int(slots // held)))
    prefill = max(1, round(n * prompt / output))
    chunks = [Chunk(1, round(held))] * n + [Chunk(prefill, round(prompt / 2))]
    step_s = step_time(spec.cost, spec.gpu, chunks, n).seconds
    return n / output / step_s
