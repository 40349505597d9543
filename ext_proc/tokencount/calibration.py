"""The estimate's bounds for one tokenizer, measured at load on a shipped, generated sample.

Job: ``exact_count: needed`` lets the cheap estimate decide when the verdict is the same at
``⌈estimate × low⌉`` and at ``⌈estimate × high⌉`` (``ext_proc.admit.counting``), and holds a
request at the high end: that is only safe when every exact count lies in between. How far a
tokenizer strays from the estimate depends on its vocabulary (byte fallback spends 3–4 tokens
on an emoji or a CJK character the estimate prices at one; a digit-splitting vocabulary one
token a digit where the estimate puts four digits in a token), so the bounds are measured per
tokenizer, not assumed:

    rᵢ   = exact(sampleᵢ) / estimate(sampleᵢ)           over CALIBRATION's requests
    low  = min(DEFAULT_LOW,  ⌊minᵢ rᵢ / MARGIN⌋₀.₀₁)
    high = max(DEFAULT_HIGH, ⌈maxᵢ rᵢ × MARGIN⌉₀.₀₁)

(⌊⌋₀.₀₁ / ⌈⌉₀.₀₁: rounded down / up to a hundredth; ``MARGIN`` 1.25 covers mixtures and
lengths the sample lacks; never narrower than the 0.5–2.0 assumed before, so measuring only
widens). ``exact`` is the counter's own count (chat: template + encode; completions: encode
with the BOS the post-processor adds); ``estimate`` is the caller's (``ExactCounter.load``'s
``estimate``: the schema adapters' figure for the same body, ``input_tokens``).

The sample (``calibration_requests``) is generated from a fixed seed, one chat request per
class of text an estimate gets wrong in a different way: prose, code, CSV, logs, JSON,
digits, hex, base64, emoji, CJK, narrow non-ASCII (arrows, box drawing, maths), accented
Latin and Cyrillic, combining marks, whitespace runs, ASCII punctuation runs, a conversation
of empty turns (the template's framing), one short turn; and the same texts as completions
prompts. Each text is ~2,000 characters: long enough that the template's framing does not
dominate, so ratios reflect the vocabulary.

Invariants: pure given the counter and estimate; ``calibration_requests`` returns equal
values on every call; ``low ≤ DEFAULT_LOW < DEFAULT_HIGH ≤ high``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from ext_proc.tokencount.derived import DerivedBounds

__all__ = [
    "DEFAULT_BOUNDS",
    "DEFAULT_HIGH",
    "DEFAULT_LOW",
    "MARGIN",
    "SAMPLE_WORDS",
    "EstimateBounds",
    "Estimator",
    "calibration_requests",
    "measure_bounds",
]

DEFAULT_LOW = 0.5
DEFAULT_HIGH = 2.0
MARGIN = 1.25
SAMPLE_CHARS = 2000
SEED = 31

# (api, body) → the estimate's input tokens for that request (the schema adapters' figure).
Estimator = Callable[[str, Mapping[str, Any]], int]
# (api, body) → the exact count.
Exact = Callable[[str, Mapping[str, Any]], int]


@dataclass(frozen=True, slots=True)
class EstimateBounds:
    """exact ÷ estimate lies in [low, high] for this tokenizer on the sample (see the module
    doc). ``source``: measured on the sample, or assumed (no estimator given at load);
    ``derived``: the bounds the tokenizer itself gives for any text (``derived``), which
    ``ext_proc.admit.counting`` widens these with."""

    low: float
    high: float
    source: Literal["measured", "assumed"] = "assumed"
    worst_low: str = ""  # the sample class of the smallest ratio, and the ratio
    worst_high: str = ""  # the sample class of the largest ratio, and the ratio
    derived: DerivedBounds | None = None

    @property
    def factors(self) -> tuple[float, float]:
        return self.low, self.high


DEFAULT_BOUNDS = EstimateBounds(DEFAULT_LOW, DEFAULT_HIGH)

# Words of the serving domain, also the filler of the long-context bench and its tests.
SAMPLE_WORDS = (
    "memory",
    "cache",
    "block",
    "token",
    "prefix",
    "request",
    "server",
    "queue",
    "model",
    "gateway",
)

_WORDS = [
    "the",
    *SAMPLE_WORDS,
    "budget",
    "batch",
    "was",
    "new",
    "old",
    "admit",
    "refuse",
    "count",
    "exact",
    "estimate",
    "window",
    "context",
    "length",
    "policy",
    "tenant",
    "priority",
    "pressure",
    "backend",
    "endpoint",
    "latency",
    "throughput",
    "decode",
    "prefill",
    "stream",
    "reply",
    "agent",
    "tool",
    "call",
    "result",
    "history",
    "turn",
    "system",
    "user",
    "assistant",
    "a",
    "an",
    "of",
    "to",
    "in",
    "on",
    "for",
    "with",
]


def _pick(rng: random.Random, lo: int, hi: int, n: int) -> str:
    return "".join(chr(rng.randint(lo, hi)) for _ in range(n))


def _fill(make: Callable[[random.Random], str], rng: random.Random) -> str:
    out = ""
    while len(out) < SAMPLE_CHARS:
        out += make(rng)
    return out[:SAMPLE_CHARS]


def _texts() -> dict[str, str]:
    rng = random.Random(SEED)
    words = _WORDS
    return {
        "prose": _fill(lambda r: " ".join(r.choices(words, k=12)).capitalize() + ". ", rng),
        "code": _fill(
            lambda r: (
                f"    def {r.choice(words)}_{r.randint(0, 99)}(self, x: int) -> int:\n"
                f"        return x * {r.randint(2, 999)} + self.{r.choice(words)}"
                f"  # {r.choice(words)}\n"
            ),
            rng,
        ),
        "csv": _fill(
            lambda r: (
                f"{r.randint(1000, 99999)},2026-05-{r.randint(10, 28)}T12:{r.randint(10, 59)}"
                f":0{r.randint(0, 9)}Z,web-{r.randint(1, 20):02d},{r.uniform(0, 999):.2f},"
                f"{r.choice([200, 404, 500])}\n"
            ),
            rng,
        ),
        "logs": _fill(
            lambda r: (
                f"2026-05-01 12:{r.randint(10, 59)}:{r.randint(10, 59)},{r.randint(100, 999)} "
                f"{r.choice(['INFO', 'WARN', 'ERROR'])} [worker-{r.randint(1, 16)}] GET /api/v1/"
                f"{r.choice(words)}/{r.getrandbits(32):08x} took {r.randint(1, 999)}ms\n"
            ),
            rng,
        ),
        "json": _fill(
            lambda r: (
                f'{{"id":{r.randint(0, 10**6)},"{r.choice(words)}":[{r.random():.6f},'
                f'{r.randint(-99, 99)}],"ok":{r.choice(["true", "false", "null"])}}},'
            ),
            rng,
        ),
        "digits": _fill(lambda r: str(r.getrandbits(64)), rng),
        "hex": _fill(lambda r: f"{r.getrandbits(128):032x}", rng),
        "base64": _fill(
            lambda r: (
                "".join(
                    r.choices(
                        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/", k=76
                    )
                )
                + "\n"
            ),
            rng,
        ),
        **_unicode_texts(rng),
    }


def _unicode_texts(rng: random.Random) -> dict[str, str]:
    return {
        "emoji": _pick(rng, 0x1F300, 0x1F64F, SAMPLE_CHARS // 2),
        "cjk": _pick(rng, 0x4E00, 0x9FFF, SAMPLE_CHARS // 2),
        "narrow": _pick(rng, 0x2190, 0x21FF, SAMPLE_CHARS // 4)
        + _pick(rng, 0x2500, 0x257F, SAMPLE_CHARS // 4),
        "latin": _fill(
            lambda r: r.choice(["émigré", "naïve", "Größe", "Привет", "мир", "Ελλάδα", "ça"]) + " ",
            rng,
        ),
        "combining": _fill(lambda r: r.choice("aeiou") + _pick(r, 0x0300, 0x036F, 2), rng),
        "whitespace": _fill(
            lambda r: r.choice(_WORDS) + r.choice([" " * r.randint(2, 40), "\t" * 3, "\n" * 4]),
            rng,
        ),
        "punctuation": _fill(lambda r: r.choice("-=*#|_~.:;!?<>/\\") * r.randint(1, 12), rng),
    }


def calibration_requests() -> list[tuple[str, str, dict[str, Any]]]:
    """(class, api, body): each class's text as one user turn and as a completions prompt;
    then the framing cases (20 empty turns, one short turn)."""
    out: list[tuple[str, str, dict[str, Any]]] = []
    for name, text in _texts().items():
        out.append((name, "openai.chat", {"messages": [{"role": "user", "content": text}]}))
        out.append((f"{name} (prompt)", "openai.completions", {"prompt": text}))
    empty = [{"role": "user" if i % 2 == 0 else "assistant", "content": ""} for i in range(21)]
    out.append(("empty turns", "openai.chat", {"messages": empty}))
    out.append(("short turn", "openai.chat", {"messages": [{"role": "user", "content": "Hi"}]}))
    return out


def measure_bounds(exact: Exact, estimate: Estimator) -> EstimateBounds:
    """The bounds of the module doc over ``calibration_requests``; a request either side
    cannot count (its template refuses, say) is left out."""
    ratios: list[tuple[float, str]] = []
    for name, api, body in calibration_requests():
        try:
            got, est = exact(api, body), estimate(api, body)
        except ValueError:  # TokenCountError, or the adapter's BadRequest
            continue
        if est > 0:
            ratios.append((got / est, name))
    if not ratios:
        return DEFAULT_BOUNDS
    (lo, lo_name), (hi, hi_name) = min(ratios), max(ratios)
    return EstimateBounds(
        low=min(DEFAULT_LOW, math.floor(lo / MARGIN * 100) / 100),
        high=max(DEFAULT_HIGH, math.ceil(hi * MARGIN * 100) / 100),
        source="measured",
        worst_low=f"{lo_name} {lo:.2f}",
        worst_high=f"{hi_name} {hi:.2f}",
    )
