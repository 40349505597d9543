"""Bounds on a tokenizer's count that hold for any text, derived from the tokenizer itself.

Job: ``exact_count: needed`` lets the estimate (``ext_proc.schemas.estimate``) decide when the
verdict is the same at a lower and an upper bound of the exact count, and the header-only
verdict counts the most tokens a body of L bytes can hold. Both are only safe when the bounds
hold for every text, adversarial included: a literal special token repeated, a CJK word the
vocabulary holds whole, a character NFKC expands (ﷺ → 18 characters, ㍿ → 4). Ratios measured on
a sample (``calibration``) do not; these are derived from the tokenizer's own parts.

Units. The estimate prices each character c at a weight w(c), in estimate tokens: 1/4 for
ASCII, 1 for "wide" characters (UTF-8 lead 0xE3–0xED, 0xEF, or four bytes), 1/2 for every
other ("narrow"); a text's estimate is ⌈ascii/4⌉ + wide + ⌈narrow/2⌉ ≥ Σ w(c), and
Σ w(c) ≥ estimate/4 (a one-character ASCII text: w = 1/4, estimate 1). A **symbol** is the
smallest unit the model can give a token of: a byte-level character (``ByteLevel``), a
character in the vocabulary, or, with byte fallback, one byte of a character that is not.
Every token covers at least one symbol, so tokens ≤ symbols.

The tokenizer's pipeline (normalizer, then pre-tokenizer) is probed over every code point
(U+0000–U+10FFFF but the surrogates), in blocks: a block whose pipeline output is its own
symbols (after the pipeline's fixed prefix, e.g. Metaspace's "▁") maps every character to
itself; any other block is halved down to single characters, each measured alone:

    S(c)  = symbols(pipeline(c·c)) − symbols(pipeline(c))      (the per-string prefix cancels)
    K     = symbols(pipeline("a")) − S("a")                      (the prefix: "▁", "Ġ"; per text)

**High side** (most tokens per estimate token, and per byte of the request's text):

    h     = max( max_c S(c) / w(c),  max_a (1 + K) / w(a) )
    tpb   = max( max_c S(c) / len_utf8(c),  max_a (1 + K) / len_utf8(a) )

over code points c and the added tokens a (specials matched inside user text: one token, and
the text after it is a new segment that may get the prefix again). For a character the
pipeline keeps, S(c) is 1, or its UTF-8 length under ``ByteLevel`` or byte fallback: 4 per
ASCII estimate token, 6 for a three-byte narrow character (an arrow). NFKC's ﷺ (3 bytes,
weight 1) becomes 33 bytes of Arabic and spaces: up to 33 symbols, h ≥ 33, tpb ≥ 11. The
chat template adds its framing, measured at load by the counter (``framing``): F0 tokens for
one empty user turn with the reply primer, F1 more per further turn; the estimate prices
them at 3 + 4 per message, so for a request of M messages and estimate E (``upper``):

    exact ≤ ⌈h × E⌉ + P + K × (M + 1) + max(0, F0 − 7h) + M × max(0, F1 + 2 − 4h)

(P: the tokens the post-processor adds, BOS and the like; 2 per turn for tokens merged across
the edges of a turn's text.)

**Low side** (fewest tokens per estimate token): a token's text is normalized, so the weight
it can stand for is that of the original characters that normalize to its characters:
ŵ(d) = max(w(d), w(NFD(d)), max{w(c) : d ∈ pipeline(c)}), and W = max over the vocabulary's
tokens (and the added tokens' raw text) of Σ ŵ(d) over their characters (byte-fallback pieces
and the unknown token count 1). Then every token stands for at most W of the text's weight:

    exact ≥ ⌊max(0, E − 4M − 3) / (4 × W)⌋                       (``lower``)

unless the pipeline can **delete** a character (S(c) = 0: BERT's whitespace and control
characters, an accent it strips), the template trims a turn (``| trim``: a turn of
whitespace counts no more than an empty one), or one unknown token covers any number of characters
(WordPiece's ``[UNK]`` for a word, a fused unknown without byte fallback): then no text has
a lower bound above zero and ``lower`` is 0 (``exact_count: needed`` then never refuses from
the estimate: it counts).

What it does not cover: text the estimate prices that a template may render otherwise or
not at all (tool schemas, tool calls, reasoning, documents, template keywords): for such a
body the caller sets the lower bound to 0 (``ext_proc.admit.counting.plain``), and for the
upper bound takes the wider of this and the calibration's measured bound (``calibration``),
which covers the shipped sample's tools but not an adversarial nesting a template indents.

Invariants: ``derive`` is pure given the tokenizer and the framing (its results are cached by
the tokenizer's identity, computed once at load, never on the request path); ``lower(E, M)
≤ upper(E, M)``; ``tokens_per_byte ≥ 1`` and ``high ≥ 4``.
"""

from __future__ import annotations

import hashlib
import json
import math
import threading
import time
import unicodedata
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

__all__ = ["DerivedBounds", "derive", "derived_for", "weight"]

_BLOCK = 256
_MAX_CP = 0x110000
_SURROGATES = range(0xD800, 0xE000)
_BYTE_PIECE = "<0x"
_CACHE: dict[bytes, DerivedBounds] = {}
_LOCK = threading.Lock()


def weight(c: str) -> float:
    """The estimate's price of one character, in estimate tokens (the module docstring)."""
    cp = ord(c)
    if cp < 0x80:
        return 0.25
    if 0x3000 <= cp <= 0xDFFF or cp >= 0xF000:
        return 1.0
    return 0.5


def _text_weight(text: str) -> float:
    return sum(weight(c) for c in text)


@dataclass(frozen=True, slots=True)
class DerivedBounds:
    """What the tokenizer itself says about its counts (the module docstring)."""

    high: float  # h: most tokens per estimate token
    tokens_per_byte: float  # tpb: most tokens per UTF-8 byte of the text
    token_weight: float  # W: most estimate tokens one token stands for (inf: unbounded)
    deletes: bool  # the pipeline or the template can delete text: no lower bound above 0
    prefix_tokens: int  # K
    special_tokens: int  # P: what the post-processor adds
    framing_first: int  # F0
    framing_per_turn: int  # F1
    derive_s: float = 0.0  # how long the derivation took
    widest_high: str = ""  # the character or added token that sets h, for the load log
    widest_token: str = ""  # the token that sets W

    @property
    def low(self) -> float:
        """Fewest tokens per estimate token of the text (0: none can be promised)."""
        if self.deletes or math.isinf(self.token_weight):
            return 0.0
        return 1.0 / (4.0 * self.token_weight)

    def lower(self, estimate: int, messages: int) -> int:
        """The fewest tokens a request of ``estimate`` estimated tokens and ``messages``
        chat messages (0: a text prompt) can count."""
        return math.floor(max(0, estimate - 4 * messages - 3) * self.low)

    def upper(self, estimate: int, messages: int) -> int:
        """The most tokens such a request can count."""
        h, m = self.high, max(0, messages)
        framing = max(0.0, self.framing_first - 7 * h) + m * max(
            0.0, self.framing_per_turn + 2 - 4 * h
        )
        extra = self.special_tokens + self.prefix_tokens * (m + 1) + math.ceil(framing)
        return math.ceil(h * max(0, estimate)) + extra


# -- the pipeline


def _find(node: Any, kind: str) -> bool:
    if isinstance(node, dict):
        return node.get("type") == kind or any(_find(v, kind) for v in node.values())
    if isinstance(node, list):
        return any(_find(v, kind) for v in node)
    return False


def _byte_chars() -> list[str]:
    """GPT-2's byte → character table (what ``ByteLevel`` writes for each byte)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table, extra = {b: chr(b) for b in keep}, 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return [table[b] for b in range(256)]


class _Pipeline:
    """The tokenizer's normalizer and pre-tokenizer, counted in symbols."""

    def __init__(self, tok: Tokenizer, config: dict[str, Any]) -> None:
        self.norm = tok.normalizer
        self.pre = tok.pre_tokenizer
        model = config.get("model") or {}
        self.byte_level = _find(config.get("pre_tokenizer"), "ByteLevel")
        self.fallback = bool(model.get("byte_fallback"))
        self.vocab = set(tok.get_vocab(with_added_tokens=False))
        self.chars = _byte_chars() if self.byte_level else None
        self.table = dict(enumerate(self.chars)) if self.chars else None
        self.prefix = ""
        out = self.run("a")
        self.prefix = out[: -len(self.symbolize("a"))] if out.endswith(self.symbolize("a")) else ""

    def run(self, s: str) -> str:
        """The pipeline's output for ``s``, its pieces joined."""
        n = self.norm.normalize_str(s) if self.norm is not None else s
        if self.pre is None:
            return n
        return "".join(p for p, _ in self.pre.pre_tokenize_str(n))

    def symbolize(self, s: str) -> str:
        """``s`` as the model's symbols when the pipeline leaves it as it is."""
        if self.table is None:
            return s
        return s.encode("utf-8").decode("latin-1").translate(self.table)

    def symbols(self, out: str) -> int:
        if self.byte_level or not self.fallback:
            return len(out)
        return sum(1 if ch in self.vocab else len(ch.encode("utf-8")) for ch in out)

    def kept(self, c: str) -> int:
        """S(c) for a character the pipeline keeps as it is."""
        if self.byte_level or self.fallback:
            return len(c.encode("utf-8"))
        return 1


def _changed(p: _Pipeline) -> Iterable[int]:
    """The code points the pipeline does not keep as they are (the module docstring): a
    block of ``_BLOCK`` that changes is looked at in sixteenths, and a sixteenth that changes
    one character at a time; -1 for a block the pipeline deletes whole."""
    for lo in range(0, _MAX_CP, _BLOCK):
        if lo in _SURROGATES:
            continue
        if _same(p, lo, lo + _BLOCK):
            continue
        if _gone(p, lo, lo + _BLOCK):  # every character deleted (BERT's private use planes)
            yield -1
            continue
        step = _BLOCK // 16
        for sub in range(lo, lo + _BLOCK, step):
            if not _same(p, sub, sub + step):
                yield from (cp for cp in range(sub, sub + step) if not _same(p, cp, cp + 1))


def _gone(p: _Pipeline, lo: int, hi: int) -> bool:
    try:
        return p.run("".join(map(chr, range(lo, hi)))) in ("", p.prefix)
    except Exception:
        return False


def _same(p: _Pipeline, lo: int, hi: int) -> bool:
    s = "".join(map(chr, range(lo, hi)))
    try:
        return p.run(s) == p.prefix + p.symbolize(s)
    except Exception:  # a pipeline that refuses a character: measure them one by one
        return False


# -- derivation


@dataclass(slots=True)
class _Probe:
    """What the probe found so far: the high side, what sets it, the reach of each symbol."""

    high: float = 0.0
    high_at: str = ""
    per_byte: float = 1.0
    deletes: bool = False
    reach: dict[str, float] = field(default_factory=dict)

    def see(self, text: str, tokens: float, price: float) -> None:
        """``text`` (a character or an added token, priced at ``price`` estimated tokens)
        may become ``tokens`` tokens."""
        if tokens / price > self.high:
            self.high, self.high_at = tokens / price, text
        self.per_byte = max(self.per_byte, tokens / len(text.encode("utf-8")))


def _probe(p: _Pipeline, k: int, added: list[str]) -> _Probe:
    """Every code point through the pipeline, and the added tokens (the module docstring)."""
    found = _Probe()
    for c in ("a", "é", "→", "中", "😀"):  # kept: ASCII, two bytes, three narrow / wide, four
        found.see(c, p.kept(c), weight(c))
    for cp in _changed(p):
        if cp < 0:
            found.deletes = True
            continue
        c = chr(cp)
        try:
            once, twice = p.run(c), p.run(c + c)
        except Exception:  # the tokenizer refuses it in any text too: no count to bound
            continue
        s = max(p.symbols(twice) - p.symbols(once), p.symbols(once) - k)
        found.deletes = found.deletes or s <= 0
        w = weight(c)
        found.see(c, s, w)
        out = twice[len(once) :] or once  # what c becomes, less the prefix
        share = w / len(out) if out else 0.0  # c's weight, spread over its symbols
        for d in out:
            if found.reach.get(d, 0.0) < share:
                found.reach[d] = share
    for a in added:  # one token, and the segment after it may get the prefix again
        found.see(a, 1 + k, _text_weight(a))
    return found


def derive(
    tok: Tokenizer, framing: tuple[int, int, bool] = (0, 0, False), special_tokens: int = 0
) -> DerivedBounds:
    """The bounds of the module docstring for ``tok``; ``framing``: (F0, F1, trims), the chat
    template's tokens for one empty turn with the primer, per further turn, and whether it
    trims a turn's whitespace (``framing``); ``special_tokens``: P."""
    start = time.perf_counter()
    config = json.loads(tok.to_str())
    p = _Pipeline(tok, config)
    one = p.symbols(p.run("a"))
    k = max(0, one - (p.symbols(p.run("aa")) - one))
    added = [a.content for a in tok.get_added_tokens_decoder().values() if a.content]
    found = _probe(p, k, added)
    width, widest = _token_weight(p, config, found.reach, added)
    return DerivedBounds(
        high=max(4.0, found.high),
        tokens_per_byte=found.per_byte,
        token_weight=width,
        deletes=found.deletes or framing[2],
        prefix_tokens=k,
        special_tokens=special_tokens,
        framing_first=framing[0],
        framing_per_turn=framing[1],
        derive_s=time.perf_counter() - start,
        widest_high=found.high_at,
        widest_token=widest,
    )


def _reach_weight(p: _Pipeline, reach: dict[str, float], composes: bool) -> Callable[[str], float]:
    """ŵ(d): the most weight of original text one symbol d can stand for: its own share, a
    share of a character the pipeline changes into it (``reach``), or of the characters a
    composing normalizer (NFC, NFKC) joins into it (the decomposition's weight)."""
    if p.chars is None:

        def hat(d: str) -> float:
            decomposed = unicodedata.normalize("NFD", d)
            return max(weight(d), _text_weight(decomposed), reach.get(d, 0.0))

        return hat
    by_byte = {ch: max(_byte_share(b), reach.get(ch, 0.0)) for b, ch in enumerate(p.chars)}
    if composes:  # a composed character's bytes carry its decomposition's weight
        for cp in range(0x30000):
            c = chr(cp)
            if cp in _SURROGATES or unicodedata.normalize("NFD", c) == c:
                continue
            data = c.encode("utf-8")
            share = _text_weight(unicodedata.normalize("NFD", c)) / len(data)
            for b in data:
                ch = p.chars[b]
                by_byte[ch] = max(by_byte[ch], share)
    return lambda d: by_byte.get(d, reach.get(d, 1.0))


def _byte_share(b: int) -> float:
    """The most estimate weight one UTF-8 byte carries when its character is kept: its
    character's weight over its length (a continuation byte: at most a wide character's,
    1/3)."""
    if b < 0x80:
        return 0.25
    if b < 0xC0:
        return 1 / 3
    if b < 0xE0:
        return 0.25
    if 0xE3 <= b <= 0xED or b == 0xEF:
        return 1 / 3
    if b < 0xF0:
        return 0.5 / 3
    return 0.25


def _token_weight(
    p: _Pipeline, config: dict[str, Any], reach: dict[str, float], added: list[str]
) -> tuple[float, str]:
    """W and the token that sets it (the module docstring)."""
    model = config.get("model") or {}
    kind = model.get("type")
    if kind == "WordPiece":  # a word the vocabulary cannot spell is one [UNK], however long
        return math.inf, str(model.get("unk_token", "[UNK]"))
    unknown = not p.fallback and not p.byte_level  # an unknown character becomes <unk>
    if unknown and (kind == "Unigram" or (kind == "BPE" and model.get("fuse_unk"))):
        return math.inf, "<unk> (fused)"  # a run of them fuses into one token
    composes = any(_find(config.get("normalizer"), k) for k in ("NFC", "NFKC", "Precompiled"))
    hat = _reach_weight(p, reach, composes)
    prefix = str(model.get("continuing_subword_prefix") or "")
    texts = sorted(  # sorted: the same widest token on every run
        token[len(prefix) :] if prefix and token.startswith(prefix) else token
        for token in p.vocab
        if not (token.startswith(_BYTE_PIECE) and token.endswith(">") and len(token) == 6)
    )
    weights = {d: hat(d) for d in set().union(*texts)}
    best, widest = 1.0, ""
    for text in texts:
        w = sum(map(weights.__getitem__, text))
        if w > best:
            best, widest = w, text
    for a in added:
        w = max(_text_weight(a), sum(hat(d) for d in a))
        if w > best:
            best, widest = w, a
    return best, widest


def derived_for(
    identity: bytes, tok: Tokenizer, framing: tuple[int, int, bool], special_tokens: int
) -> DerivedBounds:
    """``derive`` once per tokenizer identity and framing (a policy reload, a second model
    with the same files, reuse it)."""
    key = hashlib.sha256(identity + repr((framing, special_tokens)).encode()).digest()
    with _LOCK:
        hit = _CACHE.get(key)
    if hit is not None:
        return hit
    got = derive(tok, framing, special_tokens)
    with _LOCK:
        _CACHE[key] = got
    return got


def framing(count_chat: Callable[[list[dict[str, str]]], int]) -> tuple[int, int, bool]:
    """(F0, F1, trims): the template's tokens for one empty user turn with the reply primer;
    the most one further empty turn adds (an assistant turn after it, a user turn after
    that, a system turn before it: as the template takes them; 0 when it takes none); and
    whether a turn of whitespace counts no more than an empty one (the template trims the
    text, ``| trim``, or the tokenizer drops whitespace)."""

    def count(*roles: str, text: str = "") -> int | None:
        try:
            return count_chat([{"role": r, "content": text} for r in roles])
        except ValueError:  # TokenCountError: a template that refuses the conversation
            return None

    first = count("user")
    if first is None:
        return 0, 0, True
    two, three = count("user", "assistant"), count("user", "assistant", "user")
    system = count("system", "user")
    steps = [two - first if two is not None else 0, system - first if system is not None else 0]
    if two is not None and three is not None:
        steps.append(three - two)
    blank = count("user", text=" \n\t\u3000 " * 4)
    return first, max(0, *steps), blank is None or blank <= first
