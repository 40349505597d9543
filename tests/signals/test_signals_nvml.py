"""nvml.py with a hand-written stand-in for pynvml (no GPU exists in a test)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from ext_proc.signals.nvml import NvmlReader, NvmlSource, NvmlUnavailable
from ext_proc.signals.scrapes import GpuScrape
from tests.builders import GIB, H200, FakeNvml, FakeNVMLError
from tests.builders import GpuMem as _Mem

OLD = {  # an older board through an older pynvml: bytes strings, no PCIe counters
    "uuid": b"GPU-bbbb",
    "name": b"Tesla T4",
    "mem": _Mem(total=16 * GIB, free=16 * GIB, used=0),
    "util": FakeNVMLError("Not Supported"),
    "tx": FakeNVMLError("Not Supported"),
    "rx": FakeNVMLError("Not Supported"),
}


def test_reads_every_gpu_in_ice_units() -> None:
    fake = FakeNvml(devices=[H200, OLD])
    src = NvmlSource("node-1", module=fake)
    assert src.available() and src.reason is None
    a, b = src.read(12.5)
    assert (a.source, a.at_s, a.gpu, a.uuid, a.model_name) == (
        "node-1",
        12.5,
        "0",
        "GPU-aaaa",
        "NVIDIA H200",
    )
    assert (a.fb_total_bytes, a.fb_free_bytes, a.fb_used_bytes) == (141 * GIB, 41 * GIB, 100 * GIB)
    assert a.gpu_util == pytest.approx(0.87)
    assert (a.pcie_tx_bytes_s, a.pcie_rx_bytes_s) == (2048 * 1024, 1000 * 1024)  # KB/s → B/s
    assert a.host  # this host's name
    assert (b.gpu, b.uuid, b.model_name, b.fb_used_bytes) == ("1", "GPU-bbbb", "Tesla T4", 0.0)
    assert (b.gpu_util, b.pcie_tx_bytes_s, b.pcie_rx_bytes_s) == (None, None, None)


def test_pcie_can_be_skipped() -> None:
    fake = FakeNvml(devices=[H200])
    (g,) = NvmlSource(module=fake, pcie=False).read(0.0)
    assert (g.pcie_tx_bytes_s, g.pcie_rx_bytes_s) == (None, None)
    assert not any(c.startswith("pcie") for c in fake.calls)


def test_init_failure_is_reported_not_raised() -> None:
    fake = FakeNvml(devices=[H200], init_error=FakeNVMLError("Driver Not Loaded"))
    src = NvmlSource(module=fake)
    assert src.read(0.0) == []
    assert not src.available()
    assert src.reason == "NVML unavailable: Driver Not Loaded"
    assert fake.calls == ["init"]  # tried once


def test_device_count_failure() -> None:
    src = NvmlSource(module=FakeNvml(devices=[], count_error=FakeNVMLError("Unknown Error")))
    assert src.read(0.0) == []
    assert src.reason == "nvmlDeviceGetCount failed"


def test_a_module_missing_functions_gives_unknown_fields() -> None:
    class Bare:
        def nvmlInit(self) -> None:
            pass

        def nvmlDeviceGetCount(self) -> int:
            return 1

        def nvmlDeviceGetHandleByIndex(self, i: int) -> object:
            return object()

    (g,) = NvmlSource(module=Bare()).read(0.0)
    assert (g.gpu, g.uuid, g.fb_used_bytes, g.gpu_util, g.pcie_tx_bytes_s) == (
        "0",
        None,
        None,
        None,
        None,
    )


def test_close_shuts_nvml_down_and_allows_a_new_start() -> None:
    fake = FakeNvml(devices=[H200])
    src = NvmlSource(module=fake)
    src.read(0.0)
    src.close()
    src.close()
    assert fake.calls.count("shutdown") == 1
    assert src.available() and fake.calls.count("init") == 2


def test_the_real_pynvml_on_this_machine_never_raises() -> None:
    """Where there is no GPU (CI) NVML reports itself unavailable with a reason."""
    src = NvmlSource()
    gpus = src.read(0.0)
    if not src.available():
        assert gpus == [] and src.reason
    src.close()


# -- the collector's side: poll and the reader thread ----------------------------------------


def test_poll_raises_unavailable_and_starts_nvml_again_next_time() -> None:
    fake = FakeNvml(devices=[H200], init_error=FakeNVMLError("Driver Not Loaded"))
    src = NvmlSource(module=fake)
    with pytest.raises(NvmlUnavailable, match="NVML unavailable: Driver Not Loaded"):
        src.poll(0.0)
    fake.init_error = None  # the driver came up
    (gpu,) = src.poll(1.0)
    assert gpu.uuid == "GPU-aaaa" and fake.calls.count("init") == 2


def test_poll_raises_when_the_device_list_fails_then_reads_again() -> None:
    fake = FakeNvml(devices=[H200], count_error=FakeNVMLError("Unknown Error"))
    src = NvmlSource(module=fake)
    with pytest.raises(NvmlUnavailable, match="nvmlDeviceGetCount failed"):
        src.poll(0.0)
    fake.count_error = None
    assert [g.gpu for g in src.poll(1.0)] == ["0"] and src.reason is None


def test_a_host_without_gpus_polls_to_an_empty_list() -> None:
    assert NvmlSource(module=FakeNvml(devices=[])).poll(0.0) == []


class SlowNvml(FakeNvml):
    """nvmlDeviceGetCount blocks until the test releases it (a driver call that hangs)."""

    def __init__(self) -> None:
        super().__init__(devices=[H200])
        self.release = threading.Event()
        self.counts = 0

    def nvmlDeviceGetCount(self) -> int:
        self.counts += 1
        self.release.wait(10)
        return super().nvmlDeviceGetCount()


def test_the_reader_keeps_one_read_in_flight() -> None:
    fake = SlowNvml()
    reader = NvmlReader(NvmlSource(module=fake))

    async def run() -> list[GpuScrape]:
        first = reader.read()
        with pytest.raises(TimeoutError):  # the caller gives up waiting; the read goes on
            await asyncio.wait_for(asyncio.shield(first), 0.01)
        assert reader.read() is first  # asked again: the same read, no second thread call
        fake.release.set()
        return await first

    (gpu,) = asyncio.run(run())
    reader.close()
    assert gpu.uuid == "GPU-aaaa" and fake.counts == 1
