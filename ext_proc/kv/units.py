"""Byte sizes as people write them: ``"3.81GiB"`` → ``4090956349``.

Job: turn a size string into an exact integer number of bytes, and bytes back into the
two-decimal GiB figure vLLM prints in its start-up log.

Grammar: ``NUMBER [UNIT]`` with optional spaces; NUMBER is ``DIGITS`` or ``DIGITS.DIGITS``
(no sign, no exponent); UNIT, case-insensitive:

=========  ===============  =========  ===============
unit       bytes            unit       bytes
=========  ===============  =========  ===============
(none), B  1                KB         10^3
KiB        2^10             MB         10^6
MiB        2^20             GB         10^9
GiB        2^30             TB         10^12
TiB        2^40
=========  ===============  =========  ===============

Result: ``floor(NUMBER × unit)``, computed on integers (no float rounding):
``"3.81GiB"`` → ``floor(3.81 × 2^30)`` = 4,090,956,349; ``"1.5"`` → 1.

Invariant: pure functions; ``parse_size`` raises ``ValueError`` (never returns a negative
or a float) and names the text it could not read.
"""

from __future__ import annotations

import re

__all__ = ["UNIT_BYTES", "format_gib", "parse_size"]

UNIT_BYTES: dict[str, int] = {
    "": 1,
    "b": 1,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
    "tib": 1 << 40,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
}

_SIZE = re.compile(r"\s*(\d+)(?:\.(\d+))?\s*([A-Za-z]*)\s*")


def parse_size(text: str) -> int:
    """Exact bytes in ``text`` (see the module docstring); ``ValueError`` if unreadable."""
    m = _SIZE.fullmatch(text)
    if m is None:
        raise ValueError(f"not a size: {text!r} (use e.g. 3.81GiB, 80GB, 512MiB or bytes)")
    whole: str = m.group(1)
    frac: str = m.group(2) or ""
    unit: str = m.group(3).lower()
    mult: int | None = UNIT_BYTES.get(unit)
    if mult is None:
        raise ValueError(f"unknown size unit {m.group(3)!r} in {text!r} (B, KiB..TiB, KB..TB)")
    scale: int = 10 ** len(frac)
    return (int(whole) * scale + int(frac or "0")) * mult // scale


def format_gib(n_bytes: int) -> str:
    """``n_bytes`` in GiB with two decimals, as vLLM logs sizes (``"3.81"``)."""
    return f"{n_bytes / (1 << 30):.2f}"
