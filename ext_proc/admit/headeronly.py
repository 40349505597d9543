"""The coarse verdict: a request judged from its size, without its body, when ICE is busy.

When the worker's backlog (``ext_proc.admit.backlog``) says a body could not be judged before
Envoy's message timeout, or would hold too much memory, ICE decides without the body. It
cannot see ``n``, the output limit or the prompts, and it cannot edit a body it has not
read, so it judges the **worst request a body of that size can be**, and passes it only
where every such body would pass the full verdict untouched at the pool's current state;
everywhere else it refuses (429 with Retry-After, the API's format) or, on a route with an
admission queue, queues it.

The worst request of a body of L bytes (L: its ``content-length``, or, for a chunked body,
its size at the body phase; ``ext_proc.serve.servicer``):

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
  byte). Not a bound: an expanding normaliser with no tokenizer configured, and media parts
  (an image URL of 60 bytes costs as many tokens as the image has patches). No sequence
  holds more than max_model_len tokens of KV (the backend refuses longer prompts), hence the
  cap.
- **Sequences** S = ``max_sequences`` (a body names ``n`` in a few bytes, whatever its
  size; more than S is the full verdict's 400), each with its own prompt of P tokens and no
  prefix-cache sharing (``prompt_logprobs`` turns it off; ``Shape.reads_cache`` False).
- **Output** O = M − P per sequence (M = max_model_len): ``"max_tokens": 99999999`` (or no
  limit at all) fits in any body, and a body ICE did not read goes on as sent, so each
  sequence may run to the end of the context (vLLM 0.32 cuts a larger limit to M − prompt
  itself). The full verdict would cut such a limit to M − P − output_buffer_tokens
  (``context_budget``): no memory decision, the backend's own context bounds it, so the
  coarse verdict does not refuse for it, and it counts the whole context. Without
  max_model_len O is unbounded. Embeddings: one sequence of P, no output.

So the worst request needs W = S × blocks(P + O) = S × ⌈M / block_size⌉ KV blocks
(``KvFit.need`` of S unshared sequences with O each), and the full verdict would leave every
body of L bytes untouched (but for ``context_budget``) only when all of these hold; the
coarse ladder (``COARSE_LADDER``) refuses at the first that does not:

1. ``shed_by_priority`` does not shed the priority at the pool's level (429
   ``memory_pressure``), as in the full ladder;
2. ``refuse_unread_cap``: the level has no output cap (``max_tokens_cap``), on a generating
   endpoint. With a cap, some body of L bytes asks more (or nothing, and gets the cap
   injected): the full verdict would downgrade it, which an unread body cannot be. 429
   ``memory_pressure``, for every priority (``critical`` included: the alternative is a
   critical request running uncapped);
3. ``refuse_unread_kv``: W ≤ the free blocks of the endpoint (``on_kv_shortfall`` ``shed``
   or ``downgrade``; never for ``critical``, as in the full ladder). Otherwise some body of
   L bytes would be shed or downgraded to fit: 429 ``kv_exhausted``. With O unbounded, any
   known pool refuses.

A pass is held in the in-flight ledger as the worst request (S × M tokens), like a full
verdict's. A coarse verdict never rewrites the body and never answers 400. What it
does not catch: the 400s of the full verdict (more than S sequences, too many media parts,
a prompt over the context, a malformed body: the backend's own answer), and media parts'
tokens past their bytes (above). The coarse verdict is marked ``x-ice-judged: headers``.
"""

from __future__ import annotations

import math

from ext_proc.policy.decision import Decision, Wait
from ext_proc.policy.evaluate import Case, Rule, shed_by_priority
from ext_proc.policy.model import Profile
from ext_proc.policy.output import backend_output
from ext_proc.schemas import RequestFeatures, SchemaAdapter

__all__ = [
    "COARSE_LADDER",
    "H_JUDGED",
    "TEMPLATE_SLACK_TOKENS",
    "TOKENS_PER_BYTE",
    "coarse_features",
    "coarse_tokens",
    "refuse_unread_cap",
    "refuse_unread_kv",
]

H_JUDGED = "x-ice-judged"
TOKENS_PER_BYTE = 1.0
TEMPLATE_SLACK_TOKENS = 256
_NOT_GENERATING = ("openai.embeddings",)
_UNREAD = "ICE could not read this request's body in time"


def coarse_tokens(
    nbytes: int, max_model_len: int | None, tokens_per_byte: float = TOKENS_PER_BYTE
) -> int:
    """The prompt-token bound of a body of ``nbytes`` (see the module docstring);
    ``tokens_per_byte``: the loaded tokenizers' most (``CounterRegistry.tokens_per_byte``)."""
    tokens = math.ceil(nbytes * tokens_per_byte) + TEMPLATE_SLACK_TOKENS
    return tokens if max_model_len is None else min(tokens, max_model_len)


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
    return RequestFeatures(
        schema=adapter.name,
        model=None,
        input_tokens=prompt,
        max_tokens=_to_the_end(profile, prompt) if generates else None,
        max_tokens_field=None,
        stream=False,
        message_count=0,
        input_tokens_source="bound",
        samples=profile.max_sequences if generates else 1,
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


def refuse_unread_kv(case: Case) -> Decision | None:
    """Rule 3: the worst request of the body's size must fit the free blocks."""
    kv, f = case.kv, case.features
    if kv is None or case.profile.on_kv_shortfall == "ignore" or case.priority == "critical":
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


COARSE_LADDER: tuple[Rule, ...] = (shed_by_priority, refuse_unread_cap, refuse_unread_kv)
