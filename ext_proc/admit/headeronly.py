"""The coarse verdict: a request judged from its headers (or its size) when ICE is busy.

When the worker's backlog (``ext_proc.admit.backlog``) says a body could not be judged before
Envoy's message timeout, or would hold too much memory, ICE decides without the body:

- **Prompt tokens** P = min(ceil(L × TOKENS_PER_BYTE) + TEMPLATE_SLACK_TOKENS,
  max_model_len), where L is the body's ``content-length`` (or, when it has none, the
  ``max_body_bytes`` limit; at the body phase, the body's size). TOKENS_PER_BYTE = 1: every
  token of a byte-level BPE tokenizer (GPT-2, tiktoken's cl100k/o200k, Llama 3, Qwen,
  Mistral's Tekken) and of a SentencePiece or WordPiece model without expanding
  normalisation (Llama 2, Mistral, Gemma; byte fallback included) stands for at least one
  byte of text, the text of a JSON body is never longer than the body (escapes only
  lengthen it), and token ids cost at least two bytes each (``1,``). The chat template adds
  per message fewer tokens than the JSON around a message takes (``{"role":"user",
  "content":""}`` is 28 bytes), plus a fixed preamble (system defaults, tool instructions),
  covered by TEMPLATE_SLACK_TOKENS = 256. Not a bound: tokenizers whose normalisation expands
  text (NFKC in T5-style SentencePiece models: U+FDFA is 3 bytes and 18 characters), for
  which ICE uses the same figure, and media parts (an image URL of 60 bytes costs as many
  tokens as the image has patches), which the coarse verdict cannot see. No sequence holds
  more than max_model_len tokens of KV (the backend refuses longer prompts), hence the cap.
- **Output**: unknown (the body is unread): the profile's ``min_output_tokens`` for
  generating endpoints, 0 for embeddings.
- **Rules**: the ladder's two pool-level rules only, on one sequence: ``shed_by_priority``
  (429 ``memory_pressure``) and ``shed_on_kv_shortfall`` (429 ``kv_exhausted``: P plus the
  output needs more blocks than the request's endpoint has free). Otherwise it passes.

A coarse verdict never rewrites the body and never answers 400: the figures are bounds, not
counts. What it cannot catch (documented in README "Under a flood"): fan-out (``n``,
``best_of``, prompt lists: one sequence is assumed), media parts, the client's output limit
(a pass keeps ``max_tokens`` as sent), a prompt over max_model_len (the backend's own 400),
malformed bodies (the backend's own 4xx). A pass is held in the in-flight ledger with P and
the output, like a full verdict.
"""

from __future__ import annotations

import math

from ext_proc.policy.evaluate import shed_by_priority, shed_on_kv_shortfall
from ext_proc.schemas import RequestFeatures, SchemaAdapter

__all__ = [
    "COARSE_LADDER",
    "H_JUDGED",
    "TEMPLATE_SLACK_TOKENS",
    "TOKENS_PER_BYTE",
    "coarse_features",
    "coarse_tokens",
]

H_JUDGED = "x-ice-judged"
TOKENS_PER_BYTE = 1.0
TEMPLATE_SLACK_TOKENS = 256
COARSE_LADDER = (shed_by_priority, shed_on_kv_shortfall)
_NOT_GENERATING = ("openai.embeddings",)


def coarse_tokens(nbytes: int, max_model_len: int | None) -> int:
    """The prompt-token bound of a body of ``nbytes`` (see the module docstring)."""
    tokens = math.ceil(nbytes * TOKENS_PER_BYTE) + TEMPLATE_SLACK_TOKENS
    return tokens if max_model_len is None else min(tokens, max_model_len)


def coarse_features(
    adapter: SchemaAdapter, nbytes: int, max_model_len: int | None
) -> RequestFeatures:
    """What the coarse verdict assumes of a request of ``nbytes`` on ``adapter``'s API."""
    generates = adapter.name not in _NOT_GENERATING
    return RequestFeatures(
        schema=adapter.name,
        model=None,
        input_tokens=coarse_tokens(nbytes, max_model_len),
        max_tokens=None,
        max_tokens_field=None,
        stream=False,
        message_count=0,
        input_tokens_source="bound",
        generates=generates,
        inputs=1 if not generates else 0,
    )
