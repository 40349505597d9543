"""``CounterRegistry``: served model name → ``ExactCounter``, built once from configuration.

Job: load every configured ``TokenizerSpec`` at start-up (eagerly: a bad file stops start-up
with a ``TokenizerLoadError`` that names ``tokenizers.<model>``, the file and the problem),
share one counter among models whose specs are equal (``TokenizerSpec.key``), and answer
``counter_for(model)`` (None: estimate instead). With ``estimate`` (the schema adapters'
figure) each counter measures its estimate bounds at load (``calibration``), and derives the
bounds that hold for any text (``derived``); the load log names each model's split and bounds.
``tokens_per_byte`` is the most tokens a byte of text can become under any of them (at least
1): what the header-only verdict charges a body's byte.

``learn`` merges the piece counts another process's counters made (``pieces.Lesson``: the
helper process teaches its worker) into the counter of the same tokenizer.

Invariant: immutable after construction (read-only mappings; only the counters' piece
caches change), so it is shared by threads; there is no module state but its logger.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Iterator, Mapping
from types import MappingProxyType
from typing import Any

from ext_proc.tokencount.calibration import Estimator
from ext_proc.tokencount.counter import ExactCounter
from ext_proc.tokencount.newtext import Lesson
from ext_proc.tokencount.pieces import DEFAULT_CACHE_BYTES
from ext_proc.tokencount.spec import TokenizerLoadError, TokenizerSpec

log = logging.getLogger(__name__)


class CounterRegistry:
    """Served model name → ``ExactCounter``, loaded once (eagerly, so a bad file stops
    start-up with ``TokenizerLoadError``). Models whose specs are equal share a counter."""

    __slots__ = ("_counters", "_distinct")

    def __init__(
        self,
        specs: Mapping[str, TokenizerSpec] | None = None,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        estimate: Estimator | None = None,
    ) -> None:
        loaded: dict[tuple[Any, ...], ExactCounter] = {}
        counters: dict[str, ExactCounter] = {}
        for model, spec in (specs or {}).items():
            key = spec.key()
            if key not in loaded:
                try:
                    loaded[key] = ExactCounter.load(spec, cache_bytes, estimate)
                except TokenizerLoadError as e:
                    raise TokenizerLoadError(f"tokenizers.{model}: {e}") from None
            counters[model] = loaded[key]
            c = loaded[key]
            b = c.bounds
            d = b.derived
            if d is not None:
                log.info(
                    "tokenizer for %s: derived bounds: %.4f-%.2f tokens per estimated token "
                    "(widest token %r, %.2f; highest %r), %.2f tokens per byte, in %.0f ms",
                    model,
                    d.low,
                    d.high,
                    d.widest_token[:40],
                    d.token_weight,
                    d.widest_high[:40],
                    d.tokens_per_byte,
                    d.derive_s * 1000,
                )
            # whole texts are exact but cost the whole conversation every turn: a warning
            log.log(
                logging.WARNING if c.count_mode == "whole" else logging.INFO,
                "tokenizer for %s: counting by %s (split %s); estimate bounds %.2f-%.2f %s%s",
                model,
                c.count_mode,
                c.split,
                b.low,
                b.high,
                b.source,
                f" (lowest {b.worst_low}, highest {b.worst_high})" if b.worst_high else "",
            )
        self._counters = MappingProxyType(counters)
        self._distinct = tuple(loaded.values())

    @property
    def tokens_per_byte(self) -> float:
        """The most tokens one byte of text can become under any loaded tokenizer (≥ 1)."""
        derived = (c.bounds.derived for c in self._distinct)
        return max([1.0, *(d.tokens_per_byte for d in derived if d is not None)])

    def counter_for(self, model: str | None) -> ExactCounter | None:
        """The counter for a request's ``model``, or None (then estimate)."""
        if model is None:
            return None
        return self._counters.get(model)

    def learn(self, lessons: Iterable[Lesson]) -> int:
        """Merge piece counts made elsewhere into the counters of the same identity (a
        lesson for a tokenizer not loaded here is dropped); returns the entries added."""
        return sum(c.learn(lesson) for lesson in lessons for c in self._distinct)

    def __len__(self) -> int:
        return len(self._counters)

    def __iter__(self) -> Iterator[str]:
        return iter(self._counters)
