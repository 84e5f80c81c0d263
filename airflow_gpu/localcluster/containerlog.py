"""Container logs in the CRI format the kubelet reads ("<RFC3339Nano> <stdout|stderr> <F|P> <text>"),
so `kubectl logs --timestamps`, sinceSeconds/sinceTime, tailLines and follow behave as on a node, and
clients that parse timestamps (KubernetesPodOperator) get them."""

from __future__ import annotations

import asyncio
import datetime as dt
from pathlib import Path

from airflow_gpu.localcluster.podutil import parse_time

TRUE = ("true", "1", "True")


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
            self.since = dt.datetime.now(dt.timezone.utc) - dt.timedelta(seconds=int(options["sinceSeconds"]))
        elif options.get("sinceTime"):
            self.since = parse_time(options["sinceTime"])
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
            if self.since is not None and (parse_time(ts.decode()) or self.since) < self.since:
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
