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

from types import TracebackType

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


class _Judging:
    """The context of ``judging``: stateless, so one per (stage, client) serves every body
    (a generator-based context manager cost ~3 µs a use on the request path; this, ~0.3)."""

    __slots__ = ("client", "stage")

    def __init__(self, stage: str, client: bool) -> None:
        self.stage, self.client = stage, client

    def __enter__(self) -> None:
        return None

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if e is None or isinstance(e, JudgeFault) or not isinstance(e, Exception):
            return
        if self.client and isinstance(e, rawjson.InvalidJSON | BadRequest | RecursionError):
            return
        raise JudgeFault(self.stage, type(e).__name__, str(e)[:300]) from e


_CONTEXTS: dict[tuple[str, bool], _Judging] = {}


def judging(stage: str, *, client: bool = False) -> _Judging:
    """An exception inside is ICE's fault at ``stage`` (``JudgeFault``; an inner stage's
    stays its own), but (``client``) those that say the body breaks its API: a 400."""
    key = (stage, client)
    context = _CONTEXTS.get(key)
    if context is None:
        context = _CONTEXTS[key] = _Judging(stage, client)
    return context
