"""Builders the test modules share (one home: no test module imports another; tests/README.md).

- ``admission``: a stream's ``Admission`` over a pipeline and a queue, as the servicer builds
  one, for tests that drive the queue or the shared ledger without gRPC; its ``commit`` is the
  one that commits a verdict. ``counting_pipeline``: a pipeline that counts with the tokenizer
  in ``folder`` under ``exact_count: mode``, on a calm pool. ``exact_pipeline``: the recorded
  vLLM CPU tokenizer's pipeline (tests/data/tokens).
- The queue's rig (``QueueRig``, ``QUEUE_POLICY``, ``QUEUE_BODY``, ``waiter_outcome``, ...).
- The servicer's scripted ext_proc messages (``headers_msg``, ``body_msg``, ``response_msg``,
  ``FakeContext``, ``SERVICER_POLICY``).
- Signals: ``FakeNvml`` (the slice of pynvml ICE reads) and the Prometheus API's answers.
- The forecast's backend (``forecast_backend``, ``LENGTHS``, ``decoding``).
- Tokenizers: ``chatml`` (the tiny tokenizer under a ChatML template),
  ``build_nfkc_bytelevel``; ``post_json`` for a live server.
- ``load_bench``: a ``bench/`` script as a module.

``DATA`` is tests/data, ``REPO`` the repository root, wherever the test that asks sits.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib.util
import json
import math
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as pb
from tokenizers import (
    AddedToken,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    trainers,
)

from ext_proc.admit.admission import Admission
from ext_proc.admit.backlog import Backlog
from ext_proc.admit.pipeline import Pipeline, RequestFacts, Route
from ext_proc.admit.queue import AdmissionQueue, Waiter, queueable
from ext_proc.admit.stream import Stream
from ext_proc.admit.verdict import BodyVerdict
from ext_proc.placement.inflight import Hold
from ext_proc.policy.load import parse_policy
from ext_proc.schemas import OPENAI_CHAT
from ext_proc.signals.parse import read_samples
from ext_proc.signals.scrapes import Derived, Histogram
from ext_proc.signals.snapshot import BackendSignals, PoolSnapshot
from ext_proc.tokencount import ExactCounter, TokenizerSpec
from tests import token_families as tf

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
DATA = TESTS / "data"
TOKENIZER_DIR = DATA / "vllm_cpu" / "tokenizer"
CHATML = DATA / "tokens" / "chatml_tools.jinja"
INF = math.inf
BENCH = REPO / "bench"


def admission(
    pipeline: Pipeline,
    route: Route,
    facts: RequestFacts,
    queue: AdmissionQueue,
    stream: Stream | None = None,
) -> Admission:
    """An ``Admission`` for one request whose headers gave ``facts``."""
    backlog = Backlog()
    got = Admission(
        pipeline=pipeline,
        helper=None,
        route=route,
        stream=stream or Stream(backlog, pipeline.views, queue),
        backlog=backlog,
        gate=asyncio.Lock(),
        queue=queue,
        recount=lambda *_args: None,
    )
    got.facts = facts
    return got


def counting_pipeline(folder: str | Path, max_model_len: int, mode: str) -> Pipeline:
    """A pipeline with the tokenizer in ``folder`` (``exact_count: mode``), no output buffer,
    against a calm backend of unknown size."""
    policy = parse_policy(
        f"""
profiles: {{default: {{max_model_len: {max_model_len}, output_buffer_tokens: 0,
                      min_output_tokens: 1}}}}
tokenizers:
  m: {{model_dir: {folder}}}
exact_count: {mode}
"""
    )
    backend = BackendSignals(url="u", kv_cache_usage=0.1, num_requests_waiting=0)
    snap = PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())
    return Pipeline(policy, lambda _pool: snap)


# --- the admission queue's rig (tests/admit/test_queue*.py) -------------------------------------

# 11 blocks of 16 tokens: floor((11 − 1) × (1 − usage)) free blocks
QUEUE_IDLE = BackendSignals(
    url="u", kv_cache_usage=0.0, num_requests_waiting=0, num_gpu_blocks=11, block_size=16
)


# "x" * 200 → 57 input tokens; + 40 output = 97 tokens = 7 blocks: one fits in 10 free blocks
QUEUE_BODY = json.dumps({"messages": [{"role": "user", "content": "x" * 200}], "max_tokens": 40})


QUEUE_POLICY = """
profiles:
  default:
    on_kv_shortfall: shed
    queue: {enabled: true, max_queue_wait_ms: 59000, max_queue_length: %d, tenant_header: x-tenant,
            max_tenants: %d, poll_ms: 59000}
"""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class QueueRig:
    """A pipeline over a view the test replaces, and a queue on a clock it moves."""

    def __init__(self, length: int = 64, tenants: int = 16) -> None:
        self.view = PoolSnapshot("default", (QUEUE_IDLE,), time.monotonic() - 1.0)
        self.pipeline = Pipeline(
            parse_policy(QUEUE_POLICY % (length, tenants)), lambda _: self.view
        )
        self.route = self.pipeline.router.resolve([])
        self.clock = Clock()
        self.queue = AdmissionQueue(clock=self.clock)
        self.passed: list[Hold] = []  # pass_one's requests, live until newer_view
        # every request's stream (an admitted one: its hold), by its facts' identity
        self.streams: dict[int, Stream] = {}

    def facts(self, priority: str = "standard", tenant: str = "") -> RequestFacts:
        facts = RequestFacts(adapter=OPENAI_CHAT, priority=priority, queue_tenant=tenant)  # type: ignore[arg-type]
        self.streams[id(facts)] = Stream(Backlog(), self.pipeline.views, self.queue)
        return facts

    def stream(self, facts: RequestFacts) -> Stream:
        return self.streams[id(facts)]

    def offer_as_is(self, facts: RequestFacts, first: BodyVerdict) -> Waiter | BodyVerdict:
        """The queue's answer to ``first`` (a waiter, or its refusal), with its commit."""
        stream = self.stream(facts)
        return self.queue.offer(
            self.pipeline, self.route, facts, stream, first, commit=self.commit(facts)
        )

    def commit(self, facts: RequestFacts) -> Callable[[BodyVerdict], None]:
        """The commit of the request ``facts`` names (its stream's ``Admission``)."""
        return admission(self.pipeline, self.route, facts, self.queue, self.stream(facts)).commit

    def judge(self, facts: RequestFacts) -> BodyVerdict:
        verdict = self.pipeline.on_body(self.route, facts, QUEUE_BODY.encode())
        assert verdict is not None
        return verdict

    def pass_one(self) -> None:
        verdict = self.judge(self.facts())
        assert verdict.decision is not None and verdict.decision.decision == "pass"
        hold = self.pipeline.recorder.record(self.route, verdict)
        assert hold is not None
        self.passed.append(hold)

    def offer(self, facts: RequestFacts) -> Waiter:
        first = self.judge(facts)
        assert queueable(self.route, first), first.decision
        got = self.offer_as_is(facts, first)
        assert isinstance(got, Waiter)
        return got

    def newer_view(self, usage: float = 0.0) -> None:
        """A view taken now, after every request passed so far finished (their streams
        ended: their reservations are released)."""
        holds = self.passed + [s.hold for s in self.streams.values() if s.hold is not None]
        for hold in holds:
            self.pipeline.views.release(hold)
        backend = BackendSignals(
            url="u", kv_cache_usage=usage, num_requests_waiting=0, num_gpu_blocks=11, block_size=16
        )
        self.view = PoolSnapshot("default", (backend,), time.monotonic())


def waiter_outcome(w: Waiter) -> str:
    v = w.future.result()
    assert v.decision is not None
    return f"{v.decision.decision}:{v.decision.reason}"


def waiter_headers(w: Waiter) -> dict[str, str]:
    return dict(w.future.result().outcome.headers)


# --- scripted ext_proc streams for the servicer (tests/serve/) ----------------------------------

SERVICER_POLICY = parse_policy(
    """
profiles:
  default: {max_model_len: 8192, output_buffer_tokens: 512}
  strict: {max_model_len: 8192, fail_mode: closed}
routes:
  chat: {profile: default}
"""
)


class FakeContext:
    def __init__(self, metadata: tuple[tuple[str, str], ...]) -> None:
        self._metadata = metadata

    def invocation_metadata(self) -> tuple[tuple[str, str], ...]:
        return self._metadata


def servicer_snapshot(usage: float, waiting: float) -> PoolSnapshot:
    backend = BackendSignals(url="u", kv_cache_usage=usage, num_requests_waiting=waiting)
    return PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())


def headers_msg(
    path: str = "/v1/chat/completions", eos: bool = False, **extra: str
) -> pb.ProcessingRequest:
    pairs = {":path": path, ":method": "POST", "content-type": "application/json", **extra}
    hs = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    return pb.ProcessingRequest(
        request_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=hs), end_of_stream=eos)
    )


def body_msg(body: bytes) -> pb.ProcessingRequest:
    return pb.ProcessingRequest(request_body=pb.HttpBody(body=body, end_of_stream=True))


def set_headers(mutation: pb.HeaderMutation) -> dict[str, str]:
    return {h.header.key: h.header.raw_value.decode() for h in mutation.set_headers}


VALVE_BODY_HEADERS = {"server": "uvicorn", "content-type": "application/json"}


def response_msg(
    status: str = "503", details: str | None = "via_upstream", **extra: str
) -> pb.ProcessingRequest:
    pairs = {":status": status, **VALVE_BODY_HEADERS, **extra}
    hs = [base_pb2.HeaderValue(key=k, raw_value=v.encode()) for k, v in pairs.items()]
    msg = pb.ProcessingRequest(
        response_headers=pb.HttpHeaders(headers=base_pb2.HeaderMap(headers=hs))
    )
    if details is not None:
        fields = msg.attributes["envoy.filters.http.ext_proc"].fields
        fields["response.code_details"].string_value = details
    return msg


# --- pynvml's slice, faked (no GPU here) --------------------------------------------------------


class FakeNVMLError(Exception):
    pass


@dataclass
class GpuMem:
    total: int
    free: int
    used: int


@dataclass
class GpuUtil:
    gpu: int
    memory: int = 0


@dataclass
class FakeNvml:
    """The slice of pynvml NvmlSource uses. Devices are dicts; a key holding an exception
    makes that call raise it."""

    devices: list[dict[str, object]]
    init_error: Exception | None = None
    count_error: Exception | None = None
    calls: list[str] = field(default_factory=list)
    NVML_PCIE_UTIL_TX_BYTES: int = 0
    NVML_PCIE_UTIL_RX_BYTES: int = 1

    def nvmlInit(self) -> None:
        self.calls.append("init")
        if self.init_error:
            raise self.init_error

    def nvmlShutdown(self) -> None:
        self.calls.append("shutdown")

    def nvmlDeviceGetCount(self) -> int:
        if self.count_error:
            raise self.count_error
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> dict[str, object]:
        return self.devices[i]

    def _get(self, handle: dict[str, object], key: str) -> object:
        value = handle[key]
        if isinstance(value, Exception):
            raise value
        return value

    def nvmlDeviceGetUUID(self, handle: dict[str, object]) -> object:
        return self._get(handle, "uuid")

    def nvmlDeviceGetName(self, handle: dict[str, object]) -> object:
        return self._get(handle, "name")

    def nvmlDeviceGetMemoryInfo(self, handle: dict[str, object]) -> object:
        return self._get(handle, "mem")

    def nvmlDeviceGetUtilizationRates(self, handle: dict[str, object]) -> object:
        return self._get(handle, "util")

    def nvmlDeviceGetPcieThroughput(self, handle: dict[str, object], counter: int) -> object:
        self.calls.append(f"pcie{counter}")
        return self._get(handle, "tx" if counter == self.NVML_PCIE_UTIL_TX_BYTES else "rx")


GIB = 2**30


H200 = {
    "uuid": "GPU-aaaa",
    "name": "NVIDIA H200",
    "mem": GpuMem(total=141 * GIB, free=41 * GIB, used=100 * GIB),
    "util": GpuUtil(gpu=87),
    "tx": 2048,
    "rx": 1000,
}


# --- the Prometheus API's answers ---------------------------------------------------------------


def promapi_answer(samples: list[tuple[str, dict[str, str], float]]) -> dict[str, Any]:
    def text(v: float) -> str:
        return "+Inf" if v == math.inf else "NaN" if math.isnan(v) else repr(v)

    return {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {"metric": {"__name__": n, **labels}, "value": [1_795_968_600.123, text(v)]}
                for n, labels, v in samples
            ],
        },
    }


def as_prometheus(kind: str, path: Path, instance: str) -> list[tuple[str, dict[str, str], float]]:
    """The page's wanted samples as Prometheus would return them: target labels added."""
    samples, _ = read_samples(kind, path.read_text())
    return [(n, {**lab, "instance": instance, "job": kind}, v) for n, lab, v in samples]


# --- the forecast's backend ---------------------------------------------------------------------

# 100 finished requests: 20 of ≤ 10 tokens, 40 of 10–100, 40 of 100–1000
LENGTHS = Histogram(bounds=(10, 100, 1000, INF), counts=(20, 60, 100, 100), count=100, sum=0)


def blocks16(i: int, o: int) -> int:
    return -(-(i + o) // 16)


def forecast_backend(usage: float, preemptions: float = 0.0) -> BackendSignals:
    return BackendSignals(
        url="u",
        kv_cache_usage=usage,
        num_requests_running=2,
        num_gpu_blocks=101,
        block_size=16,
        output_lengths=LENGTHS,
        preemptions=preemptions,
        derived=Derived(window_s=10.0, generation_tokens_per_s=0.0),
    )


# --- the forecast's backend ---------------------------------------------------------------------


def decoding(usage: float) -> BackendSignals:
    """A backend decoding at 100 tokens/s a sequence (``itl_mean_s`` 0.01, no window rate),
    first token at once (no TTFT figure)."""
    return dataclasses.replace(
        forecast_backend(usage), itl_mean_s=0.01, derived=Derived(window_s=10.0)
    )


FORECAST_URL = "http://10.0.0.7:8000/metrics"


# --- the tiny tokenizer under a ChatML template -------------------------------------------------


def chatml(tmp_path: Path) -> ExactCounter:
    """The tiny tokenizer with ChatML's turn markers as special tokens, and chatml_tools."""
    tok = Tokenizer.from_file(str(TOKENIZER_DIR / "tokenizer.json"))
    tok.add_special_tokens(
        [AddedToken(t, special=True, normalized=False) for t in ("<|im_start|>", "<|im_end|>")]
    )
    tok.save(str(tmp_path / "tokenizer.json"))
    config = json.loads((TOKENIZER_DIR / "tokenizer_config.json").read_text())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    spec = TokenizerSpec(
        tmp_path / "tokenizer.json", tmp_path / "tokenizer_config.json", chat_template=CHATML
    )
    return ExactCounter.load(spec)


# --- the recorded vLLM CPU tokenizer's pipeline -------------------------------------------------


def exact_pipeline(max_model_len: int, exact_count: str = "always") -> Pipeline:
    policy = parse_policy(
        f"""
profiles: {{default: {{max_model_len: {max_model_len}, output_buffer_tokens: 0,
                      min_output_tokens: 1}}}}
tokenizers:
  tiny: {{model_dir: vllm_cpu/tokenizer}}
exact_count: {exact_count}
""",
        base_dir=DATA,
    )
    backend = BackendSignals(url="u", kv_cache_usage=0.1, num_requests_waiting=0)
    snap = PoolSnapshot(pool="default", backends=(backend,), taken_at_s=time.monotonic())
    return Pipeline(policy, lambda _pool: snap)


# --- an NFKC + ByteLevel BPE, trained now -------------------------------------------------------


def build_nfkc_bytelevel(root: Path) -> Path:
    """ByteLevel BPE behind an NFKC normalizer (no prefix space), ChatML specials."""
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<unk>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(tf.CORPUS, trainer)
    return tf._write(root / "nfkc-bytelevel", tok, tf.CHATML_SPECIAL, tf.CHATML_EXTRA, tf.CHATML)


# --- a live server's JSON -----------------------------------------------------------------------


def post_json(url: str, payload: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """POST ``payload`` as JSON: (status, the JSON answer), an HTTP error's included."""
    req = urllib.request.Request(
        url,
        data=json.dumps(payload).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return int(resp.status), json.loads(resp.read())
    except urllib.error.HTTPError as e:
        body = json.loads(e.read() or b"{}")
        e.close()
        return int(e.code), body


# --- bench/ scripts as modules ------------------------------------------------------------------


def load_bench(script: str, name: str) -> ModuleType:
    """``bench/<script>`` as the module ``name``."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, BENCH / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
