"""Container logs in the CRI format the kubelet reads ("<RFC3339Nano> <stdout|stderr> <F|P> <text>"),
so `kubectl logs --timestamps`, sinceSeconds/sinceTime, tailLines and follow behave as on a node, and
clients that parse timestamps (KubernetesPodOperator) get them."""

from __future__ import annotations

import asyncio
import datetime as dt
import re
from pathlib import Path

from airflow_gpu.localcluster import errors

TRUE = ("true", "1", "True")
RFC3339 = re.compile(r"^(\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2})(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def timestamp() -> bytes:
    now = dt.datetime.now(dt.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S.").encode() + b"%06d000Z" % now.microsecond


class LogWriter:
    def __init__(self, path: Path):
        self.file = open(path, "ab")

    def write(self, stream: bytes, text: bytes, final: bool = True) -> None:
        self.file.write(b"%s %s %s %s\n" % (timestamp(), stream, b"F" if final else b"P", text))
        self.file.flush()

    async def pump(self, reader: asyncio.StreamReader, stream: bytes) -> None:
        """Copy a process pipe into the log, one record per line (P records for overlong chunks)."""
        while True:
            try:
                line = await reader.readuntil(b"\n")
                self.write(stream, line[:-1])
            except asyncio.IncompleteReadError as exc:
                if exc.partial:
                    self.write(stream, exc.partial, final=False)
                return
            except asyncio.LimitOverrunError as exc:
                self.write(stream, await reader.read(exc.consumed), final=False)

    def close(self) -> None:
        self.file.close()


def parse_rfc3339(text: str) -> dt.datetime | None:
    """RFC 3339 with any fraction (the log's nanoseconds, a client's sinceTime): the kubelet compares
    log records with sinceTime at full precision, so nothing is rounded to whole seconds here."""
    m = RFC3339.match(text.strip())
    if m is None:
        return None
    base, fraction, zone = m.groups()
    micros = (fraction or "")[1:7].ljust(6, "0")
    zone = "+00:00" if zone in ("Z", "z") else zone
    try:
        return dt.datetime.fromisoformat(f"{base}.{micros}{zone}").astimezone(dt.timezone.utc)
    except ValueError:
        return None


def _parse(record: bytes) -> tuple[bytes, bytes] | None:
    """-> (timestamp, text as printed: with its newline for full lines)."""
    parts = record.rstrip(b"\n").split(b" ", 3)
    if len(parts) < 3:
        return None
    ts, _, tag = parts[:3]
    text = parts[3] if len(parts) == 4 else b""
    return ts, text + (b"\n" if tag == b"F" else b"")


class LogReader:
    """Render a CRI log file for the pods/log API with the kubelet's options."""

    def __init__(self, path: Path, options: dict):
        self.path = path
        self.timestamps = options.get("timestamps") in TRUE
        self.since = None
        if options.get("sinceSeconds"):
            seconds = options["sinceSeconds"]
            if not str(seconds).isdigit() or int(seconds) < 1:
                raise errors.bad_request(f"sinceSeconds={str(seconds)[:40]!r}: must be a positive integer")
            self.since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=int(seconds))
        elif options.get("sinceTime"):
            self.since = parse_rfc3339(options["sinceTime"])
            if self.since is None:
                raise errors.bad_request(f"sinceTime={options['sinceTime'][:40]!r}: must be an RFC 3339 time "
                                         "such as 2026-01-02T15:04:05Z or 2026-01-02T15:04:05.123456Z")
        self.tail = int(options["tailLines"]) if options.get("tailLines") not in (None, "") else None
        self.limit = int(options["limitBytes"]) if options.get("limitBytes") else None
        self.sent = 0

    def render(self, records: list[bytes]) -> bytes:
        out = []
        for record in records:
            parsed = _parse(record)
            if parsed is None:
                continue
            ts, text = parsed
            if self.since is not None and (parse_rfc3339(ts.decode()) or self.since) < self.since:
                continue
            out.append(ts + b" " + text if self.timestamps else text)
        data = b"".join(out)
        if self.limit is not None:
            data = data[: max(self.limit - self.sent, 0)]
        self.sent += len(data)
        return data

    async def stream(self, follow: bool, finished) -> "asyncio.AsyncIterator[bytes]":
        """Yield rendered chunks; with follow, until finished() and the file is drained."""
        with open(self.path, "rb") as fh:
            records = fh.read().splitlines(keepends=True)
            pending = b""
            if records and not records[-1].endswith(b"\n"):
                pending = records.pop()
            if self.tail is not None:
                records = records[-self.tail:] if self.tail > 0 else []
            yield self.render(records)
            while follow and (self.limit is None or self.sent < self.limit):
                chunk = fh.read()
                if chunk:
                    data = pending + chunk
                    lines = data.splitlines(keepends=True)
                    pending = lines.pop() if lines and not lines[-1].endswith(b"\n") else b""
                    rendered = self.render(lines)
                    if rendered:
                        yield rendered
                    continue
                if finished():
                    break
                await asyncio.sleep(0.1)
