"""``exact_count: needed`` gives ``always``'s verdict on adversarial text, through real Envoy.

Issue 44, item 9. ICE runs with a tokenizer trained at test time for ``dev-model`` (the e2e
window: 8,192 tokens) and ``exact_count: needed``:

- high side: an NFKC + ByteLevel tokenizer and a turn of 400 × ﷺ (1,261 body bytes, an
  estimate of 407, 13,213 tokens: NFKC makes each ﷺ 18 characters). Before, the estimate's
  measured bounds (0.5–7.5, capped at a token a body byte: 1,517) decided it and it reached
  the backend; now the bounds derived from the tokenizer (up to 33 tokens per estimated
  token) straddle the window, it is counted, and refused as ``always`` refuses it: 400
  ``context_length_exceeded``.
- low side: a ByteLevel tokenizer with ChatML specials and a turn of 6,000 literal
  ``<|im_start|>`` (an estimate of 18,007; 6,016 tokens, one a special). Before, the lower
  bound (9,004) refused it with 400 ``context_length_exceeded``; now it is counted and passes.
"""

from __future__ import annotations

from pathlib import Path

import openai

from tests import token_families as tf
from tests.builders import build_nfkc_bytelevel

from .harness import running_stack


def post(base_url: str, content: str) -> tuple[int, dict[str, str]]:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0)
    try:
        raw = client.chat.completions.with_raw_response.create(
            model="dev-model",
            messages=[{"role": "user", "content": content}],
            max_tokens=16,
        )
        return raw.status_code, dict(raw.headers)
    except openai.APIStatusError as e:
        return e.status_code, dict(e.response.headers)
    finally:
        client.close()


def policy(folder: Path) -> str:
    return f"tokenizers:\n  dev-model: {{model_dir: {folder}}}\nexact_count: needed\n"


def test_needed_refuses_an_nfkc_expanded_prompt_over_the_window(tmp_path: Path) -> None:
    folder = build_nfkc_bytelevel(tmp_path / "tok")
    with running_stack(tmp_path, policy_extra=policy(folder)) as e2e:
        status, headers = post(e2e.base_url, "ﷺ" * 400)
    assert headers.get("x-ice-decision") == "reject", (status, headers)
    assert status == 400 and headers["x-ice-reason"] == "context_length_exceeded"
    assert headers.get("x-ice-tokens") == "exact"


def test_needed_passes_a_prompt_of_literal_specials_within_the_window(tmp_path: Path) -> None:
    folder = next(f.folder for f in tf.build(tmp_path / "tok") if f.name == "bytelevel-chatml")
    with running_stack(tmp_path, policy_extra=policy(folder)) as e2e:
        status, headers = post(e2e.base_url, "<|im_start|>" * 6000)
    assert headers.get("x-ice-decision") == "pass", (status, headers)
    assert status == 200 and headers.get("x-ice-tokens") == "exact"
