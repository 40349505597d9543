"""The vLLM walkthrough: a real ``vllm serve`` (CPU, tiny model) behind Envoy + ICE on the
fixed ports (``ext_proc.lab.overload.overload_setup``), its steps, then the burst side by side.

Invariant: the ports are checked free before anything starts; every process started here
stops when ``_run_vllm`` returns; when vLLM fails to start and ``fall_back`` is set, the dev
walkthrough runs instead, after the partial vLLM stack has been stopped.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ext_proc.lab.demo.common import BACKEND_URL, DAY_TWO, ENVOY_URL, SHOWN, _http
from ext_proc.lab.demo.dev_walkthrough import _run_dev
from ext_proc.lab.demo.vllm_steps import (
    BUSY_REQUESTS,
    CHAT,
    _answer,
    _brief,
    _long_chat,
    _say,
    _settle,
    _shed_while_busy,
    _vllm_step,
)
from ext_proc.lab.stack import StackError

if TYPE_CHECKING:
    from ext_proc.lab.overload import Setup

VLLM_PORT = 8000
ICE_ADDRESS = "127.0.0.1:50051"
ENVOY_PORT = 10000
ADMIN_PORT = 9901
BURST_REQUESTS = 12

_TRY_VLLM = """\
  curl -si http://127.0.0.1:10000/v1/chat/completions -H 'content-type: application/json' \\
    -H 'x-priority: critical' \\
    -d '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":100000}'
  curl -s http://127.0.0.1:8000/metrics | grep -E '^vllm:(num_requests|kv_cache_usage|num_pre)'"""

# The burst table: summary key and label (ext_proc.lab.overload.RunResult.summary).
_BURST_ROWS: tuple[tuple[str, str], ...] = (
    ("requests", "requests"),
    ("ok", "200 completed"),
    ("shed_429", "429 (ICE shed)"),
    ("other", "other errors"),
    ("preemptions", "vLLM preemptions"),
    ("output_tokens", "completed output tokens"),
    ("wall_s", "burst wall time (s)"),
    ("ok_p50_s", "200 latency p50 (s)"),
    ("ok_p95_s", "200 latency p95 (s)"),
    ("wait_p95_s", "200 time to 1st token p95 (s)"),
    ("wait_max_s", "longest wait for 1st token (s)"),
    ("vllm_queue_mean_s", "vLLM mean queue time (s)"),
    ("shed_max_s", "429 latency max (s)"),
    ("shed_retry_after", "429 Retry-After (s)"),
    ("shed_by_priority", "429 by priority"),
    ("waiting_max", "vLLM waiting max"),
    ("kv_usage_max", "vLLM KV usage max"),
    ("unjudged", "ICE fail-open (unjudged)"),
)


def vllm_unavailable() -> str | None:
    """Why the vLLM backend cannot run here (None: it can): venv or tiny model missing."""
    from ext_proc.lab import vllm_local as vl

    if not vl.venv_ready(vl.DEFAULT_VENV):
        return f"{vl.DEFAULT_VENV} is not installed; `make vllm-install` installs it (~2 min)"
    if not vl.model_ready(vl.DEFAULT_MODEL_DIR):
        return f"no tiny model at {vl.DEFAULT_MODEL_DIR}; `make vllm-install` builds it"
    return None


def _busy_ports(ports: list[int]) -> list[int]:
    busy = []
    for port in ports:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                busy.append(port)
    return busy


def _vllm_walkthrough(setup: Setup) -> None:
    from ext_proc.lab import overload
    from ext_proc.lab import vllm_local as vl

    model = setup.model
    short = [{"role": "user", "content": "Explain KV caches in two sentences."}]
    _vllm_step(
        "pass: low pressure, the request fits",
        {"model": model, "messages": short, "max_tokens": 32},
        note="(random weights: the text is noise, the token counts are real)",
    )

    big = {"model": model, "messages": short, "max_tokens": 100000}
    status, _, raw = _http("POST", setup.vllm_url + CHAT, big, timeout_s=60)
    # Sent as `critical`: with this policy's `on_kv_shortfall: shed`, ICE (evaluate.py,
    # shed_on_kv_shortfall) compares the *requested* 100,000 tokens with the free KV blocks
    # before the context budget cuts them, and sheds a standard request (429 kv_exhausted).
    _vllm_step(
        "downgrade: max_tokens 100000 cut to fit the 2,048-token context (input + output + 128)",
        big,
        {"x-priority": "critical"},
        note=f"(straight to vLLM the same request is refused: {status} {_answer(status, raw)})",
    )

    _settle(setup)
    chat = _long_chat(vl.filler_text)
    body = {"model": model, "messages": chat, "max_tokens": 32}
    status, _, raw = _http("POST", setup.vllm_url + CHAT, body, timeout_s=60)
    _vllm_step(
        f"truncate: a {len(chat)}-message chat longer than the context keeps the turn its "
        "question needs",
        body,
        note=f"(straight to vLLM the same request is refused: {status} {_answer(status, raw)})",
    )

    _settle(setup)
    long_prompt = [{"role": "user", "content": vl.filler_text(2100, 1)}]
    _vllm_step(
        "reject 400: a ~2,100-token prompt cannot fit the 2,048-token context",
        {"model": model, "messages": long_prompt, "max_tokens": 16},
        note="(ICE counted the prompt with the model's own tokenizer; vLLM never saw it)",
    )

    _settle(setup)
    probe = {"model": model, "messages": short, "max_tokens": 64}
    headers = {"x-priority": "sheddable"}
    _say(
        f"\n=== reject 429: a sheddable request while vLLM is busy ({BUSY_REQUESTS} long "
        "requests sent straight to it)"
    )
    _say(f"  → POST {CHAT} {_brief(probe)}  headers {headers}")
    seen, tries, (status, resp_headers, raw) = asyncio.run(
        _shed_while_busy(setup.vllm_url, model, probe, headers)
    )
    _say(
        f"  vLLM then: {seen['running']:.0f} running, {seen['waiting']:.0f} waiting, "
        f"KV cache {seen['kv_usage']:.0%} used" + (f" (try {tries})" if tries > 1 else "")
    )
    verdict = {k: resp_headers[k] for k in SHOWN if k in resp_headers}
    _say(f"  ← {status}  {verdict}")
    _say(f"  ← {_answer(status, raw)}")
    overload.wait_idle(setup.metrics_url)

    burst = overload.plan_burst(
        BURST_REQUESTS,
        overload.PROMPT_TOKENS,
        overload.MAX_TOKENS,
        overload.SPACING_MS,
        overload.MIX,
    )
    _say(
        f"\n=== burst: {BURST_REQUESTS} requests of ~{overload.PROMPT_TOKENS} prompt + "
        f"{overload.MAX_TOKENS} output tokens, one every {overload.SPACING_MS:.0f} ms "
        f"(priorities {overload.MIX}), straight to vLLM, then through ICE"
    )
    results = overload.compare(setup, burst, rounds=1, progress=lambda line: _say(f"  {line}"))
    _say()
    _say(overload.table(results, _BURST_ROWS, heads=["straight to vLLM", "through ICE"]))
    runs = {r.mode: r for r in results}
    direct, ice = runs["direct"], runs["ice"]
    _say()
    cut = f" ({1 - ice.preemptions / direct.preemptions:.0%} fewer)" if direct.preemptions else ""
    _say(
        f"vLLM preempted {direct.preemptions} times straight, {ice.preemptions} through "
        f"ICE{cut}; ICE answered {ice.summary()['shed_429']} requests at once with 429 + "
        "Retry-After instead of queueing them."
    )


def _run_vllm(wait: bool, fall_back: bool) -> int:
    """The vLLM walkthrough; ``fall_back``: run the dev one when vLLM does not start."""
    from ext_proc.lab import overload
    from ext_proc.lab import vllm_local as vl

    busy = _busy_ports([VLLM_PORT, ENVOY_PORT, ADMIN_PORT, int(ICE_ADDRESS.rsplit(":", 1)[1])])
    if busy:
        print(f"ice demo: ports in use on 127.0.0.1: {busy}")
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="ice-demo-"))
    _say(
        f"ICE demo: starting vLLM (CPU, tiny model) on {BACKEND_URL}, ICE on {ICE_ADDRESS}, "
        f"Envoy on {ENVOY_URL}; logs in {workdir}"
    )
    t0 = time.monotonic()
    with contextlib.ExitStack() as es:
        try:
            setup = es.enter_context(
                overload.overload_setup(
                    workdir,
                    vllm_port=VLLM_PORT,
                    ice_address=ICE_ADDRESS,
                    envoy_port=ENVOY_PORT,
                    admin_port=ADMIN_PORT,
                )
            )
        except (vl.VllmError, StackError) as e:
            if not fall_back:
                print(f"ice demo: vLLM did not start: {e}")
                return 2
            print(f"vLLM did not start: {e}\nRunning the dev backend.\n")
            es.close()
            return _run_dev(wait)
        _say(
            f"up in {time.monotonic() - t0:.0f} s (vLLM {setup.vllm.startup_s:.0f} s); "
            f"policy {overload.POLICY.name}: max_model_len 2048, 24 KV blocks of 128 tokens"
        )
        _vllm_walkthrough(setup)
        if not wait:
            return 0
        _say(f'\nServing on {ENVOY_URL} (model "tiny") until Ctrl-C. Try:\n{_TRY_VLLM}\n{DAY_TWO}')
        try:
            while setup.vllm.proc.poll() is None and all(
                p.poll() is None for p in setup.stack.procs.values()
            ):
                time.sleep(0.5)
        except KeyboardInterrupt:
            print("\nstopping")
    return 0
