"""Issue 44, "the answer reaches the client": a refusal sent at a large upload's headers.

ICE answers a body over ``--max-body-bytes`` (8 MiB) at its headers with 413 (and a busy
worker's coarse refusal with 429, the same way). Envoy then writes the answer, adds
``connection: close``, stops reading the upload and closes the socket after its
``delayed_close_timeout`` (1 s); the kernel resets a connection closed with unread data.
Envoy has no setting that reads the rest of the upload before closing (envoyproxy/envoy
issue 36080: its maintainers confirmed it does not drain an unread request body after an
early response), so what a client sees depends on whether it reads the answer while, or
after, its upload fails (docs/flood.md, "The answer reaches the client"):

- curl (it reads while it sends), Python ``httpx`` (``httpcore`` reads the answer after a
  failed write) and the OpenAI and Anthropic SDKs (both on ``httpx``) see the 413 every time;
- ``http.client`` raises ``ConnectionResetError`` from ``request()`` and never reads the
  answer waiting in its socket (7 of 8 here; not asserted: it is the client's doing).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import anthropic
import httpx2
import openai
import pytest

from .harness import CHAT, E2E, MESSAGES

SIZE = 9 * 1024 * 1024  # over ICE's --max-body-bytes and Envoy's 8 MiB buffer
TRIES = 3
TEXT = "word " * (SIZE // 5)


def body() -> bytes:
    msg = {"role": "user", "content": TEXT}
    return json.dumps({"model": "dev-model", "max_tokens": 16, "messages": [msg]}).encode()


def via_curl(e2e: E2E, tmp: Path) -> int:
    path = tmp / "body.json"
    path.write_bytes(body())
    argv = ["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "-H", "Expect:"]
    argv += ["-H", "content-type: application/json", "--data-binary", f"@{path}"]
    argv.append(f"{e2e.base_url}{CHAT}")
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    return int(out.stdout.strip() or 0)


def via_httpx(e2e: E2E, _tmp: Path) -> int:
    headers = {"content-type": "application/json"}
    return httpx2.post(
        f"{e2e.base_url}{CHAT}", content=body(), headers=headers, timeout=60
    ).status_code


def via_openai(e2e: E2E, _tmp: Path) -> int:
    client = openai.OpenAI(base_url=f"{e2e.base_url}/v1", api_key="x", max_retries=0)
    with pytest.raises(openai.APIStatusError) as refused:
        client.chat.completions.create(
            model="dev-model", max_tokens=16, messages=[{"role": "user", "content": TEXT}]
        )
    return refused.value.status_code


def via_anthropic(e2e: E2E, _tmp: Path) -> int:
    client = anthropic.Anthropic(base_url=e2e.base_url, api_key="x", max_retries=0)
    with pytest.raises(anthropic.APIStatusError) as refused:
        client.messages.create(
            model="dev-model", max_tokens=16, messages=[{"role": "user", "content": TEXT}]
        )
    return refused.value.status_code


@pytest.mark.parametrize(
    "send", [via_curl, via_httpx, via_openai, via_anthropic], ids=lambda f: f.__name__[4:]
)
def test_a_refusal_at_a_large_uploads_headers_reaches_the_client(
    stack: E2E, tmp_path: Path, send: object
) -> None:
    assert MESSAGES  # the Anthropic SDK posts to /v1/messages
    for _ in range(TRIES):
        assert send(stack, tmp_path) == 413  # type: ignore[operator]
