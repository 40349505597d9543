"""Profile ICE's per-request Python work in-process: no network, no Envoy, no gRPC core.

    .venv/bin/python bench/profile_hotpath.py [--requests 20000] [--top 20]
    .venv/bin/python bench/profile_hotpath.py --collapsed FILE   # summarise a py-spy raw file

Drives ``ExtProcServicer.Process`` with prebuilt ``ProcessingRequest`` messages exactly as
Envoy sends them for the benchmark's request (``bench/chat.lua``; headers, then the buffered
body), against a snapshot parsed from the fast upstream's /metrics page in
``envoy/bench.yaml`` (low pressure → pass). Prints:

1. µs per request for each stage (timed without a profiler), including the protobuf
   (de)serialisation gRPC does per message, which a pure-Python profile does not show;
2. cProfile's top functions by own time and by cumulative time, per request.

``--collapsed`` reads ``py-spy record --format raw`` output (as written by
``bench/throughput.py --py-spy FILE``) and prints the top frames by own and cumulative share
of samples: that view includes grpc.aio's Cython layer and the event loop.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import io
import pstats
import re
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import yaml
from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb

from ext_proc.admit.admission import Step
from ext_proc.admit.pipeline import Pipeline, RequestFacts
from ext_proc.lab.stack import ENVOY_DIR
from ext_proc.policy.evaluate import evaluate
from ext_proc.policy.load import load_policy
from ext_proc.schemas import rawjson
from ext_proc.serve import render
from ext_proc.serve.servicer import ExtProcServicer, message_for
from ext_proc.signals.collector import backend_from_scrape
from ext_proc.signals.parse import parse_engine
from ext_proc.signals.snapshot import PoolSnapshot

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import PATH, request_body

ROUTE_METADATA = (("x-ice-route", "chat"),)


def metrics_page() -> str:
    """The /metrics page the fast upstream serves (envoy/bench.yaml)."""
    config = yaml.safe_load((ENVOY_DIR / "bench.yaml").read_text())
    listener = next(
        x for x in config["static_resources"]["listeners"] if x["name"] == "fast_upstream"
    )
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    metrics = next(r for r in routes if r["match"].get("path") == "/metrics")
    return str(metrics["direct_response"]["body"]["inline_string"])


def envoy_messages(body: bytes) -> list[pb.ProcessingRequest]:
    """The two messages Envoy sends for one benchmark request (headers as wrk sends them)."""
    headers = [
        (":authority", "127.0.0.1:10100"),
        (":path", PATH),
        (":method", "POST"),
        (":scheme", "http"),
        ("content-length", str(len(body))),
        ("content-type", "application/json"),
        ("x-forwarded-proto", "http"),
        ("x-request-id", "3f0a5c1e-9f7e-4d55-9d0b-2c4d8c3b7a10"),
    ]
    hmap = base_pb2.HeaderMap(
        headers=[base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in headers]
    )
    return [
        pb.ProcessingRequest(request_headers=pb.HttpHeaders(headers=hmap, end_of_stream=False)),
        pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True)),
    ]


class FakeContext:
    """The part of ``grpc.aio.ServicerContext`` the servicer uses."""

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return ROUTE_METADATA


async def _feed(messages: list[pb.ProcessingRequest]) -> AsyncIterator[pb.ProcessingRequest]:
    for m in messages:
        yield m


async def drive(servicer: ExtProcServicer, messages: list[pb.ProcessingRequest], n: int) -> None:
    """``n`` ext_proc streams through ``Process``, as grpc.aio would iterate them."""
    ctx: Any = FakeContext()
    for _ in range(n):
        async for _reply in servicer.Process(_feed(messages), ctx):
            pass


def build() -> tuple[ExtProcServicer, list[pb.ProcessingRequest]]:
    policy = load_policy(None)
    scrape = parse_engine("vllm", "http://fast_upstream/metrics", metrics_page(), 0.0)
    backend = backend_from_scrape(scrape, [scrape], 10.0)
    snapshots = {
        name: PoolSnapshot(pool=name, backends=(backend,), taken_at_s=time.monotonic())
        for name in policy.pools
    }
    pipeline = Pipeline(policy, snapshots.get)
    return ExtProcServicer(pipeline), envoy_messages(request_body())


def _first_step(steps: AsyncIterator[Step]) -> Step:
    """The first step of an async generator that does not wait (driven by hand)."""
    coro = steps.__anext__()
    try:
        coro.send(None)
    except StopIteration as done:
        step: Step = done.value
        return step
    coro.close()
    raise RuntimeError("the headers phase waited (a busy worker?)")


def per_call_us(fn: Callable[[], object], n: int) -> float:
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return 1e6 * (time.perf_counter() - t0) / n


def _record(record: Callable[..., Any], pipeline: Pipeline, verdict: Any) -> None:
    hold = record(pipeline.router.resolve(ROUTE_METADATA), verdict)
    if hold is not None:
        pipeline.views.release(hold)


def stage_table(servicer: ExtProcServicer, messages: list[pb.ProcessingRequest], n: int) -> None:
    """µs per request for each stage, timed without a profiler."""
    pipeline = servicer.pipeline
    route = pipeline.router.resolve(ROUTE_METADATA)
    wire = [m.SerializeToString() for m in messages]
    hdr, body_msg = messages[0].request_headers, messages[1].request_body

    pairs = [(h.key, h.raw_value or h.value.encode()) for h in hdr.headers.headers]

    def headers_phase() -> tuple[RequestFacts, pb.ProcessingResponse]:
        """The headers phase as the servicer runs it: a stream's ``Admission``, its one
        step (driven without a loop: nothing in it waits when the worker is not busy)."""
        admission = servicer.admission(route)
        step = _first_step(admission.on_headers(pairs, hdr.end_of_stream))
        return admission.facts, message_for(step, admission.facts)

    facts, _ = headers_phase()
    adapter = facts.adapter
    assert adapter is not None
    doc = rawjson.parse_object(body_msg.body)
    features = adapter.features(doc.values)
    pressure = pipeline.views.pressure(route.profile, pipeline.lookup(route.pool))
    verdict = pipeline.on_body(route, facts, body_msg.body)
    assert verdict is not None and verdict.decision is not None
    if verdict.decision.decision != "pass":
        raise SystemExit(f"expected a pass, got {verdict.decision}")
    replies = [
        headers_phase()[1],
        render.render_body_outcome(verdict.outcome),
    ]
    on_body = pipeline.on_body
    parse = pb.ProcessingRequest.FromString
    record = pipeline.recorder.record  # a pass holds its blocks: released right after
    stages: list[tuple[str, Callable[[], object]]] = [
        ("router.resolve (route metadata)", lambda: pipeline.router.resolve(ROUTE_METADATA)),
        ("parse 2 ProcessingRequests (gRPC)", lambda: [parse(w) for w in wire]),
        ("headers phase: admission.on_headers", headers_phase),
        ("body phase: on_body (the 4 below)", lambda: on_body(route, facts, body_msg.body)),
        ("  rawjson.parse_object", lambda: rawjson.parse_object(body_msg.body)),
        ("  adapter.features", lambda: adapter.features(doc.values)),
        (
            "  views.pressure",
            lambda: pipeline.views.pressure(route.profile, pipeline.lookup(route.pool)),
        ),
        ("  evaluate", lambda: evaluate(features, pressure, route.profile, facts.priority)),
        ("render.render_body_outcome", lambda: render.render_body_outcome(verdict.outcome)),
        ("recorder.record + release (commit)", lambda: _record(record, pipeline, verdict)),
        ("serialise 2 replies (gRPC)", lambda: [r.SerializeToString() for r in replies]),
    ]
    print(f"stage timings, µs per request ({n} calls each, no profiler):")
    for name, fn in stages:
        print(f"  {name:<44}{per_call_us(fn, n):>8.1f}")
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(drive(servicer, messages, 100))
        t0 = time.perf_counter()
        loop.run_until_complete(drive(servicer, messages, n))
        total = 1e6 * (time.perf_counter() - t0) / n
    finally:
        loop.close()
    print(f"  {'Process() stream, end to end (asyncio)':<44}{total:>8.1f}")
    print(f"  reply headers: {verdict.outcome.headers}")


def cprofile(
    servicer: ExtProcServicer, messages: list[pb.ProcessingRequest], n: int, top: int
) -> None:
    loop = asyncio.new_event_loop()
    prof = cProfile.Profile()
    try:
        loop.run_until_complete(drive(servicer, messages, 100))
        prof.enable()
        loop.run_until_complete(drive(servicer, messages, n))
        prof.disable()
    finally:
        loop.close()
    stats = pstats.Stats(prof)
    total = stats.total_tt  # type: ignore[attr-defined]
    print(f"\ncProfile: {n} streams, {1e6 * total / n:.1f} µs per request under the profiler")
    for key, title in (("tottime", "own time"), ("cumulative", "cumulative time")):
        print(f"\ntop {top} by {title}, µs per request (own / cumulative / calls per request):")
        out = io.StringIO()
        ps = pstats.Stats(prof, stream=out)
        ps.sort_stats(key)
        rows = ps.fcn_list[:top]  # type: ignore[attr-defined]
        for func in rows:
            _cc, nc, tt, ct, _callers = ps.stats[func]  # type: ignore[attr-defined]
            print(f"  {1e6 * tt / n:>7.2f} {1e6 * ct / n:>8.2f} {nc / n:>6.1f}  {_name(func)}")


def _name(func: tuple[str, int, str]) -> str:
    filename, line, name = func
    if filename == "~":
        return name
    short = re.sub(r"^.*/(site-packages|main)/", "", filename)
    return f"{short}:{line}({name})"


_SHORT_PATH = re.compile(r"\s*\(.*?/(site-packages|main|lib/python3\.\d+)/")


_IDLE_LEAVES = ("epoll_wait", "epoll_pwait", "poll ", "select ")
_ICE_FRAME = re.compile(r"\(ext_proc/(?!server\.py|cli\.py)")


def _category(frames: list[str]) -> str:
    """Where a sample was: waiting, in ICE's own code, or in gRPC/asyncio machinery."""
    if any("Thread.run (" in f for f in frames):
        grpc = any("cygrpc" in f for f in frames)
        thread = "grpc poller thread" if grpc else "other thread (metrics server, ...)"
    else:
        thread = "event loop"
    if frames[-1].startswith(_IDLE_LEAVES):
        return f"{thread}: waiting (epoll/poll)"
    ice = [i for i, f in enumerate(frames) if _ICE_FRAME.search(f)]
    if thread == "event loop" and ice:
        # ICE's frames called into gRPC (``async for`` over the stream) or asyncio: not ICE's.
        below = frames[ice[-1] + 1 :]
        if not any("cygrpc" in f or "asyncio/" in f for f in below):
            return "event loop: ICE code (ext_proc, below servicer.Process)"
    return f"{thread}: gRPC/asyncio/syscalls"


def collapsed(path: Path, top: int) -> None:
    """Own and cumulative sample shares from py-spy's raw (collapsed stack) format."""
    own: Counter[str] = Counter()
    cumulative: Counter[str] = Counter()
    categories: Counter[str] = Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = [_SHORT_PATH.sub(" (", f) for f in stack.split(";")]
        frames = [f for f in frames if not f.startswith("process ")]
        if not frames:
            continue
        n = int(count)
        total += n
        own[frames[-1]] += n
        categories[_category(frames)] += n
        for f in set(frames):
            cumulative[f] += n
    print(f"py-spy {path}: {total} samples")
    busy = total - sum(n for c, n in categories.items() if "waiting" in c)
    print("\nsamples by thread and kind (share of all / of busy samples):")
    for cat, n in categories.most_common():
        of_busy = "" if "waiting" in cat else f"{100 * n / max(1, busy):>6.1f}%"
        print(f"  {100 * n / total:>5.1f}% {of_busy:>7}  {cat}")
    for title, counter in (("own", own), ("cumulative", cumulative)):
        print(f"\ntop {top} by {title} share of samples:")
        for frame, n in counter.most_common(top):
            print(f"  {100 * n / total:>5.1f}%  {frame}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--collapsed", type=Path, help="summarise a py-spy --format raw file")
    args = ap.parse_args(argv)
    if args.collapsed:
        collapsed(args.collapsed, args.top)
        return 0
    servicer, messages = build()
    stage_table(servicer, messages, args.requests)
    cprofile(servicer, messages, args.requests, args.top)
    return 0


if __name__ == "__main__":
    sys.exit(main())
