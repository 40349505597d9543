"""What every policy loader reads from a protobuf message: a field's value, or its default.

The one rule: an optional scalar the YAML left out (``HasField`` false) takes the loader's
default; one that is set keeps its value, zero included.
"""

from __future__ import annotations

from typing import Any

__all__ = ["opt"]


def opt(msg: Any, name: str, default: Any) -> Any:
    """``msg.name`` when the policy set it, else ``default``."""
    return getattr(msg, name) if msg.HasField(name) else default
