"""``ext_proc.lab.gpupool.timing``: the modelled GPU step time against hand-computed values."""

from __future__ import annotations

import dataclasses

import pytest

from ext_proc.lab.gpupool import (
    CPU_TINY,
    H100_SXM,
    Chunk,
    FittedStep,
    GpuSpec,
    ModelCost,
    Pacer,
    fitted_step_time,
    load_config,
    step_time,
)

# d = 4, h = 2, g = 1, e = 2, f = 8, V = 10, L = 1, bf16:
# layer = 4·2·2 + 2·4·1·2 + 2·2·4 + 3·4·8 + 2·4 = 16 + 16 + 16 + 96 + 8 = 152; head = 40.
TOY = {
    "hidden_size": 4,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "intermediate_size": 8,
    "vocab_size": 10,
    "num_hidden_layers": 1,
    "torch_dtype": "bfloat16",
}
GPU = GpuSpec(
    name="toy",
    hbm_bytes_per_s=1000.0,
    peak_flops=10_000.0,
    link_bytes_per_s=100.0,
    memory_bytes=0,
    mem_efficiency=0.5,
    compute_efficiency=0.5,
    overhead_s=0.1,
)


def test_toy_cost() -> None:
    cost = ModelCost.from_config(TOY)
    assert (cost.layer_params, cost.lm_head_params, cost.embed_params) == (152, 40, 40)
    assert cost.params == 40 + 152 + 4 + 40
    assert cost.weight_bytes == (152 + 40) * 2
    assert cost.kv_bytes_per_token == 2 * 1 * 1 * 2 * 2


def test_tied_head_counted_once_in_params_but_read_every_step() -> None:
    cost = ModelCost.from_config({**TOY, "tie_word_embeddings": True})
    assert cost.params == 40 + 152 + 4
    assert cost.weight_bytes == (152 + 40) * 2


@pytest.mark.parametrize(
    ("chunks", "sampled", "seconds", "mem_s", "compute_s"),
    [
        # T = 4; KV tokens (2 + 3) + (5 + 1) = 11 → 88 B; bytes 384 + 88 = 472 → 472 / 500.
        # pairs 3·2 + 3·4/2 + 1·5 + 1·2/2 = 18; flops 2·152·4 + 2·40·2 + 4·1·4·18 = 1664.
        ([Chunk(3, 2), Chunk(1, 5)], 2, 0.1 + 0.944, 0.944, 1664 / 5000),
        # One 100-token prefill: compute-bound. KV 800 B → (384 + 800) / 500 = 2.368;
        # pairs 100·101/2 = 5050; flops 30400 + 80 + 16·5050 = 111280 → 22.256.
        ([Chunk(100, 0)], 1, 0.1 + 22.256, 2.368, 22.256),
    ],
    ids=["memory-bound mix", "compute-bound prefill"],
)
def test_toy_step(
    chunks: list[Chunk], sampled: int, seconds: float, mem_s: float, compute_s: float
) -> None:
    t = step_time(ModelCost.from_config(TOY), GPU, chunks, sampled)
    assert t.seconds == pytest.approx(seconds)
    assert t.mem_s == pytest.approx(mem_s)
    assert t.compute_s == pytest.approx(compute_s)
    assert t.comm_s == 0.0


def test_tensor_parallel_splits_weights_and_adds_the_all_reduce() -> None:
    # g = 2: layer 16 + 32 + 16 + 96 + 8 = 168. tp = 2: weights (168 + 40) / 2 · 2 = 208 B;
    # KV 2·1·1·2·2 = 8 B a token, 4 tokens → 32; mem (208 + 32) / 500 = 0.48.
    # All-reduce: 2 (tp−1)/tp = 1 × 2·1·1·4·2 = 16 B / 50 = 0.32; flops 168 + 40 + 4·1·2·4 = 240.
    cost = ModelCost.from_config({**TOY, "num_key_value_heads": 2}, tp=2)
    t = step_time(cost, GPU, [Chunk(1, 3)], 1)
    assert (t.mem_s, t.comm_s, t.compute_s) == pytest.approx((0.48, 0.32, 240 / 5000))
    assert t.seconds == pytest.approx(0.1 + 0.48 + 0.32)


def test_no_tokens_no_step() -> None:
    assert step_time(ModelCost.from_config(TOY), GPU, [], 0).seconds == 0.0


def test_tp_must_divide_the_heads() -> None:
    with pytest.raises(ValueError, match="tp=3"):
        ModelCost.from_config(TOY, tp=3)


def test_llama_8b_and_70b_counts() -> None:
    small = ModelCost.from_config(load_config("llama-3.1-8b"))
    assert small.layer_params == 32 * 218_112_000
    assert small.params == 8_030_261_248  # the published "8.03B"
    assert small.kv_bytes_per_token == 131_072  # 2 × 32 × 8 × 128 × 2
    big = ModelCost.from_config(load_config("llama-3.1-70b"), tp=4)
    assert big.params == 70_553_706_496  # "70.6B"
    assert big.kv_bytes_per_token == 2 * 80 * 2 * 128 * 2  # 8 KV heads over 4 ranks


def test_calibration_point_within_two_percent() -> None:
    # The published point (timing.H100_SXM's comment): Llama-3.1-8B, vLLM, one request of
    # 1,024 in / 128 out on an A100 40 GB (1.555 TB/s): ~75 tok/s. The mid-decode context
    # is 1,024 + 64; the model gives 74.1 tok/s (−1.2 %).
    a100 = dataclasses.replace(H100_SXM, name="a100-40gb", hbm_bytes_per_s=1.555e12)
    t = step_time(ModelCost.from_config(load_config("llama-3.1-8b")), a100, [Chunk(1, 1088)], 1)
    assert 1 / t.seconds == pytest.approx(74.1, abs=0.1)
    assert abs(1 / t.seconds - 75) / 75 < 0.02


def test_h100_one_sequence() -> None:
    # (15,009,841,152 + 131,072 × 1,025) B / (3.35e12 × 0.78) + 1 ms = 6.796 ms.
    t = step_time(ModelCost.from_config(load_config("llama-3.1-8b")), H100_SXM, [Chunk(1, 1024)], 1)
    assert t.seconds == pytest.approx(1e-3 + (15_009_841_152 + 131_072 * 1025) / (3.35e12 * 0.78))
    assert t.seconds == pytest.approx(6.796e-3, abs=1e-6)


def test_fitted_step_hand_computed() -> None:
    # 2 ms + 10 µs × (3 + 1) tokens + 100 µs × 2 sequences + 1 µs × ((2 + 3) + (5 + 1)) cached
    # = 2 + 0.04 + 0.2 + 0.011 = 2.251 ms.
    fit = FittedStep("toy", base_s=2e-3, token_s=10e-6, seq_s=100e-6, kv_token_s=1e-6)
    assert fitted_step_time(fit, [Chunk(3, 2), Chunk(1, 5)]) == pytest.approx(2.251e-3)
    host = dataclasses.replace(fit, host_s=0.5e-3)  # + 0.5 ms of host time a step
    assert fitted_step_time(host, [Chunk(3, 2), Chunk(1, 5)]) == pytest.approx(2.751e-3)
    assert fitted_step_time(fit, []) == 0.0


@pytest.mark.parametrize(
    ("chunks", "ms"),
    [
        # one decode on 1,000 cached: 0.8 + 2.977 + 0.04415 + 0.1644 + 1,001 × 3.845e-6
        # = 3.9894 ms
        ([Chunk(1, 1000)], 3.9894),
        # a 1,024-token prefill: 0.8 + 2.977 + 45.2096 + 0.1644 + 0.0039 = 49.1549 ms
        ([Chunk(1024, 0)], 49.1549),
        # four decodes on 2,000 cached in all: 0.8 + 2.977 + 0.1766 + 0.6576 + 0.0077
        # = 4.6189 ms
        ([Chunk(1, 500)] * 4, 4.6189),
    ],
    ids=["one decode", "long prefill", "four decodes"],
)
def test_cpu_tiny_constants(chunks: list[Chunk], ms: float) -> None:
    assert fitted_step_time(CPU_TINY, chunks) * 1000 == pytest.approx(ms, abs=1e-3)


def test_pacer_repays_host_time_while_busy() -> None:
    # k = 10, absorb 10 ms, debt up to 200 ms. Step 1 starts at 100.0 after an idle gap of
    # 0.5 s: due = 100 − 0.010 + 10 × 0.007 = 100.060. Step 2 starts late, at 100.080 (the
    # sleep woke 20 ms late); busy, so due = 100.060 + 0.070 = 100.130, not 100.150: the
    # overrun is repaid. Step 3 at 100.131: 100.200.
    p = Pacer(10, absorb_s=0.010, max_debt_s=0.200, paced=True)
    assert p.due(100.0, 99.5, 0.007, continuous=False) == pytest.approx(100.060)
    assert p.due(100.080, 100.079, 0.007, continuous=True) == pytest.approx(100.130)
    assert p.due(100.131, 100.131, 0.007, continuous=True) == pytest.approx(100.200)
    assert p.resets == 0


def test_pacer_idle_gap_and_falling_behind() -> None:
    p = Pacer(10, absorb_s=0.010, max_debt_s=0.200, paced=True)
    p.due(100.0, 99.5, 0.007, continuous=False)  # due 100.060
    # idle gap (no request ran through it): host time since the last return counts up to
    # 10 ms: 100.500 − 0.003 + 0.070 = 100.567
    assert p.due(100.500, 100.497, 0.007, continuous=False) == pytest.approx(100.567)
    # busy but 300 ms behind the due time (> 200 ms): reset, counted
    assert p.due(100.867, 100.866, 0.007, continuous=True) == pytest.approx(100.936)
    assert p.resets == 1


def test_pacer_unpaced_sleeps_in_full() -> None:
    # a fitted step: the host's time runs before it, nothing absorbed or repaid
    p = Pacer(1, absorb_s=0.0, max_debt_s=0.0, paced=False)
    p.due(5.0, 4.0, 0.003, continuous=False)
    assert p.due(5.010, 5.004, 0.003, continuous=True) == pytest.approx(5.013)
    assert p.resets == 0
