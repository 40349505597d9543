"""When to count a prompt exactly: only when the verdict could depend on it.

Exact counting (``ext_proc.tokencount``) of a 190k-token conversation costs ~0.2 s cold; the
estimate (``ext_proc.schemas.estimate``) costs microseconds and is off by a bounded factor. For a
model with a tokenizer, ICE first judges the request twice with the estimate's bounds,

    lo = ceil(text_estimate × ESTIMATE_LOW) + media
    hi = ceil(text_estimate × ESTIMATE_HIGH) + media

(each prompt of the request alike; hi never above the body's byte bound,
``ext_proc.policy.coarse``; media tokens come from the media's sizes, not from text, so they are
not scaled). When both verdicts are the same — both pass, or both refuse for the same reason with
the same status — every count in between gets that verdict too (each rule of the ladder is monotone
in the input tokens, or independent of them), so the estimate decides: the request is judged and
held in the in-flight ledger at **hi** (never admitted on an undercount), and says
``x-ice-tokens: estimate``. Otherwise (near the context window, the free blocks, a cap or a
truncation budget: a downgrade's new limit, a truncation's plan need the exact figure) ICE
counts exactly (``x-ice-tokens: exact``). The policy's ``exact_count: always`` counts every
request exactly (as before this module).

The bounds are the model's tokenizer's own (``ExactCounter.bounds``): the factors measured at
load on a generated calibration sample (``ext_proc.tokencount.calibration``, never narrower
than ESTIMATE_LOW = 0.5 and ESTIMATE_HIGH = 2.0, which ``bounds`` uses when given none),
widened by the bounds derived from the tokenizer itself for any text
(``ext_proc.tokencount.derived``: the widest token, the normalizer's largest expansion, the
specials that can appear in text, the template's framing) when it has them:

    lo = min(⌈text × low⌉, derived.lower(text, M)) + media
    hi = min(max(⌈text × high⌉, derived.upper(text, M)), byte bound) + media

(text: the estimate less media; M: the request's messages; the derived lower bound is 0 for a
body that is not ``plain``: tools, documents, template keywords, tool calls or reasoning, which
the estimate prices but a template may not render). The byte bound is the header-only
verdict's prompt bound with the tokenizer's most tokens per byte (``derived.tokens_per_byte``;
1 without derived bounds): a body whose text NFKC expands (ﷺ: up to 11 tokens a byte) is not
capped at one token a byte.

A request the estimate refused and that waits in the admission queue (``exact_to_wait``) is
counted exactly before it waits: the refusal was right (every count between the bounds is
refused), but the queue judges it again as room comes, and at the upper bound a 120-token
chat turn would wait for ~1,000 tokens of room (measured on the tiny model's byte-fallback
tokenizer: 7–8 blocks of 128 for a 1-block prompt). Counting costs it nothing it would feel:
it waits anyway. Bodies over ``exact_count_inline_bytes`` keep the estimate (their count
belongs in the helper process).

Invariant: pure functions; ``bounds`` never returns lo > hi (``derived.lower ≤ derived.upper``,
and low ≤ high).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from ext_proc.admit.verdict import BodyVerdict
from ext_proc.policy.coarse import TOKENS_PER_BYTE, coarse_tokens
from ext_proc.policy.decision import Decision, Pass, Reject, Wait
from ext_proc.schemas import RequestFeatures
from ext_proc.tokencount import CounterRegistry, TokenCountError

if TYPE_CHECKING:
    from ext_proc.tokencount.calibration import EstimateBounds

__all__ = [
    "ESTIMATE_HIGH",
    "ESTIMATE_LOW",
    "H_TOKENS",
    "bounds",
    "exact_count",
    "exact_to_wait",
    "plain",
    "same_verdict",
]

ESTIMATE_LOW = 0.5
ESTIMATE_HIGH = 2.0
H_TOKENS = "x-ice-tokens"


def bounds(
    features: RequestFeatures,
    nbytes: int,
    factors: EstimateBounds | tuple[float, float] = (ESTIMATE_LOW, ESTIMATE_HIGH),
    values: Mapping[str, Any] | None = None,
) -> tuple[RequestFeatures, RequestFeatures]:
    """The estimate's lower and upper bound, as features (see the module docstring);
    ``factors``: the tokenizer's ``ExactCounter.bounds``, or bare (low, high) factors;
    ``values``: the decoded body (a body that is not ``plain`` has a lower bound of 0)."""
    low, high = factors if isinstance(factors, tuple) else factors.factors
    derived = None if isinstance(factors, tuple) else factors.derived
    if derived is not None and not plain(values):
        low = 0.0
    per_byte = TOKENS_PER_BYTE if derived is None else derived.tokens_per_byte
    media, messages = features.media_tokens, features.message_count
    cap = max(features.input_tokens, coarse_tokens(nbytes, None, per_byte) + media)

    def lower(tokens: int) -> int:
        text = max(0, tokens - media)
        got = math.ceil(text * low)
        if derived is not None:
            got = min(got, derived.lower(text, messages))
        return min(cap, got + media)

    def upper(tokens: int) -> int:
        text = max(0, tokens - media)
        got = math.ceil(text * high)
        if derived is not None:
            got = max(got, derived.upper(text, messages))
        return min(cap, got + media)

    def at(scale: Callable[[int], int]) -> RequestFeatures:
        prompts = tuple(scale(p) for p in features.prompt_tokens)
        return replace(features, input_tokens=scale(features.input_tokens), prompt_tokens=prompts)

    return at(lower), at(upper)


# What a plain body holds: text a template renders as it is (anything else, the estimate prices
# though a template may render it otherwise or not at all).
_PLAIN_MESSAGE = frozenset(("role", "content", "name"))
_PRICED_EXTRAS = ("tools", "functions", "documents", "chat_template_kwargs")


def plain(values: Mapping[str, Any] | None) -> bool:
    """Whether every text of the body is a message's content or a prompt, as strings or
    text parts: then the tokenizer's derived lower bound holds (tools, documents, template
    keywords, tool calls and reasoning are priced by the estimate but a template may drop
    them). None (not known): not plain."""
    if values is None:
        return False
    if any(values.get(key) for key in _PRICED_EXTRAS):
        return False
    messages = values.get("messages", [])
    if not isinstance(messages, list):
        return False
    return all(
        isinstance(m, dict) and m.keys() <= _PLAIN_MESSAGE and _text_content(m.get("content"))
        for m in messages
    )


def _text_content(content: Any) -> bool:
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, str)
        or (isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str))
        for p in content
    )


def same_verdict(a: Decision, b: Decision) -> bool:
    """Whether two decisions are the same verdict: both pass, the same refusal, or the same
    wait."""
    if isinstance(a, Pass) and isinstance(b, Pass):
        return True
    if isinstance(a, Reject) and isinstance(b, Reject):
        return (a.status, a.reason) == (b.status, b.reason)
    if isinstance(a, Wait) and isinstance(b, Wait):
        return a.reason == b.reason
    return False


def exact_count(
    counters: CounterRegistry, features: RequestFeatures, values: dict[str, Any], nbytes: int
) -> RequestFeatures:
    """``features`` with the model tokenizer's exact count (``counters``: the pipeline's
    ``ext_proc.tokencount.CounterRegistry``) in place of the estimate; as they are when the
    model has no tokenizer; at the estimate's upper bound (``input_tokens_source:
    fallback``) when the tokenizer cannot count this request."""
    counter = counters.counter_for(features.model)
    if counter is None:
        return features
    try:
        exact = counter.prompt_counts(features.schema, values)
    except TokenCountError:
        high = bounds(features, nbytes, counter.bounds, values)[1]
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


def exact_to_wait(
    counters: CounterRegistry | None, inline_bytes: int, first: BodyVerdict
) -> BodyVerdict:
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
