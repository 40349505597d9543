"""The floor under ICE's throughput: a do-nothing Python ext_proc server on the same bench.

    .venv/bin/python bench/grpc_floor.py [--server aio|sync] [--connections 8] [--duration 8]

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


def _body_reply() -> pb.ProcessingResponse:
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


class _Sync(pb_grpc.ExternalProcessorServicer):  # type: ignore[misc]
    def Process(
        self, requests: Iterator[pb.ProcessingRequest], context: Any
    ) -> Iterator[pb.ProcessingResponse]:
        for request in requests:
            yield HEADERS_REPLY if request.HasField("request_headers") else _body_reply()


def serve(kind: str, address: str) -> None:
    """Run the do-nothing server (the child process of ``main``)."""
    if kind == "aio":

        async def run() -> None:
            server = grpc.aio.server()
            pb_grpc.add_ExternalProcessorServicer_to_server(_Aio(), server)
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
    ap.add_argument("--serve", help=argparse.SUPPRESS)  # child mode: the address to serve on
    args = ap.parse_args(argv)
    if args.serve:
        serve(args.server, args.serve)
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import throughput as tb

    from ext_proc.lab.stack import Stack, free_port, render_envoy_config

    with tempfile.TemporaryDirectory() as tmp, Stack(Path(tmp)) as stack:
        ingress, upstream, admin, port = free_port(), free_port(), free_port(), free_port()
        argv_child = [sys.executable, __file__, "--server", args.server]
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
            for direct in (True, False, True, False):
                tb.wait_for_quiet(10)
                tb.run_wrk(url, args.connections, 1, 1, direct)
                cpu0 = tb.cpu_seconds([child.pid])
                result = tb.run_wrk(url, args.connections, args.duration, 1, direct)
                cpu1 = tb.cpu_seconds([child.pid])
                route = "direct" if direct else f"ext_proc ({args.server})"
                per_req = (cpu1 - cpu0) / max(1, result.requests) * 1e6
                print(
                    f"{route:16} {result.rps:8.0f} req/s  p50 {result.p50_ms:.2f} ms  "
                    f"server CPU {per_req:.0f} µs/req  non-2xx {result.non_2xx}"
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
