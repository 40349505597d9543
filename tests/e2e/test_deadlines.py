"""Issue 44, class 3, through real Envoy: ICE's deadlines are Envoy's deadlines.

Envoy's ext_proc filter starts a message's timer when it sends the message; in BUFFERED mode
the body message goes once the whole body is buffered and ICE's answer to the headers is
back, and its timer covers the transfer to ICE (``ext_proc.admit.backlog.timer_started``).
Before this change ICE counted a body's budget from when the body reached it, reported
SERVING while its helper process was still starting, and dropped a late stream without a
word in its log:

- a body judged in the helper (6 MB of empty arrays, ``n: 16, max_tokens: 1e6``) behind a
  slow link to ICE (10 MB/s: 0.6 s of transfer) got 600 ms more from its arrival, answered
  after Envoy's 1 s and went to the backend unjudged; it now gets ICE's verdict by the
  deadline (from its size, when the helper could not finish in time);
- the first helper-lane body after ICE reported SERVING got the coarse verdict (the helper
  was not ready), or none; it is now judged in full;
- a stream Envoy closed before ICE answered its body is logged with its ``x-request-id``.
"""

from __future__ import annotations

import base64
import io
import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from PIL import Image

from .harness import CHAT, E2E, ENVOY_TEMPLATE, access_log_entry, running_stack
from .slowlink import SlowLink

ASK = {"model": "dev-model", "n": 16, "max_tokens": 1_000_000}
# the tiny vLLM model's tokenizer: the helper loads it (and measures its bounds) at its start
TOKENIZER = Path(__file__).resolve().parents[1] / "data" / "vllm_cpu" / "tokenizer"
LINK_RATE_BYTES_S = 10e6


def arrays_body(count: int) -> bytes:
    """A chat whose parse belongs in the helper: ``count`` empty arrays (~4 bytes each)."""
    body: dict[str, Any] = {**ASK, "messages": [{"role": "user", "content": "hi"}]}
    body["extra"] = [[] for _ in range(count)]
    return json.dumps(body).encode()


def image_body(pad_bytes: int) -> bytes:
    """A chat with a small PNG as a data: URL and ``pad_bytes`` of text: over 1 MiB with a
    media mark, it belongs in the helper, which judges it in a few tens of ms."""
    buf = io.BytesIO()
    Image.new("RGB", (2, 2)).save(buf, "PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    parts = [
        {"type": "text", "text": "word " * (pad_bytes // 5)},
        {"type": "image_url", "image_url": {"url": url}},
    ]
    body = {
        "model": "dev-model",
        "max_tokens": 16,
        "messages": [{"role": "user", "content": parts}],
    }
    return json.dumps(body).encode()


@pytest.fixture
def slow_link_stack(tmp_path: Path) -> Iterator[E2E]:
    links: list[SlowLink] = []

    def link(address: str) -> str:
        links.append(SlowLink(address, LINK_RATE_BYTES_S))
        return links[-1].address

    try:
        with running_stack(tmp_path, ice_link=link) as e2e:
            yield e2e
    finally:
        for one in links:
            one.close()


def test_a_helper_body_behind_a_slow_link_is_answered_by_envoys_deadline(
    slow_link_stack: E2E,
) -> None:
    body = arrays_body(1_500_000)
    assert 5_500_000 < len(body) < 6_500_000
    reply = slow_link_stack.post(CHAT, body)
    tails = slow_link_stack.log_tails(30)
    assert reply.header("x-ice-decision") is not None, (reply.status, reply.ice_headers, tails)
    got = slow_link_stack.received()
    if got:  # sent on: with ICE's verdict, never with the client's n and max_tokens unread
        assert got[0].header("x-ice-decision") is not None or reply.status != 200


def test_serving_only_once_the_helper_can_judge(tmp_path: Path) -> None:
    """With a tokenizer the helper takes seconds to start (it loads the tokenizer after the
    worker did); the first helper-lane body sent once Envoy's health checks see ICE SERVING
    (no panic mode: Envoy sends ICE no stream before) is judged in full."""
    extra = f"tokenizers:\n  dev-model: {{model_dir: {TOKENIZER}}}\nexact_count: always\n"
    with running_stack(tmp_path, start_ice=False, policy_extra=extra) as e2e:
        body = image_body(1_200_000)
        e2e.stack.start_ice(
            e2e.ice_addresses[0],
            policy=tmp_path / "policy.yaml",
            metrics_address=f"127.0.0.1:{e2e.ice_metrics_port}",
            name="ice-late",
        )  # returns at the first SERVING
        e2e.wait_ice_healthy()
        reply = e2e.post(CHAT, body)
        tails = e2e.log_tails(30)
        assert reply.header("x-ice-decision") is not None, (reply.status, tails)
        assert reply.header("x-ice-judged") is None, (reply.ice_headers, tails)
        assert e2e.ice_metric("ice_coarse_verdicts_total") == 0


def short_timeout_template(workdir: Path, timeout: str) -> Path:
    """The shipped envoy.yaml with ext_proc's message_timeout set to ``timeout``."""
    config = yaml.safe_load(ENVOY_TEMPLATE.read_text())
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                for h in f["typed_config"].get("http_filters", []):
                    if h["name"] == "envoy.filters.http.ext_proc":
                        h["typed_config"]["message_timeout"] = timeout
    path = workdir / "envoy-short.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def test_a_stream_envoy_closed_before_the_answer_is_logged_with_its_request_id(
    tmp_path: Path,
) -> None:
    """Envoy's timer (0.1 s here) fires while ICE judges a body in its helper (ICE is told
    1 s): Envoy's late guard answers 429 ``ice_late`` (it used to go on unjudged), and ICE's
    log names the request."""
    template = short_timeout_template(tmp_path, "0.1s")
    with running_stack(tmp_path, envoy_template=template) as e2e:
        body = arrays_body(600_000)
        rid = "e2e-late-body-0001"
        reply = e2e.post(CHAT + "?late", body, headers={"x-request-id": rid})
        assert reply.status == 429, (reply.status, reply.ice_headers(), e2e.log_tails(30))
        assert reply.header("x-ice-reason") == "ice_late"
        assert not e2e.received(), "a body ICE did not judge in time reached the backend"
        entry = access_log_entry(e2e, CHAT + "?late")
        assert entry["ext_proc_body_status"] == "4", entry  # the body's call, not the headers'
        log = Path(e2e.stack.logs["ice"])
        deadline = time.monotonic() + 10
        late = "got no verdict in time"
        while late not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        named = re.findall(rf"request (\S+) {late}", log.read_text())
        # the client's id, unless Envoy replaced it (it may, for a client it deems external)
        assert named and named[0] != "without", e2e.log_tails(30)
