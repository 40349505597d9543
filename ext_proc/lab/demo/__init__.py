"""``ice demo`` (``make demo``): real Envoy + ICE + a backend on loopback, one walkthrough.

Both backends run on the fixed local ports (Envoy 127.0.0.1:10000, admin :9901, ICE :50051,
backend :8000), print each request, ICE's verdict headers and the backend's answer, then keep
serving until Ctrl-C (``wait=False``: exit after the walkthrough) so you can send your own.

- ``vllm``: a real ``vllm serve`` (CPU, the tiny random-weight model of
  ``ext_proc.lab.vllm_local``: 2,048-token context, 24 KV blocks of 128 tokens) behind ICE with
  ``ext_proc/lab/vllm_tiny_policy.yaml`` (started by ``ext_proc.lab.overload.overload_setup``): a
  pass; ``max_tokens: 100000`` downgraded to fit (vLLM alone answers 400); a 20-message chat
  longer than the context truncated to fit, keeping the turn its question needs (vLLM alone
  answers 400); a ~2,100-token prompt rejected 400 ``context_length_exceeded``; a
  sheddable request while vLLM has a queue → 429 with ``Retry-After``; then a 12-request
  burst straight to vLLM and through ICE, side by side (preemptions, 429s, latencies).
- ``dev``: the stdlib dev backend (``ext_proc.lab.devbackend``), whose reported memory state the
  walkthrough sets, for one request of each decision kind (the built-in policy with
  semantic truncation switched on, so one step truncates a long chat).
- ``auto`` (default): ``vllm`` when ``.venv-vllm`` and the tiny model are ready
  (``make vllm-install``), else ``dev``, saying why; also ``dev`` when vLLM fails to start.

Invariant: every process the demo starts stops when it returns, on error and on Ctrl-C too
(``Stack`` and ``overload_setup`` are context managers).

Modules: ``common`` (loopback URLs, the HTTP helper, the shown verdict headers, the long chat),
``dev_walkthrough`` (the dev backend's stack and steps), ``vllm_steps`` (sending and printing
one vLLM step, the busy-vLLM 429 probe), ``vllm_walkthrough`` (the vLLM stack and its steps)
and ``entry`` (``run_demo``: picking the backend, signals).
"""

from __future__ import annotations

from ext_proc.lab.demo.entry import BACKENDS, run_demo
from ext_proc.lab.demo.vllm_walkthrough import vllm_unavailable

__all__ = ["BACKENDS", "run_demo", "vllm_unavailable"]
