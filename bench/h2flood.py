"""The flood over one shared HTTP/2 connection (cleartext, prior knowledge), for bench/flood.py.

One connection carries every client's request as its own stream: the headers of all streams
first (as many as Envoy's SETTINGS_MAX_CONCURRENT_STREAMS allows; the rest wait, as an HTTP/2
client's requests do, and open as streams end), then their bodies in 16 KiB DATA frames,
round robin, within HTTP/2 flow control (the sender waits for Envoy's WINDOW_UPDATEs). A
stream Envoy answers early (ICE's 429 or 413 at the headers) is not sent any more data.
Each reply's time runs from the flood's start. Each stream's reply is a ``flood.Reply``-like tuple:
status (0 when reset without an answer), headers, seconds, error.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import h2.config
import h2.connection
import h2.events
import h2.exceptions

FRAME_BYTES = 16 * 1024


@dataclass
class H2Stream:
    sid: int
    started: float
    sent: int = 0
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    error: str = ""
    done: bool = False
    ended_at: float = 0.0


async def flood_h2(
    port: int, clients: int, head: list[tuple[str, str]], body: bytes
) -> list[tuple[int, dict[str, str], float, str]]:
    """Send ``clients`` requests (``head``: the pseudo and regular headers) with ``body`` on
    one HTTP/2 connection; returns (status, headers, seconds, error) per stream."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    conn = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
    )
    conn.initiate_connection()
    conn.increment_flow_control_window(2**30)
    writer.write(conn.data_to_send())
    await writer.drain()
    streams: dict[int, H2Stream] = {}
    window = asyncio.Event()
    finished = asyncio.Event()
    settled = asyncio.Event()  # Envoy's SETTINGS arrived
    now = time.perf_counter()
    waiting = [clients]  # requests not yet opened as streams

    def open_more() -> None:
        limit = conn.remote_settings.max_concurrent_streams
        while waiting[0] and conn.open_outbound_streams < limit:
            sid = conn.get_next_available_stream_id()
            conn.send_headers(sid, head, end_stream=False)
            streams[sid] = H2Stream(sid, now)
            waiting[0] -= 1

    def settle(s: H2Stream, error: str = "") -> None:
        if not s.done:
            s.done, s.error, s.ended_at = True, error, time.perf_counter()
        open_more()
        if not waiting[0] and all(x.done for x in streams.values()):
            finished.set()

    async def read() -> None:
        while not finished.is_set():
            data = await reader.read(65536)
            if not data:
                for s in streams.values():
                    settle(s, "connection closed")
                break
            for event in conn.receive_data(data):
                on_event(event)
            writer.write(conn.data_to_send())
            window.set()

    def on_event(event: h2.events.Event) -> None:
        sid = getattr(event, "stream_id", 0)
        s = streams.get(sid)
        if isinstance(event, h2.events.RemoteSettingsChanged):
            settled.set()
        elif isinstance(event, h2.events.ResponseReceived) and s is not None:
            hs = {k.lower(): v for k, v in event.headers}  # type: ignore[union-attr]
            s.status = int(hs.pop(":status", "0"))
            s.headers = hs
        elif isinstance(event, h2.events.DataReceived):
            conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded) and s is not None:
            settle(s)
        elif isinstance(event, h2.events.StreamReset) and s is not None:
            settle(s, "" if s.status else f"reset {event.error_code}")

    async def send() -> None:
        view = memoryview(body)
        await asyncio.wait_for(settled.wait(), 10)
        open_more()
        while True:
            pending = [s for s in streams.values() if not s.done and s.sent < len(body)]
            if not pending and not waiting[0]:
                return
            progressed = False
            for s in pending:
                room = min(conn.local_flow_control_window(s.sid), FRAME_BYTES)
                n = min(room, len(body) - s.sent)
                if n <= 0:
                    continue
                end = s.sent + n == len(body)
                try:
                    conn.send_data(s.sid, bytes(view[s.sent : s.sent + n]), end_stream=end)
                except (h2.exceptions.StreamClosedError, h2.exceptions.ProtocolError):
                    s.sent = len(body)
                    continue
                s.sent += n
                progressed = True
            writer.write(conn.data_to_send())
            await writer.drain()
            if not progressed:
                window.clear()
                await window.wait()

    reading = asyncio.create_task(read())
    try:
        await send()
        await asyncio.wait_for(finished.wait(), 120)
    except TimeoutError:
        for s in streams.values():
            settle(s, "timeout")
    finally:
        reading.cancel()
        writer.close()
    return [
        (s.status, s.headers, (s.ended_at or time.perf_counter()) - s.started, s.error)
        for s in streams.values()
    ]
