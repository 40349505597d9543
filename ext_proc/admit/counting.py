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

A request the estimate refused and that waits in the admission queue (``exact_to_wait``) is
counted exactly before it waits: the refusal was right (every count between the bounds is
refused), but the queue judges it again as room comes, and at the upper bound a 120-token
chat turn would wait for ~1,000 tokens of room (measured on the tiny model's byte-fallback
tokenizer: 7–8 blocks of 128 for a 1-block prompt). Counting costs it nothing it would feel:
it waits anyway. Bodies over ``exact_count_inline_bytes`` keep the estimate (their count
belongs in the helper process).

Invariant: pure functions; ``bounds`` never returns lo > hi.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any

from ext_proc.admit.headeronly import coarse_tokens
from ext_proc.admit.verdict import BodyVerdict
from ext_proc.policy.decision import Decision, Pass, Reject
from ext_proc.schemas import RequestFeatures

__all__ = [
    "ESTIMATE_HIGH",
    "ESTIMATE_LOW",
    "H_TOKENS",
    "bounds",
    "exact_count",
    "exact_to_wait",
    "same_verdict",
]

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


def exact_to_wait(counters: Any, inline_bytes: int, first: BodyVerdict) -> BodyVerdict:
    """``first`` (a verdict about to wait in the queue) with its features counted exactly,
    and ``x-ice-tokens: exact``, when the estimate decided it and its body is at most
    ``inline_bytes``; otherwise as it is (the module docstring)."""
    f, body = first.features, first.body
    if counters is None or f is None or body is None or f.input_tokens_source == "exact":
        return first
    if len(body.raw) > inline_bytes or counters.counter_for(f.model) is None:
        return first
    exact = exact_count(counters, f, body.doc.values, len(body.raw))
    if exact.input_tokens_source != "exact":
        return first
    headers = [(k, v) for k, v in first.outcome.headers if k != H_TOKENS]
    outcome = replace(first.outcome, headers=[*headers, (H_TOKENS, "exact")])
    return replace(first, features=exact, outcome=outcome)
