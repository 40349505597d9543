"""What ``ice doctor`` reports: one ``Check`` per item, and how a list of them is printed.

Job: the result record and its two renderings (one line per check, or a JSON list), plus the
exit status a list of checks gives.

Invariants:
- ``status`` is one of ``STATUSES``: ``PASS`` (verified), ``WARN`` (works, but not as the
  production checklist asks), ``FAIL`` (broken or unverifiable because something is
  unreachable), ``MANUAL`` (cannot be checked from outside: the operator must).
- ``fix`` is empty for a ``PASS``; the text line shows it as ``(fix: ...)``.
- The exit status is 1 when any check FAILs, else 0. Pure: no I/O here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Literal

__all__ = ["STATUSES", "Check", "Status", "exit_status", "fail", "render_json", "render_text"]

Status = Literal["PASS", "WARN", "FAIL", "MANUAL"]
STATUSES: tuple[Status, ...] = ("PASS", "WARN", "FAIL", "MANUAL")


@dataclass(frozen=True, slots=True)
class Check:
    """One verdict: ``name`` is stable (``envoy.processing_mode``), ``detail`` says what was
    seen, ``fix`` what to change (empty when nothing needs to)."""

    status: Status
    name: str
    detail: str
    fix: str = ""


def fail(name: str, detail: str, fix: str) -> Check:
    return Check("FAIL", name, detail, fix)


def render_text(checks: Iterable[Check]) -> str:
    """``STATUS  name  detail (fix: ...)``, one line per check, columns aligned."""
    rows = list(checks)
    width = max((len(c.name) for c in rows), default=0)
    lines = []
    for c in rows:
        line = f"{c.status:<6}  {c.name:<{width}}  {c.detail}"
        if c.fix and c.status != "PASS":
            line += f" (fix: {c.fix})"
        lines.append(line.rstrip())
    return "\n".join(lines)


def render_json(checks: Iterable[Check]) -> str:
    return json.dumps([asdict(c) for c in checks], indent=2, ensure_ascii=False)


def exit_status(checks: Sequence[Check]) -> int:
    return 1 if any(c.status == "FAIL" for c in checks) else 0
