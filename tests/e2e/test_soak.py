"""60 seconds of ``bench/soak.py``: mixed traffic, a flapping pool, an ICE worker killed; ICE's
file descriptors do not grow, every request outside the kill gets a verdict, and the mix
really holds passes, downgrades, truncations, 429s, 400s and 415s."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import yaml

from .harness import load_bench, running_stack

soak = load_bench("soak")


def test_a_minute_of_mixed_traffic_leaks_no_descriptor_and_loses_no_verdict(
    tmp_path: Path,
) -> None:
    truncation = yaml.safe_dump({"truncation": soak.TRUNCATION}, sort_keys=False)
    extra = "".join(f"    {line}\n" for line in truncation.splitlines())
    with running_stack(tmp_path, workers=2, profile_extra=extra) as e2e:
        ice_pid = e2e.stack.procs["ice"].pid
        killed: list[int] = []

        def kill_worker() -> None:
            children = [
                int(c)
                for task in Path(f"/proc/{ice_pid}/task").glob("*")
                for c in (task / "children").read_text().split()
            ]
            workers = [p for p in children if soak.tb.role(p, ice_pid) == "worker"]
            os.kill(workers[-1], signal.SIGKILL)
            killed.append(workers[-1])

        backend = f"http://127.0.0.1:{e2e.backend_port}"
        result = soak.run(e2e.envoy_port, backend, ice_pid, 60, 25, 10, None, kill_worker)
        assert killed, "the worker kill did not happen"
        assert e2e.stack.procs["ice"].poll() is None
        assert result.sent > 1000
        assert result.unjudged == 0, result
        assert result.flap_failures == 0
        statuses = set(result.by_status)
        assert {"200", "400", "415", "429"} <= statuses, statuses
        decisions = set(result.by_decision)
        assert {"pass", "downgrade", "truncate", "reject"} <= decisions, decisions
        samples = result.samples
        assert len(samples) >= 4
        # descriptors once warm (second sample) against the last: no growth beyond a few
        # (a worker restarted in between opens its own again)
        assert samples[-1].fds <= samples[1].fds + 8, [s.fds for s in samples]
