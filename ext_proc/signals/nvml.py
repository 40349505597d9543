"""Local GPUs through NVML (``pynvml`` from the ``nvidia-ml-py`` package): the I/O edge.

Job: ``NvmlSource.read(at_s)`` → one ``GpuScrape`` per GPU this host's driver sees, with
framebuffer used/free/total (bytes), GPU utilisation (fraction) and PCIe throughput
(``nvmlDeviceGetPcieThroughput``: KB/s × 1024 → bytes/s). ``ice signals nvml`` prints it; a
pool with ``local_gpus: nvml`` has the collector poll it through ``NvmlReader`` (a thread).

Invariants:
- ``read`` never raises. Without the package, the library or a driver (as on a CPU machine)
  ``available()`` is False and ``reason`` says why; ``read`` then returns ``[]``. ``poll``
  (the collector's call) raises ``NvmlUnavailable`` instead, and after a failed start tries
  NVML again at the next call.
- A query a GPU does not support leaves that field None; the GPU is still reported.
- Cost: NVML samples PCIe throughput over 20 ms per call and direction, so a read takes about
  40 ms per GPU with ``pcie=True``; run it off the event loop (a thread) or pass
  ``pcie=False`` to skip those two fields.

``module`` lets tests hand in a stand-in for ``pynvml`` (a GPU cannot exist in a test).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import math
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from ext_proc.signals.scrapes import GpuScrape

__all__ = ["NvmlReader", "NvmlSource", "NvmlUnavailable"]


class NvmlUnavailable(OSError):
    """NVML cannot be read here: no nvidia-ml-py, no NVML library or driver, or no GPU list."""


def _text(value: object) -> str | None:
    if value is None:
        return None
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


def _number(value: Any, attr: str | None = None, scale: float = 1.0) -> float | None:
    """``float(value.attr) * scale``, or None when that is not a number."""
    try:
        number = float(getattr(value, attr) if attr else value) * scale
    except Exception:
        return None
    return number if math.isfinite(number) else None


class NvmlSource:
    """The GPUs of this host. Initialises NVML on first use; ``close`` shuts it down."""

    def __init__(self, source: str = "nvml", *, module: Any = None, pcie: bool = True) -> None:
        self.source = source
        self._module = module
        self._pcie = pcie
        self._nvml: Any = None
        self._tried = False
        self.reason: str | None = None  # why NVML is unavailable, once known

    def available(self) -> bool:
        """Whether NVML answers on this host (tries once; ``reason`` tells why not)."""
        if not self._tried:
            self._tried = True
            self._nvml = self._init()
        return self._nvml is not None

    def _init(self) -> Any:
        nvml = self._module
        if nvml is None:
            try:
                nvml = importlib.import_module("pynvml")
            except Exception as e:  # ImportError, or a broken install
                self.reason = f"pynvml (nvidia-ml-py) is not installed: {e!s:.200}"
                return None
        try:
            nvml.nvmlInit()
        except Exception as e:  # NVMLError_LibraryNotFound, _DriverNotLoaded, OSError, ...
            self.reason = f"NVML unavailable: {e!s:.200}"
            return None
        return nvml

    def _call(self, function: str, *args: Any) -> Any:
        """``pynvml.<function>(*args)``, or None when it fails (NVMLError_NotSupported,
        _GpuIsLost, a function this pynvml lacks, ...): the field is then unknown."""
        try:
            return getattr(self._nvml, function)(*args)
        except Exception:
            return None

    def read(self, at_s: float) -> list[GpuScrape]:
        """One GpuScrape per GPU; ``[]`` when NVML is unavailable or the device list fails."""
        if not self.available():
            return []
        self.reason = None
        count = _number(self._call("nvmlDeviceGetCount"))
        if count is None:
            self.reason = "nvmlDeviceGetCount failed"
            return []
        host = socket.gethostname()
        out = []
        for i in range(int(count)):
            handle = self._call("nvmlDeviceGetHandleByIndex", i)
            if handle is not None:
                out.append(self._device(handle, str(i), host, at_s))
        return out

    def poll(self, at_s: float) -> list[GpuScrape]:
        """``read``, raising ``NvmlUnavailable(reason)`` where ``read`` would return ``[]``
        with a reason. Blocking (see the cost above): call it from a thread."""
        gpus = self.read(at_s)
        if self.reason is None:
            return gpus
        reason = self.reason
        if self._nvml is None:
            self._tried = False  # start NVML again next time: a driver may have come up
        raise NvmlUnavailable(reason)

    def _device(self, handle: Any, gpu: str, host: str, at_s: float) -> GpuScrape:
        mem = self._call("nvmlDeviceGetMemoryInfo", handle)
        util = self._call("nvmlDeviceGetUtilizationRates", handle)
        tx = rx = None
        if self._pcie:
            tx_code = getattr(self._nvml, "NVML_PCIE_UTIL_TX_BYTES", 0)
            rx_code = getattr(self._nvml, "NVML_PCIE_UTIL_RX_BYTES", 1)
            tx = _number(self._call("nvmlDeviceGetPcieThroughput", handle, tx_code), scale=1024)
            rx = _number(self._call("nvmlDeviceGetPcieThroughput", handle, rx_code), scale=1024)
        return GpuScrape(
            source=self.source,
            at_s=at_s,
            gpu=gpu,
            uuid=_text(self._call("nvmlDeviceGetUUID", handle)),
            host=host,
            model_name=_text(self._call("nvmlDeviceGetName", handle)),
            fb_used_bytes=_number(mem, "used"),
            fb_free_bytes=_number(mem, "free"),
            fb_total_bytes=_number(mem, "total"),
            gpu_util=_number(util, "gpu", scale=0.01),
            pcie_tx_bytes_s=tx,
            pcie_rx_bytes_s=rx,
        )

    def close(self) -> None:
        """Shut NVML down (if it was started); never raises."""
        if self._nvml is not None:
            nvml, self._nvml = self._nvml, None
            with contextlib.suppress(Exception):  # already shut down, or the driver is gone
                nvml.nvmlShutdown()
        self._tried = False


class NvmlReader:
    """Polls an ``NvmlSource`` off the event loop: one worker thread and at most one read in
    flight, so a driver call that hangs holds that thread and never starts a second one."""

    def __init__(self, source: NvmlSource) -> None:
        self.source = source
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ice-nvml")
        self._pending: asyncio.Future[list[GpuScrape]] | None = None

    def read(self) -> asyncio.Future[list[GpuScrape]]:
        """The read in flight, or a new one: ``source.poll(time.monotonic())`` in the thread.
        Await it through ``asyncio.shield`` to bound the wait without losing the read."""
        if self._pending is None or self._pending.done():
            loop = asyncio.get_running_loop()
            self._pending = loop.run_in_executor(self._executor, self._poll)
        return self._pending

    def _poll(self) -> list[GpuScrape]:
        return self.source.poll(time.monotonic())

    def close(self) -> None:
        """Shut NVML down after any read in flight; never waits for it."""
        self._executor.submit(self.source.close)
        self._executor.shutdown(wait=False)
