"""How long one client's body can hold ICE's event loop, through real Envoy (issue 30, case 2).

    .venv/bin/python bench/loop_occupancy.py [--scenarios padded_png,…] [--json FILE]

ICE runs **in this process** (its worker's gRPC server, collector, backlog and helper lane,
built as ``ice serve`` builds them: ``ext_proc.serve.server``), so that a probe task on its
event loop can measure the loop's stalls: it sleeps 5 ms at a time and records how late it
wakes; a stall is that lateness. The dev backend and real Envoy (``envoy/envoy.yaml``, its
1 s message timeout) run beside it (``ext_proc.lab.stack``). The clients run in a child
process (their own GIL), each scenario's bodies sent at once on their own connections, while
a neighbour sends a short chat request every 20 ms on the same worker. Besides the wall
stall it reports how long the loop was *busy*: the CPU time of the loop's thread across the
probe's longest sleep (on a machine shared with other work, the wall figure also holds the
time the OS gave other processes).

Scenarios (adversarial bodies; chat requests with ``n: 16, max_tokens: 1,000,000``):

- ``padded_png``: a 2×2 PNG padded with 400,000 empty chunks in a ``data:`` URL (6.4 MB);
- ``jpeg_segments``: a 2×2 JPEG after 1,200,000 empty COM segments (6.4 MB);
- ``gif_blocks``: a 2×2 GIF after a comment of 2,000,000 one-byte sub-blocks (5.3 MB);
- ``webp_chunks``: a WebP whose VP8X chunk is followed by 500,000 empty chunks (5.3 MB);
- ``huge_wav``: a 6 MB WAV whose ``data`` size says 0 (``input_audio``);
- ``png_53k_x100``: 100 bodies of 53 KB (padded PNGs of 3,000 chunks) at once;
- ``many_parts``: 400 small image parts in one body;
- ``brackets_string``: 20,001 ``[`` inside a string; ``brackets_nested``: 20,001 nested;
- ``escaped_brackets``: 2,600,000 ``\\"[`` in one string (7.8 MB: the helper lane's scan at
  its slowest, every quote escaped);
- ``idle``: only the neighbour (the probe's own floor).

Per scenario it prints the longest stall and busy time (ms), the adversarial replies (status,
``x-ice-decision``, ``x-ice-judged``), and the neighbours judged (``x-ice-decision`` present)
out of those sent. The target: no body keeps the loop busy 50 ms, every neighbour judged.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import http.client
import io
import json
import multiprocessing
import struct
import sys
import tempfile
import threading
import time
import zlib
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:  # run as a script: import ext_proc from the checkout
    sys.path.insert(0, str(REPO))

CHAT = "/v1/chat/completions"
ASK: dict[str, Any] = {"model": "dev-model", "n": 16, "max_tokens": 1_000_000}
NEIGHBOUR = json.dumps(
    {"model": "dev-model", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
).encode()
POLICY = """\
profiles:
  default: {{max_model_len: 8192, output_buffer_tokens: 512}}
pools:
  default:
    metrics_urls: ["{backend}/metrics"]
    scrape_interval_s: 0.2
    max_age_s: 2.0
routes:
  chat: {{profile: default, pool: default}}
"""


# --- the bodies (built in the client process) ------------------------------------------


def _image(fmt: str) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("P" if fmt == "GIF" else "RGB", (2, 2)).save(buf, fmt)
    return buf.getvalue()


def padded_png(chunks: int) -> bytes:
    data = _image("PNG")
    empty = struct.pack(">I", 0) + b"tEXt" + struct.pack(">I", zlib.crc32(b"tEXt"))
    return data[:33] + empty * chunks + data[33:]


def jpeg_segments(n: int) -> bytes:
    data = _image("JPEG")
    return data[:2] + b"\xff\xfe\x00\x02" * n + data[2:]


def gif_blocks(n: int) -> bytes:
    data = _image("GIF")
    flags = data[10]
    at = 13 + ((3 << ((flags & 7) + 1)) if flags & 128 else 0)
    return data[:at] + b"\x21\xfe" + b"\x01a" * n + b"\x00" + data[at:]


def webp_chunks(n: int) -> bytes:
    vp8x = b"VP8X" + struct.pack("<I", 10) + b"\0" * 4 + (1).to_bytes(3, "little") * 2
    body = b"WEBP" + vp8x + (b"JUNK" + struct.pack("<I", 0)) * n
    return b"RIFF" + struct.pack("<I", len(body)) + body


def huge_wav(nbytes: int) -> bytes:
    fmt = struct.pack("<HHIIHH", 1, 1, 16000, 32000, 2, 16)
    return b"RIFF\0\0\0\0WAVEfmt " + struct.pack("<I", 16) + fmt + b"data\0\0\0\0" + b"\0" * nbytes


def _chat(content: Any) -> bytes:
    return json.dumps({**ASK, "messages": [{"role": "user", "content": content}]}).encode()


def image_body(data: bytes, media: str = "image/png", parts: int = 1) -> bytes:
    url = f"data:{media};base64,{base64.b64encode(data).decode()}"
    return _chat([{"type": "image_url", "image_url": {"url": url}}] * parts)


def wav_body(data: bytes) -> bytes:
    part = {"type": "input_audio", "input_audio": {"data": base64.b64encode(data).decode()}}
    part["input_audio"]["format"] = "wav"
    return _chat([part])


SCENARIOS: dict[str, Callable[[], list[bytes]]] = {
    "idle": lambda: [],
    "padded_png": lambda: [image_body(padded_png(400_000))],
    "jpeg_segments": lambda: [image_body(jpeg_segments(1_200_000), "image/jpeg")],
    "gif_blocks": lambda: [image_body(gif_blocks(2_000_000), "image/gif")],
    "webp_chunks": lambda: [image_body(webp_chunks(500_000), "image/webp")],
    "huge_wav": lambda: [wav_body(huge_wav(6_000_000))],
    "png_53k_x100": lambda: [image_body(padded_png(3_000))] * 100,
    "many_parts": lambda: [image_body(jpeg_segments(200), "image/jpeg", parts=400)],
    "brackets_string": lambda: [_chat("[" * 20_001)],
    "escaped_brackets": lambda: [_chat('"[' * 2_600_000)],
    "brackets_nested": lambda: [
        json.dumps({**ASK, "messages": [{"role": "user", "content": "hi"}]}).encode()[:-1]
        + b', "metadata": '
        + b"[" * 20_001
        + b"]" * 20_001
        + b"}"
    ],
}


def _send(port: int, body: bytes) -> dict[str, Any]:
    started = time.monotonic()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("POST", CHAT, body=body, headers={"content-type": "application/json"})
        resp = conn.getresponse()
        resp.read()
        return {
            "status": resp.status,
            "decision": resp.getheader("x-ice-decision"),
            "judged": resp.getheader("x-ice-judged"),
            "seconds": round(time.monotonic() - started, 3),
        }
    except OSError as e:
        return {"status": 0, "decision": None, "judged": None, "error": str(e)}
    finally:
        conn.close()


def run_clients(port: int, name: str) -> dict[str, Any]:
    """The scenario's bodies at once, and a neighbour every 20 ms until they are answered
    (at least 10 neighbours)."""
    bodies = SCENARIOS[name]()
    replies: list[dict[str, Any]] = [{} for _ in bodies]

    def one(i: int) -> None:
        replies[i] = _send(port, bodies[i])

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    neighbours: list[dict[str, Any]] = []
    while any(t.is_alive() for t in threads) or len(neighbours) < 10:
        neighbours.append(_send(port, NEIGHBOUR))
        time.sleep(0.02)
    for t in threads:
        t.join()
    return {"bytes": sum(len(b) for b in bodies), "replies": replies, "neighbours": neighbours}


# --- ICE in this process ----------------------------------------------------------------


async def start_ice(policy: Path, address: str) -> Any:
    from ext_proc.policy.load import load_policy
    from ext_proc.serve import server
    from ext_proc.serve.inforce import InForce
    from ext_proc.serve.looplag import LoopLag

    opts = server.ServeOptions(address=address, policy_path=str(policy))
    loaded = load_policy(str(policy))
    in_force = InForce(str(policy), opts.max_body_bytes, opts.heavy_containers, 1.0, loaded)
    snapshots = server._snapshots(loaded, in_force, None)
    pipeline = server.Pipeline(loaded, snapshots.lookup, max_body_bytes=opts.max_body_bytes)
    lag = LoopLag()  # as ``ice serve`` runs it: the backlog reads the loop's lag
    grpc_server, health, servicer = server._grpc_server(opts, address, pipeline, in_force, lag)
    running = server._Running(grpc_server, health, servicer, pipeline, snapshots, None, None)
    await running.start(opts)
    lag.start()
    return running


async def measure(port: int, names: list[str]) -> list[dict[str, Any]]:
    loop = asyncio.get_running_loop()
    # (when, wall lateness, the loop thread's CPU seconds over the sleep): a stall is how
    # late the probe woke; the loop was *busy* for the CPU its thread used meanwhile (on a
    # shared machine the wall figure also holds the time the OS ran other processes)
    lags: list[tuple[float, float, float]] = []

    async def probe() -> None:
        while True:
            t, cpu = loop.time(), time.thread_time()
            await asyncio.sleep(0.005)
            lags.append((t, loop.time() - t - 0.005, time.thread_time() - cpu))

    task = asyncio.create_task(probe())
    rows = []
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=1, mp_context=ctx) as pool:
        await loop.run_in_executor(pool, run_clients, port, "idle")  # warm: imports, helper
        for name in names:
            await asyncio.sleep(0.5)
            began = loop.time()
            got = await loop.run_in_executor(pool, run_clients, port, name)
            ended = loop.time()
            window = [(lag, cpu) for t, lag, cpu in lags if began <= t <= ended]
            stall = max((lag for lag, _ in window), default=0.0)
            busy = max((cpu for _, cpu in window), default=0.0)
            rows.append(
                {
                    "scenario": name,
                    "max_stall_ms": round(stall * 1000, 1),
                    "max_busy_ms": round(busy * 1000, 1),
                    **got,
                }
            )
    task.cancel()
    return rows


def report(row: dict[str, Any]) -> str:
    seen = sorted({(r.get("status"), r.get("decision"), r.get("judged")) for r in row["replies"]})
    judged = sum(1 for n in row["neighbours"] if n.get("decision"))
    return (
        f"{row['scenario']:16s} {row['bytes'] / 1e6:5.2f} MB  longest stall "
        f"{row['max_stall_ms']:6.1f} ms (busy {row['max_busy_ms']:5.1f} ms)  neighbours "
        f"judged {judged}/{len(row['neighbours'])}"
        f"  replies {seen}"
    )


async def main_async(args: argparse.Namespace, workdir: Path) -> list[dict[str, Any]]:
    from ext_proc.lab.stack import ENVOY_DIR, Stack, free_port, render_envoy_config

    with Stack(workdir) as stack:
        backend = stack.start_backend(free_port())
        policy = workdir / "policy.yaml"
        policy.write_text(POLICY.format(backend=backend))
        address = f"127.0.0.1:{free_port()}"
        running = await start_ice(policy, address)
        port, admin = free_port(), free_port()
        config = render_envoy_config(
            ENVOY_DIR / "envoy.yaml",
            admin_port=admin,
            listeners={"ingress": port},
            clusters={"ice": [address], "backend": [backend.removeprefix("http://")]},
        )
        stack.start_envoy(config, admin)
        try:
            return await measure(port, args.scenarios)
        finally:
            await running.stop(1.0, None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--scenarios",
        type=lambda s: s.split(","),
        default=[n for n in SCENARIOS if n != "idle"] + ["idle"],
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="ice-loop-") as tmp:
        rows = asyncio.run(main_async(args, Path(tmp)))
    for row in rows:
        print(report(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
