"""Admission by forecast against a real vLLM (docs/forecast.md), at a small size.

Starts ``vllm serve`` (CPU, the tiny model, 24 KV blocks of 128 tokens: 23 usable), ICE with
``ext_proc/lab/vllm_tiny_policy.yaml`` rewritten to ``admission: forecast`` and real Envoy,
and gives vLLM a past: 24 requests of the mixed workload straight to it, so its
``vllm:request_generation_tokens`` holds the lengths the forecast reads. Then:

- three chat requests **without a limit** at once: vLLM runs each to ``max_model_len`` −
  prompt (2,048 − ~130), 16 blocks; held whole (``reserve``) two of them need 32 > 23
  blocks and the second is refused. The forecast holds each at its prompt and its predicted
  output (a block or two) and passes all three untouched;
- the mixed workload with limits as clients send them (1024 or none) through ICE: vLLM
  generates each request's drawn length (``min_tokens`` and the end-of-sequence bias), every
  request is judged, and ICE's forecast peak stays within the usable blocks.

Needs ``.venv-vllm`` (``make vllm-install``) and ``ICE_VLLM=1``; about 90 s on 2 cores.
"""

from __future__ import annotations

import json
import os
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import pytest
import yaml

from ext_proc.lab import overload
from ext_proc.lab import vllm_local as vl

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        os.environ.get("ICE_VLLM") != "1" or not vl.venv_ready(vl.DEFAULT_VENV),
        reason="needs ICE_VLLM=1 and .venv-vllm (make vllm-install)",
    ),
]

USABLE_BLOCKS = 23


@dataclass
class Forecasting:
    setup: overload.Setup
    history: list[overload.Planned]


@pytest.fixture(scope="module")
def forecasting(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Forecasting]:
    workdir = tmp_path_factory.mktemp("vllm-forecast")
    policy = overload.admission_policy(
        overload.POLICY, workdir / "forecast.yaml", "forecast", read_floors=False
    )
    # every prompt counted exactly: under exact_count: needed a request the estimate decides
    # is held at the estimate's upper bound (7.5× for the tiny tokenizer: 962 tokens for a
    # 117-token prompt), which CI saw fill the pool with two of these three requests
    doc = yaml.safe_load(policy.read_text())
    doc["exact_count"] = "always"
    policy.write_text(yaml.safe_dump(doc, sort_keys=False))
    history = overload.plan_mixed(24, 400.0, "critical=1", seed=1001, limits="client")
    with overload.overload_setup(workdir, policy=policy, history=history) as setup:
        yield Forecasting(setup, history)


def chat(setup: overload.Setup, body: dict[str, object]) -> tuple[int, dict[str, str], dict]:
    req = urllib.request.Request(
        setup.envoy_url + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "x-priority": "standard"},
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read() or b"{}")


def test_requests_without_a_limit_run_side_by_side(forecasting: Forecasting) -> None:
    setup = forecasting.setup
    overload.wait_idle(setup.metrics_url)
    body = {
        "model": setup.model,
        "messages": [{"role": "user", "content": vl.filler_text(100, 7)}],
        "temperature": 0.0,
    }
    with ThreadPoolExecutor(3) as pool:
        replies = list(pool.map(lambda _: chat(setup, body), range(3)))
    context = f"{replies}\n{setup.log_tails()}"
    assert [status for status, _, _ in replies] == [200, 200, 200], context
    for _, headers, doc in replies:
        assert headers.get("x-ice-decision") == "pass", context
        assert "x-downgraded" not in headers, context
        assert doc["usage"]["completion_tokens"] >= 1


def test_client_like_limits_through_the_forecast(forecasting: Forecasting) -> None:
    setup = forecasting.setup
    plan = overload.plan_mixed(12, 150.0, "standard=1", seed=3, limits="client")
    run = overload.compare(setup, plan, rounds=1, modes=("ice",), progress=None)[0]
    context = f"{run.summary()}\n{setup.log_tails()}"
    judged = [s for s in run.shots if s.decision is not None]
    assert len(judged) == len(plan), context
    done = [s for s in run.shots if s.status == 200 and s.error is None]
    assert done, context
    for s in done:
        if not s.downgraded:  # vLLM stopped at the drawn length, under the client's limit
            assert s.completion_tokens == plan[s.index].max_tokens, (s, context)
    with urllib.request.urlopen(setup.ice_metrics_url or "", timeout=10) as resp:
        page = resp.read().decode()
    peaks = [
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith("ice_forecast_peak_blocks{")
    ]
    assert peaks, page[:2000]
    assert all(0 <= p <= USABLE_BLOCKS for p in peaks), peaks
