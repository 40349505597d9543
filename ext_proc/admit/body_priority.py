"""The body's own ``priority`` field under the route's ``client_priority`` rule (pure).

vLLM served with ``--scheduling-policy priority`` orders its waiting queue by the body's
``priority`` integer, lower first (``vllm/v1/core/sched/request_queue.py``: "requests with a
smaller value of ``priority`` are processed first"; default 0), and preempts the largest
value first when blocks run out. Every vLLM request type ICE judges carries it at the top
level (chat, batch chat, completions, Responses, embeddings, ``/inference/v1/generate``,
and so ``/invocations``), except ``/v1/messages``, whose Anthropic request vLLM turns into a
chat request without it. SGLang reads ``priority`` too, but its order is a server flag
(``--schedule-low-priority-values-first``, off by default: larger first) and so is its
default (``--default-priority-value``).

The rule is the priority header's (``ext_proc.admit.headers.judged_priority``):
- ``trust``: the field goes on as sent;
- ``ignore``: it is removed (the server's default applies);
- ``cap``: a client may ask to go later, never earlier. On vLLM it is kept only when it is a
  JSON integer ≥ 0 (at or behind the default); anything else (a negative number, a float, a
  string vLLM would coerce, null) is removed. On SGLang (the pool's ``kind: sglang``, or the
  ``sglang_generate`` schema) ICE cannot know which way is earlier: removed.

A ``priority`` given twice is a 400 ``duplicate_key`` unless trusted (a first-copy-wins
reader would see the other copy). Removal is a minimal edit (``rawjson.remove_member``):
every other byte of the body stays as sent; a body with nothing to remove is untouched.
"""

from __future__ import annotations

from typing import Any

from ext_proc.policy.settings import ClientPriority
from ext_proc.schemas import rawjson
from ext_proc.schemas.base import check_keys

__all__ = ["FIELD", "READ_BY", "keeps", "strip_priority"]

FIELD = "priority"
# the schemas whose server reads a top-level ``priority`` (not anthropic.messages)
READ_BY = frozenset(
    (
        "openai.chat",
        "openai.chat_batch",
        "openai.completions",
        "openai.responses",
        "openai.embeddings",
        "sagemaker.invocations",
        "vllm.generate",
        "sglang.generate",
    )
)


def keeps(value: Any, mode: ClientPriority, server: str) -> bool:
    """Whether the body's ``priority`` ``value`` goes on under ``mode`` to a ``server``
    (``vllm`` or ``sglang``)."""
    if mode == "trust":
        return True
    if mode == "ignore" or server != "vllm":
        return False
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def strip_priority(
    doc: rawjson.TopLevel, schema: str, mode: ClientPriority, server: str
) -> rawjson.TopLevel | None:
    """``doc`` without its ``priority`` when the rule removes it; None: it goes on as it is.
    Raises ``BadRequest`` (``duplicate_key``) for a repeated ``priority`` not trusted."""
    if schema not in READ_BY or FIELD not in doc.values or mode == "trust":
        return None
    check_keys(doc.values, (FIELD,))
    if schema == "sglang.generate":
        server = "sglang"
    if keeps(doc.values[FIELD], mode, server):
        return None
    return rawjson.remove_member(doc, FIELD)
