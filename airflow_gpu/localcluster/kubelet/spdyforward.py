"""Port-forward over SPDY/3.1 streams, as the kubelet serves `kubectl port-forward` (portforward.k8s.io).

Each forwarded connection is a pair of client-opened streams with the same requestID header (older
clients without it: the error stream's id, the data stream's id - 2), streamType "error" or "data",
and the pod port in "port". When both have arrived the pod's port is dialled: bytes flow both ways
on the data stream; a dial failure is written to the error stream. When the pod side closes, both
streams are finished (FIN), which is what kubectl waits for before it closes its local connection.
A client FIN on the data stream half-closes the pod connection; RST_STREAM aborts the pair.

The transport and the pod are the caller's: `dial(port)` returns a connection to the pod's port or
the error message to report; `recv()` returns the next bytes (None at the end), `send(bytes)`
writes. Two transports carry it: WebSocket binary messages (subprotocol SPDY/3.1+portforward.k8s.io,
what kubectl 1.31+ tries first) and a raw connection after an HTTP `Upgrade: SPDY/3.1`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Awaitable, Callable

from airflow_gpu.localcluster.kubelet import spdy

log = logging.getLogger(__name__)
TUNNEL_PROTOCOL = "SPDY/3.1+portforward.k8s.io"
STREAM_PROTOCOL = "portforward.k8s.io"  # X-Stream-Protocol-Version of the plain SPDY upgrade
CHUNK = 32 * 1024
PAIR_TIMEOUT = 30.0  # seconds a stream waits for its partner, as the kubelet's stream creation timeout


class _Pair:
    __slots__ = ("request_id", "port", "data", "error", "inbound", "task", "timer")

    def __init__(self, request_id: str, port: int):
        self.request_id, self.port = request_id, port
        self.data: int | None = None
        self.error: int | None = None
        self.inbound: asyncio.Queue = asyncio.Queue()  # bytes from the client's data stream; None: its FIN
        self.task: asyncio.Task | None = None
        self.timer: asyncio.TimerHandle | None = None


class SpdyPortForward:
    def __init__(self, name: str, dial: Callable[[int], Awaitable[tuple[asyncio.StreamReader, asyncio.StreamWriter] | str]],
                 recv: Callable[[], Awaitable[bytes | None]], send: Callable[[bytes], Awaitable[None]]):
        self.name, self.dial, self._recv, self._send = name, dial, recv, send
        self.codec = spdy.HeaderCodec()
        self.parser = spdy.FrameParser(self.codec)
        self.pairs: dict[str, _Pair] = {}
        self.by_stream: dict[int, _Pair] = {}
        self.last_stream = 0
        self.closed = False

    async def send(self, data: bytes) -> None:
        if not self.closed:
            try:
                await self._send(data)
            except (OSError, RuntimeError):  # the client went away
                self.closed = True

    async def serve(self) -> None:
        try:
            while not self.closed:
                data = await self._recv()
                if data is None:
                    return
                try:
                    frames = self.parser.feed(data)
                except spdy.ProtocolError as exc:
                    log.info("port-forward to %s: %s", self.name, exc)
                    await self.send(spdy.encode_goaway(self.last_stream, spdy.GOAWAY_PROTOCOL_ERROR))
                    return
                for frame in frames:
                    if await self._frame(frame) is False:
                        return
        finally:
            self.closed = True
            for pair in list(self.pairs.values()):
                self._drop(pair)

    async def _frame(self, frame: spdy.Frame) -> bool:
        if frame.kind == spdy.SYN_STREAM:
            await self._open(frame)
        elif frame.kind == 0:
            pair = self.by_stream.get(frame.stream_id)
            if pair is not None and frame.stream_id == pair.data:
                if frame.data:
                    pair.inbound.put_nowait(frame.data)
                if frame.fin:
                    pair.inbound.put_nowait(None)
        elif frame.kind == spdy.RST_STREAM:
            pair = self.by_stream.get(frame.stream_id)
            if pair is not None:
                self._drop(pair)
        elif frame.kind == spdy.PING:
            await self.send(spdy.encode_ping(frame.ping_id))  # the client's pings keep its connection alive
        elif frame.kind == spdy.GOAWAY:
            return False
        return True

    async def _open(self, frame: spdy.Frame) -> None:
        sid, headers = frame.stream_id, frame.headers
        if sid <= self.last_stream or sid % 2 == 0:
            await self.send(spdy.encode_rst_stream(sid, spdy.RST_PROTOCOL_ERROR))
            return
        self.last_stream = sid
        stream_type, port = headers.get("streamtype"), headers.get("port", "")
        if stream_type not in ("data", "error") or not port.isdigit() or not 0 < int(port) < 65536:
            log.info("port-forward stream %d refused: streamType=%r port=%r", sid, stream_type, port)
            await self.send(spdy.encode_rst_stream(sid, spdy.RST_REFUSED_STREAM))
            return
        request_id = headers.get("requestid") or str(sid if stream_type == "error" else sid - 2)
        pair = self.pairs.get(request_id)
        if pair is None:
            pair = self.pairs[request_id] = _Pair(request_id, int(port))
            pair.timer = asyncio.get_running_loop().call_later(PAIR_TIMEOUT, self._drop, pair)
        if getattr(pair, stream_type) is not None:
            await self.send(spdy.encode_rst_stream(sid, spdy.RST_PROTOCOL_ERROR))
            return
        setattr(pair, stream_type, sid)
        self.by_stream[sid] = pair
        await self.send(spdy.encode_syn_reply(self.codec, sid))
        if pair.data is not None and pair.error is not None and pair.task is None:
            pair.timer.cancel()
            pair.task = asyncio.get_running_loop().create_task(self._forward(pair))

    async def _forward(self, pair: _Pair) -> None:
        writer = None
        try:
            connection = await self.dial(pair.port)
            if isinstance(connection, str):
                await self.send(spdy.encode_data(pair.error, connection.encode()))
                return
            reader, writer = connection
            inbound = asyncio.get_running_loop().create_task(self._to_pod(pair, writer))
            try:
                while data := await reader.read(CHUNK):
                    await self.send(spdy.encode_data(pair.data, data))
            finally:
                inbound.cancel()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            if writer is not None:
                writer.close()
            self._forget(pair)
            await self.send(spdy.encode_data(pair.data, b"", fin=True) + spdy.encode_data(pair.error, b"", fin=True))

    @staticmethod
    async def _to_pod(pair: _Pair, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while (data := await pair.inbound.get()) is not None:
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()  # the client closed its side: the pod reads EOF, and may still answer

    def _forget(self, pair: _Pair) -> None:
        if pair.timer is not None:
            pair.timer.cancel()
        self.pairs.pop(pair.request_id, None)
        for sid in (pair.data, pair.error):
            self.by_stream.pop(sid, None)

    def _drop(self, pair: _Pair) -> None:
        """RST, a partner that never came, or the session's end: the pod connection goes, no FIN."""
        self._forget(pair)
        if pair.task is not None:
            pair.task.cancel()
