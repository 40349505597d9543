"""``ice demo`` (``make demo``): real Envoy + ICE + a backend on loopback, one walkthrough.

Both backends run on the fixed local ports (Envoy 127.0.0.1:10000, admin :9901, ICE :50051,
backend :8000), print each request, ICE's verdict headers and the backend's answer, then keep
serving until Ctrl-C (``wait=False``: exit after the walkthrough) so you can send your own.

- ``vllm``: a real ``vllm serve`` (CPU, the tiny random-weight model of
  ``ext_proc.vllm_local``: 2,048-token context, 24 KV blocks of 128 tokens) behind ICE with
  ``ext_proc/vllm_tiny_policy.yaml`` (started by ``ext_proc.overload.overload_setup``): a
  pass; ``max_tokens: 100000`` downgraded to fit (vLLM alone answers 400); a 20-message chat
  longer than the context truncated to fit, keeping the turn its question needs (vLLM alone
  answers 400); a ~2,100-token prompt rejected 400 ``context_length_exceeded``; a
  sheddable request while vLLM has a queue → 429 with ``Retry-After``; then a 12-request
  burst straight to vLLM and through ICE, side by side (preemptions, 429s, latencies).
- ``dev``: the stdlib dev backend (``ext_proc.devbackend``), whose reported memory state the
  walkthrough sets, for one request of each decision kind (the built-in policy with
  semantic truncation switched on, so one step truncates a long chat).
- ``auto`` (default): ``vllm`` when ``.venv-vllm`` and the tiny model are ready
  (``make vllm-install``), else ``dev``, saying why; also ``dev`` when vLLM fails to start.

Invariant: every process the demo starts stops when it returns, on error and on Ctrl-C too
(``Stack`` and ``overload_setup`` are context managers).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ext_proc.stack import ENVOY_DIR, Stack, StackError, render_envoy_config

if TYPE_CHECKING:
    from ext_proc.overload import Setup

__all__ = ["BACKENDS", "run_demo", "vllm_unavailable"]

BACKENDS = ("auto", "vllm", "dev")

_TRY = """\
  curl -si http://127.0.0.1:10000/v1/chat/completions -H 'content-type: application/json' \\
    -d '{"model":"dev-model","messages":[{"role":"user","content":"hi"}],"max_tokens":99999}'
  curl -s -X PUT http://127.0.0.1:8000/_dev/state \\
    -d '{"kv_cache_usage_perc": 0.99, "num_requests_waiting": 9}'"""

ENVOY_URL = "http://127.0.0.1:10000"
BACKEND_URL = "http://127.0.0.1:8000"
SHOWN = (
    "x-mem-pressure",
    "x-mem-pressure-score",
    "x-ice-decision",
    "x-ice-truncated",
    "x-ice-reason",
    "x-downgraded",
    "x-ice-original-max-tokens",
    "retry-after",
)


def _http(
    method: str,
    url: str,
    body: Any = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 10.0,
) -> tuple[int, dict[str, str], bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("content-type", "application/json")
    for k, v in (headers or {}).items():
        req.add_header(k, v)
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return resp.status, {k.lower(): v for k, v in resp.headers.items()}, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


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
            limit = {k: sent[k] for k in ("max_tokens", "max_completion_tokens") if k in sent}
            print(f"  backend received limit {limit or 'none'}")
            if isinstance(sent.get("messages"), list) and len(body.get("messages", ())) > 2:
                kept = [m.get("content") for m in sent["messages"]]
                print(f"  backend received {len(kept)} of {len(body['messages'])} messages:")
                for text in kept:
                    print(f"    · {str(text)[:90]}")


# A long chat whose last question needs its first turn (the dev demo's truncation step).
_TURNS = (
    ("Which ryokan near Gion in Kyoto has a private onsen?", "Gion Hatanaka, by Yasaka Shrine."),
    ("How do I undo my last git commit?", "git reset --soft HEAD~1 keeps the changes staged."),
    ("A good low-light houseplant?", "A ZZ plant or a snake plant tolerates shade well."),
    ("How do I fix a dripping faucet?", "Replace the cartridge or its worn O-rings."),
    ("Explain compound interest briefly.", "Interest earns interest, so growth compounds."),
    ("Stretches for a stiff lower back?", "Cat-cow, child's pose and knee-to-chest stretches."),
    ("How long should I boil an egg?", "Nine to twelve minutes for a firm yolk."),
    ("Best way to store fresh basil?", "Stems in a glass of water at room temperature."),
    ("What is a Roth IRA?", "A retirement account funded after tax; withdrawals are tax-free."),
)
_QUESTION = "Does that inn near the shrine serve vegetarian dinners?"
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

    text = default_policy_text().replace(
        "    fail_mode: open\n", "    fail_mode: open\n" + _TRUNCATION, 1
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


def run_demo(wait: bool = True, backend: str = "auto") -> int:
    """Run the demo on ``backend`` (one of ``BACKENDS``); the exit status."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} not in {BACKENDS}")
    # SIGTERM / SIGHUP end the demo like Ctrl-C, so that its processes (each in its own
    # session, out of reach of the terminal's signals) are stopped too.
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, _interrupt)
    try:
        if backend == "dev":
            return _run_dev(wait)
        why = vllm_unavailable()
        if why is not None:
            if backend == "vllm":
                print(f"ice demo: no vLLM backend: {why}")
                return 2
            print(f"vLLM backend not available: {why}.\nRunning the dev backend.\n")
            return _run_dev(wait)
        return _run_vllm(wait, fall_back=backend == "auto")
    except KeyboardInterrupt:
        print("\nstopped")
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _run_dev(wait: bool) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="ice-demo-"))
    with Stack(workdir) as stack:
        stack.start_backend(8000)
        addresses = stack.start_ice("127.0.0.1:50051", policy=_demo_policy(workdir))
        config = render_envoy_config(
            ENVOY_DIR / "envoy.yaml",
            admin_port=9901,
            listeners={"ingress": 10000},
            clusters={"ice": addresses, "backend": ["127.0.0.1:8000"]},
        )
        stack.start_envoy(config, admin_port=9901)
        print(f"ICE demo: Envoy {ENVOY_URL} → ICE 127.0.0.1:50051 → backend {BACKEND_URL}")
        print(f"logs in {workdir}")
        _walkthrough()
        if not wait:
            return 0
        print(f"\nServing on {ENVOY_URL} until Ctrl-C. Try:\n{_TRY}")
        try:
            while all(p.poll() is None for p in stack.procs.values()):
                time.sleep(0.5)
        except KeyboardInterrupt:
            print("\nstopping")
    return 0


# --- the vLLM backend ---------------------------------------------------------------------------

VLLM_PORT = 8000
ICE_ADDRESS = "127.0.0.1:50051"
ENVOY_PORT = 10000
ADMIN_PORT = 9901
CHAT = "/v1/chat/completions"
BURST_REQUESTS = 12
# Long requests sent straight to vLLM to give it a queue for the 429 step: three ~887-token
# prompts fill 21 of the 23 usable KV blocks, the rest wait (and preempted ones rejoin them).
BUSY_REQUESTS = 6

_TRY_VLLM = """\
  curl -si http://127.0.0.1:10000/v1/chat/completions -H 'content-type: application/json' \\
    -H 'x-priority: critical' \\
    -d '{"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":100000}'
  curl -s http://127.0.0.1:8000/metrics | grep -E '^vllm:(num_requests|kv_cache_usage|num_pre)'"""

# The burst table: summary key and label (ext_proc.overload.RunResult.summary).
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


def _say(text: str = "") -> None:
    print(text, flush=True)


def vllm_unavailable() -> str | None:
    """Why the vLLM backend cannot run here (None: it can): venv or tiny model missing."""
    from ext_proc import vllm_local as vl

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


def _brief(body: dict[str, Any]) -> str:
    """The request body, a long message shown by its size."""
    shown = dict(body)
    messages = body.get("messages")
    if isinstance(messages, list):
        text = " ".join(str(m.get("content", "")) for m in messages if isinstance(m, dict))
        if len(text) > 60:
            shown["messages"] = f"<{len(messages)} message, {len(text.split())} words>"
    return json.dumps(shown, ensure_ascii=False)


def _answer(status: int, raw: bytes) -> str:
    """What the backend (or ICE, for a rejection) answered, in one line."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")[:300]
    if status == 200 and isinstance(body, dict) and body.get("choices"):
        choice = body["choices"][0]
        text = str((choice.get("message") or {}).get("content") or "")
        usage = body.get("usage") or {}
        return (
            f"vLLM: {usage.get('prompt_tokens')} prompt + {usage.get('completion_tokens')} "
            f"output tokens, finish_reason {choice.get('finish_reason')!r}, "
            f"text {text[:48]!r}{'…' if len(text) > 48 else ''}"
        )
    return json.dumps(body, ensure_ascii=False)[:400]


def _vllm_step(
    title: str,
    body: dict[str, Any],
    headers: dict[str, str] | None = None,
    note: str = "",
) -> tuple[int, dict[str, str], bytes]:
    """Send ``body`` through Envoy + ICE; print the request, the verdict and the answer."""
    _say(f"\n=== {title}")
    extra = f"  headers {headers}" if headers else ""
    _say(f"  → POST {CHAT} {_brief(body)}{extra}")
    status, resp_headers, raw = _http("POST", ENVOY_URL + CHAT, body, headers, timeout_s=300)
    verdict = {k: resp_headers[k] for k in SHOWN if k in resp_headers}
    _say(f"  ← {status}  {verdict}")
    _say(f"  ← {_answer(status, raw)}")
    if note:
        _say(f"  {note}")
    return status, resp_headers, raw


def _gauges(page: str) -> dict[str, float]:
    from ext_proc import vllm_local as vl

    return {
        "running": sum(vl.metric_values(page, "vllm:num_requests_running")),
        "waiting": sum(vl.metric_values(page, "vllm:num_requests_waiting")),
        "kv_usage": max(vl.metric_values(page, "vllm:kv_cache_usage_perc") or [0.0]),
    }


async def _shed_while_busy(
    vllm_url: str, model: str, probe: dict[str, Any], headers: dict[str, str]
) -> tuple[dict[str, float], int, tuple[int, dict[str, str], bytes]]:
    """Keep vLLM busy with ``BUSY_REQUESTS`` long streamed requests sent straight to it; once
    vLLM reports a queue (ICE scrapes it every 0.1 s), send ``probe`` through ICE, up to five
    times 0.3 s apart until it gets 429; then drop the long requests (vLLM aborts them).
    Returns vLLM's gauges just before the answered try, the number of tries, the answer."""
    import aiohttp

    from ext_proc import overload

    metrics = f"{vllm_url}/metrics"
    connector = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def busy(i: int) -> None:
            plan = overload.Planned(i, 0.0, "standard", overload.PROMPT_TOKENS, overload.MAX_TOKENS)
            body = overload.request_body(plan, model, seed=7_000 + i)
            async with session.post(vllm_url + CHAT, json=body) as resp:
                async for _ in resp.content:
                    pass

        async def gauges() -> dict[str, float]:
            return _gauges(await overload.fetch(session, metrics))

        async def send() -> tuple[int, dict[str, str], bytes]:
            async with session.post(ENVOY_URL + CHAT, json=probe, headers=headers) as resp:
                got = {k.lower(): v for k, v in resp.headers.items()}
                return resp.status, got, await resp.read()

        tasks = [asyncio.create_task(busy(i)) for i in range(BUSY_REQUESTS)]
        try:
            deadline = time.monotonic() + 60
            while (await gauges())["waiting"] < 1:
                if time.monotonic() > deadline:
                    raise RuntimeError("vLLM never queued a request")
                await asyncio.sleep(0.1)
            await asyncio.sleep(0.3)  # three of ICE's scrapes
            tries = 0
            while True:
                tries += 1
                seen = await gauges()
                answer = await send()
                if answer[0] == 429 or tries == 5:
                    return seen, tries, answer
                await asyncio.sleep(0.3)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def _settle(setup: Setup) -> None:
    """Until vLLM is idle and ICE has scraped it since: a long answer can hold vLLM's /metrics
    past the pool's max_age_s (ICE then says ``x-mem-pressure: unknown``)."""
    from ext_proc import overload

    overload.wait_idle(setup.metrics_url)
    time.sleep(0.4)  # four of ICE's scrapes (scrape_interval_s 0.1)


def _long_chat(filler: Any) -> list[dict[str, str]]:
    """~2,300 tokens for the tiny model: the demo's turns, each answered with ~210 filler
    tokens, then the question that needs the first turn."""
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    for i, (user, _) in enumerate(_TURNS):
        msgs += [
            {"role": "user", "content": user},
            {"role": "assistant", "content": filler(210, 100 + i)},
        ]
    return [*msgs, {"role": "user", "content": _QUESTION}]


def _vllm_walkthrough(setup: Setup) -> None:
    from ext_proc import overload
    from ext_proc import vllm_local as vl

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
    from ext_proc import overload
    from ext_proc import vllm_local as vl

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
        _say(f'\nServing on {ENVOY_URL} (model "tiny") until Ctrl-C. Try:\n{_TRY_VLLM}')
        try:
            while setup.vllm.proc.poll() is None and all(
                p.poll() is None for p in setup.stack.procs.values()
            ):
                time.sleep(0.5)
        except KeyboardInterrupt:
            print("\nstopping")
    return 0
