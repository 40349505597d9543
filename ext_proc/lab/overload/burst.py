"""The burst: its defaults, its plan (when each request starts, its priority, its size), bodies.

- the defaults ``bench/overload.py``, ``ice demo`` and the e2e test share (``PROMPT_TOKENS``,
  ``MAX_TOKENS``, ``REQUESTS``, ``SPACING_MS``, ``MIX``, ``POLICY``, ``VLLM_ARGS``...);
- ``parse_mix`` / ``interleave`` / ``plan_burst``: ``requests`` starts ``spacing_ms`` apart,
  priorities of ``mix`` spread by weight (smooth weighted round robin);
- ``request_body``: one planned request as a streamed chat completion of filler text
  (``ext_proc.lab.vllm_local.filler_text``).

Invariants: a plan is pure data and deterministic (no clock, no randomness), so both modes and
every round send the same sizes, priorities and schedule; only the prompt text changes, with
``seed``. A body asks for exactly ``max_tokens`` (``ignore_eos``) at temperature 0, streamed,
with a final usage chunk. ``POLICY`` is ``ext_proc/lab/vllm_tiny_policy.yaml``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ext_proc.lab import vllm_local as vl

__all__ = [
    "CHAT",
    "MAX_TOKENS",
    "MIX",
    "MODES",
    "POLICY",
    "PRIORITIES",
    "PROMPT_TOKENS",
    "REQUESTS",
    "SPACING_MS",
    "VLLM_ARGS",
    "VLLM_NICE",
    "Planned",
    "interleave",
    "parse_mix",
    "plan_burst",
    "request_body",
]

POLICY = Path(__file__).resolve().parent.parent / "vllm_tiny_policy.yaml"
CHAT = "/v1/chat/completions"
PRIORITIES = ("critical", "standard", "sheddable")
MODES = ("direct", "ice")

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


def parse_mix(spec: str) -> dict[str, int]:
    """``"standard=3,sheddable=2"`` → ``{"standard": 3, "sheddable": 2}``."""
    out: dict[str, int] = {}
    for part in spec.split(","):
        name, _, weight = part.strip().partition("=")
        if name not in PRIORITIES or not weight.isdigit() or int(weight) < 1:
            raise ValueError(f"bad --mix part {part!r}: want PRIORITY=N, N ≥ 1, of {PRIORITIES}")
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
    requests: int, prompt_tokens: int, max_tokens: int, spacing_ms: float, mix: str
) -> list[Planned]:
    priorities = interleave(parse_mix(mix), requests)
    return [
        Planned(i, i * spacing_ms / 1000.0, priorities[i], prompt_tokens, max_tokens)
        for i in range(requests)
    ]


def request_body(p: Planned, model: str, seed: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": vl.filler_text(p.prompt_tokens, seed)}],
        "max_tokens": p.max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
