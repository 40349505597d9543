"""Issue 30 through real Envoy, cases 2 and 3: no body holds a worker, and a verdict made
without the body keeps nothing it did not read.

One stack whose ICE asks Envoy for at most 1 MiB of bodies at once (``--max-inflight-bytes``),
so that one slow upload (headers and a first byte of a 1,000,000-byte body, the rest held
back) leaves the worker "busy" for any body over 48,576 bytes. Each request asks for what the
full verdict would cut at high pressure: ``n: 16, max_tokens: 1,000,000`` (the cap there is
1,024). Before this change each one reached the backend with ``max_tokens`` 1,000,000 (a
coarse pass), or unjudged (the padded PNG). Since issue 44 a chat judged from its size is
never passed (``tests/e2e/test_gate_round_three_coarse.py``).
"""

from __future__ import annotations

import base64
import io
import json
import struct
import threading
import time
import zlib
from collections.abc import Iterator
from typing import Any

import pytest
from PIL import Image

from .harness import (
    CAP_HIGH,
    CHAT,
    E2E,
    HIGH,
    IDLE,
    KV_TIGHT,
    PROBE,
    Reply,
    running_stack,
    slow_upload,
    upload,
)

WINDOW = 1024 * 1024
ASK = {"model": "dev-model", "n": 16, "max_tokens": 1_000_000}
# low pressure (score 100 × 0.40 × 0.1 / 0.65 = 6), 899 free blocks of 16 tokens
ROOM_FOR_ONE = {**KV_TIGHT, "num_gpu_blocks": 1000}


@pytest.fixture(scope="module")
def busy_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[E2E]:
    with running_stack(
        tmp_path_factory.mktemp("load"), ice_extra=["--max-inflight-bytes", str(WINDOW)]
    ) as e2e:
        yield e2e


@pytest.fixture(autouse=True)
def _fresh(busy_stack: E2E) -> None:
    busy_stack.reset()


def chat(extra: dict[str, Any] | None = None, pad: int = 0) -> bytes:
    body: dict[str, Any] = {**ASK, "messages": [{"role": "user", "content": "hi"}]}
    if pad:
        body["metadata"] = {"pad": "x" * pad}
    return json.dumps({**body, **(extra or {})}).encode()


def sent_max_tokens(e2e: E2E) -> list[int]:
    return [json.loads(r.body)["max_tokens"] for r in e2e.received() if r.path == CHAT]


def test_a_busy_worker_refuses_at_high_pressure_what_it_cannot_cap(busy_stack: E2E) -> None:
    """Case 3 (a): judged from its headers, the request cannot be held to the cap. (Since
    issue 44 a chat is refused first for the ``n`` it may name: ``ice_busy``.)"""
    busy_stack.set_state(HIGH, level="high")
    with slow_upload(busy_stack):
        reply = busy_stack.post(CHAT, chat(pad=60_000))  # 1,000,000 + 60 kB > 1 MiB
    assert reply.status == 429, reply
    assert reply.header("x-ice-judged") == "headers"
    assert reply.header("x-ice-reason") == "ice_busy"
    assert reply.header("retry-after") is not None
    assert reply.json()["error"]["code"] == "ice_busy"
    assert sent_max_tokens(busy_stack) == []


def test_a_busy_worker_never_passes_a_chat_it_has_not_read(busy_stack: E2E) -> None:
    """Case 3 (a), after issue 44: the old coarse verdict passed the worst body of 60 kB
    (16 sequences of 8,192 prompt tokens) on the idle pool and refused it for the free
    blocks on a tight one. A chat names ``n`` and its limit in a few bytes whatever its
    size, so neither state passes it: a 429 ``ice_busy``."""
    for state, level in ((IDLE, "low"), (ROOM_FOR_ONE, "low")):
        busy_stack.set_state(state, level=level)
        with slow_upload(busy_stack):
            reply = busy_stack.post(CHAT, chat(pad=60_000))
        assert reply.status == 429, reply
        assert reply.header("x-ice-judged") == "headers"
        assert reply.header("x-ice-reason") == "ice_busy"
        assert sent_max_tokens(busy_stack) == []


def test_brackets_in_a_string_do_not_leave_a_body_to_the_coarse_verdict(busy_stack: E2E) -> None:
    """Case 3 (b): 25,000 "[" inside a 6 MB string once sent the body to the helper lane,
    where it was predicted late and passed from its size with max_tokens 1,000,000."""
    busy_stack.set_state(HIGH, level="high")
    body = chat({"metadata": {"note": "[" * 25_000 + "x" * 6_000_000}})
    reply = busy_stack.post(CHAT, body)
    assert reply.status == 200, reply
    assert reply.header("x-ice-judged") is None
    assert reply.header("x-ice-decision") == "downgrade"
    assert sent_max_tokens(busy_stack) == [CAP_HIGH]


def test_a_chunked_body_beside_a_slow_upload_is_judged_in_full(busy_stack: E2E) -> None:
    """Case 3 (c): a chunked body was promised 8 MiB at its headers, so beside one slow
    upload it was judged from them; now it is admitted at its body, by its size."""
    busy_stack.set_state(HIGH, level="high")
    with slow_upload(busy_stack):
        reply = upload(busy_stack.envoy_port, CHAT, [chat()], length=None)
    assert reply.status == 200, reply
    assert reply.header("x-ice-judged") is None
    assert reply.header("x-ice-decision") == "downgrade"
    assert sent_max_tokens(busy_stack) == [CAP_HIGH]


def padded_png(chunks: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (2, 2)).save(buf, "PNG")
    data = buf.getvalue()
    empty = struct.pack(">I", 0) + b"tEXt" + struct.pack(">I", zlib.crc32(b"tEXt"))
    return data[:33] + empty * chunks + data[33:]


def test_a_padded_png_does_not_hold_the_worker_and_its_neighbour_is_judged(
    busy_stack: E2E,
) -> None:
    """Case 2: a 6.4 MB data: URL of a 2×2 PNG padded with 400,000 empty chunks kept the
    event loop 1.3–2.1 s in its header (Envoy's 1 s timeout let it through unjudged, and its
    neighbours); it is now read from its IHDR."""
    url = "data:image/png;base64," + base64.b64encode(padded_png(400_000)).decode()
    part = {"type": "image_url", "image_url": {"url": url}}
    body = json.dumps({**ASK, "messages": [{"role": "user", "content": [part]}]}).encode()
    replies: dict[str, Reply] = {}

    def send_png() -> None:
        replies["png"] = busy_stack.post(CHAT, body)

    sender = threading.Thread(target=send_png)
    sender.start()
    time.sleep(0.3)  # the PNG's body is on its way, or being judged
    replies["probe"] = busy_stack.post(CHAT, PROBE)
    sender.join(60)
    for name, reply in replies.items():
        assert reply.header("x-ice-decision") is not None, (name, reply)
    assert replies["png"].header("x-ice-judged") is None
    assert replies["probe"].header("x-ice-judged") is None
