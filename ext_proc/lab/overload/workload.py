"""The workloads a comparison can send: ``burst`` (``burst.plan_burst``) or ``mixed``.

``mixed`` (``plan_mixed``, parameters in ``MixedSpec``): ``requests`` requests, of which
``round(long_share × requests)`` are long and the rest short, the long ones at positions drawn
from ``random.Random(seed)``; then, request by request in index order, from the same
generator:

- short: prompt of ``uniform[80, 120]`` filler words (≈ 97–137 tokens: the chat template
  adds ~17), output ``lognormal(median 32, σ 1.0)``, at least 8;
- long: prompt of ``uniform[1000, 1200]`` filler words (8–10 blocks of 128 of the tiny pool's
  23 usable), output ``lognormal(median 160, σ 1.0)``, at least 32;
- every output clipped to what fits the context with room to spare: prompt words + output +
  ``template_margin_tokens`` (32) + ``output_buffer_tokens`` (128, the tiny policy's) ≤
  ``max_model_len`` (2048), so vLLM never answers 400 and ICE never cuts ``max_tokens`` for
  the context (it still may under pressure: ``max_tokens_cap``); a long prompt of 1200 words
  gets at most 688 tokens;
- priorities from ``mix`` and tenants from ``tenants``, interleaved by weight as in the burst
  (``burst.interleave``), independent of the sizes; starts ``spacing_ms`` apart;
- ``limits="client"``: the same sizes, but each request sends ``max_tokens`` 1024 or no
  limit (half each, from a second generator seeded by ``seed``), as real clients do, and
  still generates its drawn length (``burst.request_body``: ``min_tokens`` and an
  end-of-sequence bias).

``describe`` / ``plan_text``: a plan's counts and size quantiles, as data and as the line of
the report's header. ``LogNormal`` is a
seeded heavy tail: median × e^(σ·z), z standard normal.

Invariants: a plan is pure data, the same for the same arguments (``random.Random(seed)``,
nothing else random, no clock), so every arm and round of a comparison sends the same sizes,
priorities, tenants and schedule (only the prompt text changes per run, as for the burst);
exactly ``round(long_share × requests)`` long requests; each ``Planned.kind`` is ``short`` or
``long`` (the burst's is "").
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from ext_proc.lab.overload.burst import Planned, interleave, parse_mix, parse_tenants

__all__ = [
    "CLIENT_LIMIT",
    "KINDS",
    "LIMITS",
    "WORKLOADS",
    "LogNormal",
    "MixedSpec",
    "describe",
    "plan_mixed",
    "plan_text",
]

WORKLOADS = ("burst", "mixed")
# How a mixed request states its output: "exact" (max_tokens = its drawn length, ignore_eos:
# the gate sees the truth) or "client" (as clients do: max_tokens CLIENT_LIMIT or none, half
# each, drawn from the seed; the drawn length is still what vLLM generates: burst.request_body)
LIMITS = ("exact", "client")
CLIENT_LIMIT = 1024
KINDS = ("short", "long")  # the mixed workload's size classes (Planned.kind)


@dataclass(frozen=True)
class LogNormal:
    """Output lengths: ``median`` × e^(``sigma`` · z), rounded, at least ``min_tokens``."""

    median: float
    sigma: float
    min_tokens: int

    def draw(self, rng: random.Random) -> int:
        return max(self.min_tokens, round(rng.lognormvariate(math.log(self.median), self.sigma)))

    def text(self) -> str:
        return f"lognormal(median {self.median:g}, σ {self.sigma:g}), ≥ {self.min_tokens}"


@dataclass(frozen=True)
class MixedSpec:
    """Every parameter of the mixed workload (see the module's docstring)."""

    long_share: float = 0.3
    short_prompt: tuple[int, int] = (80, 120)  # filler words, uniform, inclusive
    long_prompt: tuple[int, int] = (1000, 1200)
    short_output: LogNormal = field(default_factory=lambda: LogNormal(32, 1.0, 8))
    long_output: LogNormal = field(default_factory=lambda: LogNormal(160, 1.0, 32))
    max_model_len: int = 2048  # ext_proc.lab.vllm_local.ServeConfig.max_model_len
    output_buffer_tokens: int = 128  # ext_proc/lab/vllm_tiny_policy.yaml
    template_margin_tokens: int = 32  # the chat template adds ~17 tokens to the words

    def fit(self, prompt_words: int) -> int:
        """The largest output of a prompt of ``prompt_words`` words that fits (see above)."""
        return (
            self.max_model_len
            - self.output_buffer_tokens
            - self.template_margin_tokens
            - prompt_words
        )

    def text(self) -> str:
        """The parameters in one line (the report's header)."""
        return (
            f"{1 - self.long_share:.0%} short: prompt {self.short_prompt[0]}–"
            f"{self.short_prompt[1]} words, output {self.short_output.text()}; "
            f"{self.long_share:.0%} long: prompt {self.long_prompt[0]}–{self.long_prompt[1]} "
            f"words, output {self.long_output.text()}; outputs clipped to prompt + output + "
            f"{self.template_margin_tokens} + {self.output_buffer_tokens} ≤ {self.max_model_len}"
        )

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def plan_mixed(
    requests: int,
    spacing_ms: float,
    mix: str,
    tenants: str | None = None,
    *,
    seed: int = 1,
    spec: MixedSpec | None = None,
    limits: str = "exact",
) -> list[Planned]:
    """The mixed workload (see the module's docstring); ValueError for a bad share, a prompt
    range that leaves no room for the minimum output, or ``limits`` not in ``LIMITS``."""
    if limits not in LIMITS:
        raise ValueError(f"limits {limits!r}: want one of {LIMITS}")
    spec = spec or MixedSpec()
    if not 0.0 <= spec.long_share <= 1.0:
        raise ValueError(f"long_share {spec.long_share} is not within [0, 1]")
    classes = ((spec.short_prompt, spec.short_output), (spec.long_prompt, spec.long_output))
    for (lo, hi), out in classes:
        if not 1 <= lo <= hi or spec.fit(hi) < out.min_tokens:
            raise ValueError(f"prompt range {lo}–{hi} leaves no room for {out.min_tokens} tokens")
    rng = random.Random(seed)
    limit_rng = random.Random(seed * 7919 + 1)  # the sizes stay those of limits="exact"
    n_long = round(spec.long_share * requests)
    long_at = set(rng.sample(range(requests), n_long))
    priorities = interleave(parse_mix(mix), requests)
    names: list[str | None] = (
        list(interleave(parse_tenants(tenants), requests)) if tenants else [None] * requests
    )
    plan: list[Planned] = []
    for i in range(requests):
        kind = "long" if i in long_at else "short"
        lo, hi = spec.long_prompt if kind == "long" else spec.short_prompt
        out = spec.long_output if kind == "long" else spec.short_output
        prompt = rng.randint(lo, hi)
        max_tokens = min(out.draw(rng), spec.fit(prompt))
        at_s = i * spacing_ms / 1000.0
        planned = Planned(i, at_s, priorities[i], prompt, max_tokens, names[i], kind)
        if limits == "client":
            sent = CLIENT_LIMIT if limit_rng.random() < 0.5 else None
            planned = replace(planned, client_like=True, sent_limit=sent)
        plan.append(planned)
    return plan


def _q(values: Sequence[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[max(0, min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1))]


def describe(plan: Sequence[Planned]) -> dict[str, Any]:
    """Per kind (short, long, then any other in order of appearance; ``all`` for the burst's
    ""): count, prompt words min / p50 / max, output tokens min / p50 / p95 / max and their
    sum; all nearest-rank."""
    out: dict[str, Any] = {}
    seen = dict.fromkeys(p.kind for p in plan)
    for kind in [k for k in KINDS if k in seen] + [k for k in seen if k not in KINDS]:
        mine = [p for p in plan if p.kind == kind]
        prompts = [p.prompt_tokens for p in mine]
        outputs = [p.max_tokens for p in mine]
        out[kind or "all"] = {
            "requests": len(mine),
            "prompt_words": {"min": min(prompts), "p50": _q(prompts, 0.5), "max": max(prompts)},
            "output_tokens": {
                "min": min(outputs),
                "p50": _q(outputs, 0.5),
                "p95": _q(outputs, 0.95),
                "max": max(outputs),
                "sum": sum(outputs),
            },
        }
    return out


def plan_text(plan: Sequence[Planned]) -> str:
    """``describe`` in one line: per kind, its count, prompt words and output tokens."""
    parts = []
    for kind, d in describe(plan).items():
        pw, out = d["prompt_words"], d["output_tokens"]
        parts.append(
            f"{kind} {d['requests']}: prompt {pw['min']}–{pw['max']} words (p50 {pw['p50']}), "
            f"output {out['min']}–{out['max']} tokens (p50 {out['p50']}, p95 {out['p95']}, "
            f"Σ {out['sum']})"
        )
    return "; ".join(parts)
