"""The two connection upgrades kubectl port-forward makes that uvicorn does not take as they come.

- WebSocket with subprotocol `SPDY/3.1+portforward.k8s.io` (kubectl 1.31+ tries it first): the
  websockets library parses Sec-WebSocket-Protocol as RFC 7230 tokens, where "/" is not allowed, and
  refuses the handshake. The header is taken out before that parse and given back to the app.
- `Upgrade: SPDY/3.1` (kubectl's fallback, and every older client): uvicorn serves only WebSocket
  upgrades. Here the raw connection is handed to the same ASGI app as a WebSocket-like session
  (scope extension "spdy.upgrade"): `websocket.accept` answers 101 Switching Protocols, each chunk
  read is one `websocket.receive`, each `websocket.send` is written as is, and a denial response
  goes out as a plain HTTP response. So authorization, the pod lookup and the port-forward itself
  are one code path for both transports.
"""

from __future__ import annotations

import asyncio
import logging
import time
from http import HTTPStatus
from urllib.parse import unquote

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

log = logging.getLogger(__name__)
SPDY_UPGRADE = b"spdy/3.1"
SPDY_EXTENSION = "spdy.upgrade"
STREAM_PROTOCOL_HEADER = b"x-stream-protocol-version"


class WebSocketProtocol(WebSocketsSansIOProtocol):
    def handle_connect(self, event) -> None:
        offered = event.headers.get_all("Sec-WebSocket-Protocol")
        del event.headers["Sec-WebSocket-Protocol"]  # no subprotocol is chosen by the library: the app does it
        super().handle_connect(event)
        scope = getattr(self, "scope", None)
        if scope is not None and offered:
            scope["subprotocols"] = [p.strip() for value in offered for p in value.split(",") if p.strip()]
            scope["headers"].append((b"sec-websocket-protocol", ", ".join(offered).encode("latin-1")))


class HttpProtocol(HttpToolsProtocol):
    """Also bounds what an idle or slow client can hold (slowloris): a connection must send a complete
    request head within `head_timeout` s of connecting, or of the first byte of its next request on a
    kept-alive connection (as Go's ReadHeaderTimeout, which kube-apiserver sets), else it is closed;
    past `max_connections` open connections a new one is closed at once, so the fds stay bounded."""

    head_timeout = 10.0
    max_connections = 4096
    _refused_logged_at = 0.0

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._head_timer = None
        if len(self.connections) > self.max_connections:
            now = time.monotonic()
            if now - HttpProtocol._refused_logged_at > 10:  # one line per 10 s, not one per connection
                HttpProtocol._refused_logged_at = now
                log.warning("%d connections open (the limit): new connections are closed at once", len(self.connections) - 1)
            self.transport.close()
            return
        self._arm_head_timer()

    def _arm_head_timer(self) -> None:
        if self._head_timer is None:
            self._head_timer = self.loop.call_later(self.head_timeout, self._head_timed_out)

    def _cancel_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if not self.transport.is_closing():
            self.transport.close()

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._arm_head_timer()  # kept from connect for the first request: trickled bytes do not extend it

    def on_headers_complete(self) -> None:
        self._cancel_head_timer()
        super().on_headers_complete()

    def connection_lost(self, exc) -> None:
        self._cancel_head_timer()
        super().connection_lost(exc)

    def _should_upgrade(self) -> bool:
        return super()._should_upgrade() or self._get_upgrade() == SPDY_UPGRADE

    def handle_websocket_upgrade(self) -> None:
        if self._get_upgrade() != SPDY_UPGRADE:
            super().handle_websocket_upgrade()
            return
        self.connections.discard(self)
        raw_path, _, query = self.url.partition(b"?")
        scope = {"type": "websocket", "asgi": {"version": "3.0", "spec_version": "2.4"}, "http_version": "1.1",
                 "scheme": "wss" if self.scheme == "https" else "ws", "server": self.server, "client": self.client,
                 "root_path": self.root_path, "path": self.root_path + unquote(raw_path.decode("ascii")),
                 "raw_path": raw_path, "query_string": query, "headers": list(self.scope["headers"]),
                 "subprotocols": [], "state": self.app_state.copy(),
                 "extensions": {SPDY_EXTENSION: {}, "websocket.http.response": {}}}
        protocol = SpdyUpgradeProtocol(self.app, scope, self.transport)
        self.transport.set_protocol(protocol)
        protocol.start()


def http_protocol(head_timeout: float, max_connections: int) -> type[HttpProtocol]:
    """HttpProtocol with these bounds (uvicorn instantiates the class it is given)."""
    if not head_timeout > 0 or max_connections < 1:
        raise ValueError(f"head timeout ({head_timeout}) must be > 0 s and max connections ({max_connections}) >= 1")
    return type("HttpProtocol", (HttpProtocol,), {"head_timeout": head_timeout, "max_connections": max_connections})


class SpdyUpgradeProtocol(asyncio.Protocol):
    """A raw upgraded connection presented to the ASGI app as a WebSocket session."""

    def __init__(self, app, scope: dict, transport: asyncio.Transport):
        self.app, self.scope, self.transport = app, scope, transport
        self.queue: asyncio.Queue = asyncio.Queue()
        self.accepted = self.closed = False
        self.task: asyncio.Task | None = None

    def start(self) -> None:
        self.queue.put_nowait({"type": "websocket.connect"})
        self.task = asyncio.get_running_loop().create_task(self._run())

    async def _run(self) -> None:
        try:
            await self.app(self.scope, self.queue.get, self.send)
        except Exception:
            log.exception("SPDY upgrade of %s failed", self.scope["path"])
        finally:
            self._close()

    def data_received(self, data: bytes) -> None:
        self.queue.put_nowait({"type": "websocket.receive", "bytes": data})

    def eof_received(self) -> bool | None:
        self.queue.put_nowait({"type": "websocket.disconnect", "code": 1000})
        return None

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.queue.put_nowait({"type": "websocket.disconnect", "code": 1006})

    async def send(self, message: dict) -> None:
        if self.closed:
            raise OSError("the client closed the connection")
        kind = message["type"]
        if kind == "websocket.accept":
            self.accepted = True
            self.transport.write(b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n"
                                 + STREAM_PROTOCOL_HEADER + b": portforward.k8s.io\r\n\r\n")
        elif kind == "websocket.send":
            self.transport.write(message.get("bytes") or (message.get("text") or "").encode())
        elif kind == "websocket.http.response.start":
            status = message["status"]
            head = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}".encode()]
            head += [name + b": " + value for name, value in message.get("headers", [])]
            self.transport.write(b"\r\n".join(head + [b"connection: close", b"", b""]))
        elif kind == "websocket.http.response.body":
            self.transport.write(message.get("body", b""))
            if not message.get("more_body"):
                self._close()
        elif kind == "websocket.close":
            self._close()

    def _close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()
