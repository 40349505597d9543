"""The dev backend's walkthrough: Envoy + ICE + ``ext_proc.lab.devbackend`` on the fixed ports,
one request per decision kind, the backend's reported memory state set before each group.

Invariant: the policy is the built-in one with semantic truncation switched on (nothing
else changed); every process started here stops when ``_run_dev`` returns (``Stack``).
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Any

from ext_proc.lab.demo.common import (
    _QUESTION,
    _TURNS,
    BACKEND_URL,
    DAY_TWO,
    ENVOY_URL,
    SHOWN,
    _http,
    prefix_report_demo,
)
from ext_proc.lab.stack import ENVOY_DIR, Stack, policy_passthrough_paths, render_envoy_config

_TRY = """\
  curl -si http://127.0.0.1:10000/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"dev-model","messages":[{"role":"user","content":"hi"}],"max_tokens":99999}'
  curl -s -X PUT http://127.0.0.1:8000/_dev/state \\
    -d '{"kv_cache_usage_perc": 0.99, "num_requests_waiting": 9}'"""


def _set_backend(state: dict[str, Any]) -> None:
    _http("PUT", f"{BACKEND_URL}/_dev/state", state)
    time.sleep(0.6)  # three scrape intervals: ICE sees the new state


def _last_backend_body() -> Any:
    _, _, raw = _http("GET", f"{BACKEND_URL}/_dev/requests")
    records = json.loads(raw)
    if not records:
        return None
    import base64

    return json.loads(base64.b64decode(records[-1]["body_b64"]))


def _step(
    title: str, path: str, body: dict[str, Any], headers: dict[str, str] | None = None
) -> None:
    _http("DELETE", f"{BACKEND_URL}/_dev/requests")
    print(f"\n=== {title}")
    shown_body = {k: (v if k != "messages" else f"<{len(v)} messages>") for k, v in body.items()}
    print(f"  → POST {path} {json.dumps(shown_body)}" + (f"  headers {headers}" if headers else ""))
    status, resp_headers, raw = _http("POST", ENVOY_URL + path, body, headers)
    verdict = {k: resp_headers[k] for k in SHOWN if k in resp_headers}
    print(f"  ← {status}  {verdict}")
    if status >= 400:
        print(f"  ← body {raw.decode()[:300]}")
    else:
        sent = _last_backend_body()
        if sent is not None:
            fields = ("max_tokens", "max_completion_tokens", "max_output_tokens")
            limit = {k: sent[k] for k in fields if k in sent}
            print(f"  backend received limit {limit or 'none'}")
            if isinstance(sent.get("messages"), list) and len(body.get("messages", ())) > 2:
                kept = [m.get("content") for m in sent["messages"]]
                print(f"  backend received {len(kept)} of {len(body['messages'])} messages:")
                for text in kept:
                    print(f"    · {str(text)[:90]}")


# The demo's policy: the built-in default with truncation on (budget 200 tokens at high).
_TRUNCATION = """    truncation:
      enabled: true
      budget_tokens: {high: 200, critical: 120}
      keep_last_turns: 1
      deadline_ms: 2000
"""


def _conversation() -> list[dict[str, str]]:
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    for user, assistant in _TURNS:
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    return [*msgs, {"role": "user", "content": _QUESTION}]


def _demo_policy(workdir: Path) -> Path:
    from ext_proc.policy.load import default_policy_text

    # client_priority: trust: the walkthrough's x-priority: critical is believed (the
    # built-in policy caps a client's claim at the route's priority, standard)
    text = default_policy_text().replace(
        "    fail_mode: open\n",
        "    fail_mode: open\n    client_priority: trust\n" + _TRUNCATION,
        1,
    )
    path = workdir / "policy.yaml"
    path.write_text(text)
    return path


def _walkthrough() -> None:
    chat = "/v1/chat/completions"
    msgs = [{"role": "user", "content": "Explain KV caches in two sentences."}]
    _set_backend(
        {"kv_cache_usage_perc": 0.20, "num_requests_running": 2, "num_requests_waiting": 0}
    )
    _step(
        "pass: low pressure, request fits",
        chat,
        {"model": "dev-model", "messages": msgs, "max_tokens": 256},
    )
    _step(
        "downgrade: max_tokens beyond max_model_len − input − buffer",
        chat,
        {"model": "dev-model", "messages": msgs, "max_tokens": 100000},
    )
    _step(
        "pass (Anthropic Messages API)",
        "/v1/messages",
        {"model": "dev-model", "system": "Be brief.", "messages": msgs, "max_tokens": 128},
    )
    # A small KV pool (101 blocks of 16 tokens, 10% used → 90 blocks free): low pressure, but
    # a long answer would not fit the free blocks.
    _set_backend({"kv_cache_usage_perc": 0.10, "num_gpu_blocks": 101, "num_requests_waiting": 0})
    _step(
        "downgrade: the requested output does not fit the free KV blocks (90 × 16 tokens)",
        chat,
        {"model": "dev-model", "messages": msgs, "max_tokens": 4000},
    )
    # the request above holds the free blocks in ICE's ledger until a newer view
    _set_backend({"kv_cache_usage_perc": 0.10, "num_gpu_blocks": 101, "num_requests_waiting": 0})
    _step(
        "downgrade: n=4 samples are four sequences in the free-block fit (4 × 22 blocks)",
        "/v1/completions",
        {"model": "dev-model", "prompt": "hi", "max_tokens": 1000, "n": 4},
    )
    _step(
        "reject 400: fan-out beyond max_sequences (n=3000)",
        "/v1/completions",
        {"model": "dev-model", "prompt": "hi", "max_tokens": 7000, "n": 3000},
    )
    _set_backend(
        {
            "kv_cache_usage_perc": 0.97,
            "num_requests_running": 24,
            "num_requests_waiting": 3,
            "num_gpu_blocks": 200000,
        }
    )
    _step(
        "downgrade: high pressure caps an unlimited request (cap injected)",
        chat,
        {"model": "dev-model", "messages": msgs},
    )
    _step(
        "truncate: a 10-turn chat over the high-pressure budget keeps the turn its question needs",
        chat,
        {"model": "dev-model", "messages": _conversation(), "max_tokens": 64},
    )
    _step(
        "reject 429: sheddable request under high pressure",
        chat,
        {"model": "dev-model", "messages": msgs, "max_tokens": 64},
        {"x-priority": "sheddable"},
    )
    _set_backend(
        {"kv_cache_usage_perc": 1.0, "num_requests_running": 32, "num_requests_waiting": 12}
    )
    _step(
        "reject 429: standard request under critical pressure (Anthropic format)",
        "/v1/messages",
        {"model": "dev-model", "messages": msgs, "max_tokens": 64},
    )
    _step(
        "downgrade: critical-priority request is never shed, only capped",
        chat,
        {"model": "dev-model", "messages": msgs, "max_tokens": 2048},
        {"x-priority": "critical"},
    )
    _set_backend(
        {"kv_cache_usage_perc": 0.10, "num_requests_running": 1, "num_requests_waiting": 0}
    )
    long = [{"role": "user", "content": "word " * 40000}]
    _step(
        "reject 400: the input alone exceeds max_model_len (8192)",
        chat,
        {"model": "dev-model", "messages": long, "max_tokens": 16},
    )
    _step(
        "reject 400: a malformed field, in the API's own error format",
        chat,
        {"model": "dev-model", "messages": msgs, "max_tokens": "lots"},
    )
    _step(
        "downgrade: the Responses API is judged like chat (max_output_tokens rewritten)",
        "/v1/responses",
        {"model": "dev-model", "input": "Say hi.", "max_output_tokens": 100000000},
    )
    _step(
        "404 from Envoy: a path the gateway does not judge never reaches the backend",
        "/v1/load_lora_adapter",
        {"lora_name": "x", "lora_path": "/tmp/x"},
    )


def _run_dev(wait: bool) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="ice-demo-"))
    with Stack(workdir) as stack:
        stack.start_backend(8000)
        policy = _demo_policy(workdir)
        addresses = stack.start_ice("127.0.0.1:50051", policy=policy)
        config = render_envoy_config(
            ENVOY_DIR / "envoy.yaml",
            admin_port=9901,
            listeners={"ingress": 10000},
            clusters={"ice": addresses, "backend": ["127.0.0.1:8000"]},
            passthrough_paths=policy_passthrough_paths(policy),
        )
        stack.start_envoy(config, admin_port=9901)
        print(f"ICE demo: Envoy {ENVOY_URL} → ICE 127.0.0.1:50051 → backend {BACKEND_URL}")
        print(f"logs in {workdir}")
        _walkthrough()
        print("\n▶ prefix report: 40 chats whose system prompt starts with the time")
        print(prefix_report_demo())
        if not wait:
            return 0
        print(f"\nServing on {ENVOY_URL} until Ctrl-C. Try:\n{_TRY}\n{DAY_TWO}")
        try:
            while all(p.poll() is None for p in stack.procs.values()):
                time.sleep(0.5)
        except KeyboardInterrupt:
            print("\nstopping")
    return 0
