"""The coarse verdict: a request judged from its size, without its body, when ICE is busy.

When the worker's backlog (``ext_proc.admit.backlog``) says a body could not be judged before
Envoy's message timeout, or would hold too much memory, ICE decides without the body. It
cannot edit a body it has not read, and nothing after it can hold the body to a verdict
(Envoy does not read JSON), so the invariant is: **a verdict without the body is never more
permissive than one with it.** It passes only where no body of that size could get a
stricter full verdict at the pool's current state; everywhere else it refuses (429 with
Retry-After, the API's format) or, for a memory refusal on a route with an admission queue,
queues it.

**What a few bytes can set** (``unread_risk``; the first that applies, in this order, gives
a 429 ``ice_busy`` with Retry-After = the profile's ``retry_after_min_s``: ICE, not the
backend, is what is short, and its backlog turns over within Envoy's message timeout). L is
the body's ``content-length`` (or a chunked body's size at the body phase); a JSON list of k
items takes at least 2k − 1 bytes (a value and a comma each), so a body holds at most
``most_items(L)`` = ⌈L / 2⌉ prompts, inputs or media parts.

1. ``sequences``: a body names ``n`` or ``best_of`` in a few bytes whatever its size (chat,
   completions, batch chat, ``/invocations``, vLLM and SGLang generate; completions,
   SGLang and batch chat also take prompt lists of ⌈L / 2⌉). No size bounds it, and above
   ``max_sequences`` the full verdict answers 400 ``too_many_sequences`` where the backend
   would run them all (vLLM 0.32 has no cap on ``n``). Anthropic messages and the Responses
   API start one sequence.
2. ``inputs``: embeddings: ⌈L / 2⌉ inputs over ``max_embedding_inputs`` (the full verdict's
   400 ``too_many_inputs``).
3. ``media_parts``: every API ICE judges reads media parts (embeddings in their ``messages``
   form too), and a part's tokens are priced from a URL or a header (a WAV header claims any
   duration in 44 bytes), not from its bytes: no size bounds them.
4. ``stored_context``: a Responses body names a stored response in a few bytes; with
   ``stored_context: reject`` the full verdict answers 400.
5. ``context``: with ``max_model_len`` M, a prompt bound P = ``coarse_tokens(L)`` ≥ M (> M
   for embeddings): some body of that size has no room for output (400
   ``context_length_exceeded``).
6. ``limit``: a generating body asks any output limit in a few bytes (``"max_tokens":
   1e9``); with M, the full verdict cuts it to the context budget.

Every API in ``ext_proc.schemas`` reads media parts (3), so today every coarse verdict is
such a 429: the schemas' rows (``_UNBOUNDED``) say which fields each reads, and a schema
this module does not know is taken to read them all. The rest of the ladder judges a body
none of them applies to (``COARSE_LADDER``; tested with a schema that reads none).

**The worst request of a body of L bytes** (``coarse_features``):

- **Prompt tokens** P = min(ceil(L × TOKENS_PER_BYTE) + TEMPLATE_SLACK_TOKENS,
  max_model_len). TOKENS_PER_BYTE = 1: every token of a byte-level BPE tokenizer (GPT-2,
  tiktoken's cl100k/o200k, Llama 3, Qwen, Mistral's Tekken) and of a SentencePiece or
  WordPiece model without expanding normalisation (Llama 2, Mistral, Gemma; byte fallback
  included) stands for at least one byte of text, the text of a JSON body is never longer
  than the body (escapes only lengthen it), and token ids cost at least two bytes each
  (``1,``). The chat template adds per message fewer tokens than the JSON around a message
  takes (``{"role":"user","content":""}`` is 28 bytes), plus a fixed preamble, covered by
  TEMPLATE_SLACK_TOKENS = 256. With tokenizers configured, TOKENS_PER_BYTE is instead the
  most any of them can make of one byte (``CounterRegistry.tokens_per_byte``, derived at load
  by ``ext_proc.tokencount.derived``: NFKC turns the 3 bytes of ﷺ into 33, up to 11 tokens a
  byte). Not a bound: an expanding normaliser with no tokenizer configured. No sequence holds
  more than max_model_len tokens of KV (the backend refuses longer prompts), hence the cap.
- **Sequences** S = ``max_sequences`` (1 on an API that starts one), each with its own
  prompt of P tokens and no prefix-cache sharing (``prompt_logprobs`` turns it off;
  ``Shape.reads_cache`` False).
- **Output** O = M − P per sequence (M = max_model_len): a limit fits in any body, and a
  body ICE did not read goes on as sent, so each sequence may run to the end of the context.
  Without max_model_len O is unbounded. Embeddings: one sequence of P, no output.

So the worst request needs W = S × blocks(P + O) KV blocks (``KvFit.need`` of S unshared
sequences with O each); the coarse ladder refuses at the first rule that finds some body of
L bytes the full verdict would refuse or edit:

0. ``refuse_unbounded`` (above; only in ``coarse_ladder`` when ``unread_risk`` finds one);
1. ``shed_by_priority`` sheds the priority at the pool's level (429 ``memory_pressure``), as
   in the full ladder;
2. ``refuse_unread_cap``: the level has an output cap (``max_tokens_cap``), on a generating
   endpoint. With a cap, some body of L bytes asks more (or nothing, and gets the cap
   injected): the full verdict would downgrade it. 429 ``memory_pressure``, for every
   priority (``critical`` included: the alternative is a critical request running
   uncapped);
3. ``refuse_unread_truncation``: the profile truncates this API's history and P is over a
   budget at the pool's state (``truncation_budget``): the full verdict would cut the
   history. 429 ``memory_pressure``;
4. ``refuse_unread_kv``: W ≤ the free blocks of the endpoint (``on_kv_shortfall`` ``shed``
   or ``downgrade``; never for ``critical``, as in the full ladder), else 429
   ``kv_exhausted``; with O unbounded, any known pool refuses. And, for every priority and
   shortfall mode, the S sequences of P with one output token each must fit the endpoint's
   usable blocks (the full verdict's 400 ``kv_capacity_exceeded``), else 429 ``ice_busy``.

A pass is held in the in-flight ledger as the worst request (S × M tokens), like a full
verdict's. A coarse verdict never rewrites the body and never answers 400. A memory refusal
on a route with a ``queue`` waits there and is judged again with ``COARSE_LADDER``: a body
``unread_risk`` refused never gets there (``ice_busy`` is a ``Reject``, not a ``Wait``). The coarse
verdict is marked ``x-ice-judged: headers``.
"""

from __future__ import annotations

import math
from typing import Literal

from ext_proc.policy.decision import Decision, Reject, Wait
from ext_proc.policy.evaluate import Case, Rule, shed_by_priority, truncation_budget
from ext_proc.policy.output_limit import backend_output
from ext_proc.policy.settings import Profile
from ext_proc.schemas import RequestFeatures, SchemaAdapter

__all__ = [
    "COARSE_LADDER",
    "H_JUDGED",
    "MIN_ITEM_BYTES",
    "TEMPLATE_SLACK_TOKENS",
    "TOKENS_PER_BYTE",
    "UNREAD_REASON",
    "Risk",
    "coarse_features",
    "coarse_ladder",
    "coarse_tokens",
    "most_items",
    "refuse_unbounded",
    "refuse_unread_cap",
    "refuse_unread_kv",
    "refuse_unread_truncation",
    "unread_risk",
]

H_JUDGED = "x-ice-judged"
TOKENS_PER_BYTE = 1.0
TEMPLATE_SLACK_TOKENS = 256
MIN_ITEM_BYTES = 2  # a list item: a value and a comma
UNREAD_REASON = "ice_busy"
_NOT_GENERATING = ("openai.embeddings",)
_UNREAD = "ICE could not read this request's body in time"

Risk = Literal["sequences", "inputs", "media_parts", "stored_context", "context", "limit"]

# The fields each API reads that no body size bounds (the module docstring): "sequences"
# (n, best_of, prompt lists), "media_parts", "stored_context" (a stored response named).
_ALL: frozenset[str] = frozenset(("sequences", "media_parts", "stored_context"))
_UNBOUNDED: dict[str, frozenset[str]] = {
    "openai.chat": frozenset(("sequences", "media_parts")),
    "openai.completions": frozenset(("sequences", "media_parts")),
    "openai.chat_batch": frozenset(("sequences", "media_parts")),
    "sagemaker.invocations": frozenset(("sequences", "media_parts")),
    "vllm.generate": frozenset(("sequences", "media_parts")),
    "sglang.generate": frozenset(("sequences", "media_parts")),
    "anthropic.messages": frozenset(("media_parts",)),
    "openai.responses": frozenset(("media_parts", "stored_context")),
    "openai.embeddings": frozenset(("media_parts",)),
}
_WHAT: dict[str, str] = {
    "sequences": "any number of sequences (n, best_of, or a list of prompts)",
    "inputs": "more inputs than this route allows",
    "media_parts": "image, audio or video parts, whose tokens its size does not bound",
    "stored_context": "a stored response (previous_response_id), which this route refuses",
    "context": "a prompt longer than the model's context",
    "limit": "any output limit, which this route cuts to the context",
}


def coarse_tokens(
    nbytes: int, max_model_len: int | None, tokens_per_byte: float = TOKENS_PER_BYTE
) -> int:
    """The prompt-token bound of a body of ``nbytes`` (see the module docstring);
    ``tokens_per_byte``: the loaded tokenizers' most (``CounterRegistry.tokens_per_byte``)."""
    tokens = math.ceil(nbytes * tokens_per_byte) + TEMPLATE_SLACK_TOKENS
    return tokens if max_model_len is None else min(tokens, max_model_len)


def most_items(nbytes: int) -> int:
    """The most items a JSON list in a body of ``nbytes`` holds: k items take at least
    2k − 1 bytes, so k ≤ ⌈nbytes / 2⌉."""
    return -(-nbytes // MIN_ITEM_BYTES)


def unread_risk(
    schema: str, nbytes: int, profile: Profile, tokens_per_byte: float = TOKENS_PER_BYTE
) -> Risk | None:
    """The first field a body of ``nbytes`` on ``schema`` may set so that the full verdict
    under ``profile`` refuses or cuts it, whatever the pool's state (None: no such field;
    the module docstring); ``tokens_per_byte`` as ``coarse_tokens``."""
    reads = _UNBOUNDED.get(schema, _ALL)
    generates = schema not in _NOT_GENERATING
    if generates and "sequences" in reads:
        return "sequences"
    if not generates and most_items(nbytes) > profile.max_embedding_inputs:
        return "inputs"
    if "media_parts" in reads:
        return "media_parts"
    if "stored_context" in reads and profile.stored_context == "reject":
        return "stored_context"
    limit = profile.max_model_len
    if limit is None:
        return None
    prompt = coarse_tokens(nbytes, None, tokens_per_byte)
    if prompt > limit or (generates and prompt == limit):
        return "context"
    return "limit" if generates else None


def refuse_unbounded(risk: Risk, nbytes: int = 0) -> Rule:
    """Rule 0: the 429 for a body that may set ``risk`` (``unread_risk``)."""

    def rule(case: Case) -> Decision:
        retry = case.profile.retry_after_min_s
        size = f"a body of {nbytes} bytes" if nbytes else "a body of its size"
        return Reject(
            pressure=case.pressure,
            status=429,
            reason=UNREAD_REASON,
            message=(
                f"{_UNREAD}, and {size} may ask for {_WHAT[risk]}: the gateway cannot "
                f"judge that without reading it. Retry after {retry} s."
            ),
            retry_after_s=retry,
        )

    rule.__name__ = f"refuse_unbounded_{risk}"
    return rule


def coarse_ladder(
    schema: str, nbytes: int, profile: Profile, tokens_per_byte: float = TOKENS_PER_BYTE
) -> tuple[Rule, ...]:
    """The coarse ladder for a body of ``nbytes`` on ``schema``: ``refuse_unbounded`` first
    when ``unread_risk`` finds a field, then ``COARSE_LADDER``."""
    risk = unread_risk(schema, nbytes, profile, tokens_per_byte)
    return COARSE_LADDER if risk is None else (refuse_unbounded(risk, nbytes), *COARSE_LADDER)


def coarse_features(
    adapter: SchemaAdapter,
    nbytes: int,
    profile: Profile,
    tokens_per_byte: float = TOKENS_PER_BYTE,
) -> RequestFeatures:
    """The worst request a body of ``nbytes`` can be on ``adapter``'s API under ``profile``
    (the module docstring): S sequences of P prompt tokens, unshared, each asking O output
    tokens (``max_tokens`` None: unbounded, no max_model_len)."""
    generates = adapter.name not in _NOT_GENERATING
    prompt = coarse_tokens(nbytes, profile.max_model_len, tokens_per_byte)
    one = "sequences" not in _UNBOUNDED.get(adapter.name, _ALL)
    return RequestFeatures(
        schema=adapter.name,
        model=None,
        input_tokens=prompt,
        max_tokens=_to_the_end(profile, prompt) if generates else None,
        max_tokens_field=None,
        stream=False,
        message_count=0,
        input_tokens_source="bound",
        samples=(1 if one else profile.max_sequences) if generates else 1,
        reads_prefix_cache=not generates,
        generates=generates,
        inputs=1 if not generates else 0,
    )


def _to_the_end(profile: Profile, prompt: int) -> int | None:
    """O = M − P: a sequence's output to the end of the context (None: no max_model_len)."""
    limit = profile.max_model_len
    return None if limit is None else max(0, limit - prompt)


def refuse_unread_cap(case: Case) -> Decision | None:
    """Rule 2: a level that caps the output refuses an unread generating request."""
    f, p = case.features, case.pressure
    if not f.generates or p is None:
        return None
    cap = case.profile.max_tokens_cap.get(p.level)
    if cap is None:
        return None
    retry = case.retry_after(case.shape.tokens(backend_output(f, case.profile)))
    return Wait(
        pressure=p,
        reason="memory_pressure",
        message=(
            f"{_UNREAD}, and under {p.level.label} memory pressure (score {p.score:.0f}/100) "
            f"the output is capped at {cap} tokens, which it cannot apply to a body it has "
            f"not read. Retry after {retry} s."
        ),
        retry_after_s=retry,
    )


def refuse_unread_truncation(case: Case) -> Decision | None:
    """Rule 3: a prompt bound over the profile's truncation budget refuses an unread body."""
    picked = truncation_budget(case)
    if picked is None:
        return None
    budget, why = picked
    retry = case.retry_after(case.shape.tokens(backend_output(case.features, case.profile)))
    return Wait(
        pressure=case.pressure,
        reason="memory_pressure",
        message=(
            f"{_UNREAD}; a body of its size may hold about {case.features.input_tokens} "
            f"prompt tokens, and this route would truncate its history to {budget} tokens "
            f"({why}), which it cannot do to a body it has not read. Retry after {retry} s."
        ),
        retry_after_s=retry,
    )


def refuse_unread_kv(case: Case) -> Decision | None:
    """Rule 4: the worst request of the body's size must fit the free blocks, and its
    sequences with one output token each the endpoint's usable blocks."""
    kv, f = case.kv, case.features
    if kv is None:
        return None
    least = kv.need(case.shape, 1 if f.generates else 0)
    if least > kv.usable_blocks:  # the full verdict's 400 kv_capacity_exceeded
        retry = case.profile.retry_after_min_s
        return Reject(
            pressure=case.pressure,
            status=429,
            reason=UNREAD_REASON,
            message=(
                f"{_UNREAD}; a body of its size may need {least} KV-cache blocks, and its "
                f"backend holds {kv.usable_blocks} even when idle. Retry after {retry} s."
            ),
            retry_after_s=retry,
        )
    if case.profile.on_kv_shortfall == "ignore" or case.priority == "critical":
        return None
    if f.generates and f.max_tokens is None:  # no max_model_len: the output is unbounded
        need = kv.usable_blocks + 1
        what = "an output the route does not bound (it sets no max_model_len)"
    else:
        output = f.max_tokens or 0
        need = kv.need(case.shape, output)
        if need <= kv.free_blocks:
            return None
        what = (
            f"{case.shape.sequences} sequences of up to {f.input_tokens + output} tokens, "
            f"{need} KV-cache blocks"
        )
    retry = case.retry_after(need * kv.block_size)
    return Wait(
        pressure=case.pressure,
        reason="kv_exhausted",
        message=(
            f"{_UNREAD}; a body of its size may ask for {what}, and its backend has "
            f"{kv.free_blocks} free blocks. Retry after {retry} s."
        ),
        retry_after_s=retry,
    )


COARSE_LADDER: tuple[Rule, ...] = (
    shed_by_priority,
    refuse_unread_cap,
    refuse_unread_truncation,
    refuse_unread_kv,
)
