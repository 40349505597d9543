"""names.py: the mapping table stays consistent with the records it fills."""

from __future__ import annotations

import dataclasses

import pytest

from ext_proc.signals import names as N
from ext_proc.signals.scrapes import EngineScrape, GpuScrape

ENGINE_FIELDS = {f.name for f in dataclasses.fields(EngineScrape)}
GPU_FIELDS = {f.name for f in dataclasses.fields(GpuScrape)}


@pytest.mark.parametrize("kind", N.ENGINE_KINDS)
def test_every_engine_field_is_a_record_field(kind: str) -> None:
    for field, names in N.ENGINE_NAMES[kind].items():
        assert field in N.HOW
        assert field in ENGINE_FIELDS or field == "cache_config"
        assert names and all(n.startswith(N.KIND_PREFIX[kind]) for n in names)
        if N.HOW[field] == "counter":
            assert all(n.endswith("_total") for n in names), field


def test_v1_names_come_before_legacy_ones() -> None:
    vllm = N.ENGINE_NAMES["vllm"]
    assert vllm["kv_cache_usage"] == ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
    assert vllm["prefix_cache_hits_tokens"][0] == "vllm:prefix_cache_hits_total"
    assert vllm["prefix_cache_queries_tokens"][1] == "vllm:gpu_prefix_cache_queries_total"


def test_gpu_table() -> None:
    assert set(N.GPU_NAMES) - {"fb_reserved_bytes"} <= GPU_FIELDS
    assert set(N.GPU_NAMES) == set(N.GPU_SCALE)
    assert set(N.GPU_LABELS) <= GPU_FIELDS
    assert N.GPU_SCALE["fb_used_bytes"] == 2**20 and N.GPU_SCALE["gpu_util"] == 0.01
    assert N.GPU_LABELS["pod"] == ("exported_pod", "pod")


def test_sample_names() -> None:
    names = N.sample_names("vllm")
    assert names["vllm:time_to_first_token_seconds_bucket"] == "vllm:time_to_first_token_seconds"
    assert names["vllm:num_preemptions_total"] == "vllm:num_preemptions_total"
    assert "vllm:time_to_first_token_seconds" not in names
    assert N.sample_names("dcgm")["DCGM_FI_DEV_FB_USED"] == "DCGM_FI_DEV_FB_USED"
