"""``ice plan`` (ext_proc.kv.cli): outputs, and exit 2 naming the field for bad inputs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ext_proc.kv.cli import main

DATA = Path(__file__).parents[1] / "data" / "kv"
LLAMA = str(DATA / "llama-3.1-8b.json")


def _json(capsys: pytest.CaptureFixture[str], argv: list[str]) -> dict[str, Any]:
    assert main([*argv, "--json"]) == 0
    out: dict[str, Any] = json.loads(capsys.readouterr().out)
    return out


def test_json_for_the_public_llama_log(capsys: pytest.CaptureFixture[str]) -> None:
    # The RTX 3090 start-up of vLLM issue 10517: 1952 blocks (4,093,640,704 B is the low end
    # of the exact range), 1.56x for 20,000 tokens.
    out = _json(
        capsys,
        [
            "--config",
            LLAMA,
            "--kv-memory",
            "4093640704",
            "--max-model-len",
            "20000",
            "--avg-seq-len",
            "3000",
        ],
    )
    assert out["bytes_per_token"] == 131_072
    assert out["bytes_per_block"] == 2_097_152
    assert out["num_blocks"] == 1952
    assert out["kv_cache_tokens"] == 31_232
    assert out["max_concurrency"] == pytest.approx(1.5616)
    assert out["max_concurrency_printed"] == "1.56x"
    assert out["bytes_needed_for_max_model_len"] == 1250 * 2_097_152
    assert out["estimated_max_model_len"] == 1951 * 16
    assert out["max_num_seqs_safe"] == 10  # 1951 // ceil(3000 / 16) = 1951 // 188
    assert out["fragmentation"] == pytest.approx(8 / 3008)
    # 2 × 10 safe sequences; one full cache, 1952 × 16 = 31,232 tokens
    assert out["valve"] == {"max_num_queued_reqs": 20, "max_num_queued_tokens": 31_232}
    assert out["geometry"]["kv_heads_per_rank"] == 8
    assert out["geometry"]["groups"] == [{"sliding_window": None, "num_layers": 32}]


def test_numbers_gpu_memory_and_lengths(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    lengths = tmp_path / "lengths.txt"
    lengths.write_text("# prompt+output\n1\n16\n\n17\n100  # long one\n")
    out = _json(
        capsys,
        [
            "--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--dtype", "bfloat16",
            "--gpu-memory", "80GiB", "--gpu-memory-utilization", "0.9",
            "--non-kv-memory", "17GiB", "--max-model-len", "32768", "--lengths", str(lengths),
        ],
    )  # fmt: skip
    # floor(80 GiB × 0.9) − 17 GiB = 59,055,800,320 B; // 2 MiB = 28,160 blocks.
    assert out["available_kv_bytes"] == 59_055_800_320
    assert out["num_blocks"] == 28_160
    assert out["fragmentation"] == pytest.approx(42 / 176)
    assert out["max_num_seqs_safe"] == 28_159 * 4 // 11


def test_config_max_model_len_and_block_override(capsys: pytest.CaptureFixture[str]) -> None:
    # No --max-model-len: Llama-3.1's 131,072 (llama3 RoPE adds no factor); 8192 blocks.
    out = _json(capsys, ["--config", LLAMA, "--num-gpu-blocks-override", "8192"])
    assert out["max_model_len"] == 131_072
    assert out["num_blocks"] == 8192
    assert out["available_kv_bytes"] is None
    assert out["max_concurrency"] == 1.0


def test_table(capsys: pytest.CaptureFixture[str]) -> None:
    cfg = str(DATA / "gemma-3-27b-it.json")
    assert main(["--config", cfg, "--kv-memory", "40GiB", "--avg-seq-len", "2000"]) == 0
    out = capsys.readouterr().out
    assert "62 layers (10 full, 52 sliding W=1024)" in out
    assert "2.81x (11,654 blocks per request)" in out
    assert "config.json: max_position_embeddings" in out
    assert "32,768" in out  # blocks


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        ([], "layers"),
        (
            [
                "--layers",
                "32",
                "--kv-heads",
                "8",
                "--dtype",
                "bf16",
                "--kv-memory",
                "1GiB",
                "--max-model-len",
                "100",
            ],
            "head_dim",
        ),
        (["--config", LLAMA, "--layers", "32", "--kv-memory", "1GiB"], "layers"),
        (["--config", LLAMA, "--kv-memory", "3.81 GiBs"], "kv_memory"),
        (["--config", LLAMA, "--kv-memory", "1GiB", "--gpu-memory", "80GiB"], "kv_memory"),
        (["--config", LLAMA], "kv_memory"),
        (["--config", LLAMA, "--gpu-memory", "80GiB"], "gpu_memory_utilization"),
        (
            ["--config", LLAMA, "--gpu-memory", "80GiB", "--gpu-memory-utilization", "0.9"],
            "non_kv_memory",
        ),
        (
            [
                "--config",
                LLAMA,
                "--gpu-memory",
                "80GiB",
                "--gpu-memory-utilization",
                "0.5",
                "--non-kv-memory",
                "40GiB",
            ],
            "kv_memory",
        ),
        (["--config", LLAMA, "--kv-memory", "1GiB", "--tp", "3"], "tp"),
        (["--config", LLAMA, "--kv-memory", "1GiB", "--kv-dtype", "fp4"], "kv_dtype"),
        (["--config", LLAMA, "--kv-memory", "1GiB", "--block-size", "0"], "block_size"),
        (["--config", LLAMA, "--kv-memory", "1GiB", "--avg-seq-len", "200000"], "avg_seq_len"),
        (["--config", LLAMA, "--kv-memory", "1GiB", "--max-model-len", "0"], "max_model_len"),
        (
            [
                "--layers",
                "2",
                "--kv-heads",
                "2",
                "--head-dim",
                "64",
                "--kv-memory",
                "1GiB",
                "--max-model-len",
                "100",
            ],
            "dtype",
        ),
        (["--config", str(DATA / "hybrid-jamba.json"), "--kv-memory", "1GiB"], "model_type"),
        (["--config", str(DATA / "missing.json"), "--kv-memory", "1GiB"], "config"),
        (["--config", str(DATA / "README.md"), "--kv-memory", "1GiB"], "config"),
        (
            ["--config", LLAMA, "--kv-memory", "1GiB", "--lengths", str(DATA / "README.md")],
            "lengths",
        ),
        (
            ["--config", LLAMA, "--kv-memory", "1GiB", "--data-parallel-size", "0"],
            "data_parallel_size",
        ),
    ],
    ids=[
        "nothing",
        "no-head-dim",
        "config-and-numbers",
        "bad-size",
        "two-memory-forms",
        "no-memory",
        "no-util",
        "no-non-kv",
        "nothing-left",
        "tp-not-dividing",
        "bad-kv-dtype",
        "block-size-zero",
        "avg-over-max-len",
        "max-len-zero",
        "auto-without-dtype",
        "hybrid-model",
        "missing-config",
        "not-json",
        "bad-lengths-file",
        "dp-zero",
    ],
)
def test_bad_inputs_exit_2_naming_the_field(
    capsys: pytest.CaptureFixture[str], argv: list[str], field: str
) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"ice plan: {field}: "), err
    assert err.count("\n") == 1


def test_argparse_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--tp", "two"]) == 2
    assert "--tp" in capsys.readouterr().err
    assert main(["--help"]) == 0


def test_command_imports_only_the_standard_library() -> None:
    code = (
        "import sys, ext_proc.kv.cli; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in "
        "{'grpc','google','yaml','prometheus_client','aiohttp','envoy','xds'}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


NUMBERS = ["--layers", "2", "--kv-heads", "2", "--head-dim", "64", "--dtype", "bf16"]


def test_capacity_without_max_model_len_is_printed_and_the_rest_left_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # bytes per token = 2 (K, V) × 2 layers × 2 heads × 64 × 2 B = 1,024; a block of 16
    # tokens = 16,384 B; 1 GiB / 16,384 = 65,536 blocks = 1,048,576 token slots
    assert main([*NUMBERS, "--kv-memory", "1GiB"]) == 0
    out = capsys.readouterr().out
    assert "65,536" in out and "1,048,576 tokens" in out
    rows = [line.split("  ")[0] for line in out.splitlines()]
    assert "max concurrency" not in rows and "left out" in out
    assert main([*NUMBERS, "--kv-memory", "1GiB", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert (data["num_blocks"], data["kv_cache_tokens"], data["bytes_per_block"]) == (
        65536,
        1048576,
        16384,
    )
    for key in ("max_model_len", "max_concurrency", "blocks_per_request", "fits_max_model_len"):
        assert data[key] is None


README_PLAN = [
    *("--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--kv-dtype", "bf16"),
    *("--kv-memory", "3.8125GiB", "--max-model-len", "20000", "--avg-seq-len", "2000"),
]


def _row(line: str) -> tuple[str, str]:
    key, _, value = line.partition("  ")
    return key, value.strip()


def test_valve_rows_of_the_readme_example(capsys: pytest.CaptureFixture[str]) -> None:
    # 1952 blocks; avg 2000 → 125 blocks, 1951 // 125 = 15 safe → 2 × 15 = 30; 1952 × 16.
    assert main(README_PLAN) == 0
    rows = dict(_row(line) for line in capsys.readouterr().out.splitlines())
    assert rows["safe max_num_seqs"] == "15"
    assert (
        rows["vLLM valve (behind ICE)"] == "--max-num-queued-reqs 30 --max-num-queued-tokens 31232"
    )
    assert rows["valve rule"] == (
        "2 × 15 safe sequences (a full batch running, one waiting); "
        "one full cache of prompts (31,232 tokens)"
    )


def test_valve_over_data_parallel_ranks(capsys: pytest.CaptureFixture[str]) -> None:
    # 2 ranks behind one API server: 2 × 2 × 15 = 60, 2 × 31,232 = 62,464.
    out = _json(capsys, [*README_PLAN, "--dp", "2"])
    assert out["valve"] == {"max_num_queued_reqs": 60, "max_num_queued_tokens": 62_464}
    assert out["max_num_seqs_safe"] == 15  # the per-rank figures stay per rank
    assert main([*README_PLAN, "--data-parallel-size", "2"]) == 0
    rows = dict(_row(line) for line in capsys.readouterr().out.splitlines())
    assert rows["valve rule"].startswith("2 × 2 ranks × 15 safe sequences")
    assert rows["valve rule"].endswith("2 ranks × one full cache of prompts (31,232 tokens)")


def test_valve_without_a_sequence_length_leaves_the_request_count_out(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Only max_model_len: 2 × max(1, 1951 // 1250) = 2 would refuse ordinary traffic behind
    # ICE, so no figure; the token figure needs no length.
    argv = README_PLAN[:-2]  # without --avg-seq-len 2000
    assert main(argv) == 0
    rows = dict(_row(line) for line in capsys.readouterr().out.splitlines())
    assert rows["vLLM valve (behind ICE)"] == "--max-num-queued-tokens 31232"
    assert rows["valve rule"].startswith("reqs left out (give --avg-seq-len or --lengths); ")
    out = _json(capsys, argv)
    assert out["valve"] == {"max_num_queued_reqs": None, "max_num_queued_tokens": 31_232}


def test_valve_of_a_sliding_only_model_without_max_model_len(
    capsys: pytest.CaptureFixture[str],
) -> None:
    argv = [*NUMBERS, "--sliding-window", "64", "--kv-memory", "1GiB"]
    out = _json(capsys, argv)
    assert out["valve"] == {"max_num_queued_reqs": None, "max_num_queued_tokens": None}
    assert main(argv) == 0
    rows = dict(_row(line) for line in capsys.readouterr().out.splitlines())
    assert rows["vLLM valve (behind ICE)"] == "n/a"
    assert "tokens left out (sliding-window-only model: give --max-model-len" in rows["valve rule"]
