"""The table of unset output limits (``ext_proc.schemas.limits``, docs/endpoints.md "A
request without a limit") against real vLLM: each vLLM API's request with its limit absent,
and with it ``null``, runs exactly what the table says.

vLLM 0.32 CPU, the tiny model (its generation config names no default, so ``config|rest``
is the rest of the context), ``max_model_len`` 512, ``ignore_eos`` so a sequence stops only
at its limit. Each row runs ``max_model_len`` − prompt tokens, or the table's number; a
``REFUSED`` row is vLLM's 400. SGLang is not installed here: its column is read from its
source (docs/endpoints.md).

Needs ``.venv-vllm`` (``make vllm-install``) and ``ICE_VLLM=1``; about 2.5 minutes on 2 cores
(vLLM's start-up is most of it).
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from ext_proc.lab import vllm_local as vl
from ext_proc.schemas.limits import REFUSED, UNSET_LIMITS

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        os.environ.get("ICE_VLLM") != "1" or not vl.venv_ready(vl.DEFAULT_VENV),
        reason="needs ICE_VLLM=1 and .venv-vllm (make vllm-install)",
    ),
]

MAX_MODEL_LEN = 512
USER = [{"role": "user", "content": "why does the cache fill up"}]
MODEL = "tiny"

# schema → (path, body without its limit, where the limit goes, its field, how to read the
# prompt and completion tokens from the answer)
ROWS: dict[str, tuple[str, dict[str, Any], str | None, str]] = {
    "openai.chat": ("/v1/chat/completions", {"messages": USER, "ignore_eos": True}, None,
                    "max_tokens"),
    "openai.chat_batch": ("/v1/chat/completions/batch",
                          {"messages": [USER], "ignore_eos": True}, None, "max_tokens"),
    "openai.responses": ("/v1/responses", {"input": "why does the cache fill up",
                                           "ignore_eos": True}, None, "max_output_tokens"),
    "openai.completions": ("/v1/completions", {"prompt": "why does the cache fill up",
                                               "ignore_eos": True}, None, "max_tokens"),
    "vllm.generate": ("/inference/v1/generate",
                      {"token_ids": [5, 6, 7, 8], "sampling_params": {"ignore_eos": True}},
                      "sampling_params", "max_tokens"),
    "anthropic.messages": ("/v1/messages", {"messages": USER}, None, "max_tokens"),
}  # fmt: skip


@pytest.fixture(scope="module")
def vllm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[vl.VllmServer]:
    # --enable-scale-out: /inference/v1/generate is a 403 without it
    cfg = vl.ServeConfig(
        port=vl.free_port(), max_model_len=MAX_MODEL_LEN, extra_args=("--enable-scale-out",)
    )
    log = tmp_path_factory.mktemp("vllm-unset") / "vllm.log"
    with vl.start_server(cfg, log_path=log) as server:
        yield server


def _post(server: vl.VllmServer, path: str, body: dict[str, Any]) -> tuple[int, Any]:
    data = json.dumps({"model": MODEL, **body}).encode()
    req = urllib.request.Request(
        server.base_url + path, data, {"content-type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def _ran(schema: str, body: dict[str, Any], doc: Any) -> tuple[int, int]:
    """(prompt tokens, output tokens of the first sequence) from vLLM's answer."""
    if schema == "vllm.generate":
        return len(body["token_ids"]), len(doc["choices"][0]["token_ids"])
    usage = doc["usage"]
    if schema == "openai.responses":
        return usage["input_tokens"], usage["output_tokens"]
    return usage["prompt_tokens"], usage["completion_tokens"]


@pytest.mark.parametrize("null", [False, True], ids=["absent", "null"])
@pytest.mark.parametrize("schema", list(ROWS))
def test_vllm_runs_what_the_table_says(vllm: vl.VllmServer, schema: str, null: bool) -> None:
    path, base, where, field = ROWS[schema]
    body = json.loads(json.dumps(base))
    if null:
        (body[where] if where else body)[field] = None
    row = UNSET_LIMITS[schema]
    rule = row.null if null else row.absent
    status, doc = _post(vllm, path, body)
    if rule == REFUSED:
        assert status == 400, (status, doc)
        return
    assert status == 200, (status, doc)
    prompt, output = _ran(schema, body, doc)
    expected = rule if isinstance(rule, int) else MAX_MODEL_LEN - prompt
    assert output == expected, (schema, null, prompt, output, doc)
