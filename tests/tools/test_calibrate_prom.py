"""ice calibrate --prometheus: range queries against a tiny local server with canned JSON."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import numpy as np
import pytest

from ext_proc.tools.calibrate import prom
from ext_proc.tools.calibrate.cli import main

T0, STEP, N = 1000.0, 30.0, 10
TIMES = [T0 + STEP * i for i in range(N)]
KV = {"a:8000": [0.1 * i for i in range(N)], "b:8000": [0.5] * N}
WAITING = {"a:8000": [float(i) for i in range(N)], "b:8000": [0.0] * N}
PREEMPT = {"a:8000": [0, 0, 0, 2, 2, 2, 2, 0, 1, 1], "b:8000": [0] * N}  # reset at step 7
# TTFT buckets le 1 / 2 / +Inf, cumulative; target 1.5 s: over = count − (c1 + (c2 − c1)/2)
TTFT = {"1": [0, 4, 8] + [8] * 7, "2": [0, 8, 16] + [16] * 7, "+Inf": [0, 10, 20] + [20] * 7}


def _series(labels: dict[str, str], values: list[float], start: float, end: float) -> dict:
    pts = [[t, repr(float(v))] for t, v in zip(TIMES, values, strict=True) if start <= t <= end]
    return {"metric": labels, "values": pts}


def _answer(query: str, start: float, end: float) -> dict:
    result = []
    if "kv_cache_usage_perc" in query:
        for inst, v in KV.items():
            result.append(
                _series({"__name__": "vllm:kv_cache_usage_perc", "instance": inst}, v, start, end)
            )
    elif "num_requests_waiting" in query:
        for inst, v in WAITING.items():
            result.append(
                _series({"__name__": "vllm:num_requests_waiting", "instance": inst}, v, start, end)
            )
    elif "num_preemptions_total" in query:
        for inst, v in PREEMPT.items():
            result.append(
                _series({"__name__": "vllm:num_preemptions_total", "instance": inst}, v, start, end)
            )
    elif "time_to_first_token_seconds_bucket" in query:
        for le, v in TTFT.items():
            labels = {
                "__name__": "vllm:time_to_first_token_seconds_bucket",
                "instance": "a:8000",
                "le": le,
            }
            result.append(_series(labels, v, start, end))
    return {"status": "success", "data": {"resultType": "matrix", "result": result}}


@pytest.fixture
def server() -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            u = urlparse(self.path)
            q = {k: v[0] for k, v in parse_qs(u.query).items()}
            q["path"] = u.path
            seen.append(q)
            if u.path != "/api/v1/query_range":
                self.send_response(404)
                self.end_headers()
                return
            body = json.dumps(_answer(q["query"], float(q["start"]), float(q["end"]))).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
    th = threading.Thread(target=srv.serve_forever, daemon=True)
    th.start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", seen
    srv.shutdown()
    srv.server_close()


def test_range_queries_use_ice_names() -> None:
    q = prom.range_queries("vllm", 'job="vllm"', "pod")
    assert q["kv_cache_usage"].startswith("avg by (pod, __name__) (")
    assert 'vllm:kv_cache_usage_perc|vllm:gpu_cache_usage_perc"' in q["kv_cache_usage"]
    assert 'tp_rank=~"0|"' in q["kv_cache_usage"] and q["kv_cache_usage"].endswith(',job="vllm"})')
    assert q["ttft_s"].startswith("sum by (pod, le, __name__) (")
    assert "vllm:time_to_first_token_seconds_bucket" in q["ttft_s"]
    assert "vllm:num_preemptions_total" in q["preemptions"]


def test_history_from_canned_answers(
    server: tuple[str, list[dict[str, str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    url, seen = server
    end = TIMES[-1]
    h = prom.history_from_prometheus(url, kind="vllm", start=T0, end=end, step=STEP,
                                     ttft_target_s=1.5)  # fmt: skip
    assert h.backends == ("a:8000", "b:8000") and h.t.tolist() == TIMES
    assert np.allclose(h.kv, [(0.1 * i + 0.5) / 2 for i in range(N)])
    assert np.allclose(h.waiting, [i / 2 for i in range(N)])
    assert h.preempted.tolist() == [0, 0, 0, 2, 0, 0, 0, 0, 1, 0]  # 2 → 0 reset: +0
    # over target: step 1: 10 − (4 + 2) = 4; step 2: 20 − 12 = 8 → increase 4
    assert h.ttft_total.tolist() == [0, 10, 10] + [0] * 7
    assert h.ttft_over.tolist() == [0, 4, 4] + [0] * 7
    assert {s["path"] for s in seen} == {"/api/v1/query_range"}
    assert {(s["start"], s["end"], s["step"]) for s in seen} == {("1000.0", "1270.0", "30.0")}
    # chunked: at most MAX_POINTS steps per request, same history
    seen.clear()
    monkeypatch.setattr(prom, "MAX_POINTS", 4)
    h2 = prom.history_from_prometheus(url, kind="vllm", start=T0, end=end, step=STEP,
                                      ttft_target_s=1.5)  # fmt: skip
    assert len(seen) == 4 * 3  # four queries, steps 0-3, 4-7, 8-9
    assert np.array_equal(h2.kv, h.kv) and np.array_equal(h2.ttft_over, h.ttft_over)


def test_cli_against_canned_prometheus(
    server: tuple[str, list[dict[str, str]]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url, _ = server
    out = tmp_path / "f.yaml"
    argv = ["--prometheus", url, "--until", str(TIMES[-1]), "--since", "270s", "--step", "30s",
            "--out", str(out)]  # fmt: skip
    assert main(argv) == 0
    said = capsys.readouterr().out
    assert "10 steps, 2 backends" in said and "events: " in said
    assert out.read_text().startswith("# ice calibrate: ")
    assert "profiles:\n  default:\n    pressure:\n" in out.read_text()


def test_prometheus_down_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--prometheus", "http://127.0.0.1:9", "--since", "1h", "--until", "5000"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("ice calibrate: error: Prometheus") and err.count("\n") == 1


def test_failed_query_is_input_error() -> None:
    with pytest.raises(prom.InputError, match="bad_data"):
        prom.matrix('{"status": "error", "errorType": "bad_data", "error": "bad_data: parse"}')
    with pytest.raises(prom.InputError, match="matrix"):
        prom.matrix('{"status": "success", "data": {"resultType": "vector", "result": []}}')
