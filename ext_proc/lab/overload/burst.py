"""The burst: its defaults, its plan (when each request starts, its priority, its size), bodies.

- the defaults ``bench/overload.py``, ``ice demo`` and the e2e test share (``PROMPT_TOKENS``,
  ``MAX_TOKENS``, ``REQUESTS``, ``SPACING_MS``, ``MIX``, ``POLICY``, ``VLLM_ARGS``,
  ``TTFT_SLO_S``...), the ``MODES`` a burst can run in (``DEFAULT_MODES``: direct, ice);
- ``parse_mix`` / ``interleave`` / ``plan_burst``: ``requests`` starts ``spacing_ms`` apart,
  priorities of ``mix`` spread by weight (smooth weighted round robin), and, given
  ``tenants`` (``parse_tenants``: ``"heavy=4,light=1"``, weight = relative rate), a tenant per
  request spread the same way (sent as ``TENANT_HEADER``);
- ``alone``: the requests of one tenant of a plan, at their planned times (the control run:
  what that tenant gets without the others);
- ``request_body``: one planned request as a streamed chat completion of filler text
  (``ext_proc.lab.vllm_local.filler_text``).

Invariants: a plan is pure data and deterministic (no clock, no randomness), so every mode and
every round send the same sizes, priorities, tenants and schedule; only the prompt text
changes, with ``seed``; ``alone`` keeps each request's index and time. A body asks for
exactly ``max_tokens`` (``ignore_eos``) at temperature 0, streamed, with a final usage chunk.
The mixed workload is planned in ``workload`` (seeded, same invariants).
``POLICY`` is ``ext_proc/lab/vllm_tiny_policy.yaml``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ext_proc.lab import vllm_local as vl

__all__ = [
    "CHAT",
    "DEFAULT_MODES",
    "MAX_TOKENS",
    "MIX",
    "MODES",
    "POLICY",
    "PRIORITIES",
    "PROMPT_TOKENS",
    "REQUESTS",
    "SPACING_MS",
    "TENANT_HEADER",
    "TTFT_SLO_S",
    "VLLM_ARGS",
    "VLLM_NICE",
    "Planned",
    "alone",
    "interleave",
    "parse_mix",
    "parse_tenants",
    "plan_burst",
    "request_body",
]

POLICY = Path(__file__).resolve().parent.parent / "vllm_tiny_policy.yaml"
CHAT = "/v1/chat/completions"
PRIORITIES = ("critical", "standard", "sheddable")
# direct: straight to vLLM; ice: through Envoy + ICE; queue: through Envoy + a second ICE
# whose profiles have the admission queue on (``setup.queue_policy``).
MODES = ("direct", "ice", "queue")
DEFAULT_MODES = ("direct", "ice")
TENANT_HEADER = "x-tenant"
# The time-to-first-token objective that goodput counts against (``RunResult.summary``).
TTFT_SLO_S = 2.0

# ~870 filler words → 887 prompt tokens = 7 blocks of 128 at admission; + 200 output = 9
# blocks: three admitted requests outgrow the 23 usable blocks (ext_proc.lab.vllm_local).
PROMPT_TOKENS = 870
MAX_TOKENS = 200
REQUESTS = 24
SPACING_MS = 250.0
MIX = "standard=3,sheddable=2,critical=1"
VLLM_ARGS: tuple[str, ...] = ()
VLLM_NICE = 0


@dataclass(frozen=True)
class Planned:
    """One request of the burst: when it starts (s after the first), its priority and size."""

    index: int
    at_s: float
    priority: str
    prompt_tokens: int
    max_tokens: int
    tenant: str | None = None  # sent as TENANT_HEADER; None: no such header
    # The request's size class in its workload: "short" or "long" (``workload.plan_mixed``);
    # "" in the burst, where every request has the same size.
    kind: str = ""
    # Client-like limits (``workload.plan_mixed(limits="client")``): the request sends
    # ``sent_limit`` (None: no limit at all) and generates ``max_tokens`` anyway, stopped there
    # by ``min_tokens`` and a strong bias towards the end-of-sequence token.
    client_like: bool = False
    sent_limit: int | None = None


def parse_mix(spec: str) -> dict[str, int]:
    """``"standard=3,sheddable=2"`` → ``{"standard": 3, "sheddable": 2}``."""
    out: dict[str, int] = {}
    for part in spec.split(","):
        name, _, weight = part.strip().partition("=")
        if name not in PRIORITIES or not weight.isdigit() or int(weight) < 1:
            raise ValueError(f"bad --mix part {part!r}: want PRIORITY=N, N ≥ 1, of {PRIORITIES}")
        out[name] = int(weight)
    return out


_TENANT = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


def parse_tenants(spec: str) -> dict[str, int]:
    """``"heavy=4,light=1"`` → ``{"heavy": 4, "light": 1}`` (weight = relative request rate)."""
    out: dict[str, int] = {}
    for part in spec.split(","):
        name, _, weight = part.strip().partition("=")
        if not _TENANT.match(name) or not weight.isdigit() or int(weight) < 1 or name in out:
            raise ValueError(
                f"bad --tenants part {part!r}: want NAME=N, N ≥ 1, NAME of letters, digits, "
                "'_.-' (each name once)"
            )
        out[name] = int(weight)
    return out


def interleave(weights: dict[str, int], count: int) -> list[str]:
    """``count`` names spread evenly by weight (smooth weighted round robin, deterministic)."""
    total = sum(weights.values())
    credit = dict.fromkeys(weights, 0)
    out: list[str] = []
    for _ in range(count):
        for name, w in weights.items():
            credit[name] += w
        pick = max(credit, key=lambda n: credit[n])
        credit[pick] -= total
        out.append(pick)
    return out


def plan_burst(
    requests: int,
    prompt_tokens: int,
    max_tokens: int,
    spacing_ms: float,
    mix: str,
    tenants: str | None = None,
) -> list[Planned]:
    """``requests`` starts ``spacing_ms`` apart; priorities from ``mix`` and (given) tenants
    from ``tenants``, each interleaved by weight on its own."""
    priorities = interleave(parse_mix(mix), requests)
    names: list[str | None] = (
        list(interleave(parse_tenants(tenants), requests)) if tenants else [None] * requests
    )
    return [
        Planned(i, i * spacing_ms / 1000.0, priorities[i], prompt_tokens, max_tokens, names[i])
        for i in range(requests)
    ]


def alone(burst: Sequence[Planned], tenant: str) -> list[Planned]:
    """The requests of ``tenant`` in ``burst``, unchanged (same index, time, size); ValueError
    when it has none (a name not in ``--tenants``)."""
    out = [p for p in burst if p.tenant == tenant]
    if not out:
        known = sorted({p.tenant for p in burst if p.tenant is not None})
        raise ValueError(f"tenant {tenant!r} has no request in the plan (tenants: {known})")
    return out


# The tiny model's end-of-sequence token (its config.json's eos_token_id).
TINY_EOS_ID = 1


def request_body(p: Planned, model: str, seed: int) -> dict[str, Any]:
    """The chat request of ``p``: exactly ``max_tokens`` output tokens, either as its limit
    (``ignore_eos``) or, client-like, under the limit it sends (``sent_limit``, or none):
    ``min_tokens`` k = max_tokens − 1 and a +100 bias on the end-of-sequence token make vLLM
    stop at exactly k + 1 tokens (verified on the tiny model: ../shared/FACTS.md)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": vl.filler_text(p.prompt_tokens, seed)}],
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    if not p.client_like:
        return {**body, "max_tokens": p.max_tokens, "ignore_eos": True}
    body["min_tokens"] = max(0, p.max_tokens - 1)
    body["logit_bias"] = {str(TINY_EOS_ID): 100}
    if p.sent_limit is not None:
        body["max_tokens"] = p.sent_limit
    return body
