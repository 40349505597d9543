"""The overload benchmark's arms against vLLM's own admission valve, without vLLM: parsing the
arms, grouping them by the vLLM they need, the sweep over those groups (one stack each), the
valve flags vLLM gets, the labels of the runs, and the command line (arguments, dry run,
output)."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from ext_proc.lab import vllm_local as vl
from ext_proc.lab.overload import (
    MIX,
    Arm,
    GroupRun,
    RunResult,
    Setup,
    Shot,
    SweepError,
    Valve,
    VllmGroup,
    arm_name,
    compare,
    estimate_s,
    group_arms,
    group_workdir,
    overload_setup,
    parse_arm,
    parse_arms,
    parse_limits,
    plan_burst,
    sweep,
    sweep_arms,
    valve_in_args,
    valve_reason,
)
from ext_proc.lab.overload import setup as setup_mod
from ext_proc.lab.overload.arms import short_reason, valve_sort_key

REPO = Path(__file__).resolve().parents[2]
REQS4 = Valve("reqs", 4)


@pytest.mark.parametrize(
    ("spec", "arm"),
    [
        ("direct", Arm("direct")),
        ("ice", Arm("ice")),
        ("queue", Arm("queue")),
        ("valve:reqs=4", Arm("direct", REQS4)),
        ("valve:tokens=2048", Arm("direct", Valve("tokens", 2048))),
        ("ice+valve:reqs=4", Arm("ice", REQS4)),
        ("queue+valve:tokens=512", Arm("queue", Valve("tokens", 512))),
        (" ice+valve:reqs=4 ", Arm("ice", REQS4)),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_arms_parse_and_their_names_parse_back(spec: str, arm: Arm) -> None:
    assert parse_arm(spec) == arm
    assert parse_arm(arm.name) == arm
    assert arm.name == spec.strip()


@pytest.mark.parametrize(
    "spec",
    [
        "both",
        "valve",
        "valve:",
        "valve:reqs",
        "valve:reqs=0",  # refuses everything, the warm-up too
        "valve:reqs=-1",
        "valve:reqs=4k",
        "valve:seqs=4",
        "direct+valve:reqs=4",  # that is valve:reqs=4
        "ice+reqs=4",
        "nope+valve:reqs=4",
        "ice+valve:reqs=4+tokens=2",
    ],
)
def test_bad_arms_are_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="bad arm"):
        parse_arm(spec)


def test_modes_are_arms_in_order_each_once() -> None:
    assert [a.name for a in parse_arms("direct,ice,valve:reqs=2,ice+valve:reqs=2")] == [
        "direct",
        "ice",
        "valve:reqs=2",
        "ice+valve:reqs=2",
    ]
    for bad in ("ice,ice", "valve:reqs=2,valve:reqs=2", "", " , ", "ice,valve:x=1"):
        with pytest.raises(ValueError, match="--modes"):
            parse_arms(bad)


def test_the_sweep_adds_one_arm_per_setting_and_front() -> None:
    arms = sweep_arms([2, 8], [1024], ["direct", "ice"])
    assert [a.name for a in arms] == [
        "valve:reqs=2",
        "ice+valve:reqs=2",
        "valve:reqs=8",
        "ice+valve:reqs=8",
        "valve:tokens=1024",
        "ice+valve:tokens=1024",
    ]
    assert sweep_arms([], [], ["direct"]) == []
    for fronts in (["both"], []):
        with pytest.raises(ValueError, match="--valve-with"):
            sweep_arms([2], [], fronts)


@pytest.mark.parametrize(
    ("spec", "limits"),
    [(None, []), ("", []), ("2,4,8", [2, 4, 8]), (" 16 , 2 ", [16, 2])],
)
def test_limits(spec: str | None, limits: list[int]) -> None:
    assert parse_limits(spec, "--valve-reqs") == limits


@pytest.mark.parametrize("spec", ["0", "2,0", "x", "2,2", ",", "-1"])
def test_bad_limits_are_refused(spec: str) -> None:
    with pytest.raises(ValueError, match="--valve-reqs"):
        parse_limits(spec, "--valve-reqs")


def test_arms_are_grouped_by_the_vllm_they_need() -> None:
    arms = parse_arms(
        "valve:tokens=2048,ice+valve:reqs=8,direct,valve:reqs=8,ice,valve:reqs=2,queue"
    )
    groups = group_arms(arms)
    # no valve first, then reqs by limit, then tokens; fronts in the order given
    assert groups == [
        VllmGroup(None, ("direct", "ice", "queue")),
        VllmGroup(Valve("reqs", 2), ("direct",)),
        VllmGroup(Valve("reqs", 8), ("ice", "direct")),
        VllmGroup(Valve("tokens", 2048), ("direct",)),
    ]
    assert [a.name for a in groups[2].arms] == ["ice+valve:reqs=8", "valve:reqs=8"]
    assert [g.name for g in groups] == ["no valve", "reqs=2", "reqs=8", "tokens=2048"]
    # the default arms: one group without a valve, as before valves existed
    assert group_arms(parse_arms("direct,ice")) == [VllmGroup(None, ("direct", "ice"))]
    with pytest.raises(ValueError, match="valve:reqs=2 repeated"):
        group_arms([*arms, *sweep_arms([2], [], ["direct"])])


def test_a_valve_is_its_vllm_flags() -> None:
    assert REQS4.vllm_args == ("--max-num-queued-reqs", "4")
    assert Valve("tokens", 2048).vllm_args == ("--max-num-queued-tokens", "2048")
    assert Valve.parse("tokens=2048") == Valve("tokens", 2048)
    with pytest.raises(ValueError, match="bad valve"):
        Valve("reqs", 0)
    assert arm_name("direct", "reqs=4") == "valve:reqs=4"
    assert arm_name("ice", "reqs=4") == "ice+valve:reqs=4"
    assert arm_name("ice") == "ice"
    assert sorted(["tokens=8", "reqs=16", "", "reqs=2"], key=valve_sort_key) == [
        "",
        "reqs=2",
        "reqs=16",
        "tokens=8",
    ]


@pytest.mark.parametrize(
    ("args", "found"),
    [
        (["--max-num-seqs", "4"], None),
        (["--max-num-queued-reqs", "4"], "--max-num-queued-reqs"),
        (["--max-num-queued-tokens=2048"], "--max-num-queued-tokens=2048"),
        (["--max_num_queued_reqs=2"], "--max_num_queued_reqs=2"),
        (["--max-num-queued"], None),
        ([], None),
    ],
)
def test_valve_flags_in_vllm_args_are_found(args: list[str], found: str | None) -> None:
    assert valve_in_args(args) == found


def test_a_503_says_which_valve_refused_it() -> None:
    # the messages of vllm/exceptions.py's QueueOverflowError and MaxQueuedTokensError, as
    # vLLM's error body carries them
    reqs = (
        '{"error":{"message":"The engine is currently busy and cannot accept new requests. '
        'Please try again later or on a different instance.","type":"Service Unavailable",'
        '"param":null,"code":503}}'
    )
    tokens = '{"error":{"message":"The engine has reached its prefill token backlog limit. "}}'
    assert valve_reason(reqs) == "reqs"
    assert valve_reason(tokens) == "tokens"
    assert valve_reason("upstream connect error or disconnect/reset before headers") == "-"
    assert valve_reason(None) == "-"
    assert short_reason("max_num_queued_reqs") == "reqs"
    assert short_reason("max_num_queued_tokens") == "tokens"
    assert short_reason("something_new") == "something_new"


# --- the stack and the sweep, with the processes faked ------------------------------------


def _setup(valve: Valve | None = None) -> Setup:
    return Setup(
        vllm_url="http://vllm",
        envoy_url="http://envoy",
        admin_port=1,
        model="tiny",
        stack=cast(Any, None),
        vllm=cast(Any, SimpleNamespace(startup_s=30.0)),
        ice_metrics_url="http://ice/metrics",
        valve=valve,
    )


def test_overload_setup_gives_vllm_the_valve_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[vl.ServeConfig] = []

    class Stop(Exception):
        pass

    @contextlib.contextmanager
    def fake_server(cfg: vl.ServeConfig, **kw: Any) -> Iterator[None]:
        seen.append(cfg)
        raise Stop
        yield

    monkeypatch.setattr(vl, "ensure_model", lambda *a, **k: None)
    monkeypatch.setattr(vl, "start_server", fake_server)
    with (
        pytest.raises(Stop),
        overload_setup(tmp_path, vllm_args=["--max-num-seqs", "8"], valve=REQS4),
    ):
        pass
    assert seen[0].extra_args == ("--max-num-seqs", "8", "--max-num-queued-reqs", "4")
    with pytest.raises(Stop), overload_setup(tmp_path):
        pass
    assert seen[1].extra_args == ()


def test_overload_setup_refuses_a_valve_hidden_in_vllm_args(tmp_path: Path) -> None:
    with (
        pytest.raises(ValueError, match="admission valve"),
        overload_setup(tmp_path, vllm_args=["--max-num-queued-reqs=4"]),
    ):
        pass


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """``compare`` with its runs recorded instead of sent."""
    seen: list[dict[str, Any]] = []

    async def fake_run(**kw: Any) -> RunResult:
        seen.append(kw)
        return RunResult(
            mode=kw["mode"],
            round=kw["round_no"],
            wall_s=1.0,
            preemptions=0,
            queue_time_mean_s=None,
            vllm_requests=0,
            waiting_max=0,
            running_max=0,
            kv_usage_max=0.0,
            ext_proc={},
            shots=[],
            variant=kw["variant"],
            valve=kw["valve"],
        )

    monkeypatch.setattr(setup_mod, "run_burst", fake_run)
    monkeypatch.setattr(setup_mod, "wait_idle", lambda url: None)
    return seen


def test_compare_labels_each_run_with_the_valve_of_its_vllm(calls: list[dict[str, Any]]) -> None:
    burst = plan_burst(2, 10, 10, 0, "standard=1")
    results = compare(_setup(REQS4), burst, rounds=2, modes=["direct", "ice"], progress=None)
    assert [r.label for r in results] == [
        "valve:reqs=4",
        "ice+valve:reqs=4",
        "ice+valve:reqs=4",
        "valve:reqs=4",
    ]
    assert {c["valve"] for c in calls} == {"reqs=4"}
    plain = compare(_setup(), burst, rounds=1, progress=None, seed_offset=0)
    assert [r.label for r in plain] == ["direct", "ice"]
    assert calls[-1]["valve"] == ""


def _record(groups: list[VllmGroup]) -> tuple[list[dict[str, Any]], list[dict[str, Any]], Any]:
    """A fake ``start`` and ``run`` for ``sweep``: what each got, and the runs they make."""
    started: list[dict[str, Any]] = []
    ran: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def start(workdir: Path, **kw: Any) -> Iterator[Setup]:
        started.append({"workdir": workdir, **kw})
        yield _setup(kw["valve"])

    def run(setup: Setup, burst: Any, **kw: Any) -> list[RunResult]:
        ran.append({"valve": setup.valve, **kw})
        if setup.valve == Valve("tokens", 99):
            raise RuntimeError("vllm serve exited with 2")
        name = setup.valve.name if setup.valve else ""
        return [
            RunResult(m, r + 1, 1.0, 0, None, 0, 0, 0, 0.0, {}, [], valve=name)
            for r in range(kw["rounds"])
            for m in kw["modes"]
        ]

    return started, ran, (start, run)


def test_sweep_starts_one_stack_per_vllm_config_in_turn(tmp_path: Path) -> None:
    groups = group_arms(parse_arms("direct,ice,valve:reqs=2,ice+valve:reqs=2,valve:tokens=512"))
    started, ran, (start, run) = _record(groups)
    burst = plan_burst(2, 10, 10, 0, "standard=1")
    done = sweep(
        tmp_path,
        groups,
        burst,
        rounds=3,
        progress=None,
        vllm_args=["--max-num-seqs", "8"],
        queue=True,
        start=start,
        run=run,
        policy=Path("p.yaml"),
        ice_workers=2,
    )
    assert [(s["workdir"], s["valve"]) for s in started] == [
        (tmp_path, None),  # where the bench kept its logs before valves
        (tmp_path / "vllm-reqs-2", Valve("reqs", 2)),
        (tmp_path / "vllm-tokens-512", Valve("tokens", 512)),
    ]
    # every stack: the same vLLM arguments, the queue ICE, the other set-up arguments
    assert all(s["vllm_args"] == ["--max-num-seqs", "8"] and s["queue"] for s in started)
    assert all(s["policy"] == Path("p.yaml") and s["ice_workers"] == 2 for s in started)
    assert [r["modes"] for r in ran] == [["direct", "ice"], ["direct", "ice"], ["direct"]]
    assert all(r["rounds"] == 3 for r in ran)
    # fresh prompt text in every group: group k's seeds are offset by 10,000,000 × k
    assert [r["seed_offset"] for r in ran] == [0, 10_000_000, 20_000_000]
    assert [g.vllm_args for g in done] == [
        ("--max-num-seqs", "8"),
        ("--max-num-seqs", "8", "--max-num-queued-reqs", "2"),
        ("--max-num-seqs", "8", "--max-num-queued-tokens", "512"),
    ]
    labels = [r.label for g in done for r in g.results]
    assert labels.count("ice+valve:reqs=2") == 3 and labels.count("valve:tokens=512") == 3
    assert done[1].record() == {
        "valve": "reqs=2",
        "arms": ["valve:reqs=2", "ice+valve:reqs=2"],
        "vllm_args": ["--max-num-seqs", "8", "--max-num-queued-reqs", "2"],
        "startup_s": 30.0,
        "workdir": str(tmp_path / "vllm-reqs-2"),
        "runs": 6,
    }


def test_a_failed_group_keeps_the_runs_of_the_groups_before_it(tmp_path: Path) -> None:
    groups = group_arms(parse_arms("direct,valve:tokens=99,valve:tokens=512"))
    started, _, (start, run) = _record(groups)
    with pytest.raises(SweepError, match="tokens=99") as exc:
        sweep(tmp_path, groups, [], rounds=1, progress=None, start=start, run=run)
    assert [g.group.name for g in exc.value.done] == ["no valve"]
    assert len(started) == 2  # the group after the failed one never started


def test_sweep_reports_each_vllm_coming_up(tmp_path: Path) -> None:
    groups = group_arms(parse_arms("direct,valve:reqs=2"))
    _, _, (start, run) = _record(groups)
    lines: list[str] = []
    sweep(tmp_path, groups, [], rounds=1, progress=lines.append, start=start, run=run)
    assert lines == ["[overload] vLLM up in 30.0 s", "[overload] vLLM (reqs=2) up in 30.0 s"]


def test_group_workdirs_and_the_time_estimate(tmp_path: Path) -> None:
    groups = group_arms(parse_arms("direct,ice,valve:reqs=2,valve:tokens=2048"))
    assert [group_workdir(tmp_path, g).name for g in groups] == [
        tmp_path.name,
        "vllm-reqs-2",
        "vllm-tokens-2048",
    ]
    burst = plan_burst(24, 870, 200, 250, MIX)  # the last start at 5.75 s
    # 3 vLLMs × 50 s + 3 rounds × 4 arms × (12 s + 5.75 s), and twice the runs with a control
    assert estimate_s(groups, 3, burst) == pytest.approx(150 + 12 * 17.75)
    assert estimate_s(groups, 3, burst, controls=1) == pytest.approx(150 + 24 * 17.75)


# --- the command line ---------------------------------------------------------------------


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_overload", REPO / "bench" / "overload.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def bench(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The bench with its sweep recorded: no process starts."""
    module = _bench()
    module.swept = []

    def fake_sweep(workdir: Path, groups: list[VllmGroup], burst: Any, **kw: Any) -> Any:
        module.swept.append({"groups": groups, "burst": burst, **kw})
        return [
            GroupRun(
                g,
                (),
                workdir,
                31.0,
                [
                    RunResult(
                        m,
                        1,
                        1.0,
                        0,
                        None,
                        0,
                        0,
                        0,
                        0.0,
                        {},
                        [Shot(0, "standard", 0.0, status=503, latency_s=0.01, error=_REQS_503)]
                        if g.valve
                        else [Shot(0, "standard", 0.0, status=200, latency_s=1.0, ttft_s=0.2)],
                        valve=g.valve.name if g.valve else "",
                        admission_rejections={"max_num_queued_reqs": 1} if g.valve else {},
                    )
                    for m in g.modes
                ],
            )
            for g in groups
        ]

    monkeypatch.setattr(module, "sweep", fake_sweep)
    monkeypatch.setattr(module, "overload_setup", lambda *a, **k: None)
    return module


_REQS_503 = '{"error":{"message":"... cannot accept new requests. ..."}}'


def test_the_default_invocation_runs_one_vllm_without_a_valve(
    bench: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main([]) == 0
    (call,) = bench.swept
    assert call["groups"] == [VllmGroup(None, ("direct", "ice"))]
    assert call["queue"] is False and call["rounds"] == 3
    assert call["start"] is bench.overload_setup
    assert [(p.prompt_tokens, p.max_tokens, p.at_s) for p in call["burst"][:2]] == [
        (870, 200, 0.0),
        (870, 200, 0.25),
    ]
    out = capsys.readouterr().out
    # as before valves: the per-run table first, no header, no valve columns
    assert out.startswith("|")
    assert "workload" not in out and "503" not in out and "valve" not in out


def test_a_valve_sweep_is_printed_arm_by_arm(
    bench: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--modes", "direct,ice,ice+valve:reqs=3", "--valve-reqs", "3,2"]
    argv += ["--valve-tokens", "2048", "--spacing-ms", "0"]
    assert bench.main(argv) == 0
    (call,) = bench.swept
    assert [g.name for g in call["groups"]] == ["no valve", "reqs=2", "reqs=3", "tokens=2048"]
    assert call["groups"][2].modes == ("ice", "direct")
    out = capsys.readouterr().out
    assert out.startswith("workload burst: ~870 prompt words + 200 output tokens each\n")
    assert "vLLM reqs=3 (--max-num-queued-reqs 3): ice+valve:reqs=3, valve:reqs=3" in out
    assert "runs on vLLM tokens=2048 (--max-num-queued-tokens 2048), up in 31.0 s:" in out
    totals = out[out.index("workload burst: arms × metrics") :]
    rows = [line.split("|")[1].strip() for line in totals.splitlines()[3:] if line.startswith("|")]
    assert rows == [
        "direct",
        "ice",
        "valve:reqs=2",
        "valve:reqs=3",
        "ice+valve:reqs=3",
        "valve:tokens=2048",
    ]
    heads = [c.strip() for c in totals.splitlines()[1].strip("|").split("|")]
    assert {"503", "503 reqs", "valve Δ reqs"} <= set(heads)


def test_the_mixed_workload_on_the_command_line(
    bench: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench.main(["--workload", "mixed", "--seed", "5", "--requests", "10"]) == 0
    burst = bench.swept[0]["burst"]
    assert sum(1 for p in burst if p.kind == "long") == 3
    assert burst == bench.plan_mixed(10, 250.0, MIX, None, seed=5)
    out = capsys.readouterr().out
    assert out.startswith("workload mixed (seed 5): 70% short: prompt 80–120 words")
    assert "plan: 10 requests 250 ms apart" in out and "short 7: prompt" in out


def test_dry_run_prints_the_plan_and_starts_nothing(
    bench: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--workload", "mixed", "--valve-reqs", "2,4", "--valve-with", "direct,ice"]
    assert bench.main([*argv, "--dry-run"]) == 0
    assert bench.swept == []
    out = capsys.readouterr().out.splitlines()
    assert out[2] == (
        "arms: direct, ice, valve:reqs=2, ice+valve:reqs=2, valve:reqs=4, ice+valve:reqs=4; "
        "3 rounds; TTFT SLO 2 s"
    )
    assert out[3:6] == [
        "vLLM without a valve: direct, ice",
        "vLLM reqs=2 (--max-num-queued-reqs 2): valve:reqs=2, ice+valve:reqs=2",
        "vLLM reqs=4 (--max-num-queued-reqs 4): valve:reqs=4, ice+valve:reqs=4",
    ]
    assert out[6].startswith("estimate: ~") and out[6].endswith("min (3 vLLM, 6 arms)")


def test_json_keeps_the_groups_the_plan_and_the_valve_numbers(
    bench: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    path = tmp_path / "out.json"
    assert bench.main(["--valve-reqs", "2", "--workload", "mixed", "--json", str(path)]) == 0
    data = json.loads(path.read_text())
    assert data["burst"]["workload"] == "mixed" and data["burst"]["seed"] == 1
    assert data["burst"]["mixed"]["long_share"] == 0.3
    assert len(data["burst"]["plan"]) == 24 and data["burst"]["plan"][0]["kind"] in {
        "short",
        "long",
    }
    assert [g["valve"] for g in data["burst"]["vllm_groups"]] == ["no valve", "reqs=2"]
    valve_run = next(r for r in data["runs"] if r["summary"]["valve"] == "reqs=2")
    assert valve_run["summary"]["refused_503_by_valve"] == {"reqs": 1}
    assert valve_run["summary"]["valve_rejections"] == {"reqs": 1}
    assert data["spread"]["valve:reqs=2"]["refused_503"]["max"] == 1.0


@pytest.mark.parametrize(
    "argv",
    [
        ["--modes", "direct,valve:reqs=0"],
        ["--valve-reqs", "0"],
        ["--valve-tokens", "x"],
        ["--valve-with", "both", "--valve-reqs", "2"],
        ["--modes", "direct,valve:reqs=2", "--valve-reqs", "2"],  # the same arm twice
        ["--vllm-arg=--max-num-queued-reqs=4"],  # a valve the arms would not name
        ["--workload", "mixed", "--prompt-tokens", "100"],
        ["--workload", "steady"],
    ],
)
def test_bad_valve_and_workload_arguments_are_refused_before_anything_starts(
    argv: list[str], bench: Any
) -> None:
    with pytest.raises(SystemExit) as exc:
        bench.main(argv)
    assert exc.value.code == 2
    assert bench.swept == []


@pytest.mark.parametrize(
    ("flag", "burn"), [(["--fake-pool"], False), (["--fake-pool", "burn"], True)]
)
def test_the_fake_pool_serves_every_group(
    bench: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, flag: list[str], burn: bool
) -> None:
    assert bench.main(["--modes", "direct", *flag]) == 0
    (call,) = bench.swept
    start = call["start"]
    assert start.func is bench.fake_pool_setup and start.keywords == {"burn": burn}
    seen: dict[str, Any] = {}

    @contextlib.contextmanager
    def setup(workdir: Path, **kw: Any) -> Iterator[str]:
        seen.update(kw, workdir=workdir)
        yield "setup"

    monkeypatch.setattr(bench, "overload_setup", setup)
    tiny = tmp_path / "tiny"  # the tiny model's tokenizer side only: nothing is built
    tiny.mkdir()
    (tiny / "config.json").write_text(
        json.dumps({"vocab_size": 4096, "bos_token_id": 0, "eos_token_id": 1, "pad_token_id": 3})
    )
    (tiny / vl.MODEL_STAMP).write_text("{}")
    monkeypatch.setattr(bench, "serve_config", functools.partial(bench.serve_config, tiny_dir=tiny))
    with start(tmp_path, queue=False) as got:
        assert got == "setup"
    cfg = seen["serve"]
    assert (cfg.num_gpu_blocks, cfg.block_size, cfg.max_model_len) == (24, 128, 2048)
    assert "ext_proc.lab.gpupool.executor.FakeGPUExecutor" in cfg.extra_args
    spec = json.loads(Path(dict(cfg.env)["ICE_GPUPOOL_SPEC"]).read_text())
    assert spec["burn"] is burn and spec["step"]["name"] == "cpu-tiny"
    assert seen["queue"] is False and seen["workdir"] == tmp_path


def test_without_the_flag_the_tiny_model_serves(bench: Any) -> None:
    assert bench.main(["--modes", "direct"]) == 0
    assert bench.swept[0]["start"] is bench.overload_setup
