"""A TCP relay between Envoy and ICE whose Envoy-to-ICE direction runs at a set rate, late.

It stands in for what loaded machines do to the messages Envoy sends ICE (issue 44):
- ``rate_bytes_s``: the transfer of a long body (0.15–0.9 s for 6.4 MB): Envoy writes the
  body at once (its message timer runs from then), the relay takes it at loopback speed and
  hands it to ICE at that rate;
- ``hold_s`` (settable while it runs): every byte reaches ICE that long after Envoy wrote it,
  as the headers messages of a flood did (ICE had not received them when Envoy's timer
  fired): ICE is up and answers, too late.
ICE-to-Envoy (the answers) is not slowed. One relay per ICE address; ``close`` stops it.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

from ext_proc.lab.stack import free_port

CHUNK_BYTES = 64 * 1024


class SlowLink:
    """Listens on a free loopback port and relays every connection to ``target``."""

    def __init__(self, target: str, rate_bytes_s: float, hold_s: float = 0.0) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.rate_bytes_s = rate_bytes_s
        self.hold_s = hold_s
        self.port = free_port()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="slowlink")
        self._thread.start()
        self._started.wait(10)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        server = self._loop.run_until_complete(
            asyncio.start_server(self._relay, "127.0.0.1", self.port)
        )
        self._started.set()
        try:
            self._loop.run_forever()
        finally:
            server.close()
            tasks = asyncio.all_tasks(self._loop)
            for task in tasks:
                task.cancel()
            self._loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
            self._loop.close()

    async def _relay(self, envoy_r: asyncio.StreamReader, envoy_w: asyncio.StreamWriter) -> None:
        try:
            ice_r, ice_w = await asyncio.open_connection(*self.target)
        except OSError:
            envoy_w.close()
            return
        # unbounded: Envoy is never held back; each chunk with when it arrived
        queue: asyncio.Queue[tuple[float, bytes]] = asyncio.Queue()
        await asyncio.gather(
            self._take(envoy_r, queue),
            self._drip(queue, ice_w),
            self._pipe(ice_r, envoy_w),
            return_exceptions=True,
        )
        for w in (envoy_w, ice_w):
            w.close()

    @staticmethod
    async def _take(
        reader: asyncio.StreamReader, queue: asyncio.Queue[tuple[float, bytes]]
    ) -> None:
        loop = asyncio.get_running_loop()
        while data := await reader.read(CHUNK_BYTES):
            queue.put_nowait((loop.time(), data))
        queue.put_nowait((loop.time(), b""))

    async def _drip(
        self, queue: asyncio.Queue[tuple[float, bytes]], writer: asyncio.StreamWriter
    ) -> None:
        loop = asyncio.get_running_loop()
        while True:
            arrived, data = await queue.get()
            if not data:
                break
            await asyncio.sleep(arrived + self.hold_s - loop.time())
            writer.write(data)
            await writer.drain()
            await asyncio.sleep(len(data) / self.rate_bytes_s)
        writer.close()

    @staticmethod
    async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(CHUNK_BYTES):
            writer.write(data)
            await writer.drain()
        writer.close()

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
