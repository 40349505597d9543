"""What semantic truncation costs on the request path, and in memory.

    .venv/bin/python bench/truncation.py [--cold 10] [--warm 100] [--json]

1. Planning time for a 50-message mixed English/Chinese chat of about 8,000 tokens, budget
   50 %: the server's whole truncation path (``Pipeline.on_body`` +
   ``admit.truncation.finish_truncation``: parse, features, the truncate rule, turns, similarities
   from a real embedding worker process over its Unix socket, the plan, the edited body, the second
   judgement).
   - cold: every run a conversation never seen (nothing cached): p50 / p95 / max;
   - warm: the same conversation again (every turn cached): p50 / p95;
   - next turn: the conversation grown by one turn (one new text to embed): p50 / p95.
2. Memory: ``ice serve`` (one worker) with the built-in policy and with truncation on, after
   the same 40 requests sent over the real ext_proc gRPC stream: the ext_proc worker's RSS
   both ways, and the embedding worker's RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc

from ext_proc.admit.pipeline import BodyVerdict, Pipeline, RequestFacts
from ext_proc.admit.truncation import finish_truncation
from ext_proc.lab.stack import Stack, free_port
from ext_proc.policy.load import default_policy_text, parse_policy
from ext_proc.schemas import OPENAI_CHAT
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot
from ext_proc.truncate.client import EmbeddingClient, EmbeddingWorkerProcess

EN = [
    "The deployment failed because the readiness probe timed out after thirty seconds.",
    "We should pin the dependency versions so that the build is reproducible next month.",
    "The hotel near the station has a quiet courtyard and serves breakfast until ten.",
    "Our cache hit ratio dropped after the prompt template started including a timestamp.",
    "Try lowering the learning rate and adding warmup steps before blaming the data loader.",
    "The contract renews automatically unless either party gives ninety days of notice.",
    "Roast the vegetables at a high temperature so they caramelise instead of steaming.",
    "The monitoring dashboard shows memory climbing steadily until the pod is evicted.",
]
ZH = [
    "部署失败是因为就绪探针在三十秒后超时了。",
    "我们应该固定依赖版本，这样下个月的构建才能复现。",
    "车站附近的酒店有一个安静的庭院，早餐供应到十点。",
    "提示模板开始包含时间戳之后，缓存命中率明显下降。",
    "先试着降低学习率并加入预热步骤，再去怀疑数据加载器。",
    "除非任何一方提前九十天通知，否则合同会自动续签。",
    "用高温烤蔬菜，让它们焦糖化而不是被蒸熟。",
    "监控面板显示内存持续上升，直到容器被驱逐。",
]
TRUNCATION = """\
    truncation:
      enabled: true
      budget_tokens: {high: %d}
      keep_last_turns: 2
      deadline_ms: 5000
"""


def conversation(seed: str, turns: int = 25) -> dict[str, Any]:
    """~8k tokens: 25 turns = 50 messages (+ system + question), alternating languages."""
    rng = random.Random(seed)
    msgs: list[dict[str, Any]] = [{"role": "system", "content": "You are a helpful assistant."}]
    for t in range(turns):
        pool = EN if t % 3 == 0 else ZH if t % 3 == 1 else EN + ZH
        user = " ".join(rng.choice(pool) for _ in range(2)) + f" [{seed}:{t}]"
        answer = " ".join(rng.choice(pool) for _ in range(12))
        msgs += [{"role": "user", "content": user}, {"role": "assistant", "content": answer}]
    msgs.append({"role": "user", "content": f"About the cache hit ratio drop, what now? {seed}"})
    return {"model": "m", "messages": msgs, "max_tokens": 256}


def _snapshot() -> PoolSnapshot:  # high pressure: the budget at `high` applies
    backend = BackendSignals(url="u", kv_cache_usage=0.97, num_requests_waiting=3)
    return PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())


def _policy_text(budget: int) -> str:
    return default_policy_text().replace(
        "    fail_mode: open\n", "    fail_mode: open\n" + TRUNCATION % budget, 1
    )


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def planning(cold: int, warm: int) -> dict[str, Any]:
    body0 = conversation("probe")
    tokens = OPENAI_CHAT.features(body0).input_tokens
    snap = _snapshot()
    pipeline = Pipeline(parse_policy(_policy_text(tokens // 2)), lambda _pool: snap)
    route = pipeline.router.resolve([])
    facts = RequestFacts(adapter=OPENAI_CHAT, priority="critical")
    with tempfile.TemporaryDirectory() as tmp:
        spec = parse_policy(_policy_text(1)).embedding  # as `ice serve` starts it
        proc = EmbeddingWorkerProcess(
            str(Path(tmp) / "e.sock"),
            spec.model or None,
            spec.cache_bytes,
            spec.threads,
            spec.max_seq_length,
            spec.quantize,
            echo_stderr=False,
        )
        proc.start()
        proc.wait_ready(300)
        try:
            return asyncio.run(_planning(pipeline, route, facts, proc, tokens, cold, warm))
        finally:
            proc.stop()


async def _planning(
    pipeline: Pipeline,
    route: Any,
    facts: RequestFacts,
    proc: EmbeddingWorkerProcess,
    tokens: int,
    cold: int,
    warm: int,
) -> dict[str, Any]:
    client = EmbeddingClient(proc.socket_path)
    pipeline.similarity = client

    async def once(body: bytes) -> tuple[float, BodyVerdict]:
        t = time.perf_counter()
        verdict = pipeline.on_body(route, facts, body)
        assert verdict is not None and verdict.pending is not None
        done = await finish_truncation(pipeline, route, facts, verdict)
        return time.perf_counter() - t, done

    await once(json.dumps(conversation("warmup")).encode())  # first-call costs (connection)
    cold_s, modes = [], []
    for i in range(cold):
        took, done = await once(json.dumps(conversation(f"cold{i}")).encode())
        cold_s.append(took)
        modes.append(getattr(done.decision, "mode", "?"))
    body = json.dumps(conversation("warm")).encode()
    await once(body)
    warm_s = [(await once(body))[0] for _ in range(warm)]
    grown = conversation("warm")
    next_s = []
    for i in range(min(warm, 50)):
        msgs = grown["messages"]
        msgs[-1:-1] = [
            {"role": "user", "content": f"a new question {i} about the hotel courtyard"},
            {"role": "assistant", "content": EN[i % len(EN)] + f" ({i})"},
        ]
        next_s.append((await once(json.dumps(grown).encode()))[0])
    stats = await client.stats(5)
    await client.close()
    ms = 1000.0
    return {
        "messages": len(conversation("x")["messages"]),
        "input_tokens": tokens,
        "budget_tokens": tokens // 2,
        "cold_ms": {
            "p50": round(statistics.median(cold_s) * ms, 1),
            "p95": round(_pct(cold_s, 0.95) * ms, 1),
            "max": round(max(cold_s) * ms, 1),
        },
        "cold_modes": sorted(set(modes)),
        "warm_ms": {
            "p50": round(statistics.median(warm_s) * ms, 2),
            "p95": round(_pct(warm_s, 0.95) * ms, 2),
        },
        "next_turn_ms": {
            "p50": round(statistics.median(next_s) * ms, 2),
            "p95": round(_pct(next_s, 0.95) * ms, 2),
        },
        "embedding_worker": {
            k: stats.get(k) for k in ("threads", "max_seq_length", "rss_bytes", "encoded_texts")
        },
    }


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(stat[1]) == pid:
                out.append(int(entry.name))
    return out


def _send(address: str, body: bytes) -> None:
    headers = pb.HttpHeaders(
        headers=base_pb2.HeaderMap(
            headers=[
                base_pb2.HeaderValue(key=":path", raw_value=b"/v1/chat/completions"),
                base_pb2.HeaderValue(key="content-type", raw_value=b"application/json"),
                base_pb2.HeaderValue(key="x-priority", raw_value=b"critical"),
            ]
        )
    )
    msgs = [
        pb.ProcessingRequest(request_headers=headers),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
    ]
    with grpc.insecure_channel(address) as channel:
        stub = pb_grpc.ExternalProcessorStub(channel)
        replies = list(stub.Process(iter(msgs), timeout=30))
        assert replies, "no reply"


def memory(requests: int = 40) -> dict[str, Any]:
    """ext_proc worker RSS with and without truncation (the pool scrapes nothing: the
    requests are judged with pressure unknown, so the context budget triggers truncation)."""
    out: dict[str, Any] = {}
    big = conversation("mem", turns=60)  # ~19k tokens > 8192 − 16: context-budget truncation
    with tempfile.TemporaryDirectory() as tmp:
        for name, text in (("off", default_policy_text()), ("on", _policy_text(4096))):
            workdir = Path(tmp) / name
            workdir.mkdir()
            policy = workdir / "policy.yaml"
            policy.write_text(text)
            with Stack(workdir) as stack:
                address = f"127.0.0.1:{free_port()}"
                stack.start_ice(address, policy=policy)
                pid = stack.procs["ice"].pid
                for i in range(requests):
                    big["messages"][-1]["content"] = f"About the cache hit ratio drop? {i}"
                    _send(address, json.dumps(big).encode())
                out[f"ext_proc_worker_rss_mib_truncation_{name}"] = round(_rss(pid) / 2**20, 1)
                kids = [c for c in _children(pid) if "truncate.worker" in _cmd(c)]
                if kids:
                    out["embedding_worker_rss_mib"] = round(_rss(kids[0]) / 2**20, 1)
    return out


def _cmd(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cold", type=int, default=10)
    ap.add_argument("--warm", type=int, default=100)
    ap.add_argument("--skip-memory", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    report = {"planning": planning(args.cold, args.warm)}
    if not args.skip_memory:
        report["memory"] = memory()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        for section, values in report.items():
            print(f"{section}:")
            for key, value in values.items():
                print(f"  {key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
