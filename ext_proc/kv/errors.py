"""The two ways KV arithmetic refuses an input.

- ``KVInputError``: an input is missing, malformed or contradicts another; ``field`` names it
  (a config.json key such as ``num_hidden_layers`` or a CLI option such as ``tp``).
- ``NotModelledError``: the input is understood but describes a cache this package does not
  model (Mamba/SSM or linear-attention hybrids, chunked local attention, sparse-attention
  indexers, per-layer head counts, quantised KV formats with scales). Raised instead of
  returning a figure that would be silently wrong.

``ice plan`` turns either into exit status 2 with ``ice plan: <field>: <message>``.
"""

from __future__ import annotations

__all__ = ["KVInputError", "NotModelledError"]


class KVInputError(ValueError):
    """An input is missing, malformed or contradictory; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class NotModelledError(KVInputError):
    """The model's KV cache is recognised but not modelled here (see the module docstring)."""
