"""How far ICE's TTFT and TPOT predictions (docs/slo.md) are from what vLLM reports.

Starts the GPU-shaped pool (docs/gpu-pool.md: vLLM 0.32's own server and scheduler over the
fake executor; ``--dilation`` k sleeps k × the modelled H100 step), sends chat requests to it
directly (no ICE) at Poisson arrivals, scrapes ``/metrics`` every ``--scrape-s`` seconds, and
after each scrape computes what the collector would (``ext_proc.signals.slo.speed`` over the
last ``--window-s``). Reported:

- the prefill speed and decode step line at the end;
- ICE's own measured error (``ttft_error_ratio``, the ``ice_slo_ttft_prediction_error_ratio``
  gauge) at the end;
- an independent check: at each scrape, the predicted TTFT of a mean request sent then, against
  the mean TTFT vLLM reported over the next ``--window-s`` (its histogram's Δsum ÷ Δcount):
  mean absolute percentage error and mean signed error (positive: ICE predicts long);
- the same for TPOT (predicted with running + 1 against the next window's mean inter-token
  latency).

Needs ``.venv-vllm``. Figures are in wall time on this machine (dilated); they measure the
method, not a GPU.

    .venv/bin/python bench/slo_predict.py --rate 6 --duration-s 60 --prompt-words 400
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from ext_proc.lab import vllm_local as vl
from ext_proc.lab.gpupool import PoolSpec, serve_config
from ext_proc.signals.parse import parse_engine
from ext_proc.signals.poolbuild import backend_signals
from ext_proc.signals.scrapes import EngineScrape
from ext_proc.signals.window import Window


def _post(base: str, words: int, max_tokens: int, salt: int) -> None:
    # a distinct first word: no prefix-cache hit beyond the chat template's
    text = f"{salt} " + " ".join(["tokens"] * words) if salt >= 0 else " ".join(["tokens"] * words)
    body = {
        "model": "tiny",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    req = urllib.request.Request(
        base + "/v1/chat/completions",
        json.dumps(body).encode(),
        {"content-type": "application/json"},
    )
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            resp.read()
    except OSError:
        pass


def _scrape(base: str) -> EngineScrape:
    with urllib.request.urlopen(base + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return parse_engine("vllm", base, text, time.monotonic())


def _mean(h_new: object, h_old: object) -> float | None:
    if h_new is None or h_old is None:
        return None
    n = h_new.count - h_old.count  # type: ignore[attr-defined]
    return (h_new.sum - h_old.sum) / n if n > 0 else None  # type: ignore[attr-defined]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=6.0, help="requests a second (Poisson)")
    ap.add_argument("--duration-s", type=float, default=60.0)
    ap.add_argument("--prompt-words", type=int, default=400, help="mean; uniform ±50 %%")
    ap.add_argument("--max-tokens", type=int, default=64, help="mean; uniform ±50 %%")
    ap.add_argument("--window-s", type=float, default=10.0)
    ap.add_argument("--scrape-s", type=float, default=1.0)
    ap.add_argument("--dilation", type=float, default=10.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--distinct", action="store_true", help="prompts share no prefix")
    ap.add_argument("--log", help="vLLM's log file (default: a temporary one)")
    ap.add_argument("--start-timeout-s", type=float, default=600.0)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    spec = PoolSpec(kv_memory_bytes=2**30, max_model_len=4096, dilation=args.dilation)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = serve_config(spec, Path(tmp))
        log = Path(args.log) if args.log else Path(tmp) / "vllm.log"
        with vl.start_server(cfg, log_path=log, timeout_s=args.start_timeout_s) as server:
            base = server.base_url
            stop = time.monotonic() + args.duration_s
            threads: list[threading.Thread] = []

            def drive() -> None:
                while time.monotonic() < stop:
                    words = int(args.prompt_words * rng.uniform(0.5, 1.5))
                    out = max(1, int(args.max_tokens * rng.uniform(0.5, 1.5)))
                    salt = rng.randrange(10**9) if args.distinct else -1
                    t = threading.Thread(target=_post, args=(base, words, out, salt), daemon=True)
                    t.start()
                    threads.append(t)
                    time.sleep(rng.expovariate(args.rate))

            driver = threading.Thread(target=drive, daemon=True)
            driver.start()
            window = Window(args.window_s)
            history: list[EngineScrape] = []
            predictions: list[tuple[float, float | None, float | None]] = []
            while time.monotonic() < stop + args.window_s:
                s = _scrape(base)
                window.append(s)
                history.append(s)
                b = backend_signals(s, window.derived())
                sp = b.speed
                ttft = tpot = None
                if sp is not None and sp.computed_prompt_tokens is not None:
                    hit = b.hit_ratio or 0.0
                    ttft = b.predicted_ttft_s(sp.computed_prompt_tokens / max(1e-9, 1.0 - hit))
                    tpot = b.predicted_tpot_s
                predictions.append((s.at_s, ttft, tpot))
                time.sleep(args.scrape_s)
            driver.join()
            final = window.derived()
    # the independent check: each prediction against the next window's means
    ttft_err: list[tuple[float, float]] = []
    tpot_err: list[tuple[float, float]] = []
    for i, (at_s, ttft, tpot) in enumerate(predictions):
        later = [j for j in range(i, len(history)) if history[j].at_s <= at_s + args.window_s]
        j = later[-1]
        if j == i:
            continue
        obs_ttft = _mean(history[j].ttft_s, history[i].ttft_s)
        obs_itl = _mean(history[j].itl_s, history[i].itl_s)
        if ttft is not None and obs_ttft:
            ttft_err.append((ttft, obs_ttft))
        if tpot is not None and obs_itl:
            tpot_err.append((tpot, obs_itl))

    def report(name: str, pairs: list[tuple[float, float]]) -> None:
        if not pairs:
            print(f"{name}: no pairs")
            return
        mape = sum(abs(p - o) / o for p, o in pairs) / len(pairs)
        bias = sum((p - o) / o for p, o in pairs) / len(pairs)
        mean_p = sum(p for p, _ in pairs) / len(pairs)
        mean_o = sum(o for _, o in pairs) / len(pairs)
        print(
            f"{name}: {len(pairs)} predictions, MAPE {mape:.1%}, signed {bias:+.1%}, "
            f"mean predicted {mean_p * 1e3:.1f} ms, mean observed {mean_o * 1e3:.1f} ms"
        )

    sp = final.speed if final is not None else None
    print(f"speed at the end: {sp}")
    report("TTFT vs next window", ttft_err)
    report("TPOT vs next window", tpot_err)


if __name__ == "__main__":
    main()
