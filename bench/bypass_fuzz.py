"""Can a request body walk around ICE? Seeded bodies judged by ICE, re-read as backends do.

    .venv/bin/python bench/bypass_fuzz.py --bodies 100000 --seed 1 [--show 8]

Job: generate request bodies as raw JSON text (so that keys can repeat) for every judged
endpoint (``ext_proc.schemas.ADAPTERS``, plus SGLang's ``/generate`` through a route bound to
``schema: sglang_generate``), judge each with a real ``Pipeline`` at low, medium, high and
critical pressure, and read every body ICE lets go on (``Continue``: its new body, or the
original bytes) with this module's own reader of each backend's rules. A bypass is a body
whose backend reading asks for more than ICE's verdict allowed: more sequences than
``features.sequences``, a larger output limit than the downgrade's (else
``features.max_tokens``; unbounded beats any number), an output per sequence larger than
the one ICE charged (``output_charge``: the backend's limit, or without one the rest of the
context, max_model_len − the shortest prompt, against the downgrade's limit, else
``backend_output``: a null limit judged as 16 tokens is caught here), more media parts than
``features.media_parts``, a body ``priority`` that schedules it ahead of vLLM's default under
the route's ``client_priority: cap`` (``body_priority``); or a body ICE could not judge that
goes on, a rewrite that is not JSON or that changed more than the limit and priority fields.
Each body is also judged from its size
(``Pipeline.on_size``, as a busy worker judges it): a coarse pass of a body the full verdict
refuses or edits is a bypass too (``check_coarse``; issue 44: a verdict without the body is
never more permissive than one with it). Beside the ``--bodies`` bodies, one per endpoint
every 16 rounds comes from the coarse family (``BodyGen.coarse_ask``, its own seeded
generator): ``n`` past ``max_sequences``, limits past the context, 17+ prompts, media parts,
2,049 embedding inputs, a stored response. ``--without-unread-bounds`` judges the coarse
verdict as before issue 44, to show what the check catches.

Invariant: the checker never calls ICE's adapters, ``rawjson`` or ``media`` code; it decodes
with the standard library only, twice (last copy of a repeated key wins, as ``json.loads``
and Python servers do; and first copy wins), and every reading must stay within the verdict.

What a backend reads (``read_backend``; vLLM 0.32's request models and parsers, its native
``/inference/v1/generate``, SGLang's ``/generate``; the media and ``/invocations`` rules were
checked against vLLM 0.32's pydantic models):
- output limit per sequence: chat and batch chat ``max_completion_tokens`` when not null,
  else ``max_tokens``; completions ``max_tokens`` (absent or null: 16, vLLM's, SGLang's
  and OpenAI's default; vLLM 0.32's ``normalize_null_max_tokens`` reads null so);
  Anthropic ``max_tokens``; Responses ``max_output_tokens``; vLLM generate
  ``sampling_params.max_tokens`` (absent too: vLLM 0.32's ``GenerateRequest`` gives a
  ``sampling_params`` without it ``get_max_tokens(None)``, the rest of the context); SGLang
  ``sampling_params.max_new_tokens`` (absent: 128; a list of sampling_params: the largest).
  Null, or absent elsewhere: unbounded, the rest of the context. Embeddings generate nothing.
- the body's ``priority`` (vLLM's scheduling priority, lower first, default 0), read by
  vLLM's pydantic models in lax mode (``true`` is 1, ``-1.0`` is -1, ``" -5 "`` is -5) on
  chat, batch chat, completions, Responses, embeddings, ``/invocations`` and
  ``/inference/v1/generate``; SGLang's ``/generate`` reads it with a direction set by a
  server flag, so any value there is one a capped route must not forward.
- sequences: prompts × max(n, best_of, 1) where the API has them (chat, batch chat and
  completions at the top level; vLLM generate in ``sampling_params``; SGLang ``n`` in each
  ``sampling_params``). Prompts: the strings / token-id lists of a completions ``prompt``
  plus its ``prompt_embeds`` (vLLM serves both in one request), SGLang ``text`` (else
  ``input_ids``, else ``input_embeds``), the conversations of batch chat, embeddings inputs.
- media parts, as vLLM's chat parser (``_parse_chat_message_content_mm_part``) reads them:
  a part typed image_url, input_image, image_embeds, image_pil, audio_url, input_audio,
  audio_embeds, video_url or video_embeds; a part with no type whose ``image_url`` /
  ``audio_url`` / ``video_url`` is a plain URL string (the only untyped parts the request
  model accepts); a part of any type with a ``uuid``, read by its first media key. Nested
  ``content`` lists are walked. Responses: typed ``input_image`` / ``input_audio`` parts
  (uuid rule too). Anthropic: ``image`` blocks, also inside ``tool_result``. vLLM generate:
  ``content_parts`` typed image_url / audio_url / video_url. SGLang: every item of
  ``image_data`` / ``audio_data`` / ``video_data``.
- ``/invocations``: the first request type that validates, in vLLM's order: chat, then
  completions on a generating server (chat validates when every message is an object with a
  string ``role`` and string / array content, null only for the assistant, and ``tools`` is
  null or an array); embeddings on a pooling server. Both kinds of server are read.
- embeddings: vLLM's request union reads valid ``messages`` first (an ``input`` beside them
  is ignored), else ``input``.
"""

from __future__ import annotations

import argparse
import base64
import functools
import io
import json
import math
import random
import sys
import time
import wave
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from ext_proc.admit.outcome import Continue
from ext_proc.admit.pipeline import BodyVerdict, Pipeline, RequestFacts
from ext_proc.admit.routing import Route
from ext_proc.policy import coarse as coarse_verdict
from ext_proc.policy.decision import Downgrade, Pass, Reject, Truncated
from ext_proc.policy.load import parse_policy
from ext_proc.policy.output_limit import backend_output
from ext_proc.policy.settings import Profile
from ext_proc.schemas import ADAPTERS
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot

__all__ = [
    "ENDPOINTS",
    "UNBOUNDED",
    "Bypass",
    "Case",
    "Esc",
    "Fixtures",
    "Judge",
    "Obj",
    "Reading",
    "Report",
    "check",
    "dump",
    "first_copy_wins",
    "generate",
    "main",
    "read_backend",
    "run",
]

UNBOUNDED = math.inf  # an output limit no field bounds

# name → (path, route name sent as x-ice-route; "" = the default route, schema by path)
ENDPOINTS: dict[str, tuple[str, str]] = {
    "chat": ("/v1/chat/completions", ""),
    "completions": ("/v1/completions", ""),
    "messages": ("/v1/messages", ""),
    "responses": ("/v1/responses", ""),
    "embeddings": ("/v1/embeddings", ""),
    "chat_batch": ("/v1/chat/completions/batch", ""),
    "invocations": ("/invocations", ""),
    "generate_tokens": ("/inference/v1/generate", ""),
    "sglang": ("/generate", "sglang"),
}

POLICY = """
profiles:
  default:
    max_model_len: 16384
    output_buffer_tokens: 256
    min_output_tokens: 16
    max_tokens_cap: {medium: 2048, high: 512, critical: 128}
routes:
  sglang: {schema: sglang_generate}
"""

# (name, kv_cache_usage, waiting requests per backend, share of bodies). 20,001 blocks of 16
# tokens: 3,000 free at high pressure, 600 at critical.
SCENARIOS: tuple[tuple[str, float, float, int], ...] = (
    ("low", 0.10, 0.0, 2),
    ("medium", 0.70, 2.0, 3),
    ("high", 0.85, 4.0, 4),
    ("critical", 0.97, 8.0, 1),
)
PROFILE = parse_policy(POLICY).profiles["default"]  # every route's (client_priority: cap)
NUM_GPU_BLOCKS = 20_001
BLOCK_SIZE = 16

# --- raw JSON text -----------------------------------------------------------------------


class Obj:
    """A JSON object as an ordered list of members: a key may appear more than once."""

    __slots__ = ("pairs",)

    def __init__(self, *pairs: tuple[str, Any]) -> None:
        self.pairs = list(pairs)

    def put(self, key: str, value: Any) -> Obj:
        if value is not ABSENT:
            self.pairs.append((key, value))
        return self


@dataclass(frozen=True, slots=True)
class Raw:
    """JSON text written verbatim (number spellings such as ``1e3`` or ``-0``)."""

    text: str


class Esc(str):
    """A key written with one character as a ``\\u00XX`` escape (same key once decoded)."""

    __slots__ = ()


ABSENT: Any = object()  # a member left out


def dump(value: Any, spaced: bool = False) -> str:
    """``value`` as JSON text; ``Obj`` members in order, repeats kept."""
    if isinstance(value, Obj):
        sep, colon = (", ", ": ") if spaced else (",", ":")
        return "{" + sep.join(_key(k) + colon + dump(v, spaced) for k, v in value.pairs) + "}"
    if isinstance(value, list):
        return "[" + (", " if spaced else ",").join(dump(v, spaced) for v in value) + "]"
    if isinstance(value, Raw):
        return value.text
    return json.dumps(value)


def _key(key: str) -> str:
    if isinstance(key, Esc) and key:
        i = len(key) // 2
        return '"' + key[:i] + f"\\u{ord(key[i]):04x}" + key[i + 1 :] + '"'
    return json.dumps(key)


# --- media fixtures ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Fixtures:
    """Small real media made once: PNGs (base64 and data: URLs) and one PCM WAV."""

    png_b64: tuple[str, ...]
    wav_b64: str

    @classmethod
    def make(cls) -> Fixtures:
        from PIL import Image

        pngs = []
        for size, colour in (((1, 1), "red"), ((8, 8), "blue"), ((64, 48), "green")):
            buf = io.BytesIO()
            Image.new("RGB", size, colour).save(buf, format="PNG")
            pngs.append(base64.b64encode(buf.getvalue()).decode())
        buf = io.BytesIO()
        with wave.open(buf, "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(8000)
            w.writeframes(b"\x00\x00" * 800)  # 0.1 s
        return cls(tuple(pngs), base64.b64encode(buf.getvalue()).decode())

    def png_url(self, rng: random.Random) -> str:
        return "data:image/png;base64," + rng.choice(self.png_b64)


# --- the generator -----------------------------------------------------------------------

WORDS = ("the", "pool", "cache", "token", "memory", "limit", "gateway", "请", "模型", "ok")
LIMIT_KEYS = frozenset(("max_tokens", "max_completion_tokens", "max_output_tokens"))
LIMIT_TAG_KEYS = LIMIT_KEYS | {"max_new_tokens"}  # the generator tags repeats of these
SMALL_LIMITS = (1, 8, 16, 64, 100, 256)
BIG_LIMITS = (2048, 4096, 8000, 16384, 50_000, 10**6, 10**12, 2**53 + 1, 2**64)
ODD_LIMITS: tuple[Any, ...] = (0, -1, -4096, 1.0, 512.5, "100", True, False, [], Raw("1e3"))
PRIORITIES: tuple[Any, ...] = (
    -100,
    -1,
    0,
    5,
    -(2**63),
    "-5",
    " -3 ",
    "7",
    -1.0,
    2.0,
    1.5,
    True,
    None,
    Raw("-1e0"),
    Raw("-0"),
)
COUNTS_OK = (1, 2, 3, 4, 8, 16)
COUNTS_BIG = (17, 64, 10**9, 2**63)
ODD_COUNTS: tuple[Any, ...] = (0, -1, -16, 2.0, 1.5, "4", True, False, Raw("4e0"), Raw("-0"))
# one body of the coarse family (``BodyGen.coarse_ask``) per endpoint every 16 rounds, on
# top of the ``count`` bodies of the other families
COARSE_ASK_EVERY = 16


@dataclass(frozen=True, slots=True)
class Case:
    """One generated body: its endpoint, raw text and the hard cases it holds (tags)."""

    endpoint: str
    text: str
    tags: frozenset[str]
    priority: str = ""  # x-priority header ("" = none)


class BodyGen:
    """Seeded bodies for every endpoint; ``self.tags`` collects what the current one holds."""

    def __init__(self, rng: random.Random, fx: Fixtures, coarse_seed: int = 0) -> None:
        self.rng = rng
        self.coarse_rng = random.Random(coarse_seed)
        self.fx = fx
        self.tags: set[str] = set()
        self.short_texts = [
            " ".join(rng.choice(WORDS) for _ in range(rng.choice((1, 3, 8, 20)))) for _ in range(64)
        ]
        self.long_texts = [" ".join(WORDS) * n for n in (300, 1200, 4000)]
        self.makers: dict[str, Callable[[], Any]] = {
            "chat": self.chat,
            "completions": self.completions,
            "messages": self.anthropic,
            "responses": self.responses,
            "embeddings": self.embeddings,
            "chat_batch": self.chat_batch,
            "invocations": self.invocations,
            "generate_tokens": self.vllm_generate,
            "sglang": self.sglang,
        }

    def case(self, endpoint: str) -> Case:
        r = self.rng
        self.tags = set()
        if r.random() < 0.015:  # not an object, or not JSON at all
            text = r.choice(("[]", "null", '"x"', "{", '{"messages": [}', "{} {}", "\ufeff{}"))
            self.tags.add("not_object")
        else:
            text = dump(self.makers[endpoint](), spaced=r.random() < 0.3)
        priority = r.choice(("", "", "", "", "sheddable", "critical", "bogus"))
        return Case(endpoint, text, frozenset(self.tags), priority)

    def coarse_case(self, endpoint: str) -> Case:
        """A body of the coarse family, drawn from its own generator (``coarse_rng``), so
        that the other families' bodies are the same with or without it."""
        main, self.rng = self.rng, self.coarse_rng
        try:
            self.tags = set()
            text = dump(self.coarse_ask(endpoint))
            return Case(endpoint, text, frozenset(self.tags), self.rng.choice(("", "critical")))
        finally:
            self.rng = main

    def coarse_ask(self, endpoint: str) -> Obj:
        """A body that asks in a few bytes what no body size bounds (issue 44, item 2): ``n``
        / ``best_of`` past ``max_sequences``, a limit past the context, a list of 17 or more
        prompts (the ``/invocations`` case: prompts × ``n``), media parts, 2,049 embedding
        inputs, a stored response; the old coarse verdict passed such bodies on the calm
        pool."""
        r = self.rng
        self.tags.add("coarse_ask")
        n, limit = r.choice((17, 64, 500)), r.choice((100_000, 10**6, 10**9))
        msgs = [Obj(("role", "user"), ("content", self.text()))]
        prompts = ["hi"] * r.choice((17, 200))
        image = Obj(("type", "image_url"), ("image_url", Obj(("url", self.fx.png_url(r)))))
        media = [Obj(("role", "user"), ("content", [image] * r.choice((1, 17))))]
        pick = r.choice
        bodies: dict[str, Callable[[], Obj]] = {
            "chat": lambda: Obj(("messages", pick((msgs, media))), ("n", n), ("max_tokens", limit)),
            "completions": lambda: Obj(("prompt", prompts), ("n", pick((1, n)))),
            "messages": lambda: Obj(
                ("messages", [Obj(("role", "user"), ("content", "hi"))]), ("max_tokens", limit)
            ),
            "responses": lambda: Obj(
                ("input", "hi"), ("max_output_tokens", limit), ("previous_response_id", "resp_1")
            ),
            "embeddings": lambda: Obj(("input", ["a"] * 2049)),
            "chat_batch": lambda: Obj(("messages", [msgs] * 17), ("max_tokens", limit)),
            "invocations": lambda: Obj(("prompt", prompts), ("n", 4), ("max_tokens", limit)),
            "generate_tokens": lambda: Obj(
                ("token_ids", [1, 2, 3]), ("sampling_params", Obj(("n", n), ("max_tokens", limit)))
            ),
            "sglang": lambda: Obj(
                ("text", pick(("hi", prompts))),
                ("sampling_params", Obj(("n", n), ("max_new_tokens", limit))),
            ),
        }
        return Obj(("model", "m"), *bodies[endpoint]().pairs)

    # values -------------------------------------------------------------------------------

    def p(self, chance: float) -> bool:
        return self.rng.random() < chance

    def key(self, name: str) -> str:
        if self.p(0.03):
            self.tags.add("escaped_key")
            return Esc(name)
        return name

    def text(self) -> str:
        r = self.rng
        if self.p(0.01):
            return r.choice(self.long_texts)  # thousands of tokens: context downgrades
        return r.choice(self.short_texts)

    def limit(self) -> Any:
        r = self.rng
        x = r.random()
        if x < 0.12:
            return ABSENT
        if x < 0.22:
            return None
        if x < 0.58:
            return r.choice(SMALL_LIMITS)
        if x < 0.96:
            return r.choice(BIG_LIMITS)
        self.tags.add("wrong_type")
        return r.choice(ODD_LIMITS)

    def count(self) -> Any:
        r = self.rng
        x = r.random()
        if x < 0.35:
            return ABSENT
        if x < 0.45:
            return None
        if x < 0.86:
            v: Any = r.choice(COUNTS_OK)
        elif x < 0.96:
            v = r.choice(COUNTS_BIG)
        else:
            self.tags.add("wrong_type")
            v = r.choice(ODD_COUNTS)
        if isinstance(v, int) and not isinstance(v, bool) and v > 1:
            self.tags.add("n>1")
        return v

    def put(self, obj: Obj, name: str, make: Callable[[], Any], dup: float = 0.07) -> None:
        """Put ``name`` once, or (with chance ``dup``) twice: small then big or the reverse,
        null then a number, a number then null."""
        value = make()
        if value is ABSENT:
            if name in LIMIT_TAG_KEYS:
                self.tags.add(f"absent:{name}")
            return
        if name in LIMIT_TAG_KEYS and value is None:
            self.tags.add("null_limit")
        obj.put(self.key(name), value)
        if self.p(dup):
            other = make()
            if other is ABSENT:
                other = self.rng.choice((None, 1, 10**6))
            counted = name in LIMIT_TAG_KEYS or name in ("n", "best_of")
            if counted and self.p(0.5):  # a small and a big copy, in either order
                small, big = (1, 10**6) if name in LIMIT_TAG_KEYS else (1, 64)
                first, other = self.rng.choice(((small, big), (big, small), (None, big)))
                obj.pairs[-1] = (obj.pairs[-1][0], first)
            obj.put(self.key(name), other)
            self.tags.add("dup_key")
            if name in LIMIT_TAG_KEYS:
                self.tags.add("dup_limit")
            if name in ("n", "best_of"):
                self.tags.add("dup_n")

    def unknown(self, obj: Obj) -> None:
        r = self.rng
        if self.p(0.12):  # the body's scheduling priority, in the spellings vLLM reads
            self.tags.add("priority")
            self.put(obj, "priority", lambda: r.choice(PRIORITIES), dup=0.1)
        if self.p(0.3):
            self.tags.add("unknown_field")
            for _ in range(r.randint(1, 3)):
                name = r.choice(("temperature", "user", "metadata", "x_extra", "seed", "top_p"))
                value = r.choice((0.7, "u-1", Obj(("a", 1)), [1, 2], None, "high", 42))
                obj.put(name, value)
                if self.p(0.2):
                    obj.put(name, value)  # a repeated key ICE does not read

    def maybe_shuffle(self, obj: Obj) -> Obj:
        if self.p(0.5):
            self.rng.shuffle(obj.pairs)
        return obj

    # content --------------------------------------------------------------------------------

    def part(self, api: str) -> Any:
        """One content part / block; media in every spelling the APIs and vLLM accept."""
        r, fx = self.rng, self.fx
        x = r.random()
        url = fx.png_url(r) if r.random() < 0.7 else "https://example.com/cat.png"
        if x < 0.40:
            kind = {"responses": "input_text"}.get(api, "text")
            return Obj(("type", kind), ("text", self.text()))
        self.tags.add("media")
        if x < 0.54:
            if api == "messages":
                src = Obj(("type", "base64"), ("media_type", "image/png"))
                src.put("data", r.choice(fx.png_b64))
                if self.p(0.3):
                    src = Obj(("type", "url"), ("url", url))
                return Obj(("type", "image"), ("source", src))
            if api == "responses":
                return Obj(("type", "input_image"), ("image_url", url))
            if self.p(0.25):
                return Obj(("type", "image_url"), ("image_url", url))
            return Obj(("type", "image_url"), ("image_url", Obj(("url", url))))
        if x < 0.60:
            audio = Obj(("data", fx.wav_b64), ("format", "wav"))
            return Obj(("type", "input_audio"), ("input_audio", audio))
        if x < 0.65:
            kind = r.choice(("audio_url", "video_url"))
            return Obj(("type", kind), (kind, Obj(("url", "https://example.com/a.bin"))))
        if x < 0.69:
            kind = r.choice(("image_embeds", "audio_embeds", "image_pil"))
            self.tags.add("media_embeds")
            return Obj(("type", kind), (kind, "AAAA"))
        if x < 0.75:  # no "type": vLLM infers the part from its key
            self.tags.add("media_untyped")
            kind = r.choice(("image_url", "image_url", "audio_url", "video_url", "input_audio"))
            value: Any = url if kind != "input_audio" else Obj(("data", fx.wav_b64))
            if kind == "image_url" and self.p(0.5):
                value = Obj(("url", url))
            return Obj((kind, value))
        if x < 0.78:  # a typed part with a uuid: vLLM reads it by its keys
            self.tags.add("media_uuid")
            kind = {"responses": "input_text"}.get(api, "text")
            return Obj(("type", kind), ("text", "x"), ("uuid", "u-1"), ("image_url", url))
        if x < 0.795:  # "type" twice: a text part and an image part in one
            self.tags.add("dup_nested")
            image = ("image_url", Obj(("url", url)))
            if self.p(0.5):
                return Obj(("type", "text"), ("text", "x"), ("type", "image_url"), image)
            return Obj(("type", "image_url"), image, ("type", "text"), ("text", "x"))
        if x < 0.805:  # the media key twice (first null, last real, or the reverse)
            self.tags.add("dup_nested")
            pair = [("image_url", None), ("image_url", Obj(("url", url)))]
            r.shuffle(pair)
            return Obj(("type", "image_url"), *pair)
        if x < 0.88:  # nested content
            inner = [self.part(api) for _ in range(r.randint(1, 3))]
            return Obj(("type", "tool_result"), ("tool_use_id", "t1"), ("content", inner))
        if x < 0.93:
            self.tags.add("unknown_part")
            return Obj(("type", r.choice(("file", "input_file", "document", "x"))), ("x", 1))
        if x < 0.98:
            return self.text()  # a plain string part
        self.tags.add("wrong_type")
        return r.choice((5, None, [], True))

    def content(self, api: str) -> Any:
        r = self.rng
        x = r.random()
        if x < 0.35:
            return self.text()
        if x < 0.93:
            k = r.choice((1, 1, 2, 3, 5)) if not self.p(0.03) else 17
            return [self.part(api) for _ in range(k)]
        if x < 0.98:
            return None
        self.tags.add("wrong_type")
        return r.choice((5, Obj(("type", "text")), True))

    def message(self, api: str = "chat") -> Obj:
        r = self.rng
        m = Obj()
        x = r.random()
        if x < 0.95:
            m.put("role", r.choice(("user", "user", "assistant", "system", "tool")))
        elif x < 0.98:
            self.tags.add("no_role")
        else:
            self.tags.add("wrong_type")
            m.put("role", 3)
        m.put(self.key("content"), self.content(api))
        if self.p(0.02):
            self.tags.add("dup_nested")
            m.put("content", self.content(api))
        if self.p(0.05):
            m.put("name", "bob")
        if self.p(0.05):
            call = Obj(("id", "c1"), ("type", "function"))
            call.put("function", Obj(("name", "f"), ("arguments", '{"a": 1}')))
            m.put("tool_calls", [call])
        return self.maybe_shuffle(m)

    def messages(self, api: str = "chat") -> Any:
        r = self.rng
        if self.p(0.02):
            self.tags.add("wrong_type")
            return r.choice(("hi", None, Obj(("role", "user")), 5))
        return [self.message(api) for _ in range(r.choice((1, 1, 2, 3, 6)))]

    def prompt(self) -> Any:
        """A completions ``prompt`` / embeddings ``input``: every spelling vLLM takes, and
        some it does not."""
        r = self.rng
        x = r.random()
        k = r.choice((2, 3, 5, 16, 17, 40))
        if x < 0.3:
            return self.text()
        if x < 0.5:
            self.tags.add("prompt_list")
            return [self.text() for _ in range(k)]
        if x < 0.62:
            return [r.randrange(50_000) for _ in range(r.choice((1, 8, 100)))]
        if x < 0.77:
            self.tags.add("prompt_list")
            return [[r.randrange(50_000) for _ in range(r.choice((1, 8)))] for _ in range(k)]
        if x < 0.86:
            return r.choice(([], [[]], [""]))
        if x < 0.92:
            return self.text()
        self.tags.add("wrong_type")
        return r.choice((["a", [1, 2]], [1, "a"], Obj(("x", 1)), 5, None, [[["deep"]]], [1.5]))

    # endpoints ----------------------------------------------------------------------------

    def chat_top(self, obj: Obj) -> Obj:
        obj.put("model", "m")
        self.put(obj, "max_tokens", self.limit)
        self.put(obj, "max_completion_tokens", self.limit)
        self.put(obj, "n", self.count)
        self.put(obj, "best_of", self.count, dup=0.05)
        if self.p(0.2):
            obj.put("stream", self.rng.choice((True, False)))
        if self.p(0.1):
            tools = [Obj(("type", "function"), ("function", Obj(("name", "f"))))]
            obj.put("tools", tools if self.p(0.8) else self.rng.choice((5, "x", Obj())))
        self.unknown(obj)
        return self.maybe_shuffle(obj)

    def chat(self) -> Obj:
        obj = Obj()
        self.put(obj, "messages", self.messages, dup=0.03)
        return self.chat_top(obj)

    def chat_batch(self) -> Obj:
        r = self.rng
        obj = Obj()
        if self.p(0.1):
            convs: Any = self.messages()  # a flat list of messages (wrong for batch)
        else:
            convs = [self.messages() for _ in range(r.choice((1, 2, 3)) if self.p(0.9) else 17)]
            if len(convs) > 1:
                self.tags.add("prompt_list")
        obj.put(self.key("messages"), convs)
        return self.chat_top(obj)

    def completions(self) -> Obj:
        obj = Obj(("model", "m"))
        self.put(obj, "prompt", self.prompt, dup=0.04)
        if self.p(0.05):
            self.tags.add("prompt_embeds")
            obj.put("prompt_embeds", self.rng.choice(("AAAA", ["AAAA", "BBBB"])))
        self.put(obj, "max_tokens", self.limit)
        if self.p(0.15):
            self.put(obj, "max_completion_tokens", self.limit)  # not read by completions
        self.put(obj, "n", self.count)
        self.put(obj, "best_of", self.count, dup=0.05)
        self.unknown(obj)
        return self.maybe_shuffle(obj)

    def anthropic(self) -> Obj:
        r = self.rng
        obj = Obj(("model", "claude"))
        msgs: Any = [self.message("messages") for _ in range(r.choice((1, 2, 3)))]
        if self.p(0.03):
            msgs = r.choice(("hi", None))
        obj.put(self.key("messages"), msgs)
        if self.p(0.3):
            system: Any = self.text() if self.p(0.5) else [self.part("messages")]
            obj.put("system", system)
        self.put(obj, "max_tokens", self.limit)
        if self.p(0.1):
            self.put(obj, "n", self.count)  # not read by Anthropic's API
        self.unknown(obj)
        return self.maybe_shuffle(obj)

    def response_item(self) -> Any:
        r = self.rng
        x = r.random()
        if x < 0.55:
            item = Obj()
            if self.p(0.5):
                item.put("type", "message")
            item.put("role", r.choice(("user", "assistant", "system", "developer")))
            item.put("content", self.content("responses"))
            return item
        if x < 0.65:
            return Obj(("type", "function_call"), ("name", "f"), ("arguments", "{}"))
        if x < 0.78:
            output: Any = self.text()
            if self.p(0.5):
                output = [self.part("responses") for _ in range(r.randint(1, 3))]
            return Obj(("type", "function_call_output"), ("call_id", "c"), ("output", output))
        if x < 0.83:
            return Obj(("type", "item_reference"), ("id", "msg_1"))
        if x < 0.9:
            summary = [Obj(("type", "summary_text"), ("text", "s"))]
            return Obj(("type", "reasoning"), ("summary", summary))
        self.tags.add("wrong_type")
        return r.choice((5, None, "hi", Obj(("type", "web_search_call"))))

    def response_input(self) -> Any:
        r = self.rng
        if self.p(0.3):
            return self.text()
        if self.p(0.9):
            return [self.response_item() for _ in range(r.choice((1, 2, 4)))]
        return ABSENT

    def responses(self) -> Obj:
        r = self.rng
        obj = Obj(("model", "m"))
        self.put(obj, "input", self.response_input, dup=0.03)
        if self.p(0.25):
            self.tags.add("previous_response_id")
            obj.put("previous_response_id", r.choice(("resp_1", None, 5)))
        if self.p(0.2):
            obj.put("instructions", self.text() if self.p(0.9) else 5)
        self.put(obj, "max_output_tokens", self.limit)
        if self.p(0.15):
            self.put(obj, "max_tokens", self.limit)  # not read by the Responses API
        self.unknown(obj)
        return self.maybe_shuffle(obj)

    def embeddings(self) -> Obj:
        obj = Obj(("model", "e"))
        x = self.rng.random()
        if x < 0.75:
            self.put(obj, "input", self.prompt, dup=0.04)
        elif x < 0.9:
            obj.put("messages", self.messages())
        else:  # both: vLLM's request union may read either
            self.tags.add("input_and_messages")
            obj.put("input", self.prompt())
            obj.put("messages", self.messages())
        self.unknown(obj)
        return self.maybe_shuffle(obj)

    def invocations(self) -> Obj:
        x = self.rng.random()
        if x < 0.3:
            return self.chat()
        if x < 0.5:
            return self.completions()
        if x < 0.65:
            return self.embeddings()
        if x < 0.95:  # several request shapes in one body
            self.tags.add("hybrid")
            obj = Obj()
            obj.put("messages", self.messages())
            obj.put("prompt", self.prompt())
            if self.p(0.3):
                obj.put("input", self.prompt())
            return self.chat_top(obj)
        return Obj(("model", "m"), ("text", "classify me"))

    def sampling(self, limit_key: str) -> Any:
        r = self.rng
        if self.p(0.05):
            self.tags.add("wrong_type")
            return r.choice((5, "x", [], True))
        sp = Obj()
        self.put(sp, limit_key, self.limit, dup=0.12)
        if self.p(0.3):
            other = "max_tokens" if limit_key == "max_new_tokens" else "max_new_tokens"
            self.put(sp, other, self.limit)  # the other server's name (not read)
        self.put(sp, "n", self.count, dup=0.12)
        if self.p(0.2):
            self.put(sp, "best_of", self.count)
        if self.p(0.2):
            sp.put("temperature", 0.5)
        if len({k for k, _ in sp.pairs}) < len(sp.pairs):
            self.tags.add("dup_nested")
        return self.maybe_shuffle(sp)

    def vllm_generate(self) -> Obj:
        r = self.rng
        obj = Obj(("model", "m"))
        ids: Any = [r.randrange(50_000) for _ in range(r.choice((1, 16, 300)))]
        if self.p(0.05):
            self.tags.add("wrong_type")
            ids = r.choice(([], "abc", [[1, 2]], None))
        obj.put("token_ids", ids)
        x = r.random()
        if x < 0.85:
            self.put(obj, "sampling_params", lambda: self.sampling("max_tokens"), dup=0.05)
        elif x < 0.92:
            obj.put("sampling_params", None)
        if self.p(0.2):
            obj.put("content_parts", [self.part("chat") for _ in range(r.randint(1, 3))])
        self.unknown(obj)
        return self.maybe_shuffle(obj)

    def sglang_media(self, kind: str) -> Any:
        r = self.rng
        self.tags.add("media")
        one: Any = self.fx.png_url(r) if kind == "image" else "https://example.com/a.bin"
        x = r.random()
        if x < 0.4:
            return one
        if x < 0.75:
            return [one] * r.choice((1, 2, 17))
        if x < 0.9:
            return [[one, one], [one]]
        return r.choice((None, [], [None, one], Obj(("url", one))))

    def sglang(self) -> Obj:
        r = self.rng
        obj = Obj(("model", "m"))
        x = r.random()
        if x < 0.45:
            self.put(obj, "text", self.prompt, dup=0.04)
        elif x < 0.8:
            self.put(obj, "input_ids", self.prompt, dup=0.04)
        elif x < 0.9:
            self.tags.add("text_and_input_ids")
            obj.put("text", self.prompt())
            obj.put("input_ids", self.prompt())
        else:
            rows = [[0.1, 0.2]] * r.choice((1, 4))
            obj.put("input_embeds", rows if self.p(0.5) else [rows, rows])
        y = r.random()
        if y < 0.6:
            self.put(obj, "sampling_params", lambda: self.sampling("max_new_tokens"), dup=0.05)
        elif y < 0.8:
            params = [self.sampling("max_new_tokens") for _ in range(r.choice((1, 2, 3)))]
            obj.put("sampling_params", params)
            self.tags.add("sampling_list")
        elif y < 0.85:
            obj.put("sampling_params", r.choice((None, [])))
        for kind in ("image", "audio", "video"):
            if self.p(0.15 if kind == "image" else 0.05):
                self.put(obj, f"{kind}_data", functools.partial(self.sglang_media, kind), dup=0.05)
        self.unknown(obj)
        return self.maybe_shuffle(obj)


def generate(count: int, seed: int, fx: Fixtures | None = None) -> Iterable[Case]:
    """``count`` cases, the endpoints in turn, from ``random.Random(seed)``; and, every
    ``COARSE_ASK_EVERY`` rounds, one more case per endpoint of the coarse family."""
    rng = random.Random(seed)
    gen = BodyGen(rng, fx or Fixtures.make(), coarse_seed=seed)
    names = list(ENDPOINTS)
    for i in range(count):
        name = names[i % len(names)]
        yield gen.case(name)
        if (i // len(names)) % COARSE_ASK_EVERY == COARSE_ASK_EVERY - 1:  # the coarse family
            yield gen.coarse_case(name)


# --- the backends' reading ---------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Reading:
    """What one backend reads from one decoding of a body."""

    how: str  # which reading: "last-copy-wins" / "first-copy-wins" and the schema read
    sequences: int
    limit_tokens: float  # per sequence; UNBOUNDED when no field bounds it
    media_parts: int


def first_copy_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        obj.setdefault(key, value)
    return obj


def _int(value: Any) -> int | None:
    """A number as a lax validator takes it (1, 1.0, "1"); None: not a number."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def _limit(obj: dict[str, Any], key: str, absent: float) -> float:
    if key not in obj:
        return absent
    value = _int(obj[key])
    return UNBOUNDED if value is None else value


def _samples(obj: Any, *keys: str) -> int:
    if not isinstance(obj, dict):
        return 1
    values = [_int(obj.get(k)) for k in keys]
    return max([1, *(v for v in values if v is not None)])


def _prompts(value: Any) -> int:
    """Prompts of a completions ``prompt`` / embeddings ``input`` / SGLang ``text``."""
    if isinstance(value, str):
        return 1
    if isinstance(value, list):
        if value and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return 1
        return len(value)
    return 0


MEDIA_TYPES = frozenset(
    (
        "image_url",
        "input_image",
        "image_embeds",
        "image_pil",
        "audio_url",
        "input_audio",
        "audio_embeds",
        "video_url",
        "video_embeds",
    )
)
# A part with no type, or with a uuid, is read by the first of these keys it has (vLLM's
# ``_parse_chat_message_content_mm_part``): (key, is media).
KEYED_PARTS = (
    ("image_url", True),
    ("image_pil", True),
    ("image_embeds", True),
    ("audio_embeds", True),
    ("video_embeds", True),
    ("prompt_embeds", False),
    ("audio_url", True),
    ("input_audio", True),
    ("video_url", True),
)
# Without a uuid, the only untyped parts vLLM's request model accepts are plain URL strings
# under these keys (``CustomChatCompletionContentSimple*Param``).
UNTYPED_MEDIA_KEYS = ("image_url", "audio_url", "video_url")
RESPONSES_MEDIA_TYPES = frozenset(("input_image", "input_audio"))
GENERATE_MEDIA_TYPES = frozenset(("image_url", "audio_url", "video_url"))
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # vLLM's and SGLang's CompletionRequest, and OpenAI's
SGLANG_DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's SamplingParams


def _by_keys(part: dict[str, Any]) -> bool:
    for key, media in KEYED_PARTS:
        if key in part:
            return media
    return False


def _is_media(part: dict[str, Any], types: frozenset[str] = MEDIA_TYPES) -> bool:
    """Whether vLLM's chat parser reads ``part`` as an image, audio or video."""
    if part.get("uuid") is not None:
        return _by_keys(part)
    kind = part.get("type")
    if isinstance(kind, str):
        return kind in types
    if kind is None:
        return any(isinstance(part.get(k), str) for k in UNTYPED_MEDIA_KEYS)
    return False  # a type that is not a string: refused


def _media(value: Any) -> int:
    """Media parts of a chat content value, nested ``content`` lists included."""
    if isinstance(value, list):
        return sum(_media(v) for v in value)
    if isinstance(value, dict):
        return 1 if _is_media(value) else _media(value.get("content"))
    return 0


def _message_media(messages: Any) -> int:
    if not isinstance(messages, list):
        return 0
    return sum(_media(m.get("content")) for m in messages if isinstance(m, dict))


def _responses_media(parts: Any) -> int:
    """Responses content parts: the API types every part and does not nest them; vLLM
    hands them to its chat parser, so a part with a uuid is read by its keys."""
    if not isinstance(parts, list):
        return 0
    typed = [p for p in parts if isinstance(p, dict) and p.get("type") is not None]
    return sum(1 for p in typed if _is_media(p, RESPONSES_MEDIA_TYPES))


def _generate_media(parts: Any) -> int:
    """vLLM generate's ``content_parts``: read by their type only."""
    if not isinstance(parts, list):
        return 0
    return sum(1 for p in parts if isinstance(p, dict) and p.get("type") in GENERATE_MEDIA_TYPES)


def _anthropic_media(value: Any) -> int:
    """Anthropic blocks vLLM turns into images: ``image`` blocks, also inside a
    ``tool_result``'s content."""
    if isinstance(value, list):
        return sum(_anthropic_media(v) for v in value)
    if not isinstance(value, dict):
        return 0
    if value.get("type") == "image":
        return 1
    if value.get("type") == "tool_result":
        return _anthropic_media(value.get("content"))
    return 0


def _top_limit(b: dict[str, Any], key: str, absent: float = UNBOUNDED) -> float:
    """A top-level limit: null is unbounded, absent is ``absent``."""
    if key not in b:
        return absent
    return UNBOUNDED if b[key] is None else _limit(b, key, UNBOUNDED)


def _chat_limit(b: dict[str, Any]) -> float:
    """vLLM: ``max_completion_tokens`` when not null, else ``max_tokens``."""
    if b.get("max_completion_tokens") is not None:
        return _top_limit(b, "max_completion_tokens")
    return _top_limit(b, "max_tokens")


def _chat(b: dict[str, Any], how: str) -> Reading:
    seqs = _samples(b, "n", "best_of")
    return Reading(how, seqs, _chat_limit(b), _message_media(b.get("messages")))


def _completions(b: dict[str, Any], how: str) -> Reading:
    embeds = b.get("prompt_embeds")
    prompts = _prompts(b.get("prompt")) + (
        1 if isinstance(embeds, str) else len(embeds) if isinstance(embeds, list) else 0
    )
    seqs = prompts * _samples(b, "n", "best_of")
    # vLLM 0.32's normalize_null_max_tokens reads a null as the default too
    limit = (
        COMPLETIONS_DEFAULT_MAX_TOKENS
        if b.get("max_tokens") is None
        else _top_limit(b, "max_tokens")
    )
    return Reading(how, seqs, limit, 0)


def _chat_validates(b: dict[str, Any]) -> bool:
    """vLLM 0.32's ChatCompletionRequest on ``messages`` and ``tools``: every message an
    object with a string ``role`` and ``content`` absent, a string or an array (null only
    for the assistant); ``tools`` null or an array."""
    messages = b.get("messages")
    if not isinstance(messages, list):
        return False
    for m in messages:
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            return False
        content = m.get("content", "")
        if not isinstance(content, str | list) and not (
            content is None and m["role"] == "assistant"
        ):
            return False
    return b.get("tools") is None or isinstance(b.get("tools"), list)


def _embeddings(b: dict[str, Any], how: str) -> list[Reading]:
    """vLLM's ``EmbeddingCompletionRequest | EmbeddingChatRequest``: a body whose
    ``messages`` validate is read as chat (an ``input`` beside them is ignored), else
    ``input``."""
    if "messages" in b and _chat_validates(b):
        return [Reading(how + " as chat", 1, 0, _message_media(b["messages"]))]
    if "input" in b:
        return [Reading(how + " as input", _prompts(b["input"]), 0, 0)]
    return []


def _invocations(b: dict[str, Any], how: str) -> list[Reading]:
    """SageMaker's /invocations on vLLM: the first request type that validates. A
    generating server tries chat, then completions; a pooling (embedding) server tries
    embeddings. ICE cannot tell which serves the route, so both readings count."""
    out: list[Reading] = []
    if _chat_validates(b):
        out.append(_chat(b, how + " as chat"))
    elif "prompt" in b or "prompt_embeds" in b:
        out.append(_completions(b, how + " as completions"))
    out.extend(_embeddings(b, how + " on a pooling server"))
    return out


def _vllm_generate(b: dict[str, Any], how: str) -> Reading:
    sp = b.get("sampling_params")
    sp = sp if isinstance(sp, dict) else {}
    seqs = _samples(sp, "n", "best_of")
    limit = _limit(sp, "max_tokens", UNBOUNDED)  # absent: get_max_tokens(None), vLLM 0.32
    return Reading(how, seqs, limit, _generate_media(b.get("content_parts")))


def _leaves(value: Any) -> int:
    if isinstance(value, list):
        return sum(_leaves(v) for v in value)
    return 0 if value is None else 1


def _sglang_prompts(b: dict[str, Any]) -> int:
    """SGLang's batch size: ``text``, else ``input_ids``, else ``input_embeds``."""
    if b.get("text") is not None:
        return _prompts(b["text"])
    if b.get("input_ids") is not None:
        return _prompts(b["input_ids"])
    rows = b.get("input_embeds")
    if isinstance(rows, list) and rows:
        batch = all(isinstance(r, list) and r and isinstance(r[0], list) for r in rows)
        return len(rows) if batch else 1
    return 0


def _sglang(b: dict[str, Any], how: str) -> Reading:
    raw = b.get("sampling_params")
    params = [p for p in (raw if isinstance(raw, list) else [raw]) if isinstance(p, dict)]
    params = params or [{}]
    limit = max(_limit(p, "max_new_tokens", SGLANG_DEFAULT_MAX_NEW_TOKENS) for p in params)
    samples = max(_samples(p, "n") for p in params)
    media = sum(_leaves(b.get(f"{k}_data")) for k in ("image", "audio", "video"))
    return Reading(how, _sglang_prompts(b) * samples, limit, media)


def read_backend(endpoint: str, body: Any, how: str = "") -> list[Reading]:
    """What the backend behind ``endpoint`` reads from one decoded body (none: not an
    object, which every backend refuses)."""
    if not isinstance(body, dict):
        return []
    if endpoint == "chat":
        return [_chat(body, how)]
    if endpoint == "chat_batch":
        convs = body.get("messages")
        convs = convs if isinstance(convs, list) else []
        media = sum(_message_media(c) for c in convs)
        seqs = len(convs) * _samples(body, "n", "best_of")
        return [Reading(how, seqs, _chat_limit(body), media)]
    if endpoint == "completions":
        return [_completions(body, how)]
    if endpoint == "messages":
        msgs = body.get("messages")
        msgs = msgs if isinstance(msgs, list) else []
        media = sum(_anthropic_media(m.get("content")) for m in msgs if isinstance(m, dict))
        return [Reading(how, 1, _top_limit(body, "max_tokens"), media)]
    if endpoint == "responses":
        data = body.get("input")
        items = data if isinstance(data, list) else []
        media = sum(
            _responses_media(i.get("content")) + _responses_media(i.get("output"))
            for i in items
            if isinstance(i, dict)
        )
        return [Reading(how, 1, _top_limit(body, "max_output_tokens"), media)]
    if endpoint == "embeddings":
        return _embeddings(body, how)
    if endpoint == "invocations":
        return _invocations(body, how)
    if endpoint == "generate_tokens":
        return [_vllm_generate(body, how)]
    if endpoint == "sglang":
        return [_sglang(body, how)]
    raise ValueError(f"unknown endpoint {endpoint!r}")


# --- the checker -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Bypass:
    """A body that goes on asking for more than ICE allowed."""

    # sequences | output_limit | output_charge | media_parts | body_priority | unjudged |
    # reject_goes_on | invalid_rewrite | rewrite_changed | coarse_passes_a_refusal |
    # coarse_passes_a_cut
    kind: str
    endpoint: str
    how: str
    backend: str  # what the backend reads
    allowed: str  # what ICE's verdict allowed
    verdict: str
    body: str  # the client's body
    forwarded: str  # the body that goes on (the same text when ICE left it unchanged)


# the APIs whose vLLM request model reads a top-level ``priority``
PRIORITY_READERS = frozenset(
    ("chat", "chat_batch", "completions", "responses", "embeddings", "invocations")
) | {"generate_tokens"}


def _lax_int(value: Any) -> int | None:
    """``value`` as vLLM's pydantic models read an ``int`` field in lax mode (None: refused)."""
    if isinstance(value, bool | int):
        return int(value)
    if isinstance(value, float):
        return int(value) if value.is_integer() else None
    if isinstance(value, str):
        try:
            return int(value.strip())
        except ValueError:
            return None
    return None


def priority_ahead(endpoint: str, body: Any) -> str | None:
    """The body's ``priority`` when it would schedule the request ahead of the server's
    default (what a ``client_priority: cap`` route must not forward), as text; None: not."""
    if not isinstance(body, dict) or "priority" not in body:
        return None
    value = body["priority"]
    if endpoint == "sglang":  # its direction is a server flag: any value may be ahead
        return None if value is None else json.dumps(value)
    if endpoint not in PRIORITY_READERS:
        return None
    read = _lax_int(value)
    return None if read is None or read >= 0 else str(read)


def _charged(verdict: BodyVerdict, profile: Profile) -> int:
    """The output per sequence ICE judged the request for: the downgrade's limit, else what
    ``backend_output`` says the backend runs."""
    d, f = verdict.decision, verdict.features
    assert f is not None
    if isinstance(d, Truncated):
        d = d.then
    if isinstance(d, Downgrade):
        return d.max_tokens
    return backend_output(f, profile)


def _allowed_limit(verdict: BodyVerdict) -> float:
    d, f = verdict.decision, verdict.features
    if isinstance(d, Truncated):
        d = d.then
    if isinstance(d, Downgrade):
        return d.max_tokens
    if f is None or f.max_tokens is None:
        return UNBOUNDED
    return f.max_tokens


def _describe(verdict: BodyVerdict | None) -> str:
    if verdict is None:
        return "on_body returned None"
    d, f = verdict.decision, verdict.features
    what = "none" if d is None else f"{d.decision}:{d.reason}"
    if isinstance(d, Downgrade):
        what += f" max_tokens={d.max_tokens}"
    if f is not None:
        what += (
            f"; features schema={f.schema} max_tokens={f.max_tokens} samples={f.samples} "
            f"sequences={f.sequences} media_parts={f.media_parts}"
        )
    return what


def _without_limits(value: Any) -> Any:
    """A decoded body without its output-limit fields (what a downgrade may change)."""
    if not isinstance(value, dict):
        return value
    out = {k: v for k, v in value.items() if k not in LIMIT_KEYS and k != "priority"}
    sp = out.pop("sampling_params", None)
    if isinstance(sp, dict):
        sp = {k: v for k, v in sp.items() if k not in ("max_tokens", "max_new_tokens")}
    elif isinstance(sp, list):
        sp = [_without_limits({"sampling_params": p}).get("sampling_params", {}) for p in sp]
    if sp:
        out["sampling_params"] = sp
    return out


def check(
    endpoint: str, body: bytes, verdict: BodyVerdict | None, profile: Profile | None = None
) -> list[Bypass]:
    """Every way the body that ICE lets go on asks for more than ``verdict`` allowed
    (``profile``: the route's, for the output ICE charged; the fuzz policy's by default)."""
    text = body.decode("utf-8", "replace")

    def found(kind: str, how: str, backend: str, allowed: str, forwarded: str) -> Bypass:
        return Bypass(kind, endpoint, how, backend, allowed, _describe(verdict), text, forwarded)

    if verdict is None:
        return [found("unjudged", "", "the original body", "nothing judged", text)]
    outcome = verdict.outcome
    if not isinstance(outcome, Continue):
        return []
    if verdict.pending is not None:
        return []  # a truncation placeholder: the real outcome comes later
    forwarded = outcome.body if outcome.body is not None else body
    fwd_text = forwarded.decode("utf-8", "replace")
    f = verdict.features
    if f is None:
        return [found("unjudged", "", "the body goes on", "ICE could not judge it", fwd_text)]
    if isinstance(verdict.decision, Reject) or verdict.decision is None:
        return [found("reject_goes_on", "", "the body goes on", "rejected", fwd_text)]
    try:
        decodings = [
            ("last-copy-wins", json.loads(fwd_text)),
            ("first-copy-wins", json.loads(fwd_text, object_pairs_hook=first_copy_wins)),
        ]
    except (json.JSONDecodeError, RecursionError) as e:
        if outcome.body is None:
            return []  # the client's own broken body: ICE judged it, the backend refuses it
        return [found("invalid_rewrite", "", f"not JSON: {e}", "valid JSON", fwd_text)]
    allowed = _allowed_limit(verdict)
    profile = profile or PROFILE
    charged = _charged(verdict, profile) if f.generates else 0
    context = profile.max_model_len or 0
    rest = max(1, context - min(f.prompts))  # a sequence without a limit runs to the end
    out: list[Bypass] = []
    if outcome.body is not None:
        before = json.loads(text)  # ICE decoded the client's body, so it is JSON
        if _without_limits(before) != _without_limits(decodings[0][1]):
            out.append(
                found("rewrite_changed", "last-copy-wins", "other fields changed", "", fwd_text)
            )
    for how, value in decodings:
        ahead = priority_ahead(endpoint, value)
        if ahead is not None:
            out.append(found("body_priority", how, f"priority {ahead}", "cap", fwd_text))
        for r in read_backend(endpoint, value, how):
            if r.sequences > f.sequences:
                out.append(found("sequences", r.how, str(r.sequences), str(f.sequences), fwd_text))
            runs = min(r.limit_tokens, rest) if context else r.limit_tokens
            if f.generates and r.limit_tokens > allowed:
                out.append(
                    found("output_limit", r.how, str(r.limit_tokens), str(allowed), fwd_text)
                )
            elif f.generates and runs > charged:  # within the limit, beyond the charge
                out.append(found("output_charge", r.how, str(runs), str(charged), fwd_text))
            if r.media_parts > f.media_parts:
                out.append(
                    found("media_parts", r.how, str(r.media_parts), str(f.media_parts), fwd_text)
                )
    return out


# --- the run -----------------------------------------------------------------------------


def _fixed(snapshot: PoolSnapshot, _pool: str) -> PoolSnapshot:
    return snapshot


class Judge:
    """A real ``Pipeline`` per pressure scenario, over fixed snapshots."""

    def __init__(self, policy_text: str = POLICY) -> None:
        policy = parse_policy(policy_text)
        self.pipelines: dict[str, Pipeline] = {}
        self.weights: list[tuple[str, int]] = []
        for name, usage, waiting, share in SCENARIOS:
            backend = BackendSignals(
                url="fuzz",
                kv_cache_usage=usage,
                num_requests_waiting=waiting,
                num_gpu_blocks=NUM_GPU_BLOCKS,
                block_size=BLOCK_SIZE,
            )
            snap = PoolSnapshot("default", (backend,), time.monotonic())
            self.pipelines[name] = Pipeline(policy, functools.partial(_fixed, snap))
            self.weights.append((name, share))
        self.routes: dict[tuple[str, str], Route] = {}

    def scenario(self, i: int) -> str:
        total = sum(w for _, w in self.weights)
        k = (i * 7) % total  # spread the scenarios over the endpoints
        for name, w in self.weights:
            if k < w:
                return name
            k -= w
        return self.weights[-1][0]

    def _read_headers(self, scenario: str, case: Case) -> tuple[Pipeline, Route, RequestFacts]:
        pipeline = self.pipelines[scenario]
        path, route_name = ENDPOINTS[case.endpoint]
        key = (scenario, route_name)
        route = self.routes.get(key)
        if route is None:
            meta = [("x-ice-route", route_name)] if route_name else []
            route = self.routes[key] = pipeline.router.resolve(meta)
        body = case.text.encode("utf-8")
        headers = [
            (":path", path.encode()),
            (":method", b"POST"),
            ("content-type", b"application/json"),
            ("content-length", str(len(body)).encode()),
        ]
        if case.priority:
            headers.append(("x-priority", case.priority.encode()))
        return pipeline, route, pipeline.on_headers(route, headers, end_of_stream=False)

    def judge(self, scenario: str, case: Case) -> BodyVerdict | None:
        """ICE's verdict on ``case`` (an answer to the headers is a verdict without
        features)."""
        pipeline, route, facts = self._read_headers(scenario, case)
        if facts.answer is not None:
            return BodyVerdict(None, None, facts.answer, bad="headers")
        return pipeline.on_body(route, facts, case.text.encode("utf-8"))

    def coarse(self, scenario: str, case: Case) -> BodyVerdict | None:
        """ICE's verdict on ``case`` judged from its size, as a busy worker judges it
        (``Pipeline.on_size``: its ``content-length``, or a chunked body's size)."""
        pipeline, route, facts = self._read_headers(scenario, case)
        if facts.answer is not None:
            return None
        return pipeline.on_size(route, facts, len(case.text.encode("utf-8")))


def check_coarse(
    endpoint: str, full: BodyVerdict | None, coarse: BodyVerdict, body: str = ""
) -> list[Bypass]:
    """A coarse pass where the full verdict would not send the body on untouched (issue 44:
    a verdict without the body is never more permissive than one with it): it refuses it
    (any 429 or 400, a body it cannot judge included), or cuts it (any downgrade, the
    context budget's too, a truncation, a rewrite)."""
    if not isinstance(coarse.outcome, Continue) or full is None:
        return []
    d = full.decision
    if d is None or isinstance(d, Reject):
        kind = "coarse_passes_a_refusal"
    elif isinstance(d, Truncated | Downgrade) or (
        isinstance(full.outcome, Continue) and full.outcome.body is not None
    ):
        kind = "coarse_passes_a_cut"
    else:
        return []
    what = _describe(full)
    return [Bypass(kind, endpoint, "", what, _describe(coarse), what, body, body)]


@dataclass(slots=True)
class Report:
    """Counts of one run and the bypasses it found."""

    bodies: int = 0
    per_endpoint: Counter[str] = field(default_factory=Counter)
    outcomes: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    tags: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    # the tags of the bodies ICE let go on (the ones the checker read)
    forwarded_tags: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    scenarios: Counter[str] = field(default_factory=Counter)
    coarse: Counter[str] = field(default_factory=Counter)  # the same bodies judged by size
    coarse_family: Counter[str] = field(default_factory=Counter)  # those of ``coarse_ask``
    bypasses: list[Bypass] = field(default_factory=list)
    bypass_bodies: int = 0
    elapsed_s: float = 0.0


def _outcome_name(verdict: BodyVerdict | None) -> str:
    if verdict is None:
        return "unjudged"
    d = verdict.decision
    if d is None:
        return "bad_request"
    if isinstance(d, Truncated):
        d = d.then
    if isinstance(d, Pass):
        return "passed"
    if isinstance(d, Downgrade):
        return "downgraded"
    if isinstance(d, Reject):
        return "rejected"
    return d.decision


def run(bodies: int, seed: int, fx: Fixtures | None = None, unread_bounds: bool = True) -> Report:
    """Generate ``bodies`` bodies, judge and check each. ``unread_bounds`` False: the coarse
    verdict as before issue 44, blind to what a body sets in a few bytes (its
    ``unread_risk`` finds nothing), to show what the checker catches."""
    if not unread_bounds:
        real = coarse_verdict.unread_risk
        coarse_verdict.unread_risk = lambda *_args: None  # type: ignore[assignment]
        try:
            return run(bodies, seed, fx)
        finally:
            coarse_verdict.unread_risk = real
    start = time.perf_counter()
    judge = Judge()
    report = Report()
    main = 0  # bodies of the other families: the scenario goes by their round
    for case in generate(bodies, seed, fx):
        coarse_family = "coarse_ask" in case.tags
        scenario = judge.scenario((main - coarse_family) // len(ENDPOINTS))
        main += not coarse_family
        verdict = judge.judge(scenario, case)
        report.bodies += 1
        report.per_endpoint[case.endpoint] += 1
        report.scenarios[scenario] += 1
        report.outcomes[case.endpoint][_outcome_name(verdict)] += 1
        report.tags[case.endpoint].update(case.tags)
        if verdict is not None and isinstance(verdict.outcome, Continue):
            report.forwarded_tags[case.endpoint].update(case.tags)
        found = check(case.endpoint, case.text.encode("utf-8"), verdict)
        if verdict is not None:  # judged (or refused as a bad body): and from its size?
            coarse = judge.coarse(scenario, case)
            if coarse is not None:
                report.coarse[_outcome_name(coarse)] += 1
                if coarse_family:
                    report.coarse_family[_outcome_name(coarse)] += 1
                found += check_coarse(case.endpoint, verdict, coarse, case.text)
        if found:
            report.bypass_bodies += 1
            report.bypasses.extend(found)
    report.elapsed_s = time.perf_counter() - start
    return report


def _print(report: Report, show: int) -> None:
    cols = ("passed", "downgraded", "rejected", "bad_request")
    print(f"{'endpoint':<16}{'bodies':>8}" + "".join(f"{c:>12}" for c in cols))
    totals: Counter[str] = Counter()
    for name in ENDPOINTS:
        o = report.outcomes[name]
        totals.update(o)
        row = f"{name:<16}{report.per_endpoint[name]:>8}"
        print(row + "".join(f"{o[c]:>12}" for c in cols))
    print(f"{'total':<16}{report.bodies:>8}" + "".join(f"{totals[c]:>12}" for c in cols))
    print("scenarios: " + ", ".join(f"{k}={v}" for k, v in sorted(report.scenarios.items())))
    coarse = ", ".join(f"{k}={v}" for k, v in sorted(report.coarse.items()))
    print(f"judged from their size too (the coarse verdict): {coarse}")
    family = ", ".join(f"{k}={v}" for k, v in sorted(report.coarse_family.items()))
    print(f"  of them the coarse family (coarse_ask): {family}")
    hard = (
        "dup_limit",
        "dup_n",
        "dup_nested",
        "null_limit",
        "n>1",
        "media",
        "prompt_list",
        "priority",
        "coarse_ask",
    )
    print("hard cases per endpoint, generated (went on):")
    print(f"  {'':<16}" + "".join(f"{h:>13}" for h in hard))
    for name in ENDPOINTS:
        t, f = report.tags[name], report.forwarded_tags[name]
        print(f"  {name:<16}" + "".join(f"{f'{t[h]} ({f[h]})':>13}" for h in hard))
    kinds = Counter((b.kind, b.endpoint, b.how) for b in report.bypasses)
    print(f"bypasses: {len(report.bypasses)} in {report.bypass_bodies} bodies")
    for (kind, endpoint, how), n in sorted(kinds.items()):
        print(f"  {kind:<15} {endpoint:<16} {how:<45} {n:>6}")
    shortest: dict[tuple[str, str], Bypass] = {}
    for b in report.bypasses:  # in the order found; keep the shortest of each kind
        key = (b.kind, b.endpoint)
        if key not in shortest or len(b.forwarded) < len(shortest[key].forwarded):
            shortest[key] = b
    if shortest and show:
        print(f"the shortest offending body of each kind and endpoint (at most {show}):")
    for b in list(shortest.values())[:show]:
        print(
            f"--- {b.kind} on {b.endpoint} ({b.how}): backend reads {b.backend}, "
            f"ICE allowed {b.allowed}"
        )
        print(f"    verdict: {b.verdict}")
        print(f"    body: {b.body}")
        if b.forwarded != b.body:
            print(f"    forwarded: {b.forwarded}")
    print(f"run time: {report.elapsed_s:.1f} s ({report.bodies / report.elapsed_s:.0f} bodies/s)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--bodies", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--show", type=int, default=12, help="offending bodies to print")
    parser.add_argument(
        "--without-unread-bounds",
        action="store_true",
        help="the coarse verdict as before issue 44 (what a body sets in a few bytes unread)",
    )
    args = parser.parse_args(argv)
    missing = set(ADAPTERS) - {p for p, _ in ENDPOINTS.values()}
    if missing:
        print(f"no generator for judged paths: {sorted(missing)}", file=sys.stderr)
        return 2
    report = run(args.bodies, args.seed, unread_bounds=not args.without_unread_bounds)
    _print(report, args.show)
    return 1 if report.bypasses else 0


if __name__ == "__main__":
    sys.exit(main())
