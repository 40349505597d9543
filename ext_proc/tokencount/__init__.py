"""Exact prompt-token counts: a model's own tokenizer and chat template, applied as vLLM does.

Job: when the policy names a tokenizer for a model, count a request's prompt tokens exactly
(the number vLLM reports as ``usage.prompt_tokens``) instead of estimating them
(``ext_proc.schemas.estimate``). ``ExactCounter`` holds one Hugging Face ``tokenizers`` tokenizer
(``tokenizer.json``) and the model's chat template (jinja2); ``CounterRegistry`` maps served
model names to counters, loaded once from configuration.

What is mirrored (vLLM 0.32 with transformers 5, text content; checked against a real vLLM
server in ``tests/tokencount/test_tokencount.py``):

- ``/v1/completions``: ``encode(prompt, add_special_tokens=True)``: the tokenizer's
  post-processor adds BOS/EOS as ``tokenizer.json`` says (``add_bos_token`` in
  ``tokenizer_config.json`` is ignored when a ``tokenizer.json`` exists, as in transformers).
- ``/v1/chat/completions``: messages become the template's conversation (string content
  as is; content-part arrays joined with ``"\\n"``, empty texts dropped, unless the template
  loops over ``message.content``, when text parts stay ``{"type": "text", "text": ...}``
  dicts; ``None`` content is ``""``; assistant ``tool_calls`` arguments are parsed into
  objects; ``developer`` becomes ``system`` when the template never names ``developer``);
  the template is rendered in transformers' sandbox (``ImmutableSandboxedEnvironment``,
  ``trim_blocks``, ``lstrip_blocks``, ``loopcontrols``, ``raise_exception``,
  ``strftime_now``, a non-escaping ``tojson``) with the named special tokens of
  ``tokenizer_config.json`` (``bos_token``, ``eos_token``, ...), ``tools`` and
  ``add_generation_prompt=True``; the text is encoded with ``add_special_tokens=False`` (a
  template that writes ``{{ bos_token }}`` is what adds BOS).
- ``/v1/messages`` (Anthropic): converted to chat first as vLLM's Anthropic endpoint does:
  top-level ``system`` text blocks joined with ``""`` into one leading system message; text
  blocks of a message kept as parts (so joined with ``"\\n"``), a single one as a string;
  ``tool_use`` → ``tool_calls``; a user's ``tool_result`` → a ``tool`` message before it;
  inline system messages merged into the leading one when the template rejects a system
  message after the first turn.

Not exact: images, audio and video parts (their tokens come from the model's processor):
``TokenCountError``, so the caller falls back to the estimate. Tokenizer classes whose
transformers code rebuilds the tokenizer instead of reading ``tokenizer.json`` (some
SentencePiece-era ones) may differ by a token or two; templates that print the date
(``strftime_now``) count today's date, as vLLM does.

Modules, in the order a request meets them:
- ``spec``: ``TokenizerSpec`` (where a model's files are) and the two errors;
- ``templates``: transformers' jinja sandbox, vLLM's template analysis (content format,
  system-first, ``developer``) and reading ``tokenizer_config.json``;
- ``shaping``: vLLM's ``parse_chat_messages`` for text (the template's conversation, tool
  calls, ``developer``, tools) and transformers' ``continue_final_message``;
- ``anthropic``: ``/v1/messages`` → chat messages and tools, as vLLM converts them;
- ``splits``: which split of a rendered prompt counts exactly for this tokenizer (every
  piece alike, or the first with the tokenizer and the rest without Metaspace's
  ``prepend_scheme: first``), the template's turn marker, and the adversarial texts a split
  must count exactly at load;
- ``pieces``: ``PieceCounter`` (a rendered prompt counted piece by piece, from a cache);
- ``newtext``: a bound on the new text a count may encode (``new_text_bound``) and the piece
  counts one process teaches another (``Lesson``: digests and counts);
- ``calibration``: the estimate's bounds (exact ÷ estimate) for this tokenizer, measured at
  load on a generated sample;
- ``derived``: the bounds the tokenizer itself gives for any text (its widest token, what its
  normalizer makes of every code point, the specials a user can type, the template's
  framing), derived once at load; ``exact_count: needed`` judges at the wider of the two, and
  the header-only verdict charges a byte the most tokens any loaded tokenizer makes of one;
- ``counter``: ``ExactCounter`` (loading, reading a request body, rendering, encoding);
- ``registry``: ``CounterRegistry`` (served model name → counter).

Invariants:
- An ``ExactCounter`` is immutable after ``load``: every method may run in many threads at
  once (the Rust tokenizer is only read, and ``encode`` releases the GIL; each render gets its
  own jinja context). A ``CounterRegistry`` is immutable too; there is no module state but
  ``newtext``'s context variables (a bound or notes, per thread or task, within a ``with``).
- Counting by pieces equals counting the whole text (checked at load for the tokenizer and
  template at hand, else whole texts are counted); the truncation and padding a
  ``tokenizer.json`` may set are turned off, as transformers does when encoding.
- Loading raises only ``TokenizerLoadError``, whose message names the file and the problem.
  Counting raises only ``TokenCountError`` (the template raised, or content it cannot
  count): callers keep their estimate then; no other exception escapes for JSON input, but
  ``NewTextOverBound`` inside a caller's ``newtext.new_text_bound``.
"""

from __future__ import annotations

from ext_proc.tokencount.anthropic import anthropic_to_chat
from ext_proc.tokencount.counter import API_NAMES, ExactCounter
from ext_proc.tokencount.registry import CounterRegistry
from ext_proc.tokencount.spec import (
    ContentFormat,
    TokenCountError,
    TokenizerLoadError,
    TokenizerSpec,
)

__all__ = [
    "API_NAMES",
    "ContentFormat",
    "CounterRegistry",
    "ExactCounter",
    "TokenCountError",
    "TokenizerLoadError",
    "TokenizerSpec",
    "anthropic_to_chat",
]
