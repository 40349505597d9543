"""Prefix stability: how much of each prompt a prefix cache could reuse, and what breaks it.

Job: vLLM's prefix cache reuses a prompt's leading full blocks of ``block_size`` tokens when
an earlier prompt had the same ones (each block's hash chains the previous block's). A
route whose prompts put a timestamp, a request id, a user's name or tools in a shuffled
order early on reuses almost nothing. This package measures it live (``PrefixTracker``:
Σ shared leading blocks / Σ prompt blocks over a window, per route) and explains it offline
(``ice prefix-report``: where consecutive prompts of a template first differ, and the kind
of value, with redacted context). See docs/prefix.md.

Modules:
- ``blocks``: chained sha256 block hashes, vLLM's hit cap, pseudo-tokens for text;
- ``tracker``: ``PrefixTracker`` (bounded per-route LRU tables and windows, thread-safe);
- ``render``: a request body as prompt text with named sections (system, tools, turns);
- ``diverge``: template fingerprints, divergence sites and their kinds, redaction;
- ``report``: the per-route report; ``cli``: ``ice prefix-report``.

Invariants: no module state; nothing here keeps or prints prompt text except the redacted
contexts of ``diverge``; the tracker's memory is bounded (``PrefixTracker.memory_bound_bytes``).
"""

from __future__ import annotations

from ext_proc.prefix.blocks import (
    DEFAULT_BLOCK_SIZE,
    block_hashes,
    hit_blocks,
    pseudo_tokens,
    shared_leading_blocks,
)
from ext_proc.prefix.render import render_body
from ext_proc.prefix.tracker import PrefixTracker, RouteStats

__all__ = [
    "DEFAULT_BLOCK_SIZE",
    "PrefixTracker",
    "RouteStats",
    "block_hashes",
    "hit_blocks",
    "pseudo_tokens",
    "render_body",
    "shared_leading_blocks",
]
