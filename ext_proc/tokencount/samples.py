"""Sample conversations a counter renders at load to check counting by pieces (``pieces``).

Invariant: plain data; every template must render them or raise ``TokenCountError``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["SAMPLE_CONVERSATIONS", "SAMPLE_TOOLS"]

# Conversations whose renders must count the same by pieces and whole: roles, whitespace at
# the edges of turns, newlines, digits, non-Latin text, empty and repeated turns.
SAMPLE_CONVERSATIONS: tuple[tuple[dict[str, Any], ...], ...] = (
    ({"role": "user", "content": "Hello there"},),
    (
        {"role": "system", "content": "You are a helpful assistant.\n\nAnswer briefly."},
        {"role": "user", "content": "  What is 12345 + 678?  "},
        {"role": "assistant", "content": "\n12345 + 678 = 13023.\n"},
        {"role": "user", "content": "内存压力 and émigré naïve café, then tabs\tand spaces   "},
    ),
    (
        {"role": "user", "content": ""},
        {"role": "assistant", "content": " "},
        {"role": "user", "content": "again\n\n\nagain"},
        {"role": "assistant", "content": "again\n\n\nagain"},
        {"role": "user", "content": "'quoted' \"double\" {json: [1, 2]} <tag> & done."},
    ),
)
SAMPLE_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]
