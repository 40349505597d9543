"""Mutated requests through real Envoy, ICE and the dev backend: nothing crashes, hangs, alters.

    .venv/bin/python bench/fuzz.py [--bodies 100000] [--seed 1] [--concurrency 8] [--busy]
        [--json F]

Job: from valid chat, completions and Anthropic messages bodies, make seeded mutations —
wrong types, huge numbers (1e30, 10^30), NaN / Infinity literals, nesting 20,000 deep, a
BOM, invalid UTF-8, cut-off JSON, repeated keys, six content types, bodies over the 8 MiB
limit (declared and sent), chunked bodies, odd paths and methods, and odd types and sizes
(long texts and lists, deep nesting, a 4,301-digit integer) at every field ICE reads on every
judged endpoint (``odd_field``), images and audio whose headers take many steps to walk
(``media_walk``: PNGs padded with empty chunks, JPEGs with empty segments, GIFs with
one-byte sub-blocks, WebPs with empty chunks, WAVs whose data size says 0), over 20,000
``[`` inside a string with ``n: 16, max_tokens: 1e6`` (``brackets_string``), chunked
bodies asking as much (``chunked_big_ask``), a ``null`` output limit, with ``n`` 1 or 16,
on every generating endpoint (``null_limit``: judged as the backend runs it, to the end of
the context; docs/endpoints.md "A request without a limit") and 200 kB bodies asking ``n: 17``
or ``500`` and ``max_tokens: 1e6`` (``coarse_big_ask``: with ``--busy``, every batch is sent
beside two slow uploads that hold ICE's body window, so such a body is judged from its size) —
and send each through the
stack (one ICE worker, ``envoy/envoy.yaml``, the dev backend). Every request carries
``x-fuzz-id``; the dev backend records what reached it. Reported by outcome: passed
(the backend's 200 with the body byte for byte as sent), mutated (ICE rewrote it: the body
the backend got is JSON and differs from the sent one only in the output-limit fields),
4xx by status and ``x-ice-reason`` (Envoy's own: ``envoy``), 5xx by who sent it, requests
over 5 s, ICE's crashes (its process gone or restarted) and ICE's own faults while judging
(``ice_judge_errors_total``: a fault fails open on the fuzz policy, so it is read from
ICE's metrics), unjudged requests (a POST to a judged path answered 2xx without
``x-ice-decision``: Envoy let it through) and coarse passes (a 2xx with ``x-ice-judged:
headers``: a body passed unread, which a body of any size may make more permissive than its
full verdict, docs/flood.md). Targets: 0 crashes, 0 hangs, 0 altered passed bodies, 0 5xx
from ICE, 0 judge faults, 0 unjudged, 0 coarse passes.

``run`` is what ``tests/e2e/test_fuzz.py`` calls with 2,000 bodies on the e2e stack.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.client
import json
import random
import socket
import struct
import sys
import tempfile
import time
import urllib.request
import zlib
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:  # run as a script: import ext_proc from the checkout
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

LIMIT_FIELDS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "max_new_tokens")
SLOW_S = 5.0
BIG = 9 * 1024 * 1024  # over the 8 MiB body limit
COARSE_PAD = 200_000  # coarse_big_ask: beside the busy uploads, past the 16 MiB window's 7/8
# ``--busy``: two slow uploads (headers and one byte each) that hold 14.6 MB of ICE's 16 MiB
# body window (7/8 of it for bodies over 64 KiB), so that a body over ~80 kB is judged from
# its size, not read (docs/flood.md)
BUSY_UPLOADS = (7_300_000, 7_300_000)
CONTENT_TYPES = (
    "application/json",
    "application/json; charset=utf-8",
    "text/plain",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/vnd.api+json",
)
PATHS = ("/v1/chat/completions", "/v1/completions", "/v1/messages")
# every path a POST is judged on (the shipped configs' judged routes)
JUDGED = frozenset(
    {*PATHS, "/v1/responses", "/v1/embeddings", "/v1/chat/completions/batch", "/invocations",
     "/inference/v1/generate", "/generate"}
)  # fmt: skip


@dataclass
class Case:
    id: int
    family: str
    method: str
    path: str
    content_type: str | None
    body: bytes
    chunked: bool = False


def _base(rng: random.Random, path: str) -> dict[str, Any]:
    text = " ".join(
        rng.choice(["memory", "cache", "block", "token", "why", "é", "内存"])
        for _ in range(rng.randint(1, 40))
    )
    limit = rng.choice([1, 16, 256, 4096, 100_000])
    if path == "/v1/completions":
        return {"model": "dev-model", "prompt": text, "max_tokens": limit}
    messages = [{"role": "user", "content": text}]
    if path == "/v1/messages":
        return {"model": "dev-model", "messages": messages, "max_tokens": limit}
    if rng.random() < 0.3:
        messages.insert(0, {"role": "system", "content": "Be brief."})
    return {"model": "dev-model", "messages": messages, "max_tokens": limit}


def _odd_value(rng: random.Random) -> Any:
    return rng.choice(["lots", -3, 1.5, True, None, [], {}, [1, 2], {"a": 1}, 10**30, "", "∞"])


# The fields ICE reads, by endpoint: (path, a valid body, where the field is). ``odd_field``
# puts an odd type or size there; the answer must be a 4xx or a judged pass, never a fault.
ODD_FIELD_SITES: tuple[tuple[str, dict[str, Any], tuple[str | int, ...]], ...] = tuple(
    (path, doc, where)
    for path, doc, wheres in (
        (
            "/v1/chat/completions",
            {"model": "dev-model", "max_tokens": 16, "n": 1, "tools": [], "documents": [],
             "chat_template_kwargs": {"x": "y"}, "messages": [
                 {"role": "user", "content": [{"type": "text", "text": "hi"}]},
                 {"role": "assistant", "content": "a", "reasoning": "r",
                  "tool_calls": [{"function": {"name": "f", "arguments": "{}"}}]}]},
            (("model",), ("max_tokens",), ("n",), ("tools",), ("documents",),
             ("chat_template_kwargs",), ("chat_template_kwargs", "x"), ("messages",),
             ("messages", 0), ("messages", 0, "role"), ("messages", 0, "content"),
             ("messages", 0, "content", 0), ("messages", 0, "content", 0, "type"),
             ("messages", 0, "content", 0, "text"), ("messages", 1, "reasoning"),
             ("messages", 1, "tool_calls"), ("messages", 1, "tool_calls", 0, "function")),
        ),
        (
            "/v1/chat/completions/batch",
            {"model": "dev-model", "max_tokens": 16,
             "messages": [[{"role": "user", "content": [{"type": "text", "text": "hi"}]}]]},
            (("messages",), ("messages", 0), ("messages", 0, 0, "content", 0, "type")),
        ),
        (
            "/v1/completions",
            {"model": "dev-model", "prompt": "hi", "max_tokens": 16, "best_of": 1},
            (("prompt",), ("max_tokens",), ("best_of",)),
        ),
        (
            "/v1/messages",
            {"model": "dev-model", "max_tokens": 16, "system": [{"type": "text", "text": "s"}],
             "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
            (("system",), ("system", 0, "type"), ("messages", 0, "content"),
             ("messages", 0, "content", 0, "type"), ("max_tokens",)),
        ),
        (
            "/v1/responses",
            {"model": "dev-model", "max_output_tokens": 16, "instructions": "i",
             "input": [{"type": "message", "role": "user",
                        "content": [{"type": "input_text", "text": "hi"}]}]},
            (("input",), ("input", 0, "type"), ("input", 0, "content", 0, "type"),
             ("instructions",), ("max_output_tokens",)),
        ),
        (
            "/v1/embeddings",
            {"model": "dev-model", "input": ["a", "b"]},
            (("input",), ("input", 0)),
        ),
        (
            "/inference/v1/generate",
            {"model": "dev-model", "token_ids": [1, 2], "sampling_params": {"max_tokens": 16},
             "content_parts": [{"type": "text", "text": "x"}]},
            (("token_ids",), ("sampling_params",), ("sampling_params", "max_tokens"),
             ("content_parts", 0, "type")),
        ),
        (
            "/invocations",
            {"model": "dev-model", "max_tokens": 16,
             "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]},
            (("messages", 0, "content", 0, "type"), ("max_tokens",)),
        ),
    )
    for where in wheres
)  # fmt: skip
HUGE_INT = "7" * (sys.get_int_max_str_digits() + 1)  # more digits than Python converts


def _odd_or_big(rng: random.Random) -> Any:
    """An odd type, or an odd size: long text, a long list, deep nesting, a huge integer."""
    return rng.choice(
        [
            *(_odd_value(rng) for _ in range(3)),
            [[]],
            [None],
            {"type": []},
            "x" * rng.choice([10_000, 300_000]),
            ["x"] * rng.choice([1_000, 50_000]),
            json.loads("[" * 500 + "]" * 500),
            HUGE_INT,  # spliced in as a bare number (see odd_field)
        ]
    )


def _odd_field(rng: random.Random) -> tuple[str, str]:
    """``odd_field``: one field ICE reads, set to an odd type or size; the path and text."""
    path, doc, where = rng.choice(ODD_FIELD_SITES)
    doc = json.loads(json.dumps(doc))
    parent: Any = doc
    for key in where[:-1]:
        parent = parent[key]
    value = _odd_or_big(rng)
    parent[where[-1]] = "__HUGE__" if value == HUGE_INT else value
    return path, json.dumps(doc).replace('"__HUGE__"', HUGE_INT)


def _png(chunks: int) -> bytes:
    def chunk(tag: bytes, data: bytes) -> bytes:
        crc = zlib.crc32(tag + data)
        return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", crc)

    ihdr = chunk(b"IHDR", struct.pack(">IIBBBBB", 2, 2, 8, 2, 0, 0, 0))
    sig = b"\x89PNG\r\n\x1a\n"
    return sig + ihdr + chunk(b"tEXt", b"") * chunks + chunk(b"IDAT", b"") + chunk(b"IEND", b"")


def _jpeg(segments: int) -> bytes:
    sof = b"\xff\xc0\x00\x11\x08\x00\x02\x00\x02\x03\x01\x11\x00\x02\x11\x01\x03\x11\x01"
    sos = b"\xff\xda\x00\x08\x01\x01\x00\x00\x3f\x00"
    return b"\xff\xd8" + b"\xff\xfe\x00\x02" * segments + sof + sos + b"\xff\xd9"


def _gif(blocks: int) -> bytes:
    head = b"GIF89a" + struct.pack("<HHBBB", 2, 2, 0, 0, 0)
    frame = b"," + struct.pack("<HHHHB", 0, 0, 2, 2, 0) + b"\x02\x00;"
    return head + b"\x21\xfe" + b"\x01a" * blocks + b"\x00" + frame


def _webp(chunks: int) -> bytes:
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\0" * 4 + (1).to_bytes(3, "little") * 2
    body = b"WEBP" + vp8x + (b"JUNK" + struct.pack("<I", 0)) * chunks
    return b"RIFF" + struct.pack("<I", len(body)) + body


def _wav(samples: int) -> bytes:
    fmt = b"fmt " + struct.pack("<IHHIIHH", 16, 1, 1, 16000, 32000, 2, 16)
    return b"RIFF\0\0\0\0WAVE" + fmt + b"data\0\0\0\0" + b"\0" * samples


def _media_walk(rng: random.Random) -> dict[str, Any]:
    """``media_walk``: one image or audio part whose header takes many steps to walk."""
    steps = rng.choice([0, 10, 1_000, 5_000, 20_000])
    kind = rng.choice(["png", "jpeg", "gif", "webp", "wav"])
    if kind == "wav":
        data = base64.b64encode(_wav(steps * 10)).decode()
        part: dict[str, Any] = {"type": "input_audio", "input_audio": {"data": data}}
        part["input_audio"]["format"] = "wav"
    else:
        raw = {"png": _png, "jpeg": _jpeg, "gif": _gif, "webp": _webp}[kind](steps)
        url = f"data:image/{kind};base64,{base64.b64encode(raw).decode()}"
        part = {"type": "image_url", "image_url": {"url": url}}
    content = [{"type": "text", "text": "what is it?"}, part] * rng.choice([1, 1, 4])
    return {"model": "dev-model", "messages": [{"role": "user", "content": content}]}


USER = [{"role": "user", "content": "why does the cache fill"}]
# ``null_limit``: (path, body with a null limit, where n goes: "top", "sampling_params" or "")
NULL_LIMIT_BODIES: tuple[tuple[str, dict[str, Any], str], ...] = (
    ("/v1/chat/completions", {"messages": USER, "max_tokens": None}, "top"),
    ("/v1/chat/completions",
     {"messages": USER, "max_completion_tokens": None, "max_tokens": None}, "top"),
    ("/v1/completions", {"prompt": ["why", "the cache"], "max_tokens": None}, "top"),
    ("/v1/responses", {"input": "why", "max_output_tokens": None}, ""),
    ("/v1/chat/completions/batch", {"messages": [USER, USER], "max_tokens": None}, ""),
    ("/invocations", {"prompt": "why", "max_tokens": None}, "top"),
    ("/invocations", {"messages": USER, "max_tokens": None}, "top"),
    ("/inference/v1/generate",
     {"token_ids": [1, 2, 3], "sampling_params": {"max_tokens": None}}, "sampling_params"),
    ("/generate", {"text": "why", "sampling_params": {"max_new_tokens": None}},
     "sampling_params"),
    ("/generate", {"text": ["a", "b"], "sampling_params": [{"max_new_tokens": None}, {}]}, ""),
    ("/v1/messages", {"messages": USER, "max_tokens": None}, ""),  # required: a 400
)  # fmt: skip


def _null_limit(rng: random.Random) -> tuple[str, str]:
    """``null_limit``: a body whose output limit is ``null``, n 1 or 16; the path and text."""
    path, doc, where = rng.choice(NULL_LIMIT_BODIES)
    doc = {"model": "dev-model", **json.loads(json.dumps(doc))}
    n = rng.choice([1, 16])
    if where == "top":
        doc["n"] = n
    elif where == "sampling_params":
        doc["sampling_params"]["n"] = n
    return path, json.dumps(doc)


def mutations(count: int, seed: int) -> Iterator[Case]:
    """``count`` seeded cases (see the module docstring for the families)."""
    rng = random.Random(seed)
    families = (
        "valid", "wrong_type", "huge_number", "nan", "deep", "bom", "bad_utf8", "cut",
        "repeated_key", "content_type", "oversized", "chunked", "odd_path", "odd_method",
        "odd_field", "media_walk", "brackets_string", "chunked_big_ask", "null_limit",
        "coarse_big_ask",
    )  # fmt: skip
    for i in range(count):
        family = families[i % len(families)]
        path = rng.choice(PATHS)
        doc = _base(rng, path)
        method, chunked = "POST", False
        ctype: str | None = "application/json"
        text = json.dumps(doc, ensure_ascii=rng.random() < 0.5)
        if family == "wrong_type":
            key = rng.choice([*doc.keys(), "n", "stream", "messages"])
            doc[key] = _odd_value(rng)
            text = json.dumps(doc)
        elif family == "huge_number":
            text = text.replace(
                f'"max_tokens": {doc["max_tokens"]}',
                '"max_tokens": ' + rng.choice(["1e30", "10" + "0" * 30, "-1e30", "1.0", "9" * 400]),
            )
        elif family == "nan":
            text = text.replace(
                f'"max_tokens": {doc["max_tokens"]}',
                '"max_tokens": ' + rng.choice(["NaN", "Infinity", "-Infinity"]),
            )
        elif family == "deep":
            depth = rng.choice([100, 1000, 20_000])
            text = text[:-1] + ', "x": ' + "[" * depth + "]" * depth + "}"
        elif family == "bom":
            text = "\ufeff" + text
        elif family == "cut":
            text = text[: rng.randint(0, max(0, len(text) - 1))]
        elif family == "repeated_key":
            text = text[:-1] + f', "max_tokens": {rng.choice([1, 10**6, "null"])}' + "}"
        elif family == "content_type":
            ctype = rng.choice(CONTENT_TYPES)
        elif family == "oversized":
            text = text[:-1] + ', "pad": "' + "x" * BIG + '"}'
        elif family == "chunked":
            chunked = True
        elif family == "odd_path":
            path = rng.choice(
                [
                    "/v1/chat",
                    "/v1/chat/completions/",
                    "//v1//completions",
                    "/v1/models",
                    "/admin",
                    "/v1/embeddings/x",
                    "/%2e%2e/v1/completions",
                ]
            )
        elif family == "odd_method":
            method = rng.choice(["GET", "PUT", "DELETE", "PATCH", "OPTIONS"])
        elif family == "odd_field":
            path, text = _odd_field(rng)
        elif family == "null_limit":
            path, text = _null_limit(rng)
        elif family == "media_walk":
            path, text = "/v1/chat/completions", json.dumps(_media_walk(rng))
        elif family == "coarse_big_ask":  # over 64 KiB: judged from its size when busy
            doc.update({"n": rng.choice([17, 500]), "max_tokens": 10**6})
            doc["metadata"] = {"pad": "x" * COARSE_PAD}
            text = json.dumps(doc)
        elif family in ("brackets_string", "chunked_big_ask"):
            doc.update({"n": 16, "max_tokens": 10**6})
            if family == "brackets_string":
                doc["metadata"] = {"note": "[" * rng.choice([20_001, 30_000]) + "x"}
            chunked = family == "chunked_big_ask"
            text = json.dumps(doc)
        body = text.encode("utf-8", "surrogatepass")
        if family == "bad_utf8":
            cut = rng.randint(0, len(body))
            body = (
                body[:cut]
                + rng.choice([b"\xff", b"\xc3", b"\xed\xa0\x80", b"\x80\x80"])
                + body[cut:]
            )
        if family != "content_type" and rng.random() < 0.1:
            ctype = None  # many clients send none: judged as JSON
        yield Case(i, family, method, path, ctype, body, chunked)


@dataclass
class Sent:
    case: Case
    status: int
    headers: dict[str, str]
    seconds: float
    error: str = ""


def send(port: int, case: Case, timeout_s: float = 30) -> Sent:
    headers = {"x-fuzz-id": str(case.id)}
    if case.content_type is not None:
        headers["content-type"] = case.content_type
    started = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        if case.chunked:
            conn.request(
                case.method, case.path, body=iter([case.body]), headers=headers, encode_chunked=True
            )
        else:
            conn.request(case.method, case.path, body=case.body, headers=headers)
        resp = conn.getresponse()
        resp.read()
        got = {k.lower(): v for k, v in resp.getheaders()}
        return Sent(case, resp.status, got, time.perf_counter() - started)
    except (OSError, http.client.HTTPException) as e:
        return Sent(case, 0, {}, time.perf_counter() - started, type(e).__name__)
    finally:
        conn.close()


@contextlib.contextmanager
def busy_uploads(port: int, lengths: tuple[int, ...] = BUSY_UPLOADS) -> Iterator[None]:
    """Slow uploads (their headers and one byte each, the rest never sent) held open while
    the block runs: ICE promises their bodies places in its window (``--busy``)."""
    socks = []
    try:
        for length in lengths:
            sock = socket.create_connection(("127.0.0.1", port), timeout=30)
            socks.append(sock)
            head = (
                f"POST /v1/chat/completions HTTP/1.1\r\nhost: fuzz\r\n"
                f"content-type: application/json\r\ncontent-length: {length}\r\n\r\n{{"
            )
            sock.sendall(head.encode())
        time.sleep(0.2)  # ICE has seen their headers
        yield
    finally:
        for sock in socks:
            sock.close()


def recorded(backend_url: str) -> dict[int, bytes]:
    """The bodies the dev backend received, by ``x-fuzz-id``; then cleared."""
    with urllib.request.urlopen(f"{backend_url}/_dev/requests", timeout=30) as r:
        items = json.loads(r.read())
    out = {}
    for item in items:
        ids = [v for k, v in item["headers"] if k.lower() == "x-fuzz-id"]
        if ids:
            out[int(ids[0])] = base64.b64decode(item["body_b64"])
    req = urllib.request.Request(f"{backend_url}/_dev/requests", method="DELETE")
    urllib.request.urlopen(req, timeout=30).read()
    return out


def only_limits_differ(sent: bytes, got: bytes) -> bool:
    try:
        a, b = json.loads(sent), json.loads(got)
    except ValueError:
        return False
    if not isinstance(a, dict) or not isinstance(b, dict):
        return False
    return _without_limits(a) == _without_limits(b)


def _without_limits(doc: dict[str, Any]) -> dict[str, Any]:
    """``doc`` less its output-limit fields, at the top level and inside ``sampling_params``
    (vLLM's ``/inference/v1/generate`` and SGLang's ``/generate`` keep the limit there)."""
    out = {k: v for k, v in doc.items() if k not in LIMIT_FIELDS}
    params = out.get("sampling_params")
    if isinstance(params, dict):
        out["sampling_params"] = {k: v for k, v in params.items() if k not in LIMIT_FIELDS}
    elif isinstance(params, list):
        out["sampling_params"] = [
            {k: v for k, v in p.items() if k not in LIMIT_FIELDS} if isinstance(p, dict) else p
            for p in params
        ]
    return out


@dataclass
class Report:
    sent: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    families: dict[str, Counter[str]] = field(default_factory=dict)
    altered: list[int] = field(default_factory=list)
    slow: list[int] = field(default_factory=list)
    ice_5xx: list[int] = field(default_factory=list)
    unjudged: list[int] = field(default_factory=list)
    coarse_passes: list[int] = field(default_factory=list)  # 2xx with x-ice-judged: headers
    errors: list[str] = field(default_factory=list)
    seconds: float = 0.0
    judge_errors: float = 0.0  # ICE's faults while judging (``ice_judge_errors_total``)


def classify(s: Sent, got: bytes | None, report: Report) -> None:
    c = s.case
    if s.status == 0 and c.family == "oversized" and s.error == "ConnectionResetError":
        # refused before the upload ended (413 at the headers): Envoy closes the connection
        # while http.client, which sends all before it reads, is still writing
        outcome = "413:reset_before_read"
    elif s.status == 0:
        outcome = f"error:{s.error}"
        report.errors.append(f"{c.id} {c.family}: {s.error}")
    elif s.status >= 500:
        who = "ice" if "x-ice-decision" in s.headers else s.headers.get("server", "?")
        outcome = f"5xx:{s.status}:{who}"
        if who == "ice":
            report.ice_5xx.append(c.id)
    elif s.status >= 400:
        reason = s.headers.get(
            "x-ice-reason", "envoy" if "x-ice-decision" not in s.headers else "?"
        )
        outcome = f"{s.status}:{reason}"
    elif c.method == "POST" and c.path in JUDGED and "x-ice-decision" not in s.headers:
        outcome = "2xx:unjudged"  # Envoy let it through without a verdict
        report.unjudged.append(c.id)
    elif s.headers.get("x-ice-judged") == "headers":
        outcome = "2xx:coarse_pass"  # passed unread: never, since issue 44 (docs/flood.md)
        report.coarse_passes.append(c.id)
    elif got is None:
        outcome = "2xx:not_at_backend"  # e.g. a read-only path answered by another route
    elif got == c.body or (c.chunked and got == c.body):
        outcome = "passed"
    elif only_limits_differ(c.body, got) and s.headers.get("x-ice-decision") == "downgrade":
        outcome = "mutated"
    else:
        outcome = "altered"
        report.altered.append(c.id)
    if s.seconds > SLOW_S:
        report.slow.append(c.id)
    report.outcomes[outcome] += 1
    report.families.setdefault(c.family, Counter())[outcome] += 1


def judge_errors(metrics_url: str) -> float:
    """The sum of ICE's ``ice_judge_errors_total`` samples on its /metrics page."""
    with urllib.request.urlopen(metrics_url, timeout=30) as r:
        page = r.read().decode()
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith("ice_judge_errors_total{")
    )


def run(
    port: int,
    backend_url: str,
    count: int,
    seed: int = 1,
    concurrency: int = 8,
    batch: int = 400,
    metrics_url: str | None = None,
    busy: bool = False,
) -> Report:
    """Send ``count`` cases; verify them against what the backend received (and, with
    ``metrics_url``, ICE's /metrics: its faults while judging them). ``busy``: each batch
    is sent beside slow uploads (``busy_uploads``), so that long bodies are judged from
    their size."""
    report = Report()
    faults_before = judge_errors(metrics_url) if metrics_url else 0.0
    started = time.perf_counter()
    recorded(backend_url)  # start clean
    cases = mutations(count, seed)
    with ThreadPoolExecutor(concurrency) as pool:
        while True:
            chunk = [c for _, c in zip(range(batch), cases, strict=False)]
            if not chunk:
                break
            with busy_uploads(port) if busy else contextlib.nullcontext():
                results = list(pool.map(lambda c: send(port, c), chunk))
            bodies = recorded(backend_url)
            for s in results:
                classify(s, bodies.get(s.case.id), report)
            report.sent += len(chunk)
    report.seconds = time.perf_counter() - started
    if metrics_url:
        report.judge_errors = judge_errors(metrics_url) - faults_before
    return report


def print_report(r: Report, crashes: int) -> None:
    print(
        f"{r.sent:,} requests in {r.seconds:.0f} s; ICE crashes {crashes}; over "
        f"{SLOW_S:.0f} s: {len(r.slow)}; altered: {len(r.altered)}; 5xx from ICE: "
        f"{len(r.ice_5xx)}; ICE's faults while judging: {r.judge_errors:.0f}; unjudged: "
        f"{len(r.unjudged)}; coarse passes: {len(r.coarse_passes)}"
    )
    for outcome, n in r.outcomes.most_common():
        print(f"  {outcome:<40} {n:>8,}")


def main(argv: list[str] | None = None) -> int:
    import throughput as tb

    from ext_proc.lab.stack import ENVOY_DIR, Stack, free_port, render_envoy_config

    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--bodies", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--json")
    ap.add_argument("--busy", action="store_true", help="send beside slow uploads (coarse)")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ice-fuzz-") as tmp, Stack(Path(tmp)) as stack:
        backend, ice, ingress, admin = free_port(), free_port(), free_port(), free_port()
        metrics = free_port()
        backend_url = stack.start_backend(backend)
        policy = tb.write_policy(Path(tmp), f"{backend_url}/metrics")
        stack.start_ice(f"127.0.0.1:{ice}", policy=policy, metrics_address=f"127.0.0.1:{metrics}")
        config = render_envoy_config(
            ENVOY_DIR / "envoy.yaml",
            admin_port=admin,
            listeners={"ingress": ingress},
            clusters={"ice": [f"127.0.0.1:{ice}"], "backend": [f"127.0.0.1:{backend}"]},
        )
        stack.start_envoy(config, admin)
        time.sleep(1.5)
        proc = stack.procs["ice"]
        metrics_url = f"http://127.0.0.1:{metrics}/metrics"
        report = run(
            ingress,
            backend_url,
            args.bodies,
            args.seed,
            args.concurrency,
            metrics_url=metrics_url,
            busy=args.busy,
        )
        crashes = 0 if proc.poll() is None else 1
        print_report(report, crashes)
        if args.json:
            row = {
                "sent": report.sent,
                "seconds": report.seconds,
                "crashes": crashes,
                "outcomes": dict(report.outcomes),
                "families": {k: dict(v) for k, v in report.families.items()},
                "altered": report.altered,
                "slow": report.slow,
                "ice_5xx": report.ice_5xx,
                "unjudged": report.unjudged,
                "coarse_passes": report.coarse_passes,
                "errors": report.errors,
                "judge_errors": report.judge_errors,
            }
            Path(args.json).write_text(json.dumps(row, indent=1))
        bad = (
            crashes
            or report.altered
            or report.ice_5xx
            or report.slow
            or report.judge_errors
            or report.unjudged
            or report.coarse_passes
        )
        return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
