"""Development inference backend: a fake OpenAI/Anthropic-compatible LLM server.

Used as the upstream behind a real Envoy by ICE's end-to-end tests and as the local backend
of ``make demo``. Run it with ``python -m ext_proc.lab.devbackend --host H --port P [--model M]``;
once it accepts connections it prints exactly one line ``devbackend listening on
http://H:P`` to stdout (``--port 0`` picks a free port and prints the real one).

One module per job, each stating its own invariants at the top:

- ``state``: ``DevState``, the backend's mutable state and its vLLM-style collector.
- ``answers``: request parsing and the replies / SSE events of each API (no I/O).
- ``inference``: the recorded inference handlers, JSON or streamed: OpenAI chat,
  completions, Responses, embeddings; Anthropic messages; vLLM's batch chat, SageMaker
  ``/invocations`` and ``/inference/v1/generate``; SGLang's ``/generate``.
- ``app``: ``build_app`` (routes, ``/metrics``, the ``/_dev/*`` controls, the recording
  catch-all) and ``main``; ``__main__`` runs ``main``.

Invariants:

* Replies are deterministic: ``n = min(limit, 16)`` words ``"tok0 tok1 ..."``, where the limit
  is ``max_completion_tokens``/``max_tokens`` (default 16); the finish reason is "length"
  (Anthropic: "max_tokens") iff ``limit <= 16``, else "stop" ("end_turn").
* ``/metrics`` imitates vLLM and is rendered from a private ``CollectorRegistry`` (never the
  global one). Gauges only change through ``PUT /_dev/state``; the token and request-success
  counters only grow as requests are served. ``PUT /_dev/metrics`` overrides the page with a
  verbatim text until ``DELETE /_dev/metrics``.
* Every request to an inference endpoint is recorded before any parsing, with its raw body
  bytes (``GET /_dev/requests``: a list of ``{"method", "path", "query", "headers":
  [[name, value], ...], "body_b64", "time"}``; the last 1000 are kept; ``DELETE`` clears).
  So is any request no route takes (another method or path, answered 200): only
  ``/health``, ``/v1/models``, ``/metrics`` and the ``/_dev/*`` controls go unrecorded.
* ``PUT /_dev/state`` ``{"valve": "max_num_queued_reqs"|"max_num_queued_tokens"}`` shuts an
  imitation of vLLM 0.32's admission valve: every request vLLM gates with it gets vLLM's own
  503, byte for byte (``answers.valve_answer``), and counts in
  ``vllm:admission_rejections_total{reason}``; ``""`` opens it.
* Streams send each SSE event in its own write, with ``asyncio.sleep(delay)`` between events,
  ``delay`` being request header ``x-dev-stream-delay-ms`` (default 0).
"""

from ext_proc.lab.devbackend.answers import MAX_WORDS
from ext_proc.lab.devbackend.app import build_app, main
from ext_proc.lab.devbackend.state import (
    BACKEND,
    FINISH_REASONS,
    MAX_RECORDED,
    METRICS_CONTENT_TYPE,
    DevState,
)

__all__ = [
    "BACKEND",
    "FINISH_REASONS",
    "MAX_RECORDED",
    "MAX_WORDS",
    "METRICS_CONTENT_TYPE",
    "DevState",
    "build_app",
    "main",
]
