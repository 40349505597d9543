"""The one error a bad policy file raises."""

from __future__ import annotations

__all__ = ["PolicyError"]


class PolicyError(ValueError):
    """A policy file is invalid; the message names the field and the problem."""
