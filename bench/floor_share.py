"""ICE's throughput as a share of the do-nothing gRPC floor, in one sitting, and its parts.

    .venv/bin/python bench/floor_share.py [--rounds 3] [--connections 8] [--duration 8]

Runs, one after the other and ``--rounds`` times over (alternating, so that a busy spell of
the machine falls on every configuration), each on its own Envoy (``envoy/bench.yaml``):

- ``floor``: ``bench/grpc_floor.py``, a do-nothing grpc.aio ext_proc server;
- ``floor + ICE's reply``: the same server answering every body with ICE's own body reply
  for the bench request (three verdict headers and the access log's dynamic metadata), to
  show what the *content* of ICE's answer costs Envoy;
- ``floor + judgement``: the floor running ICE's judgement of each message (the pipeline's
  header read, its body verdict, the reply's rendering; ``grpc_floor.py --judge``) and
  nothing else of ICE's;
- ``ICE``: ``bench/throughput.py`` (the real ``ice serve``, one worker).

Prints each configuration's median req/s, server CPU and Envoy CPU per request, and each as
a share of the floor's median req/s. The shares are the figure issue 48 asks for ("ICE ÷
the floor, in the same sitting"); the two middle rows split the gap into the answer's
content, the judgement, and the rest of ICE (its stream, commit, telemetry and workers).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable

_FLOOR = re.compile(
    r"ext_proc \(aio[^)]*\)\s+(\d+) req/s.*server CPU (\d+) µs/req\s+Envoy (\d+) µs/req"
)
_ICE_RPS = re.compile(r"^ICE\s+(\d+)\s+[\d.]+\s+[\d.]+\s+\d+\s+(\d+)", re.M)
_ICE_CPU = re.compile(r"ICE CPU (\d+) µs/request")


def ice_reply(path: Path) -> None:
    """Write ICE's body reply for the bench request (serialized) to ``path``."""
    sys.path.insert(0, str(HERE))
    import profile_hotpath as hot

    async def replies() -> list[bytes]:
        servicer, messages = hot.build()
        ctx = hot.FakeContext()
        return [r.SerializeToString() async for r in servicer.Process(hot._feed(messages), ctx)]

    path.write_bytes(asyncio.run(replies())[-1])


def run_floor(args: argparse.Namespace, extra: list[str]) -> tuple[float, float, float]:
    """The floor's last ext_proc run: req/s, server µs/req, Envoy µs/req."""
    argv = [PY, str(HERE / "grpc_floor.py"), "--connections", str(args.connections)]
    argv += ["--duration", str(args.duration), *extra]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True).stdout
    runs = [tuple(float(x) for x in m) for m in _FLOOR.findall(out)]
    if not runs:
        raise SystemExit(f"grpc_floor.py printed no ext_proc run:\n{out}")
    return max(runs)  # type: ignore[return-value]  # its faster of two runs, as ICE's best-of


def run_ice(args: argparse.Namespace) -> tuple[float, float, float]:
    """``bench/throughput.py``'s ICE route: req/s, ICE's µs/req, Envoy µs/req."""
    argv = [PY, str(HERE / "throughput.py"), "--connections", str(args.connections)]
    argv += ["--duration", str(args.duration), "--repeat", "2", "--settle", "0"]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=400, check=True).stdout
    rps, cpu = _ICE_RPS.search(out), _ICE_CPU.search(out)
    if rps is None or cpu is None:
        raise SystemExit(f"throughput.py printed no ICE run:\n{out}")
    return float(rps.group(1)), float(cpu.group(1)), float(rps.group(2))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--duration", type=int, default=8)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        reply = Path(tmp) / "ice_reply.bin"
        ice_reply(reply)
        configs = {
            "floor": lambda: run_floor(args, []),
            "floor + ICE's reply": lambda: run_floor(args, ["--reply", str(reply)]),
            "floor + judgement": lambda: run_floor(args, ["--judge"]),
            "ICE": lambda: run_ice(args),
        }
        got: dict[str, list[tuple[float, float, float]]] = {name: [] for name in configs}
        for r in range(args.rounds):
            for name, fn in configs.items():
                got[name].append(fn())
                rps, cpu, envoy = got[name][-1]
                print(f"round {r + 1} {name:<22}{rps:8.0f} req/s {cpu:6.0f} µs {envoy:6.0f} µs")
    floor = statistics.median(x[0] for x in got["floor"])
    print(f"\n{args.connections} connections, {args.rounds} rounds, medians:")
    print(f"{'':<22}{'req/s':>8}{'server µs/req':>15}{'Envoy µs/req':>14}{'÷ floor':>9}")
    for name, runs in got.items():
        rps, cpu, envoy = (statistics.median(x[i] for x in runs) for i in range(3))
        print(f"{name:<22}{rps:8.0f}{cpu:15.0f}{envoy:14.0f}{rps / floor:9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
