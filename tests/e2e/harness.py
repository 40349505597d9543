"""The e2e harness: the dev backend, ICE and real Envoy on free loopback ports, and clients.

``running_stack`` starts the three processes (``ext_proc.lab.stack.Stack``) with a test policy
whose pool scrapes the test backend every 0.1 s, and yields an ``E2E`` that sends requests
through Envoy, steers the backend's reported memory state and reads what the backend got.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import http.client
import importlib.util
import json
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from ext_proc.lab.devbackend import DevState
from ext_proc.lab.stack import ENVOY_DIR, Stack, free_port, render_envoy_config
from ext_proc.serve.server import worker_addresses

ENVOY_TEMPLATE = ENVOY_DIR / "envoy.yaml"
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
MESSAGES = "/v1/messages"

# What the shipped Envoy configs forward (docs/endpoints.md): each judged path, exactly, through
# ICE with x-ice-route set to its route name; the read-only paths, GET and HEAD only, ICE off;
# anything else is Envoy's 404 from the route named CLOSED.
JUDGED_ROUTES = {
    "/v1/chat/completions": "chat",
    "/v1/completions": "completions",
    "/v1/messages": "messages",
    "/v1/responses": "responses",
    "/v1/embeddings": "embeddings",
    "/v1/chat/completions/batch": "chat_batch",
    "/invocations": "invocations",
    "/inference/v1/generate": "generate_tokens",
    "/generate": "generate",
}
READ_ONLY_ROUTES = {
    "/v1/models": "readonly_models",
    "/health": "readonly_health",
    "/version": "readonly_version",
    "/ping": "readonly_ping",
}
CLOSED = "closed"

# The test policy (see POLICY below).
MAX_MODEL_LEN = 8192
OUTPUT_BUFFER = 512
CAP_HIGH = 1024
CAP_CRITICAL = 256
RETRY_AFTER_S = 2
MAX_AGE_S = 1.0

VERDICT_HEADERS = (
    "x-mem-pressure",
    "x-mem-pressure-score",
    "x-ice-decision",
    "x-ice-reason",
    "x-downgraded",
    "x-ice-original-max-tokens",
)
ICE_PREFIXES = ("x-mem-pressure", "x-ice-", "x-downgraded")

# Backend states and what ICE must make of them with the policy's weights (kv 0.40, queue
# 0.25, queue saturation 8): score = 100 × (0.40 × usage + 0.25 × min(1, waiting / 8)) / 0.65.
IDLE = dataclasses.asdict(DevState())  # every field at its default: nothing running, usage 0
LOW = {"kv_cache_usage_perc": 0.2, "num_requests_running": 2, "num_requests_waiting": 0}
# A big pool (200,000 blocks of 16 tokens): at 97% usage it still has 6,000 blocks free, so
# the pressure rules bind, not the free-block fit (tested on its own with KV_TIGHT).
HIGH = {
    "kv_cache_usage_perc": 0.97,
    "num_requests_running": 24,
    "num_requests_waiting": 3,
    "num_gpu_blocks": 200_000,
}
# Low pressure but little room: 101 blocks of 16 tokens, 10% used → floor(100 × 0.9) = 90
# blocks = 1,440 tokens free. Score 100 × 0.40 × 0.1 / 0.65 = 6 (low).
KV_TIGHT = {
    "kv_cache_usage_perc": 0.1,
    "num_requests_running": 1,
    "num_requests_waiting": 0,
    "num_gpu_blocks": 101,
}
CRITICAL = {"kv_cache_usage_perc": 1.0, "num_requests_running": 32, "num_requests_waiting": 12}
# A backend whose valve is about to refuse: 100 × (0.40 × 0.7 + 0.25 × 4/8) / 0.65 = 62.31,
# medium (the valve's first refusal then saturates the queue term: 81.54, high)
VALVE_STRAINED = {"kv_cache_usage_perc": 0.7, "num_requests_running": 8, "num_requests_waiting": 4}
LOW_SCORE = "12"  # 100 × 0.08 / 0.65 = 12.3
HIGH_SCORE = "74"  # 100 × (0.388 + 0.09375) / 0.65 = 74.1
CRITICAL_SCORE = "100"

POLICY = """\
default_profile: default
default_pool: default
priority_header: x-priority
profiles:
  default:
    max_model_len: {max_model_len}
    output_buffer_tokens: {output_buffer}
    min_output_tokens: 16
    default_priority: standard
    client_priority: {client_priority}
    pressure:
      weight_kv_cache: 0.40
      weight_queue: 0.25
      queue_saturation_requests: 8
      thresholds: {{medium: 40, high: 65, critical: 85}}
    max_tokens_cap: {{high: {cap_high}, critical: {cap_critical}}}
    shed: {{sheddable: high, standard: critical}}
    retry_after_s: {retry_after}
    # Pinned: the drain-rate Retry-After is checked by unit tests, not through the dev backend.
    retry_after_min_s: {retry_after}
    retry_after_max_s: {retry_after}
    fail_mode: open
pools:
  default:
    metrics_urls: ["http://127.0.0.1:{backend_port}/metrics"]
    scrape_interval_s: 0.1
    scrape_timeout_s: 0.5
    max_age_s: {max_age}
routes:
  chat: {{profile: default, pool: default}}
  completions: {{profile: default, pool: default, priority: sheddable}}
  messages: {{profile: default, pool: default}}
  responses: {{profile: default, pool: default}}
  embeddings: {{profile: default, pool: default}}
  chat_batch: {{profile: default, pool: default}}
  invocations: {{profile: default, pool: default}}
  generate_tokens: {{profile: default, pool: default}}
  generate: {{profile: default, pool: default, schema: sglang_generate}}
"""

# A request every state lets through with its verdict headers (critical is never shed; the
# harness's policy trusts the priority header, as a route whose mesh sets it would).
PROBE = {"model": "dev-model", "messages": [{"role": "user", "content": "probe"}], "max_tokens": 1}
PROBE_HEADERS = {"x-priority": "critical"}


def write_policy(
    path: Path,
    backend_port: int,
    profile_extra: str = "",
    passthrough_paths: Iterable[str] = (),
    policy_extra: str = "",
    client_priority: str = "trust",
    pool_extra: str = "",
) -> Path:
    """The e2e policy; ``profile_extra`` (YAML, 4-space indented) joins the default profile,
    ``pool_extra`` (the same) the default pool, ``policy_extra`` (top-level YAML) the policy;
    ``passthrough_paths`` become the policy's ``passthrough_paths``. ``client_priority``: the
    profile's; ``trust`` (the tests send ``x-priority: critical`` for requests that must not
    be shed: the tests play the mesh that sets it), ``cap`` (ICE's default) where a test
    plays an untrusted client (tests/e2e/test_client_priority.py)."""
    text = POLICY.format(
        client_priority=client_priority,
        max_model_len=MAX_MODEL_LEN,
        output_buffer=OUTPUT_BUFFER,
        cap_high=CAP_HIGH,
        cap_critical=CAP_CRITICAL,
        retry_after=RETRY_AFTER_S,
        backend_port=backend_port,
        max_age=MAX_AGE_S,
    )
    if profile_extra:
        text = text.replace("    fail_mode: open\n", "    fail_mode: open\n" + profile_extra, 1)
    if pool_extra:
        at = f"    max_age_s: {MAX_AGE_S}\n"
        text = text.replace(at, at + pool_extra, 1)
    paths = list(passthrough_paths)
    if paths:
        text += f"passthrough_paths: {json.dumps(paths)}\n"
    text += policy_extra
    path.write_text(text)
    return path


@dataclass(frozen=True)
class Reply:
    """An HTTP response: status, headers (lower-case names, in order) and the raw body."""

    status: int
    header_list: list[tuple[str, str]]
    body: bytes

    def header(self, name: str) -> str | None:
        values = self.headers_named(name)
        return values[-1] if values else None

    def headers_named(self, name: str) -> list[str]:
        return [v for k, v in self.header_list if k == name]

    def ice_headers(self) -> dict[str, str]:
        return {k: v for k, v in self.header_list if k.startswith(ICE_PREFIXES)}

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class Recorded:
    """A request the dev backend received: its headers (lower-case names) and raw body."""

    method: str
    path: str
    header_list: list[tuple[str, str]]
    body: bytes
    time: float

    def header(self, name: str) -> str | None:
        values = self.headers_named(name)
        return values[-1] if values else None

    def headers_named(self, name: str) -> list[str]:
        return [v for k, v in self.header_list if k == name]

    def ice_headers(self) -> dict[str, str]:
        return {k: v for k, v in self.header_list if k.startswith(ICE_PREFIXES)}

    def json(self) -> Any:
        return json.loads(self.body)


def request(
    port: int,
    method: str,
    path: str,
    body: bytes | Iterable[bytes] | None = None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> Reply:
    """One HTTP/1.1 request to 127.0.0.1:``port`` on a fresh connection."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout_s)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        pairs = [(k.lower(), v) for k, v in resp.getheaders()]
        return Reply(resp.status, pairs, data)
    finally:
        conn.close()


def upload(
    port: int,
    path: str,
    parts: Iterable[bytes],
    *,
    length: int | None,
    headers: dict[str, str] | None = None,
    timeout_s: float = 30.0,
) -> Reply:
    """POST ``parts`` (with ``content-length: length``, else chunked), reading the reply early.

    The body is sent from a thread while this one reads, as a careful client does: a 413
    comes back before the upload ends, and a client that only reads after sending the
    whole body gets its connection reset once the proxy stops reading (send errors are
    ignored here; the reply is what counts).
    """
    extra = dict(headers or {})
    host = next((extra.pop(k) for k in list(extra) if k.lower() == "host"), "e2e")
    lines = [f"POST {path} HTTP/1.1", f"host: {host}", "content-type: application/json"]
    lines += [f"{k}: {v}" for k, v in extra.items()]
    lines.append(
        f"content-length: {length}" if length is not None else "transfer-encoding: chunked"
    )
    head = ("\r\n".join(lines) + "\r\n\r\n").encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout_s)

    def send() -> None:
        with contextlib.suppress(OSError):
            sock.sendall(head)
            for part in parts:
                framed = f"{len(part):x}\r\n".encode() + part + b"\r\n" if length is None else part
                sock.sendall(framed)
            if length is None:
                sock.sendall(b"0\r\n\r\n")

    sender = threading.Thread(target=send, name="e2e-upload", daemon=True)
    sender.start()
    try:
        resp = http.client.HTTPResponse(sock)
        try:
            resp.begin()
            data = resp.read()
            pairs = [(k.lower(), v) for k, v in resp.getheaders()]
        finally:
            resp.close()
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_RDWR)
        sock.close()
        sender.join(timeout_s)
    return Reply(resp.status, pairs, data)


def free_ports(count: int) -> int:
    """The first of ``count`` consecutive free loopback ports."""
    for _ in range(100):
        first = free_port()
        with contextlib.ExitStack() as held:
            try:
                for port in range(first, first + count):
                    s = held.enter_context(socket.socket())
                    s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return first
    raise RuntimeError(f"no {count} consecutive free ports")


def metric_samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [
        (s.name, dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(text)
        for s in family.samples
    ]


@dataclass
class E2E:
    """A running stack and the ways a test talks to it."""

    stack: Stack
    workdir: Path
    envoy_port: int
    admin_port: int
    backend_port: int
    ice_addresses: list[str]
    ice_metrics_port: int
    host: str | None = None  # the Host sent when a test names none (a mesh's named vhost)
    _dirty: bool = field(default=False, repr=False)

    def _with_host(self, headers: dict[str, str] | None) -> dict[str, str]:
        sent = dict(headers or {})
        if self.host is not None and not any(k.lower() == "host" for k in sent):
            sent["host"] = self.host
        return sent

    # --- through Envoy -----------------------------------------------------------------------
    def post(
        self,
        path: str,
        body: bytes | dict[str, Any] | None,
        headers: dict[str, str] | None = None,
        content_type: str | None = "application/json",
    ) -> Reply:
        raw = json.dumps(body).encode() if isinstance(body, dict) else body
        sent = {"content-type": content_type} if content_type else {}
        sent.update(headers or {})
        return request(self.envoy_port, "POST", path, raw, self._with_host(sent))

    def get(self, path: str, headers: dict[str, str] | None = None) -> Reply:
        return request(self.envoy_port, "GET", path, None, self._with_host(headers))

    def call(
        self,
        method: str,
        path: str,
        body: bytes | None = None,
        headers: dict[str, str] | None = None,
    ) -> Reply:
        """Any method through Envoy (``post`` and ``get`` are the usual two)."""
        return request(self.envoy_port, method, path, body, self._with_host(headers))

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.envoy_port}"

    # --- the dev backend ---------------------------------------------------------------------
    def backend(self, method: str, path: str, body: bytes | None = None) -> Reply:
        reply = request(self.backend_port, method, path, body)
        assert reply.status == 200, (method, path, reply)
        return reply

    def set_state(self, state: dict[str, Any], *, level: str, score: str | None = None) -> None:
        """Set the backend's reported memory state and wait until ICE judges with it."""
        self._dirty = True
        self.backend("PUT", "/_dev/state", json.dumps(state).encode())
        self.wait_pressure(level, score)

    def shut_valve(self, reason: str = "max_num_queued_reqs") -> None:
        """Shut the backend's imitation of vLLM's admission valve: every request it gates gets
        vLLM's 503 (``reset`` opens it again). A valve refuses when its queue is at its cap,
        so first the backend reports such a queue (``VALVE_STRAINED``: pressure medium, when
        ICE asks for the response headers of the requests it sends on)."""
        self.set_state(VALVE_STRAINED, level="medium")
        self._dirty = True
        self.backend("PUT", "/_dev/state", json.dumps({"valve": reason}).encode())

    def set_raw_metrics(self, text: bytes) -> None:
        """Serve ``text`` verbatim as the backend's /metrics page."""
        self._dirty = True
        self.backend("PUT", "/_dev/metrics", text)

    def restore_metrics(self) -> None:
        self.backend("DELETE", "/_dev/metrics")

    def wait_pressure(self, level: str, score: str | None = None, timeout_s: float = 15.0) -> None:
        """Probe through Envoy until ICE reports ``level`` (and ``score``); forget the probes."""
        deadline = time.monotonic() + timeout_s
        while True:
            reply = self.post(CHAT, PROBE, PROBE_HEADERS)
            seen = (reply.header("x-mem-pressure"), reply.header("x-mem-pressure-score"))
            if seen[0] == level and (score is None or seen[1] == score):
                break
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"ICE did not reach pressure {level}/{score} in {timeout_s} s: last "
                    f"{reply.status} {seen}\n{self.log_tails()}"
                )
            time.sleep(0.05)
        # ICE counts the probes it passed against the free blocks until a view newer than
        # them (pipeline._room): let two scrapes (0.1 s apart) go by before the test's request.
        time.sleep(0.25)
        self.clear_received()

    def received(self) -> list[Recorded]:
        records = self.backend("GET", "/_dev/requests").json()
        return [
            Recorded(
                method=r["method"],
                path=r["path"],
                header_list=[(k.lower(), v) for k, v in r["headers"]],
                body=base64.b64decode(r["body_b64"]),
                time=r["time"],
            )
            for r in records
        ]

    def only_received(self) -> Recorded:
        """The one request the backend received since the last reset."""
        got = self.received()
        assert len(got) == 1, f"backend received {len(got)} requests, expected 1"
        return got[0]

    def clear_received(self) -> None:
        self.backend("DELETE", "/_dev/requests")

    def reset(self) -> None:
        """Back to the idle state (pressure low, score 0) with no recorded requests."""
        if self._dirty:
            self.restore_metrics()
            self.backend("PUT", "/_dev/state", json.dumps(IDLE).encode())
            self.wait_pressure("low", "0")
            self._dirty = False
        self.clear_received()

    # --- ICE's and Envoy's own views ---------------------------------------------------------
    def ice_metric(self, name: str, **labels: str) -> float:
        """Sum of ICE's samples called ``name`` whose labels include ``labels`` (0 if none)."""
        reply = request(self.ice_metrics_port, "GET", "/metrics")
        assert reply.status == 200
        return sum(
            value
            for sample, got, value in metric_samples(reply.body.decode())
            if sample == name and all(got.get(k) == v for k, v in labels.items())
        )

    def envoy_host_stats(self, cluster: str) -> dict[str, dict[str, str]]:
        """Envoy's per-host stats of ``cluster`` (admin /clusters): host → stat → value."""
        reply = request(self.admin_port, "GET", "/clusters")
        hosts: dict[str, dict[str, str]] = {}
        for line in reply.body.decode().splitlines():
            parts = line.split("::")
            if len(parts) == 4 and parts[0] == cluster:
                hosts.setdefault(parts[1], {})[parts[2]] = parts[3]
        return hosts

    def wait_ice_healthy(self, timeout_s: float = 10.0) -> None:
        """Until Envoy's health checks see every ICE host healthy: with no panic mode (the
        generated clusters) Envoy sends ICE no stream before, and requests fail open."""
        deadline = time.monotonic() + timeout_s
        while True:
            stats = self.envoy_host_stats("ice")
            hosts = {a: h["health_flags"] for a, h in stats.items() if "health_flags" in h}
            if hosts and all(flags == "healthy" for flags in hosts.values()):
                return
            assert time.monotonic() < deadline, f"ICE not healthy in Envoy: {hosts}"
            time.sleep(0.1)

    def log_tails(self, lines: int = 15) -> str:
        return self.stack.log_tails(lines)


@contextlib.contextmanager
def running_stack(
    workdir: Path,
    *,
    start_ice: bool = True,
    workers: int = 1,
    ice_extra: list[str] | None = None,
    profile_extra: str = "",
    passthrough_paths: Iterable[str] = (),
    policy_extra: str = "",
    envoy_template: Path = ENVOY_TEMPLATE,
    listener: str = "ingress",
    ice_cluster: str = "ice",
    backend_cluster: str | tuple[str, ...] = "backend",
    client_priority: str = "trust",
    envoy_port: int | None = None,
    backend_port: int | None = None,
    host: str | None = None,
    ice_link: Callable[[str], str] | None = None,
    pool_extra: str = "",
) -> Iterator[E2E]:
    """Backend, ICE (unless ``start_ice`` is false: its address stays dead) and Envoy;
    ``passthrough_paths`` go into the policy and, opened, into Envoy's config.
    ``envoy_template`` (a bootstrap shaped like a mesh's proxy, tests/e2e/meshes.py) with the
    names of its listener and of its ICE and backend clusters (several: Envoy Gateway makes
    one per route rule): Envoy runs that instead. ``client_priority``: ``write_policy``'s.
    ``envoy_port`` / ``backend_port``: ports the caller chose (``free_port``) because its
    template needs them (a mesh's inbound listener keyed by its own port). ``host``: the Host
    the E2E's requests send unless a test names one (a template whose virtual host is named).
    ``ice_link``: the address Envoy dials for each of ICE's (a relay between them,
    tests/e2e/slowlink.py)."""
    paths = list(passthrough_paths)
    with Stack(workdir) as stack:
        backend_port = backend_port or free_port()
        stack.start_backend(backend_port)
        policy = write_policy(
            workdir / "policy.yaml",
            backend_port,
            profile_extra,
            paths,
            policy_extra,
            client_priority=client_priority,
            pool_extra=pool_extra,
        )
        address = f"127.0.0.1:{free_ports(workers)}"
        addresses = worker_addresses(address, workers)
        metrics_port = free_port()
        if start_ice:
            stack.start_ice(
                address,
                policy=policy,
                workers=workers,
                metrics_address=f"127.0.0.1:{metrics_port}",
                extra=ice_extra,
            )
        envoy_port, admin_port = envoy_port or free_port(), free_port()
        config = render_envoy_config(
            envoy_template,
            admin_port=admin_port,
            listeners={listener: envoy_port},
            clusters={
                ice_cluster: [ice_link(a) for a in addresses] if ice_link else addresses,
                **{
                    name: [f"127.0.0.1:{backend_port}"]
                    for name in (
                        (backend_cluster,) if isinstance(backend_cluster, str) else backend_cluster
                    )
                },
            },
            passthrough_paths=paths,
        )
        stack.start_envoy(config, admin_port)
        e2e = E2E(
            stack=stack,
            workdir=workdir,
            envoy_port=envoy_port,
            admin_port=admin_port,
            backend_port=backend_port,
            ice_addresses=addresses,
            ice_metrics_port=metrics_port,
            host=host,
        )
        if start_ice:
            e2e.wait_pressure("low", "0")
        yield e2e


@dataclass
class Sent:
    """One request of a ``Load``: when it started and ended (wall clock), and its outcome."""

    started: float
    ended: float
    reply: Reply | None
    error: str | None


class Load:
    """Sends one request after another in a thread (a fresh connection each) until stopped."""

    def __init__(self, e2e: E2E, path: str, body: dict[str, Any], headers: dict[str, str]):
        self._e2e, self._path, self._body, self._headers = e2e, path, body, headers
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="e2e-load", daemon=True)
        self.sent: list[Sent] = []

    def _run(self) -> None:
        while not self._stop.is_set():
            started = time.time()
            try:
                reply: Reply | None = self._e2e.post(self._path, self._body, self._headers)
                error = None
            except Exception as e:  # recorded and asserted on by the test
                reply, error = None, f"{type(e).__name__}: {e}"
            self.sent.append(Sent(started, time.time(), reply, error))
            time.sleep(0.01)

    def __enter__(self) -> Load:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def wait_for(self, count: int, timeout_s: float = 15.0) -> None:
        """Wait until ``count`` more requests have completed."""
        target = len(self.sent) + count
        deadline = time.monotonic() + timeout_s
        while len(self.sent) < target:
            assert time.monotonic() < deadline, f"load stalled at {len(self.sent)} requests"
            time.sleep(0.02)


def load_bench(name: str) -> ModuleType:
    """``bench/<name>.py`` as a module (the benchmarks are scripts, not a package)."""
    path = Path(__file__).resolve().parents[2] / "bench" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


# --- what several e2e modules check: the verdict headers, byte-exact bodies -----------------

MSGS = [{"role": "user", "content": "Explain KV caches in two sentences."}]


# Odd spacing, tabs, unicode (escaped and raw), unknown fields, number spellings and an
# unusual key order: everything ICE does not change must reach the backend byte for byte.
# "@LIMIT@" stands for the output-token limit member.
CHAT_RAW = (
    '{\n  "temperature" : 0.50,\t"model":"dev-model",  "messages" : [ {"role":"user",'
    ' "content":"h\\u00e9llo w\\u00f6rld — 你好 🚀 \\"quoted\\""} ],\n'
    ' "x_unknown": {"nested": [1, 2.50e0, null, true]},  "stop": ["\\n"],'
    ' @LIMIT@ , "seed" :7\n}\n'
)


def raw_body(template: str, limit: str) -> bytes:
    return template.replace("@LIMIT@", limit).encode()


def chat_raw(limit: str) -> bytes:
    return raw_body(CHAT_RAW, f'"max_tokens":   {limit}')


def assert_verdict(
    headers: Reply | Recorded,
    *,
    decision: str,
    level: str,
    score: str,
    reason: str | None = None,
    original: str | None = None,
) -> None:
    """The verdict headers, each exactly once with ICE's value, and no others."""
    expected = {"x-mem-pressure": level, "x-mem-pressure-score": score, "x-ice-decision": decision}
    if reason is not None:
        expected["x-ice-reason"] = reason
    if decision == "downgrade":
        expected["x-downgraded"] = "true"
    if original is not None:
        expected["x-ice-original-max-tokens"] = original
    got = [(k, v) for k, v in headers.header_list if k.startswith(ICE_PREFIXES)]
    assert sorted(got) == sorted(expected.items())  # a duplicated header would show twice


LONG_INPUT = "word " * 40000  # about 50,000 estimated tokens, far over max_model_len


# --- Envoy's access log ----------------------------------------------------------------------


def access_log_entry(e2e: E2E, path: str, timeout_s: float = 5.0) -> dict[str, Any]:
    """The access log's JSON line for the request to ``path`` (Envoy flushes about every 1 s;
    the query string tells the test's requests from the harness's probes)."""
    log = e2e.workdir / "envoy.log"
    deadline = time.monotonic() + timeout_s
    while True:
        for line in log.read_text().splitlines():
            if line.startswith("{"):
                doc: dict[str, Any] = json.loads(line)
                if doc.get("path") == path:
                    return doc
        assert time.monotonic() < deadline, f"no access log line for {path}"
        time.sleep(0.1)


# --- a client that holds its body back --------------------------------------------------------

SLOW_LENGTH = 1_000_000


@contextlib.contextmanager
def slow_upload(e2e: E2E, length: int = SLOW_LENGTH) -> Iterator[None]:
    """A client that sends its headers and one byte of a ``length``-byte body, then waits:
    ICE has promised its body a place (``ice_backlog_bytes``) until the stream ends."""
    sock = socket.create_connection(("127.0.0.1", e2e.envoy_port), timeout=30)
    head = (
        f"POST {CHAT} HTTP/1.1\r\nhost: e2e\r\ncontent-type: application/json\r\n"
        f"content-length: {length}\r\n\r\n{{"
    )
    try:
        sock.sendall(head.encode())
        deadline = time.monotonic() + 10
        while e2e.ice_metric("ice_backlog_bytes") < length:
            assert time.monotonic() < deadline, "ICE never promised the slow upload its place"
            time.sleep(0.05)
        yield
    finally:
        sock.close()
        deadline = time.monotonic() + 10
        while e2e.ice_metric("ice_backlog_bytes") and time.monotonic() < deadline:
            time.sleep(0.05)


# --- the admission queue's body, through Envoy ------------------------------------------------

# KV_TIGHT: 90 free blocks of 16 tokens (1,440 tokens); this body needs ~1,507 + 16 tokens,
# more than is free and less than the 100 usable blocks: 429 kv_exhausted without a queue
QUEUE_BODY = {
    "model": "dev-model",
    "messages": [{"role": "user", "content": "word " * 1200}],
    "max_tokens": 16,
}


def queue_post(e2e: E2E, header: tuple[str, str] = ("x-tenant", "team-a")) -> tuple[float, object]:
    """QUEUE_BODY through Envoy with ``header``: (seconds taken, the reply)."""
    start = time.monotonic()
    headers = {"content-type": "application/json", header[0]: header[1]}
    reply = request(e2e.envoy_port, "POST", CHAT, json.dumps(QUEUE_BODY).encode(), headers)
    return time.monotonic() - start, reply


def queue_ours(e2e: E2E) -> list[Recorded]:
    """What the backend got of QUEUE_BODY (set_state's probes pass through Envoy too)."""
    return [r for r in e2e.received() if r.json().get("messages") == QUEUE_BODY["messages"]]
