"""``record``: the golden files of ``tests/data/vllm_cpu`` from a running server, and overloads.

``record`` saves an idle ``/metrics`` page, one chat completion and the start-up log's KV
lines, then runs ``OVERLOAD_RUNS``: ``drive_overload`` sends concurrent chats of
``filler_text`` while polling ``/metrics``, and keeps the page seen at the highest KV usage.

Invariants: prompts are deterministic (``filler_text(tokens, seed)``: same seed, same text);
the golden files hold no path of this checkout (``<repo>`` replaces it); requests go only to
the server's loopback ``base_url``.
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import threading
import time
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ext_proc.lab.vllm_local.common import REPO_ROOT
from ext_proc.lab.vllm_local.metrics import metric_values
from ext_proc.lab.vllm_local.serve import VllmServer

__all__ = [
    "OVERLOAD_PROMPT_TOKENS",
    "OVERLOAD_RUNS",
    "OverloadResult",
    "drive_overload",
    "filler_text",
    "record",
    "startup_lines",
]


def _get(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        body: bytes = resp.read()
        return body.decode("utf-8")


def _post_json(url: str, payload: Mapping[str, Any], timeout_s: float = 600.0) -> dict[str, Any]:
    req = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=timeout_s) as resp:
        body: dict[str, Any] = json.loads(resp.read())
        return body


STARTUP_LOG_RE = re.compile(
    r"KV cache|kv_cache|GPU blocks|num_gpu_blocks|Maximum concurrency|Initializing a V1 LLM "
    r"engine|engine config",
    re.IGNORECASE,
)


def startup_lines(log: str) -> list[str]:
    """The start-up log lines about the KV cache (size, blocks, concurrency) and engine config."""
    return [line for line in log.splitlines() if STARTUP_LOG_RE.search(line)]


_FILLER = (
    "self return import value name data result error path file list string object class true "
    "false memory cache token server limit block usage running default option buffer length"
)
_FILLER_WORDS = _FILLER.split()


def filler_text(approx_tokens: int, seed: int) -> str:
    """Deterministic prose of about ``approx_tokens`` tokens for the tiny tokenizer.

    Every word is one token of a BPE trained on Python sources (" self", " cache", ...).
    """
    rng = random.Random(seed)
    return " ".join(rng.choice(_FILLER_WORDS) for _ in range(approx_tokens))


# Two overloads of 20 concurrent requests, each max_tokens 200 (ignore_eos), against 23 usable
# blocks of 128 tokens (the 24th is the pool's null block):
# - "steady": ~1,017 prompt tokens = 8 blocks at admission, so two requests run; they grow to
#   10 blocks each and never outgrow 20 of 23: KV usage holds at 20/23 = 0.87, 16 wait, no
#   preemption.
# - "preempting": ~887 prompt tokens = 7 blocks, so three are admitted, outgrow the cache while
#   decoding and get preempted: KV usage touches 1.0, preemptions climb.
OVERLOAD_PROMPT_TOKENS = 1000
OVERLOAD_RUNS = (
    ("steady", 1000, "metrics_loaded.txt"),
    ("preempting", 870, "metrics_preempting.txt"),
)


@dataclass
class OverloadResult:
    requests: int
    ok: int
    errors: list[str]
    wall_s: float
    kv_usage_max: float
    waiting_max: float
    running_max: float
    preemptions_delta: float
    prompt_tokens: list[int] = field(default_factory=list)
    completion_tokens: list[int] = field(default_factory=list)
    loaded_page: str = ""
    loaded_kv_usage: float = 0.0
    # (seconds since start, kv_cache_usage_perc, waiting, running, preemptions so far)
    timeline: list[tuple[float, float, int, int, int]] = field(default_factory=list)


def drive_overload(
    base_url: str,
    *,
    model: str = "tiny",
    requests: int = 20,
    prompt_tokens: int = OVERLOAD_PROMPT_TOKENS,
    max_tokens: int = 200,
    poll_s: float = 0.2,
) -> OverloadResult:
    """Send ``requests`` concurrent chat completions and watch ``/metrics`` while they run.

    ``loaded_page`` is the /metrics page seen at the highest KV usage (most waiting on a tie).
    """
    before = _get(f"{base_url}/metrics")
    preempt0 = sum(metric_values(before, "vllm:num_preemptions_total"))
    errors: list[str] = []
    usages: list[dict[str, Any]] = []
    lock = threading.Lock()
    done = threading.Event()
    timeline: list[tuple[float, float, int, int, int]] = []
    t0 = time.monotonic()
    peak: dict[str, Any] = {"kv": 0.0, "waiting": 0.0, "running": 0.0, "page": "", "key": (-1.0,)}

    def one(i: int) -> None:
        payload = {
            "model": model,
            "messages": [{"role": "user", "content": filler_text(prompt_tokens, i)}],
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "temperature": 0.0,
        }
        try:
            body = _post_json(f"{base_url}/v1/chat/completions", payload)
            with lock:
                usages.append(body["usage"])
        except Exception as e:  # recorded, reported by the caller
            with lock:
                errors.append(f"{i}: {e!r}")

    def poll() -> None:
        while not done.is_set():
            # A failed scrape or a page that is not Prometheus text: skip this poll.
            with contextlib.suppress(OSError, ValueError):
                page = _get(f"{base_url}/metrics")
                kv = max(metric_values(page, "vllm:kv_cache_usage_perc") or [0.0])
                waiting = sum(metric_values(page, "vllm:num_requests_waiting"))
                running = sum(metric_values(page, "vllm:num_requests_running"))
                preempted = sum(metric_values(page, "vllm:num_preemptions_total")) - preempt0
                timeline.append(
                    (
                        round(time.monotonic() - t0, 2),
                        kv,
                        int(waiting),
                        int(running),
                        int(preempted),
                    )
                )
                peak["waiting"] = max(peak["waiting"], waiting)
                peak["running"] = max(peak["running"], running)
                if (kv, waiting) > peak["key"]:
                    peak.update(kv=kv, key=(kv, waiting), page=page)
            done.wait(poll_s)

    poller = threading.Thread(target=poll, daemon=True)
    workers = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(requests)]
    poller.start()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    wall_s = time.monotonic() - t0
    done.set()
    poller.join()
    after = _get(f"{base_url}/metrics")
    return OverloadResult(
        requests=requests,
        ok=len(usages),
        errors=errors,
        wall_s=wall_s,
        kv_usage_max=float(peak["kv"]),
        waiting_max=float(peak["waiting"]),
        running_max=float(peak["running"]),
        preemptions_delta=sum(metric_values(after, "vllm:num_preemptions_total")) - preempt0,
        prompt_tokens=[int(u["prompt_tokens"]) for u in usages],
        completion_tokens=[int(u["completion_tokens"]) for u in usages],
        loaded_page=str(peak["page"]),
        loaded_kv_usage=float(peak["kv"]),
        timeline=timeline,
    )


def record(
    server: VllmServer, out_dir: Path, *, requests: int = 20, max_tokens: int = 200
) -> dict[str, OverloadResult]:
    """Write the golden files of ``tests/data/vllm_cpu`` from a running server; drive overload.

    Files: ``metrics_idle.txt``; ``chat_completion.json``; ``startup.log`` (the KV lines and
    the engine config, repository path replaced by ``<repo>``); one page per overload run at
    its peak KV usage, ``metrics_loaded.txt`` (the ~1,000-token run) and
    ``metrics_preempting.txt``; ``overload.json`` (both runs' numbers and timelines).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    base = server.base_url
    (out_dir / "metrics_idle.txt").write_text(_get(f"{base}/metrics"))
    chat = _post_json(
        f"{base}/v1/chat/completions",
        {
            "model": server.cfg.served_model_name,
            "messages": [{"role": "user", "content": "Say something about memory pressure."}],
            "max_tokens": 16,
            "temperature": 0.0,
        },
    )
    (out_dir / "chat_completion.json").write_text(json.dumps(chat, indent=2) + "\n")
    log = "\n".join(startup_lines(server.log_text())).replace(str(REPO_ROOT), "<repo>")
    (out_dir / "startup.log").write_text(log + "\n")
    results: dict[str, OverloadResult] = {}
    summary: dict[str, Any] = {"startup_s": round(server.startup_s, 1), "runs": {}}
    for name, filler_tokens, page in OVERLOAD_RUNS:
        result = drive_overload(
            base,
            model=server.cfg.served_model_name,
            requests=requests,
            prompt_tokens=filler_tokens,
            max_tokens=max_tokens,
        )
        results[name] = result
        (out_dir / page).write_text(result.loaded_page)
        summary["runs"][name] = {
            "filler_tokens": filler_tokens,
            "max_tokens": max_tokens,
            "page": page,
            **{k: v for k, v in result.__dict__.items() if k not in ("loaded_page", "errors")},
            "errors": result.errors[:5],
        }
    text = json.dumps(summary, indent=1)
    # Lists of scalars (timeline rows, token counts) on one line each.
    text = re.sub(r"\[\s+([^\[\]{}]*?)\s+\]", lambda m: f"[{' '.join(m[1].split())}]", text)
    (out_dir / "overload.json").write_text(text + "\n")
    return results
