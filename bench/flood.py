"""ICE under a flood: N clients send one long body each at the same moment, through real Envoy.

    .venv/bin/python bench/flood.py [--clients 32,128,256,512] [--mix] [--body-bytes 2760000]
        [--modes h1,h2] [--ask n16] [--busy-loops 2] [--runs 5]
        [--ice-arg=--max-inflight-bytes=...] [--kill-ice] [--without-late-guard] [--json FILE]
    .venv/bin/python bench/flood.py --matrix --json matrix.json   # issue 44's whole matrix

``--modes``: ``h1`` (the default) gives each client its own HTTP/1.1 connection; ``h2``
sends every client's request as a stream of one shared HTTP/2 connection (``h2flood.py``).
``--ask n16`` puts ``n: 16, max_tokens: 1,000,000`` in the body (what a request the full
verdict would cut asks for). ``--busy-loops K`` runs K busy loops (``python -c 'while 1:
pass'``) beside the stack while each flood lasts, as other tenants of a shared node do.
``--runs R`` repeats each cell R times. ``--matrix`` runs every cell of body sizes
(``--sizes``, default 16 KB, 100 KB, 400 KB, 1 MB, 2.76 MB, 8 MB) × clients (default 64,
256, 512) × modes (h1, h2) × busy loops (``--busy``, default 0 and 2) × ``--runs`` (default
5), each on a fresh stack, with ``--after-s`` (default 2 s in a matrix) of quiet after each
flood, and prints one line per cell with its unjudged counts; ``--json`` writes every run.

The stack is ``envoy/bench.yaml`` (real Envoy with the production ext_proc filter, one
worker thread; ICE with one worker; Envoy's fast upstream answering a fixed chat.completion
and serving a low-pressure vLLM ``/metrics`` page with a large pool). The policy is the
built-in one with its pool on that page and ``max_model_len`` 1,048,576 (a long-context
model), so that a long body is a request ICE would pass when it fits.

Each run opens N connections first, then sends N copies of one long chat body (a system
prompt and 1,000 turns of ~2.7 kB: a long agent conversation, 2.76 MB by default) at once;
with ``--mix`` a further client sends a short chat request every 50 ms on its own keep-alive
connection while the flood lasts. Per run it reports:

- judged in full (``x-ice-decision`` and ``x-ice-judged: body``), judged from the headers
  (``x-ice-judged: headers``), unjudged (a response without ``x-ice-decision``: Envoy let it
  through fail-open), refused (ICE's 429s and other ICE answers), late (Envoy's 429
  ``ice_late``: ICE did not answer in time and the late guard refused the request instead
  of sending it on unjudged; ``ext_proc.tools.envoygen.late_guard``), Envoy's own refusals
  (overload manager: a 503 or a reset without ICE headers) and client errors;
- ICE's peak RSS (its process tree: worker and helpers) and its RSS 10 s after the last
  response, both against its idle RSS (after start-up and a warm-up of a few long and short
  requests), the same for Envoy, and ICE's CPU seconds over the run;
- the latency (p50 / p99 / max) of the short requests sent during the flood;
- ICE's own counters: bodies dropped because Envoy had given up (``ice_bodies_dropped_total``)
  and verdicts by how they were judged (``ice_judged_total``), and Envoy's ext_proc counters
  (message timeouts);
- the peaks of Envoy's gauges on its connections to ICE, sampled every 20 ms: bytes waiting
  for HTTP/2 flow control (``http2.pending_send_bytes``), streams and connections open.

``--kill-ice`` kills ICE (SIGKILL) while the flood is under way and checks that Envoy still
answers every request (fail-open: the backend's 200, unjudged).
The client is asyncio on raw sockets (``loop.sock_sendall`` sends the one shared body
without copying it per connection), so 512 clients cost the client little memory and CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import socket
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
if str(REPO) not in sys.path:  # run as a script: import ext_proc from the checkout
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import throughput as tb  # noqa: E402  (the /proc helpers and the policy writer)

from ext_proc.lab.stack import (  # noqa: E402
    ENVOY_DIR,
    Stack,
    free_port,
    policy_passthrough_paths,
    render_envoy_config,
)

PATH = "/v1/chat/completions"
LONG_CONTEXT = 1_048_576
SHORT_EVERY_S = 0.05
AFTER_S = 10.0
# Envoy counters reported per run (summed over the names that end so).
ENVOY_STATS = (
    "overload.envoy.overload_actions.stop_accepting_requests.scale_percent",
    "downstream_rq_overload_close",
    "cluster.ice.upstream_flow_control_paused_reading_total",
    "cluster.ice.upstream_cx_tx_bytes_total",
    "ext_proc.streams_started",
    "cluster.ice.upstream_cx_total",
    "cluster.ice.http2.tx_flush_timeout",
    "cluster.ice.health_check.failure",  # a failed check flags ICE (panic threshold: late guard)
    "rbac.ice_late.denied",
)
# Envoy gauges sampled every 20 ms while a flood lasts (EnvoySampler): their peaks per run.
SAMPLED_GAUGES = (
    "cluster.ice.http2.pending_send_bytes",
    "cluster.ice.http2.streams_active",
    "cluster.ice.upstream_cx_active",
    "cluster.ice.upstream_rq_active",
    "cluster.ice.upstream_rq_pending_active",
)


# --- bodies ----------------------------------------------------------------------------------


def long_body(size: int, seed: int = 1, ask: str = "plain") -> bytes:
    """A long agent conversation of about ``size`` bytes: a system prompt and turns of
    ~2.7 kB of words, alternating user and assistant, ending with a user turn (a body under
    ~5 kB: one user turn of its size). ``ask``: "plain" (``max_tokens`` 256) or "n16"
    (``n`` 16, ``max_tokens`` 1,000,000)."""
    rng = random.Random(seed)
    words = (
        "the a memory cache block token prefix request server queue model gateway envoy tool "
        "call result file line error retry plan step agent context window"
    )
    vocab = words.split()

    def text(n: int) -> str:
        out: list[str] = []
        total = 0
        while total < n:
            w = rng.choice(vocab)
            out.append(w)
            total += len(w) + 1
        return " ".join(out)

    limits = {"n": 16, "max_tokens": 1_000_000} if ask == "n16" else {"max_tokens": 256}
    if size < 5000:
        messages = [{"role": "user", "content": text(max(1, size - 120))}]
        return json.dumps({"model": "m", "messages": messages, **limits}).encode()
    messages: list[dict[str, str]] = [{"role": "system", "content": text(2000)}]
    turns = max(1, (size - 2100) // 2770)
    for i in range(turns | 1):  # odd: the last turn is the user's
        messages.append({"role": "user" if i % 2 == 0 else "assistant", "content": text(2740)})
    return json.dumps({"model": "m", "messages": messages, **limits}).encode()


def short_body() -> bytes:
    messages = [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Say hello in one short sentence."},
    ]
    return json.dumps({"model": "m", "messages": messages, "max_tokens": 32}).encode()


def request_bytes(port: int, body_len: int, keep_alive: bool = False) -> bytes:
    conn = "keep-alive" if keep_alive else "close"
    return (
        f"POST {PATH} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {body_len}\r\n"
        f"Connection: {conn}\r\n\r\n"
    ).encode()


# --- the client ------------------------------------------------------------------------------


@dataclass
class Reply:
    status: int  # 0: no HTTP response (reset, refused)
    headers: dict[str, str]
    seconds: float
    error: str = ""

    @property
    def kind(self) -> str:
        """judged_body, judged_headers, refused (ICE answered), late (Envoy's 429 ``ice_late``:
        ICE did not answer in time, ``envoygen.late_guard``), unjudged, envoy, error."""
        if self.status == 0:
            return "error"
        decision = self.headers.get("x-ice-decision", "")
        if not decision:
            return "unjudged" if self.status < 400 else "envoy"
        if self.headers.get("x-ice-reason") == "ice_late":
            return "late"
        if decision == "reject":
            return "refused"
        if self.headers.get("x-ice-judged") == "headers":
            return "judged_headers"
        return "judged_body"


async def _read_response(loop: asyncio.AbstractEventLoop, sock: socket.socket) -> Reply:
    buf = b""
    started = time.perf_counter()
    while b"\r\n\r\n" not in buf:
        chunk = await loop.sock_recv(sock, 65536)
        if not chunk:
            raise ConnectionError("closed before the response headers")
        buf += chunk
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    length = int(headers.get("content-length", "0") or 0)
    while len(rest) < length:
        chunk = await loop.sock_recv(sock, 65536)
        if not chunk:
            break
        rest += chunk
    return Reply(status, headers, time.perf_counter() - started)


async def _connect(loop: asyncio.AbstractEventLoop, port: int) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    await loop.sock_connect(sock, ("127.0.0.1", port))
    return sock


async def _one(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, head: bytes, body: memoryview
) -> Reply:
    started = time.perf_counter()
    cut = ""  # the upload was cut (Envoy answered at the headers and closed)
    try:
        try:
            await loop.sock_sendall(sock, head)
            await loop.sock_sendall(sock, body)
        except OSError as e:  # read the answer anyway, as httpx (httpcore) does
            cut = type(e).__name__
        reply = await _read_response(loop, sock)
        reply.seconds = time.perf_counter() - started
        reply.error = f"answered, upload cut ({cut})" if cut else ""
        return reply
    except OSError as e:
        return Reply(0, {}, time.perf_counter() - started, cut or type(e).__name__)
    finally:
        sock.close()


async def _shorts(port: int, stop: asyncio.Event, out: list[Reply]) -> None:
    """Short requests, one every SHORT_EVERY_S on one keep-alive connection, until ``stop``."""
    loop = asyncio.get_running_loop()
    body = short_body()
    head = request_bytes(port, len(body), keep_alive=True)
    sock: socket.socket | None = None
    while not stop.is_set():
        started = time.perf_counter()
        try:
            if sock is None:
                sock = await _connect(loop, port)
            await loop.sock_sendall(sock, head + body)
            reply = await _read_response(loop, sock)
            reply.seconds = time.perf_counter() - started
            out.append(reply)
            if reply.headers.get("connection", "") == "close":
                sock.close()
                sock = None
        except OSError as e:
            out.append(Reply(0, {}, time.perf_counter() - started, type(e).__name__))
            if sock is not None:
                sock.close()
            sock = None
        await asyncio.sleep(max(0.0, SHORT_EVERY_S - (time.perf_counter() - started)))
    if sock is not None:
        sock.close()


async def flood(
    port: int, clients: int, body: bytes, mix: bool, mode: str = "h1"
) -> tuple[list[Reply], list[Reply]]:
    """Send ``clients`` copies of ``body`` at once (``h1``: connections opened first, one
    each; ``h2``: streams of one HTTP/2 connection); with ``mix``, short requests alongside.
    Returns (long replies, short replies)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    shorts: list[Reply] = []
    side = asyncio.create_task(_shorts(port, stop, shorts)) if mix else None
    if mode == "h2":
        from h2flood import flood_h2

        head = [
            (":method", "POST"),
            (":scheme", "http"),
            (":authority", f"127.0.0.1:{port}"),
            (":path", PATH),
            ("content-type", "application/json"),
            ("content-length", str(len(body))),
        ]
        got = await flood_h2(port, clients, head, body)
        longs = [Reply(status, headers, seconds, error) for status, headers, seconds, error in got]
    else:
        socks = await asyncio.gather(*(_connect(loop, port) for _ in range(clients)))
        head_bytes = request_bytes(port, len(body))
        view = memoryview(body)
        longs = await asyncio.gather(*(_one(loop, s, head_bytes, view) for s in socks))
    stop.set()
    if side is not None:
        await side
    return list(longs), shorts


def send_one(port: int, body: bytes) -> Reply:
    async def go() -> Reply:
        loop = asyncio.get_running_loop()
        sock = await _connect(loop, port)
        return await _one(loop, sock, request_bytes(port, len(body)), memoryview(body))

    return asyncio.run(go())


# --- sampling --------------------------------------------------------------------------------


class RssSampler:
    """Samples the RSS (MiB) of ICE's process tree and of Envoy every 50 ms in a thread."""

    def __init__(self, ice_pid: int, envoy_pid: int) -> None:
        self.ice_pid, self.envoy_pid = ice_pid, envoy_pid
        self.ice_peak = self.envoy_peak = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def ice(self) -> float:
        return sum(tb.rss_kib(p) for p in tb.process_tree(self.ice_pid)) / 1024

    def envoy(self) -> float:
        return tb.rss_kib(self.envoy_pid) / 1024

    def _run(self) -> None:
        while not self._stop.is_set():
            self.ice_peak = max(self.ice_peak, self.ice())
            self.envoy_peak = max(self.envoy_peak, self.envoy())
            self._stop.wait(0.05)

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class LagSampler:
    """Samples ICE's event loop lag gauge (``ice_event_loop_lag_seconds``: the most it was
    late over the last second) every 100 ms in a thread; ``peak_s`` is the largest seen."""

    def __init__(self, metrics_url: str) -> None:
        self.url = metrics_url
        self.peak_s = 0.0
        # (seconds since the start, headers ICE has answered, bodies it has answered)
        self.series: list[tuple[float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            text = scrape(self.url)
            if text:
                self.peak_s = max(self.peak_s, metric_sum(text, "ice_event_loop_lag_seconds"))
                seen = "ice_processing_seconds_count"
                self.series.append(
                    (
                        time.perf_counter() - self.started,
                        metric_sum(text, seen, phase="request_headers"),
                        metric_sum(text, seen, phase="request_body"),
                    )
                )
            self._stop.wait(0.1)

    def __enter__(self) -> LagSampler:
        self.started = time.perf_counter()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class EnvoySampler:
    """Samples Envoy's gauges on its connections to ICE (``SAMPLED_GAUGES``: bytes waiting
    for HTTP/2 flow control, streams and connections open) every 20 ms in a thread, from its
    admin page (served by Envoy's main thread, not the workers that read the uploads);
    ``peaks`` holds the largest of each."""

    def __init__(self, admin: int) -> None:
        names = "|".join(g.replace(".", "\\.") for g in SAMPLED_GAUGES)
        self.url = f"http://127.0.0.1:{admin}/stats?usedonly&filter=^({names})$"
        self.peaks: dict[str, int] = dict.fromkeys(SAMPLED_GAUGES, 0)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            for line in scrape(self.url).splitlines():
                key, _, value = line.partition(": ")
                if key in self.peaks and value.strip().isdigit():
                    self.peaks[key] = max(self.peaks[key], int(value))
            self._stop.wait(0.02)

    def __enter__(self) -> EnvoySampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def scrape(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return str(r.read().decode())
    except OSError:
        return ""


def metric_sum(text: str, name: str, **labels: str) -> float:
    """The sum of a metric's samples whose labels include ``labels`` (prometheus_client)."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                total += s.value
    return total


def envoy_stat(admin: int, name: str) -> int:
    text = scrape(f"http://127.0.0.1:{admin}/stats?filter={name}")
    total = 0
    for line in text.splitlines():
        key, _, value = line.partition(": ")
        if key.endswith(name) and value.strip().isdigit():
            total += int(value)
    return total


# --- one run ---------------------------------------------------------------------------------


@dataclass
class RunResult:
    clients: int
    mix: bool
    counts: dict[str, int]
    ice_idle_mib: float
    ice_peak_mib: float
    ice_after_mib: float
    envoy_idle_mib: float
    envoy_peak_mib: float
    envoy_after_mib: float
    ice_cpu_s: float
    envoy_cpu_s: float
    seconds: float
    short: dict[str, float] = field(default_factory=dict)
    ice_dropped: float = 0.0
    ice_headers_seen: float = 0.0
    ice_bodies_seen: float = 0.0
    message_timeouts: int = 0
    envoy_stats: dict[str, int] = field(default_factory=dict)
    envoy_peaks: dict[str, int] = field(default_factory=dict)  # SAMPLED_GAUGES' peaks
    ice_killed: bool = False
    loop_lag_peak_s: float = 0.0
    # answered though Envoy cut the upload (a client that reads after a send error sees it)
    upload_cut_answered: int = 0
    answered_series: list[tuple[float, float, float]] = field(default_factory=list)
    body_bytes: int = 0
    mode: str = "h1"
    busy_loops: int = 0
    ask: str = "plain"
    coarse: dict[str, float] = field(default_factory=dict)

    @property
    def unjudged(self) -> int:
        return self.counts.get("unjudged", 0)


def _short_stats(replies: list[Reply]) -> dict[str, float]:
    ok = [r.seconds * 1e3 for r in replies if r.status]
    if not ok:
        return {"count": float(len(replies))}
    ok.sort()
    p99 = ok[min(len(ok) - 1, int(0.99 * len(ok)))]
    judged = sum(
        1 for r in replies if "x-ice-decision" in r.headers and "x-ice-judged" not in r.headers
    )
    return {
        "count": float(len(replies)),
        "p50_ms": statistics.median(ok),
        "p99_ms": p99,
        "max_ms": ok[-1],
        "judged_body": float(judged),
    }


@dataclass(frozen=True)
class Cell:
    """One cell of a run plan: how the flood is sent and what runs beside it."""

    clients: int
    mix: bool = False
    mode: str = "h1"
    busy_loops: int = 0
    after_s: float = AFTER_S


@contextlib.contextmanager
def busy_loops(count: int) -> Iterator[None]:
    """``count`` busy loops beside the stack (other tenants of a shared node)."""
    import subprocess

    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for p in procs:
            p.kill()
            p.wait()


def run_one(
    ports: dict[str, int],
    pids: dict[str, int],
    cell: Cell,
    body: bytes,
    idle: tuple[float, float],
    kill_ice: bool = False,
) -> RunResult:
    clients, mix = cell.clients, cell.mix
    metrics = f"http://127.0.0.1:{ports['metrics']}/metrics"
    before = scrape(metrics)
    timeouts0 = envoy_stat(ports["admin"], "ext_proc.message_timeouts")
    cpu0, ecpu0 = tb.tree_cpu(pids["ice"]), tb.tree_cpu(pids["envoy"])
    started = time.perf_counter()
    with (
        RssSampler(pids["ice"], pids["envoy"]) as rss,
        LagSampler(metrics) as lag,
        EnvoySampler(ports["admin"]) as gauges,
    ):
        if kill_ice:
            threading.Timer(0.3, lambda: os.killpg(pids["ice"], signal.SIGKILL)).start()
        with busy_loops(cell.busy_loops):
            longs, shorts = asyncio.run(flood(ports["ingress"], clients, body, mix, cell.mode))
        seconds = time.perf_counter() - started
        cpu1, ecpu1 = tb.tree_cpu(pids["ice"]), tb.tree_cpu(pids["envoy"])
        time.sleep(cell.after_s)
        ice_after, envoy_after = rss.ice(), rss.envoy()
    after = scrape(metrics)
    counts: dict[str, int] = {}
    for r in longs:
        counts[r.kind] = counts.get(r.kind, 0) + 1
    dropped = metric_sum(after, "ice_bodies_dropped_total") - metric_sum(
        before, "ice_bodies_dropped_total"
    )

    def delta(name: str, **labels: str) -> float:
        return metric_sum(after, name, **labels) - metric_sum(before, name, **labels)

    return RunResult(
        ice_headers_seen=delta("ice_processing_seconds_count", phase="request_headers"),
        ice_bodies_seen=delta("ice_processing_seconds_count", phase="request_body"),
        clients=clients,
        mix=mix,
        counts=counts,
        ice_idle_mib=idle[0],
        ice_peak_mib=rss.ice_peak,
        ice_after_mib=ice_after,
        envoy_idle_mib=idle[1],
        envoy_peak_mib=rss.envoy_peak,
        envoy_after_mib=envoy_after,
        ice_cpu_s=cpu1 - cpu0,
        envoy_cpu_s=ecpu1 - ecpu0,
        seconds=seconds,
        short=_short_stats(shorts),
        ice_dropped=dropped,
        message_timeouts=envoy_stat(ports["admin"], "ext_proc.message_timeouts") - timeouts0,
        envoy_stats={k: envoy_stat(ports["admin"], k) for k in ENVOY_STATS},
        envoy_peaks=gauges.peaks,
        ice_killed=kill_ice,
        loop_lag_peak_s=lag.peak_s,
        upload_cut_answered=sum(1 for r in longs if r.status and r.error),
        answered_series=lag.series,
        body_bytes=len(body),
        mode=cell.mode,
        busy_loops=cell.busy_loops,
        coarse={
            why: delta("ice_coarse_verdicts_total", why=why)
            for why in ("bytes", "lag", "time", "late", "budget", "shed")
        },
    )


def write_policy(workdir: Path, metrics_url: str) -> Path:
    path = tb.write_policy(workdir, metrics_url)
    policy = yaml.safe_load(path.read_text())
    for profile in policy["profiles"].values():
        profile["max_model_len"] = LONG_CONTEXT
    path.write_text(yaml.safe_dump(policy, sort_keys=False))
    return path


def set_message_timeout(config: dict[str, Any], ms: int) -> None:
    """Envoy's ext_proc message_timeout (ICE is told the same with --message-timeout-ms)."""
    for listener in config["static_resources"]["listeners"]:
        for chain in listener["filter_chains"]:
            for f in chain["filters"]:
                for h in f["typed_config"].get("http_filters", []):
                    if h["name"] == "envoy.filters.http.ext_proc":
                        h["typed_config"]["message_timeout"] = f"{ms / 1000:g}s"


def tune_envoy(config: dict[str, Any], args: argparse.Namespace) -> None:
    """Experiments on the shipped bench config: without the late guard (``--without-late-guard``:
    a request ICE answers too late goes on unjudged, as before issue 44), the ingress
    listener's read size per event
    (``--listener-buffer-bytes``), the buffer of Envoy's connections to ICE
    (``--ice-cluster-buffer-bytes``), and the downstream HTTP/2 settings (streams one client
    connection may have open at once, its windows)."""
    ingress = config["static_resources"]["listeners"][0]
    if args.without_late_guard:  # the configs before issue 44's late guard: fail-open when late
        for chain in ingress["filter_chains"]:
            for f in chain["filters"]:
                filters = f["typed_config"]["http_filters"]
                filters[:] = [h for h in filters if h["name"] != "envoy.filters.http.rbac"]
    if args.ice_cluster_buffer_bytes:
        for cluster in config["static_resources"]["clusters"]:
            if cluster["name"] == "ice":
                cluster["per_connection_buffer_limit_bytes"] = args.ice_cluster_buffer_bytes
    if args.listener_buffer_bytes:
        ingress["per_connection_buffer_limit_bytes"] = args.listener_buffer_bytes
    h2 = {
        "max_concurrent_streams": args.downstream_max_streams,
        "initial_stream_window_size": args.downstream_stream_window,
        "initial_connection_window_size": args.downstream_connection_window,
    }
    for chain in ingress["filter_chains"]:
        for f in chain["filters"]:
            options = f["typed_config"].setdefault("http2_protocol_options", {})
            options.update({k: v for k, v in h2.items() if v})


def warm_up(port: int, body: bytes) -> None:
    for _ in range(3):
        send_one(port, body)
        send_one(port, short_body())


def print_result(r: RunResult) -> None:
    c = r.counts
    name = f"{r.clients}{' + short' if r.mix else ''}{' (ICE killed)' if r.ice_killed else ''}"
    busy = f" busy {r.busy_loops}" if r.busy_loops else ""
    name = f"{r.body_bytes / 1e6:.2f} MB × {name} {r.mode}{busy}"
    print(
        f"{name:>22}  body {c.get('judged_body', 0):4d}  headers {c.get('judged_headers', 0):4d}"
        f"  refused {c.get('refused', 0):4d}  late {c.get('late', 0):4d}"
        f"  unjudged {c.get('unjudged', 0):4d}"
        f"  envoy {c.get('envoy', 0):3d}  errors {c.get('error', 0):3d}  in {r.seconds:5.1f} s"
        f"  (answered mid-upload {r.upload_cut_answered})"
    )
    print(
        f"{'':>22}  ICE RSS idle {r.ice_idle_mib:.0f} peak {r.ice_peak_mib:.0f} "
        f"({r.ice_peak_mib / r.ice_idle_mib:.2f}×) +10 s {r.ice_after_mib:.0f} "
        f"({r.ice_after_mib / r.ice_idle_mib:.2f}×) MiB   Envoy idle {r.envoy_idle_mib:.0f} "
        f"peak {r.envoy_peak_mib:.0f} +10 s {r.envoy_after_mib:.0f} MiB   ICE CPU "
        f"{r.ice_cpu_s:.1f} s   Envoy CPU {r.envoy_cpu_s:.1f} s   dropped {r.ice_dropped:.0f}"
        "   Envoy message timeouts "
        f"{r.message_timeouts}   ICE saw {r.ice_headers_seen:.0f} headers, "
        f"{r.ice_bodies_seen:.0f} bodies   ICE loop lag peak {r.loop_lag_peak_s * 1000:.0f} ms"
    )
    print(f"{'':>22}  Envoy {r.envoy_stats}")
    print(f"{'':>22}  Envoy peaks {r.envoy_peaks}")
    if r.short.get("p50_ms") is not None:
        s = r.short
        print(
            f"{'':>22}  short requests {s['count']:.0f}: p50 {s['p50_ms']:.0f} ms, p99 "
            f"{s['p99_ms']:.0f} ms, max {s['max_ms']:.0f} ms, judged in full "
            f"{s['judged_body']:.0f}"
        )


MATRIX_SIZES = [16_000, 100_000, 400_000, 1_000_000, 2_760_000, 8_000_000]
MATRIX_CLIENTS = [64, 256, 512]


def plan(args: argparse.Namespace) -> list[tuple[int, Cell]]:
    """(body bytes, cell) for every run, in order: each cell ``--runs`` times in a row."""
    sizes = args.sizes if args.matrix else [args.body_bytes]
    clients = args.clients if not args.matrix or args.clients_set else MATRIX_CLIENTS
    busy = args.busy if args.matrix else [args.busy_loops]
    after_s = args.after_s if args.after_s is not None else (2.0 if args.matrix else AFTER_S)
    mixes = [False, True] if args.mix else [False]
    if args.kill_ice:
        return [(sizes[0], Cell(clients[-1], args.mix, args.modes[0], busy[0], after_s))]
    return [
        (size, Cell(n, mix, mode, loops, after_s))
        for size in sizes
        for loops in busy
        for mode in args.modes
        for mix in mixes
        for n in clients
        for _ in range(args.runs)
    ]


def run(args: argparse.Namespace) -> list[RunResult]:
    runs = plan(args)
    print(f"{len(runs)} runs; ICE args {args.ice_arg}; ask {args.ask}")
    results: list[RunResult] = []
    bodies: dict[int, bytes] = {}
    for size, cell in runs:  # a fresh stack per run: one run's memory is not the next's
        body = bodies.setdefault(size, long_body(size, ask=args.ask))
        result = run_fresh(args, cell, body)
        result.ask = args.ask
        print_result(result)
        results.append(result)
        if args.json:  # after every run: a long matrix keeps what it measured
            Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=1))
        if args.kill_ice:
            bad = result.counts.get("error", 0) + result.counts.get("envoy", 0)
            print(f"ICE killed: {bad} requests without the backend's answer")
    print_cells(results)
    return results


def run_fresh(args: argparse.Namespace, cell: Cell, body: bytes) -> RunResult:
    """One flood on a fresh stack (Envoy, ICE, Envoy's fast upstream)."""
    with tempfile.TemporaryDirectory(prefix="ice-flood-") as tmp, Stack(Path(tmp)) as stack:
        ports = {k: free_port() for k in ("ingress", "upstream", "admin", "ice", "metrics")}
        policy = write_policy(Path(tmp), f"http://127.0.0.1:{ports['upstream']}/metrics")
        timeout_ms = args.message_timeout_ms
        stack.start_ice(
            f"127.0.0.1:{ports['ice']}",
            policy=policy,
            metrics_address=f"127.0.0.1:{ports['metrics']}",
            extra=[*args.ice_arg, f"--message-timeout-ms={timeout_ms}"],
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
        set_message_timeout(config, timeout_ms)
        tune_envoy(config, args)
        stack.start_envoy(config, ports["admin"], concurrency=args.envoy_concurrency)
        pids = {"ice": stack.procs["ice"].pid, "envoy": stack.procs["envoy"].pid}
        time.sleep(2)  # the first scrape
        warm_up(ports["ingress"], body)
        time.sleep(3)
        sampler = RssSampler(pids["ice"], pids["envoy"])
        idle = (sampler.ice(), sampler.envoy())
        result = run_one(ports, pids, cell, body, idle, args.kill_ice)
        if args.envoy_stats:
            text = scrape(f"http://127.0.0.1:{ports['admin']}/stats?filter={args.envoy_stats}")
            print("\n".join(x for x in text.splitlines() if not x.endswith(": 0")))
        return result


def print_cells(results: list[RunResult]) -> None:
    """One line per cell: its unjudged counts, run by run, and what ICE answered instead."""
    cells: dict[tuple[int, int, str, int, bool], list[RunResult]] = {}
    for r in results:
        cells.setdefault((r.body_bytes, r.clients, r.mode, r.busy_loops, r.mix), []).append(r)
    print(
        "\nbody MB | clients | mode | busy loops | unjudged per run | late (429) per run "
        "| refused | from headers | in full | Envoy/errors"
    )
    for (size, n, mode, loops, mix), rs in cells.items():

        def total(kind: str, rs: list[RunResult] = rs) -> int:
            return sum(r.counts.get(kind, 0) for r in rs)

        unjudged = ", ".join(str(r.unjudged) for r in rs)
        late = ", ".join(str(r.counts.get("late", 0)) for r in rs)
        print(
            f"{size / 1e6:.3f} | {n}{' + short' if mix else ''} | {mode} | {loops} | {unjudged} "
            f"| {late} "
            f"| {total('refused')} | {total('judged_headers')} | {total('judged_body')} "
            f"| {total('envoy') + total('error')}"
        )


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ints = lambda s: [int(float(x)) for x in s.split(",") if x]  # noqa: E731
    ap.add_argument("--clients", type=ints, default=None)
    ap.add_argument("--modes", type=lambda s: s.split(","), default=["h1"], help="h1,h2")
    ap.add_argument("--ask", choices=["plain", "n16"], default="plain")
    ap.add_argument("--busy-loops", type=int, default=0, help="busy loops beside the stack")
    ap.add_argument("--runs", type=int, default=None, help="runs of each cell (matrix: 5)")
    ap.add_argument("--matrix", action="store_true", help="issue 44's matrix (module docstring)")
    ap.add_argument("--sizes", type=ints, default=MATRIX_SIZES, help="--matrix's body sizes")
    ap.add_argument("--busy", type=ints, default=[0, 2], help="--matrix's busy loops")
    ap.add_argument("--after-s", type=float, default=None, help="quiet after each flood")
    ap.add_argument("--listener-buffer-bytes", type=int, help="experiment: Envoy's read size")
    ap.add_argument("--ice-cluster-buffer-bytes", type=int, help="experiment: ICE's connection")
    ap.add_argument("--downstream-max-streams", type=int, help="experiment: h2 streams a client")
    ap.add_argument("--downstream-stream-window", type=int, help="experiment: h2 stream window")
    ap.add_argument("--downstream-connection-window", type=int, help="experiment: its connection's")
    ap.add_argument(
        "--without-late-guard", action="store_true", help="experiment: fail-open when ICE is late"
    )
    ap.add_argument("--mix", action="store_true", help="also runs with short requests alongside")
    ap.add_argument("--body-bytes", type=int, default=2_760_000)
    ap.add_argument("--ice-arg", action="append", default=[], help="an extra `ice serve` flag")
    ap.add_argument("--kill-ice", action="store_true", help="SIGKILL ICE during the flood")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument(
        "--message-timeout-ms", type=int, default=1000, help="Envoy's ext_proc message_timeout"
    )
    ap.add_argument(
        "--envoy-concurrency",
        type=int,
        default=2,
        help="Envoy worker threads (docs/flood.md: 1 vs 2)",
    )
    ap.add_argument("--envoy-stats", help="print Envoy's non-zero stats matching this regex")
    args = ap.parse_args(argv)
    args.clients_set = args.clients is not None
    if args.clients is None:
        args.clients = [32, 128, 256, 512]
    if args.runs is None:
        args.runs = 5 if args.matrix else 1
    return args


def main(argv: list[str] | None = None) -> int:
    run(_parse_args(argv))
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
