"""``run_demo``: pick the backend (``auto`` falls back to ``dev`` when vLLM is not ready)
and run its walkthrough, with SIGTERM / SIGHUP turned into Ctrl-C.

Invariant: the previous SIGTERM / SIGHUP handlers are restored on return; signal handlers
are only installed from the main thread.
"""

from __future__ import annotations

import signal
import threading
from typing import Any

from ext_proc.lab.demo.dev_walkthrough import _run_dev
from ext_proc.lab.demo.vllm_walkthrough import _run_vllm, vllm_unavailable

BACKENDS = ("auto", "vllm", "dev")


def run_demo(wait: bool = True, backend: str = "auto") -> int:
    """Run the demo on ``backend`` (one of ``BACKENDS``); the exit status."""
    if backend not in BACKENDS:
        raise ValueError(f"backend {backend!r} not in {BACKENDS}")
    # SIGTERM / SIGHUP end the demo like Ctrl-C, so that its processes (each in its own
    # session, out of reach of the terminal's signals) are stopped too.
    previous: dict[signal.Signals, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            previous[sig] = signal.signal(sig, _interrupt)
    try:
        if backend == "dev":
            return _run_dev(wait)
        why = vllm_unavailable()
        if why is not None:
            if backend == "vllm":
                print(f"ice demo: no vLLM backend: {why}")
                return 2
            print(f"vLLM backend not available: {why}.\nRunning the dev backend.\n")
            return _run_dev(wait)
        return _run_vllm(wait, fall_back=backend == "auto")
    except KeyboardInterrupt:
        print("\nstopped")
        return 130
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt
