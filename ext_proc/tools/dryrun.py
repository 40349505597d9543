"""``ice evaluate``: judge one request offline with the server's own pipeline.

For policy authors: given a policy, a saved (or live) ``/metrics`` page and a request body,
print the decision, the pressure score and the exact mutation ICE would make, as JSON; on a
profile with an admission queue, whether the request would wait in it (``queue``) instead of
getting its 429 at once.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

from ext_proc.admit.identity import request_tenant
from ext_proc.admit.outcome import Continue, Respond
from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.admit.queue import queueable
from ext_proc.admit.truncation import finish_truncation
from ext_proc.policy.decision import Wait
from ext_proc.policy.load import load_policy
from ext_proc.policy.pressure import pressure_of
from ext_proc.signals.collector import backend_from_scrape
from ext_proc.signals.parse import detect_kind, parse_engine
from ext_proc.signals.snapshot import PoolSnapshot

__all__ = ["dry_run", "read_source"]


def read_source(source: str, timeout_s: float = 5.0) -> str:
    """The text of a file path or an http(s) URL."""
    if source.startswith(("http://", "https://")):
        with urllib.request.urlopen(source, timeout=timeout_s) as resp:
            return str(resp.read().decode("utf-8", "replace"))
    return Path(source).read_text("utf-8")


def _body_json(body: bytes | None) -> Any:
    if body is None:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return body.decode("utf-8", "replace")


def dry_run(
    *,
    policy_path: str | None,
    metrics: str | None,
    request: bytes,
    route: str = "",
    path: str = "/v1/chat/completions",
    priority: str | None = None,
    profile: str = "",
    content_type: str = "application/json",
) -> dict[str, Any]:
    """The JSON-ready report of what ICE would do with ``request``."""
    policy = load_policy(policy_path)
    metadata = [("x-ice-route", route), ("x-ice-profile", profile)]
    snapshot: PoolSnapshot | None = None
    if metrics is not None:
        text = read_source(metrics)
        kind = detect_kind(text)
        scrape = parse_engine(kind if kind in ("vllm", "sglang") else "vllm", metrics, text, 0.0)
        backend = backend_from_scrape(scrape, [scrape], 10.0)
        snapshot = PoolSnapshot(pool="", backends=(backend,), taken_at_s=time.monotonic())
    pipeline = Pipeline(policy, lambda _pool: snapshot)
    r = pipeline.router.resolve(metadata)
    headers = [(":path", path.encode()), (":method", b"POST")]
    headers.append(("content-type", content_type.encode()))
    if priority:
        headers.append((policy.priority_header, priority.encode()))
    facts: RequestFacts = pipeline.on_headers(r, headers, end_of_stream=not request)
    report: dict[str, Any] = {
        "route": r.name,
        "profile": r.profile.name,
        "pool": r.pool,
        "priority": facts.priority,
    }
    if snapshot is not None:
        b = snapshot.backends[0]
        report["signals"] = {
            "kv_cache_usage": b.kv_cache_usage,
            "num_requests_running": b.num_requests_running,
            "num_requests_waiting": b.num_requests_waiting,
            "num_gpu_blocks": b.num_gpu_blocks,
            "block_size": b.block_size,
        }
        p = pressure_of(snapshot, r.profile.pressure)
        report["mem_pressure_score"] = p.score if p else None
        report["mem_pressure"] = p.level.label if p else "unknown"
    else:
        report["mem_pressure"] = "unknown"
    if facts.answer is not None:
        outcome: Continue | Respond | None = facts.answer
        report["decision"] = "reject"
    elif facts.skip_body:
        report["decision"] = "passthrough"
        report["mutation"] = None
        return report
    else:
        verdict = pipeline.on_body(r, facts, request)
        assert verdict is not None
        if verdict.pending is not None:  # truncation: the model runs in this process
            import asyncio

            from ext_proc.truncate.runner import LocalSimilarity

            emb = policy.embedding
            pipeline.similarity = LocalSimilarity(
                emb.model or None, emb.max_seq_length, emb.quantize
            )
            verdict = asyncio.run(finish_truncation(pipeline, r, facts, verdict))
        pipeline.recorder.record(r, verdict)
        outcome = verdict.outcome
        spec = r.profile.queue
        if spec is not None:  # what the profile's admission queue would do with it
            report["queue"] = {
                "would_queue": queueable(r, verdict),
                "max_queue_wait_ms": spec.max_queue_wait_ms,
                "tenant": request_tenant(r, facts),
            }
        shown = verdict.decision
        if isinstance(shown, Wait):  # its answer if it cannot wait ("queue" says it would)
            shown = shown.refusal()
        report["decision"] = shown.decision if shown is not None else "reject"
        if shown is not None:
            report["reason"] = shown.reason
        if verdict.features is not None:
            f = verdict.features
            report["features"] = {
                "schema": f.schema,
                "model": f.model,
                "input_tokens_estimate": f.input_tokens,
                "max_tokens": f.max_tokens,
                "max_tokens_field": f.max_tokens_field,
                "stream": f.stream,
                "messages": f.message_count,
                "prompts": len(f.prompts),
                "samples": f.samples,
                "sequences": f.sequences,
                "media_parts": f.media_parts,
                "media_tokens": f.media_tokens,
                "stored_context": f.stored_context,
            }
    if isinstance(outcome, Respond):
        report["mutation"] = {
            "immediate_response": {
                "status": outcome.status,
                "headers": dict(outcome.headers),
                "body": _body_json(outcome.body),
            }
        }
    elif isinstance(outcome, Continue):
        report["mutation"] = {
            "request_headers": dict(outcome.headers),
            "body": _body_json(outcome.body),
            "body_changed": outcome.body is not None,
        }
    return report
