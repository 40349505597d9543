"""The floor under ICE's throughput: a do-nothing Python ext_proc server on the same bench.

    .venv/bin/python bench/grpc_floor.py [--server aio|sync] [--connections 8] [--duration 8]
        [--py-spy FILE] [--reply FILE] [--judge]

Runs ``envoy/bench.yaml`` (the same Envoy, routes and fast upstream as bench/throughput.py)
with its ``ice`` cluster pointed at a minimal server that answers the request headers with an
empty HeadersResponse and the buffered body with one header mutation — the two messages ICE's
production config needs per request, and nothing else: no parsing, no policy, no metrics.
Prints req/s of the direct route and of the ext_proc route (two alternating runs each), the
ratio and the server's CPU per request. Whatever ICE does, it cannot be faster than this
with the same gRPC stack (grpc.aio, or grpcio's thread-pool server with ``--server sync``).
The server also answers gRPC health (SERVING), as ICE does: the shipped configs health-check
the ``ice`` cluster and route nothing to an unhealthy host (requests fail open), so without it
the floor would measure Envoy failing open. Envoy's fail-open count is printed after the runs.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from envoy.service.ext_proc.v3 import external_processor_pb2_grpc as pb_grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

HEADERS_REPLY = pb.ProcessingResponse(request_headers=pb.HeadersResponse())


_REPLY: list[pb.ProcessingResponse] = []  # --reply: this body reply instead


def _body_reply() -> pb.ProcessingResponse:
    if _REPLY:
        return _REPLY[0]
    reply = pb.ProcessingResponse()
    header = reply.request_body.response.header_mutation.set_headers.add().header
    header.key, header.raw_value = "x-mem-pressure", b"low"
    return reply


class _Aio(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    async def Process(
        self, requests: AsyncIterator[pb.ProcessingRequest], context: Any
    ) -> AsyncIterator[pb.ProcessingResponse]:
        async for request in requests:
            yield HEADERS_REPLY if request.HasField("request_headers") else _body_reply()


class _Judge(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    """``--judge``: the floor that also runs ICE's judgement of each message — the pipeline's
    header read, its body verdict and the reply's rendering, as ``bench/profile_hotpath.py``
    builds them (the bench's policy and /metrics page) — and nothing else of ICE's: no
    admission stream, backlog, queue, commit or telemetry of the servicer."""

    def __init__(self) -> None:
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import profile_hotpath as hot

        from ext_proc.serve import render

        self.pipeline = hot.build()[0].pipeline
        self.render = render.render_body_outcome
        self.route = self.pipeline.router.resolve(hot.ROUTE_METADATA)
        # the views as ICE's collector keeps them: re-stamped at each scrape interval (1 s),
        # so that no judgement runs on a stale view (the ledger's fallback path)
        self._views: dict[str, Any] = self.pipeline.lookup.__self__  # type: ignore[attr-defined]
        self._stamped = time.monotonic()

    def _restamp(self) -> None:
        now = time.monotonic()
        if now - self._stamped >= 1.0:
            self._stamped = now
            for name, view in self._views.items():
                self._views[name] = dataclasses.replace(view, taken_at_s=now)

    async def Process(
        self, requests: AsyncIterator[pb.ProcessingRequest], context: Any
    ) -> AsyncIterator[pb.ProcessingResponse]:
        pipeline, route, facts = self.pipeline, self.route, None
        self._restamp()
        async for request in requests:
            if request.HasField("request_headers"):
                headers = request.request_headers
                pairs = ((h.key, h.raw_value or h.value.encode()) for h in headers.headers.headers)
                facts = pipeline.on_headers(route, pairs, headers.end_of_stream)
                yield HEADERS_REPLY
            else:
                assert facts is not None
                verdict = pipeline.on_body(route, facts, request.request_body.body)
                assert verdict is not None
                yield self.render(verdict.outcome)


class _Sync(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def Process(
        self, requests: Iterator[pb.ProcessingRequest], context: Any
    ) -> Iterator[pb.ProcessingResponse]:
        for request in requests:
            yield HEADERS_REPLY if request.HasField("request_headers") else _body_reply()


def serve(kind: str, address: str, judge: bool = False) -> None:
    """Run the do-nothing server (the child process of ``main``)."""
    if kind == "aio":
        servicer = _Judge() if judge else _Aio()

        async def run() -> None:
            server = grpc.aio.server()
            pb_grpc.add_ExternalProcessorServicer_to_server(servicer, server)
            checks = HealthServicer()
            await checks.set("", health_pb2.HealthCheckResponse.SERVING)
            health_pb2_grpc.add_HealthServicer_to_server(checks, server)
            server.add_insecure_port(address)
            await server.start()
            print("ready", flush=True)
            await server.wait_for_termination()

        asyncio.run(run())
        return
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    pb_grpc.add_ExternalProcessorServicer_to_server(_Sync(), server)
    sync_checks = health.HealthServicer()
    sync_checks.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(sync_checks, server)
    server.add_insecure_port(address)
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--server", choices=("aio", "sync"), default="aio")
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--duration", type=int, default=8)
    ap.add_argument(
        "--py-spy",
        type=Path,
        help="sample the server during the last ext_proc run (collapsed stacks)",
    )
    ap.add_argument(
        "--reply",
        type=Path,
        help="answer the body with this serialized ProcessingResponse (e.g. ICE's own answer, "
        "to see what its content costs Envoy)",
    )
    ap.add_argument(
        "--judge",
        action="store_true",
        help="the aio floor plus ICE's judgement of each message (pipeline and rendering only)",
    )
    ap.add_argument("--serve", help=argparse.SUPPRESS)  # child mode: the address to serve on
    args = ap.parse_args(argv)
    if args.serve:
        if args.reply:
            _REPLY.append(pb.ProcessingResponse.FromString(args.reply.read_bytes()))
        serve(args.server, args.serve, args.judge)
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import throughput as tb

    from ext_proc.lab.stack import Stack, free_port, render_envoy_config

    with tempfile.TemporaryDirectory() as tmp, Stack(Path(tmp)) as stack:
        ingress, upstream, admin, port = free_port(), free_port(), free_port(), free_port()
        argv_child = [sys.executable, __file__, "--server", args.server]
        if args.reply:
            argv_child += ["--reply", str(args.reply)]
        if args.judge:
            argv_child += ["--judge"]
        child = subprocess.Popen(
            [*argv_child, "--serve", f"127.0.0.1:{port}"], stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None and child.stdout.readline().strip() == "ready"
            config = render_envoy_config(
                tb.BENCH_YAML,
                admin_port=admin,
                listeners={"ingress": ingress, "fast_upstream": upstream},
                clusters={"ice": [f"127.0.0.1:{port}"], "fast_upstream": [f"127.0.0.1:{upstream}"]},
            )
            stack.start_envoy(config, admin, concurrency=1)
            time.sleep(2)  # Envoy's first health checks of the cluster
            url = f"http://127.0.0.1:{ingress}{tb.PATH}"
            best: dict[bool, float] = {True: 0.0, False: 0.0}
            for i, direct in enumerate((True, False, True, False)):
                tb.wait_for_quiet(10)
                tb.run_wrk(url, args.connections, 1, 1, direct)
                spy = None
                if args.py_spy and i == 3:
                    spy = tb.start_py_spy(args.py_spy, child.pid, args.duration)
                envoy_pid = stack.procs["envoy"].pid
                cpu0, envoy0 = tb.cpu_seconds([child.pid]), tb.cpu_seconds([envoy_pid])
                result = tb.run_wrk(url, args.connections, args.duration, 1, direct)
                cpu1, envoy1 = tb.cpu_seconds([child.pid]), tb.cpu_seconds([envoy_pid])
                if spy is not None:
                    spy.communicate()
                route = (
                    "direct"
                    if direct
                    else f"ext_proc ({args.server}{' + judge' if args.judge else ''})"
                )
                per_req = (cpu1 - cpu0) / max(1, result.requests) * 1e6
                envoy_us = (envoy1 - envoy0) / max(1, result.requests) * 1e6
                print(
                    f"{route:16} {result.rps:8.0f} req/s  p50 {result.p50_ms:.2f} ms  "
                    f"server CPU {per_req:.0f} µs/req  Envoy {envoy_us:.0f} µs/req  "
                    f"non-2xx {result.non_2xx}"
                )
                best[direct] = max(best[direct], result.rps)
            print(f"ratio ext_proc/direct {best[False] / best[True]:.3f} (best runs)")
            failed_open = tb.envoy_stats(admin).get("failure_mode_allowed", 0)
            print(f"Envoy failed open {failed_open} times (0: every request reached the floor)")
        finally:
            child.kill()
            child.wait()
    return 0


if __name__ == "__main__":
    sys.exit(main())
