"""What the embedding worker costs: load time, memory, cold and warm similarity calls.

    .venv/bin/python bench/embed_worker.py [--threads 1 2] [--messages 50] [--tokens 160]
                                           [--repeats 3] [--warm-calls 200] [--json]

For each ``--threads`` value a real worker process is started
(``EmbeddingWorkerProcess``: ``python -m ext_proc.truncate.worker``) and measured through the
real client over its Unix socket:

1. ready: spawn → ``READY`` (imports torch + sentence-transformers, loads the packaged
   all-MiniLM-L6-v2; the worker's own log line gives the load part);
2. rss: the worker's resident memory right after READY (``stats`` op);
3. cold: one ``similarities`` call with a new query and ``--messages`` never-seen messages of
   ~``--tokens`` word pieces each (counted with the model's own tokenizer; messages alternate
   English, Chinese and mixed text), ``--repeats`` times with fresh texts;
4. warm: the same call again, everything cached, ``--warm-calls`` times: p50/p95; and the
   same while the compute thread encodes another cold batch (answered from the cache on the
   worker's event loop);
5. new query: a call whose history is cached and whose query is new (the steady state of a
   conversation: one text to encode): p50/p95.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from ext_proc.truncate.client import EmbeddingClient, EmbeddingWorkerProcess
from ext_proc.truncate.embed import resolve_model_path

ENGLISH = [
    "The router keeps dropping the connection every few minutes after the firmware update.",
    "I tried resetting the admin password but the web page does not load on port 8080.",
    "Our quarterly report shows revenue growth in the European market despite currency swings.",
    "Please summarise the attached contract and list every clause about termination fees.",
    "The unit tests fail only on the CI machine because the timezone is different there.",
    "Can you suggest a vegetarian dinner menu for six people with one guest allergic to nuts?",
    "The kubelet evicted the pod when the node ran out of memory during the batch job.",
    "Explain why the gradient vanishes in deep recurrent networks and how LSTMs help.",
]
CHINESE = [
    "路由器在固件升级后每隔几分钟就会断开连接。",
    "我尝试重置管理员密码，但是网页无法打开。",
    "我们的季度报告显示欧洲市场的收入有所增长。",
    "请总结附件中的合同，并列出所有关于解约费用的条款。",
    "单元测试只在持续集成的机器上失败，因为那里的时区不同。",
    "你能推荐一份适合六个人的素食晚餐菜单吗？",
    "批处理任务运行期间节点内存不足，容器被驱逐了。",
    "请解释为什么深层循环神经网络中梯度会消失。",
]


def _messages(
    tokenizer: Tokenizer, count: int, tokens: int, seed: int, tag: str
) -> tuple[list[str], float]:
    """``count`` distinct messages of about ``tokens`` word pieces; their mean length."""
    rng = random.Random(seed)
    out: list[str] = []
    lengths: list[int] = []
    for n in range(count):
        kind = n % 3  # 0 English, 1 Chinese, 2 mixed
        text = f"[{tag} {n}] "
        while len(tokenizer.encode(text).ids) < tokens:
            if kind == 0 or (kind == 2 and rng.random() < 0.5):
                text += rng.choice(ENGLISH) + " "
            else:
                text += rng.choice(CHINESE)
        out.append(text)
        lengths.append(len(tokenizer.encode(text).ids))
    return out, statistics.mean(lengths)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _measure(
    socket_path: str, tokenizer: Tokenizer, args: argparse.Namespace, threads: int
) -> dict[str, Any]:
    client = EmbeddingClient(socket_path)
    try:
        stats = await client.stats(timeout_s=10)
        result: dict[str, Any] = {
            "threads": threads,
            "model_load_s": stats["load_s"],
            "rss_after_load_mib": round(stats["rss_bytes"] / 2**20, 1),
        }
        cold: list[float] = []
        mean_tokens = 0.0
        texts: list[str] = []
        for repeat in range(args.repeats):
            texts, mean_tokens = _messages(
                tokenizer, args.messages, args.tokens, seed=repeat, tag=f"t{threads}r{repeat}"
            )
            query = f"What did we decide about the router? ({threads}/{repeat})"
            started = time.perf_counter()
            await client.similarities(query, texts, timeout_s=600)
            cold.append(time.perf_counter() - started)
        result["cold_s"] = [round(s, 3) for s in cold]
        result["message_tokens_mean"] = round(mean_tokens, 1)
        warm: list[float] = []
        for _ in range(args.warm_calls):
            started = time.perf_counter()
            await client.similarities("What did we decide about the router?", texts, 60)
            warm.append(time.perf_counter() - started)
        new_query: list[float] = []
        for n in range(max(20, args.warm_calls // 10)):
            started = time.perf_counter()
            await client.similarities(f"A new question, number {n}, about the router", texts, 60)
            new_query.append(time.perf_counter() - started)
        busy: list[float] = []  # cached calls while the compute thread encodes a cold batch
        cold_texts, _ = _messages(tokenizer, args.messages, args.tokens, seed=99, tag="busy")
        cold_call = asyncio.ensure_future(client.similarities("busy", cold_texts, 600))
        await asyncio.sleep(0.05)
        while not cold_call.done():
            started = time.perf_counter()
            await client.similarities("What did we decide about the router?", texts, 60)
            busy.append(time.perf_counter() - started)
            await asyncio.sleep(0.01)
        await cold_call
        result["warm_while_encoding_p50_ms"] = round(_pct(busy, 0.5) * 1e3, 3)
        result["warm_while_encoding_p95_ms"] = round(_pct(busy, 0.95) * 1e3, 3)
        result["warm_p50_ms"] = round(_pct(warm, 0.5) * 1e3, 3)
        result["warm_p95_ms"] = round(_pct(warm, 0.95) * 1e3, 3)
        result["new_query_p50_ms"] = round(_pct(new_query, 0.5) * 1e3, 2)
        result["new_query_p95_ms"] = round(_pct(new_query, 0.95) * 1e3, 2)
        stats = await client.stats(timeout_s=10)
        result["rss_after_run_mib"] = round(stats["rss_bytes"] / 2**20, 1)
        result["cache_mib"] = round(stats["cache_bytes"] / 2**20, 2)
        return result
    finally:
        await client.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--messages", type=int, default=50)
    parser.add_argument("--tokens", type=int, default=160)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warm-calls", type=int, default=200)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    tokenizer = Tokenizer.from_file(str(resolve_model_path(None) / "tokenizer.json"))
    tokenizer.no_truncation()
    results = []
    with tempfile.TemporaryDirectory(prefix="ice-emb-") as folder:
        for threads in args.threads:
            socket_path = str(Path(folder) / f"t{threads}.sock")
            worker = EmbeddingWorkerProcess(socket_path, threads=threads, echo_stderr=False)
            started = time.perf_counter()
            worker.start()
            try:
                worker.wait_ready(300)
                ready_s = time.perf_counter() - started
                result = asyncio.run(_measure(socket_path, tokenizer, args, threads))
                result["spawn_to_ready_s"] = round(ready_s, 2)
                results.append(result)
            finally:
                worker.stop()
    if args.json:
        print(json.dumps(results, indent=2))
        return
    for r in results:
        print(
            f"threads={r['threads']}: spawn→READY {r['spawn_to_ready_s']:.2f} s "
            f"(model load incl. imports {r['model_load_s']:.2f} s), "
            f"RSS {r['rss_after_load_mib']:.0f} MiB after load, "
            f"{r['rss_after_run_mib']:.0f} MiB after the run (cache {r['cache_mib']} MiB)\n"
            f"  cold: {args.messages} messages × {r['message_tokens_mean']:.0f} word pieces "
            f"+ query: {', '.join(f'{s:.3f}' for s in r['cold_s'])} s\n"
            f"  warm (all cached): p50 {r['warm_p50_ms']:.2f} ms, p95 {r['warm_p95_ms']:.2f} ms"
            f"\n  warm while the compute thread encodes a cold batch: "
            f"p50 {r['warm_while_encoding_p50_ms']:.2f} ms, "
            f"p95 {r['warm_while_encoding_p95_ms']:.2f} ms"
            f"\n  new query, cached history: p50 {r['new_query_p50_ms']:.2f} ms, "
            f"p95 {r['new_query_p95_ms']:.2f} ms"
        )


if __name__ == "__main__":
    main()
