"""ICE's own faults while judging a body, named by the stage they happened in.

``judging(stage)`` turns an exception inside into a ``JudgeFault`` (decode, features, count,
judge, plan), except, with ``client=True``, those that say the body breaks its API (invalid
JSON, a ``BadRequest``, nesting too deep): the pipeline answers those with the API's 400. The
shell (``ext_proc.serve.servicer``) counts a fault by its stage and answers by the profile's
``fail_mode``.

Invariant: a ``JudgeFault`` holds plain strings only, so it pickles (from the helper process
too); an inner stage's fault keeps its own stage.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from ext_proc.schemas import BadRequest, rawjson

__all__ = ["JudgeFault", "judging"]


class JudgeFault(Exception):
    """ICE's own fault while judging a body: its stage (decode, features, count, judge,
    plan), the error's type and message (plain strings: it pickles, from the helper too)."""

    def __init__(self, stage: str, kind: str, message: str) -> None:
        super().__init__(stage, kind, message)
        self.stage, self.kind = stage, kind

    def __str__(self) -> str:
        return f"{self.kind} while judging ({self.stage}): {self.args[2]}"


@contextmanager
def judging(stage: str, client: bool = False) -> Iterator[None]:
    """An exception inside is ICE's fault at ``stage`` (``JudgeFault``; an inner stage's
    stays its own), but (``client``) those that say the body breaks its API: a 400."""
    try:
        yield
    except JudgeFault:
        raise
    except Exception as e:
        if client and isinstance(e, rawjson.InvalidJSON | BadRequest | RecursionError):
            raise
        raise JudgeFault(stage, type(e).__name__, str(e)[:300]) from e
