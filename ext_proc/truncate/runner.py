"""Carry out a ``TruncateHistory`` decision: similarities under a deadline, then the plan.

Steps for one request (``conversation_for``, then ``truncate``):
1. Split the body into units (``units.conversation_of``) with the profile's turn rules.
2. The budget is in the request's token units (exact when a tokenizer is configured, else
   the estimator's); units are in the estimator's. ``scale = input_tokens / units' total``
   converts: the planner gets ``floor(budget / scale)``, and ``saved_tokens`` comes back as
   ``round(saved × scale)``.
3. Nothing droppable (a single turn, or every turn must stay): an unchanged plan, and the
   rest of the ladder judges the request as it is. When the must-keep units alone exceed the
   budget: ``Overflow`` (no embedding is asked),
   or with ``on_overflow: best_effort`` a plan that keeps only them (mode ``must_keep``).
4. Otherwise ask the similarity source for the cosine similarity of each droppable turn's
   text (``turn_text``: its messages' texts, question first) to the latest user message,
   with ``deadline_ms``. One text per turn, cut to ``embedding.max_seq_length`` word pieces
   by the model, keeps a cold 50-message conversation near 25 short embeddings. A turn's
   similarity is (1 − w) × cosine + w × lexical overlap (``lexical``: w is the profile's
   ``lexical_weight``, by default the question's share of CJK characters, which the
   default English model cannot read).
   Late → recency (``fallback: deadline``); the worker down or
   failing → recency (``unavailable``); a question without text → recency (``no_query``).
5. ``planner.plan_truncation`` with the similarities (or none).

Invariant: waits only on the similarity source, and never longer than the deadline.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ext_proc.media import MediaCost
from ext_proc.policy.settings import TruncationSpec
from ext_proc.schemas.base import DEFAULT_MEDIA
from ext_proc.truncate.client import EmbeddingTimeout
from ext_proc.truncate.lexical import cjk_share, lexical_similarities
from ext_proc.truncate.planner import Overflow, Plan, PlanRules, plan_truncation
from ext_proc.truncate.units import Conversation, TurnRules, Unit, conversation_of

__all__ = [
    "LocalSimilarity",
    "SimilaritySource",
    "TruncationResult",
    "conversation_for",
    "rules_of",
    "truncate",
    "turn_text",
]


class SimilaritySource(Protocol):
    """Cosine similarities of texts to a query (the embedding worker's client)."""

    async def similarities(
        self, query: str, texts: Sequence[str], timeout_s: float
    ) -> list[float]: ...


@dataclass(frozen=True, slots=True)
class TruncationResult:
    """The plan (or overflow), how it was made, and the conversion to request tokens."""

    conversation: Conversation
    plan: Plan | Overflow
    fallback: str  # "" | deadline | unavailable | no_query
    scale: float  # request tokens per estimated token
    similarities: tuple[float, ...] | None = None  # per unit (must-keep units: 1.0)

    @property
    def saved_tokens(self) -> int:
        return round(self.plan.saved_tokens * self.scale) if isinstance(self.plan, Plan) else 0


def rules_of(spec: TruncationSpec) -> tuple[TurnRules, PlanRules]:
    """The planner's rules from the profile's truncation block."""
    return (
        TurnRules(
            keep_last_turns=spec.keep_last_turns,
            pin_first_turns=spec.pin_first_turns,
            pin_roles=spec.pin_roles,
            pin_names=spec.pin_names,
        ),
        PlanRules(
            threshold=spec.similarity_threshold,
            fill=spec.fill,
            placeholder=spec.placeholder,
            placeholder_role=spec.placeholder_role,
        ),
    )


def conversation_for(
    schema: str, values: dict[str, Any], spec: TruncationSpec, media: MediaCost = DEFAULT_MEDIA
) -> Conversation:
    """Step 1: the request's units under the profile's turn rules (pure CPU work: the
    pipeline does it where it decoded the body, so a heavy body's units are built in the
    offload helper and only they, not the decoded body, come back to the event loop)."""
    return conversation_of(schema, values, rules_of(spec)[0], media)


async def truncate(
    conv: Conversation,
    input_tokens: int,
    budget_tokens: int,
    spec: TruncationSpec,
    source: SimilaritySource | None,
) -> TruncationResult:
    """Plan the truncation of one request's units (see the module docstring)."""
    plan_rules = rules_of(spec)[1]
    scale = input_tokens / conv.total_tokens if conv.total_tokens > 0 else 1.0
    budget = int(budget_tokens / scale) if scale > 0 else budget_tokens
    droppable = [k for k, u in enumerate(conv.units) if u.keep is None]
    if not droppable:  # nothing to drop (one turn, or all pinned): the ladder judges as is
        whole = plan_truncation(conv, conv.total_tokens, None, plan_rules)
        return TruncationResult(conv, whole, "", scale)
    must = conv.fixed_tokens + sum(u.tokens for u in conv.units if u.keep is not None)
    if must > budget:
        if spec.on_overflow == "best_effort":  # send only what must stay
            kept = plan_truncation(conv, must, None, replace(plan_rules, placeholder=""))
            if isinstance(kept, Plan):
                return TruncationResult(conv, replace(kept, mode="must_keep"), "", scale)
        return TruncationResult(conv, Overflow(round(must * scale), budget_tokens), "", scale)
    sims: list[float] | None = None
    fallback = ""
    if not conv.query.strip():
        fallback = "no_query"
    elif source is None:
        fallback = "unavailable"
    else:
        texts = [turn_text(conv.units[k]) for k in droppable]
        try:
            flat = await source.similarities(conv.query, texts, spec.deadline_ms / 1000)
        except (TimeoutError, EmbeddingTimeout):
            fallback = "deadline"
        except Exception:  # EmbeddingUnavailable, or anything else the source raised
            fallback = "unavailable"
        else:
            w = spec.lexical_weight
            if w is None:
                w = cjk_share(conv.query)
            lex = lexical_similarities(conv.query, texts) if w > 0 else [0.0] * len(texts)
            sims = [1.0] * len(conv.units)
            for k, cos, overlap in zip(droppable, flat, lex, strict=False):
                sims[k] = (1 - w) * cos + w * overlap
    plan = plan_truncation(conv, budget, sims, plan_rules)
    return TruncationResult(conv, plan, fallback, scale, tuple(sims) if sims else None)


def turn_text(unit: Unit) -> str:
    """The text embedded for a turn: its messages' texts in order (the question first), of
    which the model reads the first ``embedding.max_seq_length`` word pieces."""
    return "\n".join(t for t in unit.texts if t)


class LocalSimilarity:
    """An in-process similarity source for the dry runs (``ice truncate``, ``ice evaluate``):
    loads the model on first use (torch in this process) and has no deadline."""

    def __init__(
        self, model: str | None = None, max_seq_length: int | None = None, quantize: bool = False
    ) -> None:
        self.model = model
        self.max_seq_length = max_seq_length
        self.quantize = quantize
        self._embedder: Any = None

    async def similarities(self, query: str, texts: Sequence[str], timeout_s: float) -> list[float]:
        if self._embedder is None:
            from ext_proc.truncate.embed import Embedder

            self._embedder = Embedder(
                self.model, max_seq_length=self.max_seq_length, quantize=self.quantize
            )
        result: list[float] = self._embedder.similarities(query, texts)
        return result
