"""SPDY/3.1 framing, the server's side, as far as kubectl's port-forward uses it (sans-IO).

kubectl (client-go's spdystream) opens streams with SYN_STREAM, sends DATA, half-closes with FIN,
aborts with RST_STREAM, pings, and ends with GOAWAY; it ignores flow control (WINDOW_UPDATE,
SETTINGS), so this side does too. Header blocks are zlib-compressed with the SPDY/3 dictionary, one
compression context per direction for the whole connection (a sync flush after each block).

No maintained Python SPDY library exists (PyPI has spdy-py 0.2.0 of 2021 and a 2012 binding to a C
library), and the part needed is small: frames in (FrameParser.feed), frames out (the encode_*
functions). The transport (raw TCP after an HTTP upgrade, or WebSocket binary messages) is the
caller's.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field

VERSION = 3
SYN_STREAM, SYN_REPLY, RST_STREAM, SETTINGS, PING, GOAWAY, HEADERS, WINDOW_UPDATE = 1, 2, 3, 4, 6, 7, 8, 9
FLAG_FIN = 0x01
RST_PROTOCOL_ERROR, RST_REFUSED_STREAM, RST_CANCEL = 1, 3, 5
GOAWAY_OK, GOAWAY_PROTOCOL_ERROR = 0, 1
MAX_FRAME = 0xFFFFFF  # a frame's length field is 24 bits
MAX_HEADER_BLOCK = 1 << 20  # a decompressed header block larger than this is a protocol error here

# The SPDY/3 header dictionary (draft-mbelshe-httpbis-spdy-00, 2.6.10.1): length-prefixed words, then text.
_DICTIONARY_WORDS = (
    "options head post put delete trace accept accept-charset accept-encoding accept-language accept-ranges age "
    "allow authorization cache-control connection content-base content-encoding content-language content-length "
    "content-location content-md5 content-range content-type date etag expect expires from host if-match "
    "if-modified-since if-none-match if-range if-unmodified-since last-modified location max-forwards pragma "
    "proxy-authenticate proxy-authorization range referer retry-after server te trailer transfer-encoding upgrade "
    "user-agent vary via warning www-authenticate method get status").split() + [
    "200 OK", "version", "HTTP/1.1", "url", "public", "set-cookie", "keep-alive", "origin"]
_DICTIONARY_TEXT = (
    "100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505"
    "203 Non-Authoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized"
    "403 Forbidden404 Not Found500 Internal Server Error501 Not Implemented503 Service Unavailable"
    "Jan Feb Mar Apr May Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMT"
    "chunked,text/html,image/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,"
    "text/javascript,publicprivatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.")
DICTIONARY = b"".join(struct.pack(">I", len(w)) + w.encode() for w in _DICTIONARY_WORDS) + _DICTIONARY_TEXT.encode()


class ProtocolError(ValueError):
    """The peer sent something that is not SPDY/3.1: the connection ends with GOAWAY(PROTOCOL_ERROR)."""


@dataclass
class Frame:
    """One frame. kind: a control frame type, or 0 for DATA."""
    kind: int
    flags: int = 0
    stream_id: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    data: bytes = b""
    status: int = 0  # RST_STREAM and GOAWAY
    ping_id: int = 0

    @property
    def fin(self) -> bool:
        return bool(self.flags & FLAG_FIN)


class HeaderCodec:
    """The two zlib contexts of one connection (they span every header block, in order)."""

    def __init__(self):
        self._inflate = zlib.decompressobj(zdict=DICTIONARY)
        self._deflate = zlib.compressobj(zdict=DICTIONARY)

    def decode(self, block: bytes) -> dict[str, str]:
        try:
            raw = self._inflate.decompress(block, MAX_HEADER_BLOCK)
        except zlib.error as exc:
            raise ProtocolError(f"header block does not inflate with the SPDY/3 dictionary: {exc}") from None
        if self._inflate.unconsumed_tail:
            raise ProtocolError(f"header block larger than {MAX_HEADER_BLOCK} bytes")
        return _parse_header_block(raw)

    def encode(self, headers: dict[str, str]) -> bytes:
        raw = struct.pack(">I", len(headers))
        for name, value in headers.items():
            n, v = name.lower().encode(), value.encode()
            raw += struct.pack(">I", len(n)) + n + struct.pack(">I", len(v)) + v
        return self._deflate.compress(raw) + self._deflate.flush(zlib.Z_SYNC_FLUSH)


def _parse_header_block(raw: bytes) -> dict[str, str]:
    def take(offset: int) -> tuple[bytes, int]:
        if offset + 4 > len(raw):
            raise ProtocolError("truncated header block")
        (n,) = struct.unpack_from(">I", raw, offset)
        if offset + 4 + n > len(raw):
            raise ProtocolError("truncated header block")
        return raw[offset + 4:offset + 4 + n], offset + 4 + n

    if len(raw) < 4:
        raise ProtocolError("truncated header block")
    (count,) = struct.unpack_from(">I", raw, 0)
    offset, headers = 4, {}
    for _ in range(count):
        name, offset = take(offset)
        value, offset = take(offset)
        # several values of one name are NUL-separated: port-forward's headers have one each
        headers[name.decode("latin-1").lower()] = value.decode("latin-1").split("\0")[0]
    return headers


class FrameParser:
    """Bytes in, frames out: feed() whatever arrived (any chunking) and get the complete frames."""

    def __init__(self, codec: HeaderCodec):
        self.codec = codec
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Frame]:
        self._buffer += data
        frames = []
        while len(self._buffer) >= 8:
            word, flags_length = struct.unpack_from(">II", self._buffer, 0)
            length = flags_length & MAX_FRAME
            if len(self._buffer) < 8 + length:
                break
            payload = bytes(self._buffer[8:8 + length])
            del self._buffer[:8 + length]
            flags = flags_length >> 24
            if word & 0x80000000:
                version, kind = (word >> 16) & 0x7FFF, word & 0xFFFF
                if version != VERSION:
                    raise ProtocolError(f"SPDY version {version} (this server speaks 3.1)")
                frame = self._control(kind, flags, payload)
                if frame is not None:
                    frames.append(frame)
            else:
                frames.append(Frame(0, flags, word & 0x7FFFFFFF, data=payload))
        return frames

    def _control(self, kind: int, flags: int, payload: bytes) -> Frame | None:
        def need(n: int) -> None:
            if len(payload) < n:
                raise ProtocolError(f"control frame type {kind} shorter than {n} bytes")
        if kind == SYN_STREAM:
            need(10)
            stream_id = struct.unpack_from(">I", payload, 0)[0] & 0x7FFFFFFF
            return Frame(kind, flags, stream_id, headers=self.codec.decode(payload[10:]))
        if kind in (SYN_REPLY, HEADERS):
            need(4)
            stream_id = struct.unpack_from(">I", payload, 0)[0] & 0x7FFFFFFF
            return Frame(kind, flags, stream_id, headers=self.codec.decode(payload[4:]))
        if kind == RST_STREAM:
            need(8)
            stream_id, status = struct.unpack_from(">II", payload, 0)
            return Frame(kind, flags, stream_id & 0x7FFFFFFF, status=status)
        if kind == PING:
            need(4)
            return Frame(kind, flags, ping_id=struct.unpack_from(">I", payload, 0)[0])
        if kind == GOAWAY:
            need(8)
            last, status = struct.unpack_from(">II", payload, 0)
            return Frame(kind, flags, last & 0x7FFFFFFF, status=status)
        return None  # SETTINGS, WINDOW_UPDATE, CREDENTIAL, unknown: ignored, as spdystream does


def _control(kind: int, flags: int, payload: bytes) -> bytes:
    return struct.pack(">HHI", 0x8000 | VERSION, kind, (flags << 24) | len(payload)) + payload


def encode_syn_reply(codec: HeaderCodec, stream_id: int, headers: dict[str, str] | None = None,
                     fin: bool = False) -> bytes:
    return _control(SYN_REPLY, FLAG_FIN if fin else 0, struct.pack(">I", stream_id) + codec.encode(headers or {}))


def encode_data(stream_id: int, data: bytes, fin: bool = False) -> bytes:
    """One DATA frame per MAX_FRAME bytes (FIN on the last)."""
    out = []
    chunks = [data[i:i + MAX_FRAME] for i in range(0, len(data), MAX_FRAME)] or [b""]
    for n, chunk in enumerate(chunks):
        flags = FLAG_FIN if fin and n == len(chunks) - 1 else 0
        out.append(struct.pack(">II", stream_id & 0x7FFFFFFF, (flags << 24) | len(chunk)) + chunk)
    return b"".join(out)


def encode_rst_stream(stream_id: int, status: int) -> bytes:
    return _control(RST_STREAM, 0, struct.pack(">II", stream_id, status))


def encode_ping(ping_id: int) -> bytes:
    return _control(PING, 0, struct.pack(">I", ping_id))


def encode_goaway(last_stream_id: int, status: int = GOAWAY_OK) -> bytes:
    return _control(GOAWAY, 0, struct.pack(">II", last_stream_id, status))
