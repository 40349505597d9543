"""The embedding worker process and its client, over a real Unix socket with the real model.

One worker process serves the whole module (started once: ~5 s to load torch and the model);
the restart test starts its own under ``EmbeddingWorkerProcess.supervise``. Values that come
over the socket are compared with an in-process ``Embedder``. Timings are printed, never
asserted.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ext_proc.truncate.client import (
    MAX_FRAME_BYTES,
    EmbeddingClient,
    EmbeddingTimeout,
    EmbeddingUnavailable,
    EmbeddingWorkerProcess,
    FrameTooLarge,
    encode_frame,
    read_frame,
)
from ext_proc.truncate.embed import Embedder
from ext_proc.truncate.worker import _watch_parent

QUERY = "How do I reset my router password?"
TEXTS = [
    "router admin password reset steps",
    "chocolate cake recipe",
    "",
    "如何重置路由器密码？",
    "Press the reset button on the back of the router for 10 seconds.",
]


@pytest.fixture(scope="module")
def socket_dir() -> Iterator[Path]:
    # Short on purpose: a Unix socket path has at most 107 bytes.
    folder = Path(tempfile.mkdtemp(prefix="ice-emb-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="module")
def worker(socket_dir: Path) -> Iterator[EmbeddingWorkerProcess]:
    process = EmbeddingWorkerProcess(str(socket_dir / "w.sock"), threads=1)
    started = time.perf_counter()
    process.start()
    try:
        process.wait_ready(120)
        print(f"\nembedding worker ready in {time.perf_counter() - started:.2f} s")
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def embedder() -> Embedder:
    return Embedder(threads=1)


async def _exchange(path: str, frames: list[bytes], answers: int) -> list[dict[str, Any]]:
    """Send raw frames on one connection and read ``answers`` answers."""
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        for frame in frames:
            writer.write(frame)
        await writer.drain()
        return [json.loads(await read_frame(reader)) for _ in range(answers)]
    finally:
        writer.close()
        await writer.wait_closed()


async def _closed_by_peer(path: str, raw: bytes) -> bool:
    """Whether the worker closes the connection after ``raw`` (without answering)."""
    reader, writer = await asyncio.open_unix_connection(path)
    try:
        writer.write(raw)
        await writer.drain()
        return await asyncio.wait_for(reader.read(), 5.0) == b""
    finally:
        writer.close()
        await writer.wait_closed()


def _request(request_id: int, texts: list[str], deadline_in_s: float = 30.0) -> bytes:
    return encode_frame(
        {
            "id": request_id,
            "op": "similarities",
            "query": QUERY,
            "texts": texts,
            "deadline": time.time() + deadline_in_s,
        }
    )


# --- pure: frames and the import rule ------------------------------------------------------


def test_client_module_imports_only_the_standard_library() -> None:
    code = (
        "import sys; before = set(sys.modules); import ext_proc.truncate.client; "
        "print(sorted(m for m in set(sys.modules) - before "
        "if m.split('.')[0] not in sys.stdlib_module_names and not m.startswith('ext_proc')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"


def test_frames_round_trip_and_refuse_oversize() -> None:
    async def run() -> None:
        reader = asyncio.StreamReader()
        reader.feed_data(encode_frame({"id": 1, "text": "路由器 \ud800"}))
        reader.feed_data(struct.pack(">I", MAX_FRAME_BYTES + 1))
        reader.feed_eof()
        assert json.loads(await read_frame(reader)) == {"id": 1, "text": "路由器 \ud800"}
        with pytest.raises(FrameTooLarge):
            await read_frame(reader)

    asyncio.run(run())
    with pytest.raises(FrameTooLarge):
        encode_frame({"texts": ["x" * 100]}, max_bytes=50)


def test_worker_watches_its_parent() -> None:
    async def run() -> bool:
        stop = asyncio.Event()
        await asyncio.wait_for(_watch_parent(-1, stop), 5.0)  # -1 is nobody's parent
        return stop.is_set()

    assert asyncio.run(run())


# --- the module's worker -------------------------------------------------------------------


def test_worker_similarities_equal_the_in_process_embedder(
    worker: EmbeddingWorkerProcess, embedder: Embedder
) -> None:
    async def run() -> list[float]:
        client = EmbeddingClient(worker.socket_path)
        try:
            return await client.similarities(QUERY, TEXTS, timeout_s=30)
        finally:
            await client.close()

    remote = asyncio.run(run())
    local = embedder.similarities(QUERY, TEXTS)
    assert remote == pytest.approx(local, abs=1e-5)
    assert remote[2] == 0.0
    assert remote[0] > remote[1]


def test_client_multiplexes_concurrent_calls_on_one_connection(
    worker: EmbeddingWorkerProcess, embedder: Embedder
) -> None:
    queries = [f"question number {n} about routers" for n in range(12)]

    async def run() -> tuple[list[list[float]], dict[str, Any], dict[str, Any]]:
        client = EmbeddingClient(worker.socket_path)
        try:
            before = await client.stats(timeout_s=10)
            answers = await asyncio.gather(
                *(client.similarities(q, TEXTS, timeout_s=30) for q in queries)
            )
            after = await client.stats(timeout_s=10)
            return answers, before, after
        finally:
            await client.close()

    answers, before, after = asyncio.run(run())
    for query, answer in zip(queries, answers, strict=True):
        assert answer == pytest.approx(embedder.similarities(query, TEXTS), abs=1e-5)
    assert after["connections_total"] == before["connections_total"]  # one connection
    assert after["requests"] == before["requests"] + len(queries) + 1


def test_worker_serves_many_connections_at_once(worker: EmbeddingWorkerProcess) -> None:
    async def one(n: int) -> list[float]:
        client = EmbeddingClient(worker.socket_path)
        try:
            return await client.similarities(f"client {n}", ["router", "cake"], timeout_s=30)
        finally:
            await client.close()

    async def run() -> list[list[float]]:
        return await asyncio.gather(*(one(n) for n in range(8)))

    assert all(len(sims) == 2 for sims in asyncio.run(run()))


def test_worker_stats_over_the_socket(worker: EmbeddingWorkerProcess) -> None:
    async def run() -> dict[str, Any]:
        client = EmbeddingClient(worker.socket_path)
        try:
            await client.similarities(QUERY, TEXTS, timeout_s=30)
            return await client.stats(timeout_s=10)
        finally:
            await client.close()

    stats = asyncio.run(run())
    print(f"\nworker rss after load and a few requests: {stats['rss_bytes'] / 2**20:.0f} MiB")
    assert stats["pid"] == worker.pid
    assert stats["rss_bytes"] > 50 * 2**20
    assert stats["threads"] == 1 and stats["dimension"] == 384
    assert stats["cache_hits"] > 0 and stats["cache_entries"] > 0


def test_warm_similarity_calls_timing(worker: EmbeddingWorkerProcess) -> None:
    async def run() -> list[float]:
        client = EmbeddingClient(worker.socket_path)
        try:
            await client.similarities(QUERY, TEXTS, timeout_s=30)
            times = []
            for _ in range(50):
                started = time.perf_counter()
                await client.similarities(QUERY, TEXTS, timeout_s=5)
                times.append(time.perf_counter() - started)
            return sorted(times)
        finally:
            await client.close()

    times = asyncio.run(run())
    print(f"\nwarm call: p50 {times[25] * 1e3:.2f} ms, p95 {times[47] * 1e3:.2f} ms")


def test_deadline_already_past(worker: EmbeddingWorkerProcess) -> None:
    async def run() -> None:
        (answer,) = await _exchange(worker.socket_path, [_request(7, ["x"], -1.0)], 1)
        assert answer["id"] == 7 and answer["code"] == "deadline"
        client = EmbeddingClient(worker.socket_path)
        try:
            with pytest.raises(EmbeddingTimeout):
                await client.similarities(QUERY, ["never sent"], timeout_s=0)
            with pytest.raises(EmbeddingTimeout):
                await client.similarities(QUERY, ["too quick to answer"], timeout_s=1e-4)
            assert await client.similarities(QUERY, ["still works"], timeout_s=30)
        finally:
            await client.close()

    asyncio.run(run())


def test_deadline_passed_while_queued_and_loop_keeps_reading(
    worker: EmbeddingWorkerProcess,
) -> None:
    # A slow request (uncached long texts) holds the compute thread; the next one's deadline
    # passes while it waits its turn; meanwhile a stats request and a fully cached
    # similarities request are answered at once, on the event loop.
    slow_texts = [
        f"{n} " + "a long uncached sentence about many different topics " * 30 for n in range(40)
    ]

    async def run() -> list[dict[str, Any]]:
        await _exchange(worker.socket_path, [_request(9, TEXTS)], 1)  # cache QUERY and TEXTS
        frames = [
            _request(1, slow_texts),
            _request(2, ["queued behind the slow one"], 0.05),
            encode_frame({"id": 3, "op": "stats"}),
            _request(4, TEXTS),
        ]
        return await _exchange(worker.socket_path, frames, 4)

    answers = asyncio.run(run())
    by_id = {answer["id"]: answer for answer in answers}
    assert {answers[0]["id"], answers[1]["id"]} == {3, 4}  # out of order: before the slow one
    assert [a["id"] for a in answers[2:]] == [1, 2]
    assert len(by_id[1]["sims"]) == len(slow_texts)
    assert len(by_id[4]["sims"]) == len(TEXTS)
    assert by_id[2]["code"] == "deadline"
    assert by_id[3]["stats"]["queued"] == 2


@pytest.mark.parametrize(
    ("request_body", "message"),
    [
        ({"op": "nope"}, "unknown op"),
        ({"op": "similarities", "query": 1, "texts": [], "deadline": 1e12}, "query"),
        ({"op": "similarities", "query": "q", "texts": "t", "deadline": 1e12}, "texts"),
        ({"op": "similarities", "query": "q", "texts": [1], "deadline": 1e12}, "texts"),
        ({"op": "similarities", "query": "q", "texts": ["t"]}, "deadline"),
        ({"op": "similarities", "query": "q", "texts": ["t"], "deadline": "x"}, "deadline"),
    ],
    ids=["op", "query", "texts-str", "texts-int", "no-deadline", "deadline-str"],
)
def test_bad_requests_are_answered(
    worker: EmbeddingWorkerProcess, request_body: dict[str, Any], message: str
) -> None:
    frame = encode_frame({"id": 11, **request_body})
    (answer,) = asyncio.run(_exchange(worker.socket_path, [frame], 1))
    assert answer["id"] == 11 and answer["code"] == "bad_request"
    assert message in answer["error"]


@pytest.mark.parametrize(
    "raw",
    [
        struct.pack(">I", 5) + b"hello",
        struct.pack(">I", 3) + b"[1]",
        struct.pack(">I", 12) + b'{"id": true}',
        struct.pack(">I", 4) + b"\xff\xfe\xfd\xfc",
        struct.pack(">I", MAX_FRAME_BYTES + 1) + b"{}",
    ],
    ids=["not-json", "not-object", "bool-id", "not-utf8", "oversize"],
)
def test_garbage_frame_closes_that_connection_only(
    worker: EmbeddingWorkerProcess, raw: bytes
) -> None:
    async def run() -> None:
        client = EmbeddingClient(worker.socket_path)
        try:
            await client.similarities(QUERY, ["before"], timeout_s=30)  # connected
            assert await _closed_by_peer(worker.socket_path, raw)
            assert await client.similarities(QUERY, ["after"], timeout_s=30)  # same connection
            fresh = EmbeddingClient(worker.socket_path)
            try:
                assert await fresh.similarities(QUERY, ["new client"], timeout_s=30)
            finally:
                await fresh.close()
        finally:
            await client.close()

    asyncio.run(run())
    assert worker.alive()


# --- process handling ----------------------------------------------------------------------


def test_wait_ready_reports_the_workers_stderr(socket_dir: Path) -> None:
    process = EmbeddingWorkerProcess(
        str(socket_dir / "bad.sock"), model=str(socket_dir / "no-model"), echo_stderr=False
    )
    process.start()
    with pytest.raises(RuntimeError, match="exited") as info:
        process.wait_ready(60)
    assert "does not exist" in str(info.value) and "no-model" in str(info.value)
    assert process.stop() == 2


def test_sigterm_while_loading_exits_cleanly(socket_dir: Path) -> None:
    process = EmbeddingWorkerProcess(str(socket_dir / "early.sock"), echo_stderr=False)
    process.start()
    deadline = time.monotonic() + 30
    while "loading the embedding model" not in process.stderr_tail():  # signals handled now
        assert time.monotonic() < deadline and process.alive()
        time.sleep(0.02)
    time.sleep(0.3)  # inside the imports of torch and sentence-transformers
    assert process.stop(timeout_s=10) == 0
    assert not (socket_dir / "early.sock").exists()


def test_second_worker_refuses_a_live_socket(worker: EmbeddingWorkerProcess) -> None:
    second = EmbeddingWorkerProcess(worker.socket_path, echo_stderr=False)
    second.start()
    with pytest.raises(RuntimeError, match="another embedding worker is listening"):
        second.wait_ready(60)
    second.stop()
    assert worker.alive() and os.path.exists(worker.socket_path)


def test_worker_refuses_a_path_that_is_not_a_socket(socket_dir: Path) -> None:
    path = socket_dir / "plain-file"
    path.write_text("keep me")
    process = EmbeddingWorkerProcess(str(path), echo_stderr=False)
    process.start()
    with pytest.raises(RuntimeError, match="is not a socket"):
        process.wait_ready(60)
    process.stop()
    assert path.read_text() == "keep me"


def test_killed_worker_fails_fast_and_the_supervised_restart_recovers(
    socket_dir: Path,
) -> None:
    path = str(socket_dir / "s.sock")
    process = EmbeddingWorkerProcess(path, threads=1)

    async def until_answer(client: EmbeddingClient, timeout_s: float) -> float:
        started = time.perf_counter()
        while True:
            try:
                await client.similarities(QUERY, ["router"], timeout_s=5)
                return time.perf_counter() - started
            except EmbeddingUnavailable:
                if time.perf_counter() - started > timeout_s:
                    raise
                await asyncio.sleep(0.05)

    async def run() -> None:
        stop = asyncio.Event()
        supervisor = asyncio.create_task(process.supervise(stop, min_backoff_s=0.2))
        client = EmbeddingClient(path)
        try:
            await until_answer(client, 120)
            first_pid = process.pid
            assert first_pid is not None
            slow_texts = [f"{n} in flight when the worker dies " * 40 for n in range(40)]
            in_flight = asyncio.create_task(client.similarities(QUERY, slow_texts, timeout_s=60))
            await asyncio.sleep(0.2)
            os.kill(first_pid, signal.SIGKILL)
            started = time.perf_counter()
            with pytest.raises(EmbeddingUnavailable):
                await in_flight
            print(
                f"\nin-flight call failed {(time.perf_counter() - started) * 1e3:.1f} ms after kill"
            )

            failures = []
            for _ in range(3):
                started = time.perf_counter()
                with pytest.raises(EmbeddingUnavailable):
                    await client.similarities(QUERY, ["router"], timeout_s=5)
                failures.append(time.perf_counter() - started)
            print(
                "dead worker: calls failed in " + ", ".join(f"{s * 1e6:.0f} µs" for s in failures)
            )
            recovered_s = await until_answer(client, 120)
            print(f"same client answered again {recovered_s:.2f} s later (restart + load)")
            assert process.pid != first_pid
        finally:
            await client.close()
            stop.set()
            await asyncio.wait_for(supervisor, 30)

    asyncio.run(run())
    assert process.returncode == 0  # SIGTERM: a clean exit
    assert not os.path.exists(path)  # and the socket file removed
