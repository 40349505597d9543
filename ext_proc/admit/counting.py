"""When to count a prompt exactly: only when the verdict could depend on it.

Exact counting (``ext_proc.tokencount``) of a 190k-token conversation costs ~0.2 s cold; the
estimate (``ext_proc.schemas.estimate``) costs microseconds and is off by a bounded factor. For a
model with a tokenizer, ICE first judges the request twice with the estimate's bounds,

    lo = ceil(text_estimate × ESTIMATE_LOW) + media
    hi = ceil(text_estimate × ESTIMATE_HIGH) + media

(each prompt of the request alike; hi never above the body's byte bound,
``ext_proc.admit.headeronly``; media tokens come from the media's sizes, not from text, so they are
not scaled). When both verdicts are the same — both pass, or both refuse for the same reason with
the same status — every count in between gets that verdict too (each rule of the ladder is monotone
in the input tokens, or independent of them), so the estimate decides: the request is judged and
held in the in-flight ledger at **hi** (never admitted on an undercount), and says
``x-ice-tokens: estimate``. Otherwise (near the context window, the free blocks, a cap or a
truncation budget: a downgrade's new limit, a truncation's plan need the exact figure) ICE
counts exactly (``x-ice-tokens: exact``). The policy's ``exact_count: always`` counts every
request exactly (as before this module).

The factors are the model's tokenizer's own (``ExactCounter.bounds``: measured at load on a
generated calibration sample, ``ext_proc.tokencount.calibration``, never narrower than
ESTIMATE_LOW = 0.5 and ESTIMATE_HIGH = 2.0, which ``bounds`` uses when given none).

Invariant: pure functions; ``bounds`` never returns lo > hi.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from ext_proc.admit.headeronly import coarse_tokens
from ext_proc.policy.decision import Decision, Pass, Reject
from ext_proc.schemas import RequestFeatures

__all__ = ["ESTIMATE_HIGH", "ESTIMATE_LOW", "H_TOKENS", "bounds", "exact_count", "same_verdict"]

ESTIMATE_LOW = 0.5
ESTIMATE_HIGH = 2.0
H_TOKENS = "x-ice-tokens"


def _scaled(tokens: int, media: int, factor: float, cap: int) -> int:
    return min(cap, math.ceil(max(0, tokens - media) * factor) + media)


def bounds(
    features: RequestFeatures,
    nbytes: int,
    factors: tuple[float, float] = (ESTIMATE_LOW, ESTIMATE_HIGH),
) -> tuple[RequestFeatures, RequestFeatures]:
    """The estimate's lower and upper bound, as features (see the module docstring);
    ``factors``: (low, high), the tokenizer's ``ExactCounter.bounds``."""
    media = features.media_tokens
    cap = max(features.input_tokens, coarse_tokens(nbytes, None) + media)

    def at(factor: float) -> RequestFeatures:
        prompts = tuple(_scaled(p, media, factor, cap) for p in features.prompt_tokens)
        return replace(
            features,
            input_tokens=_scaled(features.input_tokens, media, factor, cap),
            prompt_tokens=prompts,
        )

    return at(factors[0]), at(factors[1])


def same_verdict(a: Decision, b: Decision) -> bool:
    """Whether two decisions are the same verdict: both pass, or the same refusal."""
    if isinstance(a, Pass) and isinstance(b, Pass):
        return True
    if isinstance(a, Reject) and isinstance(b, Reject):
        return (a.status, a.reason) == (b.status, b.reason)
    return False


def exact_count(
    counters: Any, features: RequestFeatures, values: dict[str, Any], nbytes: int
) -> RequestFeatures:
    """``features`` with the model tokenizer's exact count (``counters``: the pipeline's
    ``ext_proc.tokencount.CounterRegistry``) in place of the estimate; as they are when the
    model has no tokenizer; at the estimate's upper bound (``input_tokens_source:
    fallback``) when the tokenizer cannot count this request."""
    from ext_proc.tokencount import TokenCountError

    counter = counters.counter_for(features.model)
    if counter is None:
        return features
    try:
        exact = counter.prompt_counts(features.schema, values)
    except TokenCountError:
        high = bounds(features, nbytes, counter.bounds.factors)[1]
        return replace(high, input_tokens_source="fallback")
    media = features.media_tokens  # the tokenizer sees placeholders, not the media
    counts = tuple(c + media for c in exact)
    return replace(
        features,
        input_tokens=max(counts),
        prompt_tokens=counts if len(counts) > 1 else (),
        input_tokens_source="exact",
        count_mode=counter.count_mode,
    )
