"""``ice signals``: saved pages, a URL served here, JSON and table output, errors."""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from ext_proc.signals.cli import main

DATA = Path(__file__).parents[1] / "data"
PREEMPTING = DATA / "vllm_cpu" / "metrics_preempting.txt"
SGLANG = DATA / "signals" / "sglang_metrics.txt"
VALVE = DATA / "signals" / "vllm_valve_metrics.txt"  # metrics_preempting + 7 + 2 rejections
ASLEEP = DATA / "signals" / "vllm_asleep_metrics.txt"  # metrics_idle after sleep level 1
DCGM = DATA / "signals" / "dcgm_metrics.txt"


def test_table_for_a_saved_vllm_page(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(PREEMPTING)]) == 0
    out = capsys.readouterr().out
    rows = dict(line.split(None, 1) for line in out.splitlines() if line and "(" not in line)
    assert rows["kind"] == "vllm" and rows["kv_cache_usage"] == "0.9565"
    assert rows["num_requests_waiting"] == "13" and rows["num_gpu_blocks"] == "24"
    assert "28 observations, p50 3.75 s" in out  # le=2.5 → 10, le=5 → 18: 2.5 + 2.5·4/8


def _rows(out: str) -> dict[str, str]:
    """The table's rows: name, two or more spaces, value."""
    return dict(re.split(r"\s{2,}", line.strip(), maxsplit=1) for line in out.splitlines() if line)


def test_table_shows_the_valve_and_the_sleep_state(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(VALVE)]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["sleep_state"] == "awake"
    assert rows["admission_rejections (total)"] == "9"
    assert main([str(ASLEEP)]) == 0
    rows = _rows(capsys.readouterr().out)
    assert rows["sleep_state"] == "weights_offloaded (asleep)"
    assert rows["admission_rejections (total)"] == "0"


def test_json_shows_the_valve_and_the_sleep_state(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(VALVE), "--json"]) == 0
    scrape = json.loads(capsys.readouterr().out)["scrape"]
    assert (scrape["admission_rejections"], scrape["sleep_state"]) == (9, "awake")
    assert main([str(ASLEEP), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scrape"]["sleep_state"] == "weights_offloaded"


def test_json_has_every_field(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(SGLANG), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    scrape = doc["scrape"]
    assert scrape["kind"] == "sglang" and scrape["kv_capacity_tokens"] == 327_680
    assert scrape["ttft_s"]["bounds"][-1] == "+Inf" and scrape["ttft_s"]["count"] == 2000
    assert "derived" not in doc


def test_dcgm_page(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(DCGM), "--json"]) == 0
    gpus = json.loads(capsys.readouterr().out)
    assert [g["gpu"] for g in gpus] == ["0", "1"] and gpus[0]["pod"] == "vllm-llama-0"
    assert main([str(DCGM)]) == 0
    assert "inference/vllm-llama-0" in capsys.readouterr().out


def test_kind_can_be_forced(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(PREEMPTING), "--kind", "sglang"]) == 1
    assert "no sglang metrics" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("<html>502 Bad Gateway</html>\n", "no vLLM, SGLang or DCGM metrics"),
        ('vllm:num_requests_running{engine="0"} 1', "truncated"),
    ],
    ids=["html", "truncated"],
)
def test_bad_pages_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    page = tmp_path / "page.txt"
    page.write_text(content)
    assert main([str(page)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("ice signals: ") and message in err


def test_missing_file_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "nope.txt")]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_window_needs_a_url(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(PREEMPTING), "--window", "1"]) == 2


def test_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(PREEMPTING.read_text()))
    assert main(["-", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["scrape"]["num_requests_running"] == 3


@pytest.fixture
def served() -> Iterator[tuple[str, list[bytes]]]:
    """A local /metrics server answering the pages in ``pages`` one after another."""
    pages: list[bytes] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            body = pages.pop(0) if len(pages) > 1 else pages[0]
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=1.0.0; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/metrics", pages
    finally:
        server.shutdown()
        server.server_close()


def _loaded_then_preempting(
    served: tuple[str, list[bytes]], capsys: pytest.CaptureFixture[str]
) -> dict[str, Any]:
    """``--json --window`` over the tiny vLLM's loaded page, then its preempting one."""
    url, pages = served
    pages += [
        (DATA / "vllm_cpu" / f"metrics_{n}.txt").read_bytes() for n in ("loaded", "preempting")
    ]
    assert main([url, "--json", "--window", "0.05"]) == 0
    doc: dict[str, Any] = json.loads(capsys.readouterr().out)
    return doc


def test_url_with_window_adds_rates(
    served: tuple[str, list[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    doc = _loaded_then_preempting(served, capsys)
    assert doc["scrape"]["num_requests_waiting"] == 13  # the second page
    d = doc["derived"]
    assert d["window_s"] > 0 and d["preemptions_per_s"] > 0
    assert d["ttft_delta"]["count"] == 28 - 5


def test_url_with_window_shows_the_valves_rate_and_recent_flag(
    served: tuple[str, list[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, pages = served
    pages += [(DATA / "vllm_cpu" / "metrics_loaded.txt").read_bytes(), VALVE.read_bytes()]
    assert main([url, "--json", "--window", "0.05"]) == 0
    d = json.loads(capsys.readouterr().out)["derived"]
    # 0 → 9 rejections between the two scrapes: 9 / window_s per second, and recent
    assert d["admission_rejections_per_s"] == pytest.approx(9 / d["window_s"])
    assert d["admission_rejected_recently"] is True
    pages[:] = [VALVE.read_bytes()]  # the same page twice: nothing new
    assert main([url, "--window", "0.05"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert (rows["admission_rejections_per_s"], rows["admission_rejected_recently"]) == ("0", "no")


def test_url_table(served: tuple[str, list[bytes]], capsys: pytest.CaptureFixture[str]) -> None:
    url, pages = served
    pages.append(PREEMPTING.read_bytes())
    assert main([url]) == 0
    assert "kv_cache_usage" in capsys.readouterr().out


def test_unreachable_url_exits_1(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["http://127.0.0.1:9/metrics", "--timeout", "1"]) == 1
    assert "cannot read" in capsys.readouterr().err


def test_nvml_source_answers_or_says_why(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["nvml"])
    captured = capsys.readouterr()
    assert (rc, bool(captured.err)) in ((0, False), (1, True))


def test_table_shows_what_the_forecast_reads(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(PREEMPTING)]) == 0
    rows = _rows(capsys.readouterr().out)
    # ITL sum 32.3095 s over 4,821 gaps: 6.70 ms, 149.2 tokens/s per sequence
    assert rows["forecast: decode rate"] == (
        "149.2 tok/s (1 / mean inter-token latency since start)"
    )
    assert rows["forecast: limit share"] == "1"  # 25 of 25 finished at their limit
    # one page: no window, so neither the delay nor a preemption rise is known
    assert rows["forecast: first-token delay"] == "-"
    assert rows["forecast: caution"] == "-"


def test_window_says_when_the_preemption_counter_rose(
    served: tuple[str, list[bytes]], capsys: pytest.CaptureFixture[str]
) -> None:
    url, pages = served
    doc = _loaded_then_preempting(served, capsys)
    f, d = doc["forecast"], doc["derived"]
    # 4,108 tokens within ~0.05 s over 3 running is far above 149.2: the mean latency binds
    assert f["decode_rate_tok_per_s"] == pytest.approx(4821 / 32.30954410700042)
    assert f["rate_from"] == "itl_mean"
    assert f["first_token_delay_s"] == d["ttft_p50_s"] > 0
    assert (f["preemptions_in_window"], f["caution_raised"]) == (2, True)  # 0 → 2
    pages[:] = [PREEMPTING.read_bytes()]  # the same page twice: no rise
    assert main([url, "--window", "0.05"]) == 0
    rows = _rows(capsys.readouterr().out)
    assert (rows["forecast: preemptions in window"], rows["forecast: caution"]) == ("0", "no rise")
