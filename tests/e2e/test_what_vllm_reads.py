"""ICE charges what vLLM will actually do, through real Envoy and ICE with the e2e policy:
samples share prompt blocks only when vLLM reads its prefix cache for the request, and a WAV
costs the audio its decoder will play, whatever its header claims."""

from __future__ import annotations

import base64
import struct
from typing import Any

import pytest

from .harness import CHAT, COMPLETIONS, E2E, IDLE, KV_TIGHT

# -- sharing: KV_TIGHT is 90 free blocks of 16; the dev backend caches prefixes, no hits yet

PROMPT = list(range(1, 65))  # 64 token ids: 4 full blocks of 16


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        # shared: c = ceil((64 + O) / 16), a sibling c − floor(63 / 16) = c − 3:
        # c + 3 × (c − 3) = 4c − 9 ≤ 90 → c ≤ 24 → O = 24 × 16 − 64 = 320
        ({}, 320),
        # vLLM reads no cached block: 4c ≤ 90 → c ≤ 22 → O = 22 × 16 − 64 = 288
        ({"prompt_logprobs": 0}, 288),
        ({"echo": True, "logprobs": 1}, 288),
    ],
    ids=["shared", "prompt_logprobs", "echo-logprobs"],
)
def test_samples_share_prompt_blocks_only_when_vllm_reads_the_cache(
    stack: E2E, extra: dict[str, Any], expected: int
) -> None:
    stack.set_state(KV_TIGHT, level="low")
    body = {"prompt": PROMPT, "n": 4, "max_tokens": 1000, **extra}
    reply = stack.post(COMPLETIONS, body)
    assert reply.status == 200, reply
    assert reply.header("x-ice-reason") == "kv_free_blocks"
    assert stack.only_received().json()["max_tokens"] == expected


# -- a WAV whose header lies about its data size


def wav(seconds: int, data_size: int | None = None) -> bytes:
    """8 kHz, mono, 8-bit PCM (one byte a frame); ``data_size``: what the header claims."""
    data = b"\x80" * (8000 * seconds)
    fmt = struct.pack("<HHIIHH", 1, 1, 8000, 8000, 1, 8)
    size = len(data) if data_size is None else data_size
    body = b"WAVEfmt " + struct.pack("<I", len(fmt)) + fmt + b"data" + struct.pack("<I", size)
    return b"RIFF" + struct.pack("<I", len(body) + len(data)) + body + data


def audio_chat(audio: bytes) -> dict[str, Any]:
    part = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(audio).decode(), "format": "wav"},
    }
    content = [{"type": "text", "text": "Transcribe this."}, part]
    return {
        "model": "dev-model",
        "messages": [{"role": "user", "content": content}],
        "max_tokens": 16,
    }


def test_a_wav_whose_header_says_no_data_is_charged_all_it_plays(stack: E2E) -> None:
    # 600 s at 25 tokens/s = 15,000 tokens > max_model_len 8,192: the honest header is refused;
    # so is the one that says its data is 0 bytes (FFmpeg, vLLM's first decoder, plays all
    # 600 s of it); it was charged 1 token before.
    stack.set_state(IDLE, level="low")
    honest = stack.post(CHAT, audio_chat(wav(600)))
    assert honest.status == 400, honest
    assert honest.header("x-ice-reason") == "context_length_exceeded"
    lying = stack.post(CHAT, audio_chat(wav(600, data_size=0)))
    assert lying.status == 400, lying
    assert lying.header("x-ice-reason") == "context_length_exceeded"
    assert stack.received() == []
