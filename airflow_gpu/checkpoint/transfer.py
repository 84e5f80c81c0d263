"""Parallel part transfers with a CRC32 per part: upload sources, download and verify objects.

Parts of every object of a save go through one thread pool, so a checkpoint of one 1 GB file and
one of a thousand small files both keep `workers` requests in flight. zlib.crc32 and the socket/file
calls release the GIL, so the threads really run in parallel."""

from __future__ import annotations

import os
import zlib
from concurrent.futures import FIRST_EXCEPTION, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from airflow_gpu.checkpoint.storage.base import Backend, ObjectMissing
from airflow_gpu.checkpoint.errors import CorruptCheckpointError
from airflow_gpu.checkpoint.layout import ObjectEntry


@dataclass
class Source:
    """Bytes to upload as one object: `read(offset, length)` returns that slice."""

    name: str
    size: int
    read: Callable[[int, int], bytes]
    close: Callable[[], None] = lambda: None

    @classmethod
    def from_bytes(cls, name: str, data: bytes | bytearray | memoryview) -> "Source":
        view = memoryview(data).cast("B")
        return cls(name, len(view), lambda offset, length: bytes(view[offset : offset + length]))

    @classmethod
    def from_file(cls, name: str, path: Path) -> "Source":
        fd = os.open(path, os.O_RDONLY)
        size = os.fstat(fd).st_size

        def read(offset: int, length: int) -> bytes:
            chunks, todo = [], length
            while todo:
                chunk = os.pread(fd, todo, offset)
                if not chunk:
                    raise CorruptCheckpointError(f"{path} shrank while being checkpointed (at byte {offset})")
                chunks.append(chunk)
                offset, todo = offset + len(chunk), todo - len(chunk)
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)

        return cls(name, size, read, lambda: os.close(fd))


def _digest(data: bytes | bytearray | memoryview) -> str:
    return f"{zlib.crc32(data):08x}"


class _Crc32:
    """Incremental CRC32 (zlib releases the GIL for large chunks)."""

    def __init__(self) -> None:
        self.value = 0

    def update(self, data: bytes) -> None:
        self.value = zlib.crc32(data, self.value)

    def hexdigest(self) -> str:
        return f"{self.value:08x}"


def _run_all(futures: list[Future]) -> None:
    """Wait for all; on the first failure cancel what has not started and raise it."""
    done, pending = wait(futures, return_when=FIRST_EXCEPTION)
    for fut in done:
        if fut.exception() is not None:
            for p in pending:
                p.cancel()
            wait(pending)
            raise fut.exception()  # type: ignore[misc]


MAX_PARTS = 10_000  # S3's limit on parts per multipart upload


def part_size_for(size: int, part_size: int) -> int:
    """part_size, grown in whole MiB for objects that would otherwise need more than MAX_PARTS parts."""
    if size <= part_size * MAX_PARTS:
        return part_size
    mib = 1024 * 1024
    return -(-size // MAX_PARTS // mib) * mib + mib


def upload(
    backend: Backend, pool: ThreadPoolExecutor, sources: list[Source], key_of: Callable[[str], str], part_size: int
) -> list[ObjectEntry]:
    """Upload every source (multipart above part_size); return entries with per-part digests."""
    digests: dict[str, list[str]] = {}
    handles: dict[str, Any] = {}
    futures: list[Future] = []

    def put_single(src: Source) -> None:
        data = src.read(0, src.size)
        digests[src.name][0] = _digest(data)
        backend.put(key_of(src.name), data)

    def put_part(src: Source, index: int) -> None:
        offset = index * sizes[src.name]
        data = src.read(offset, min(sizes[src.name], src.size - offset))
        digests[src.name][index] = _digest(data)
        backend.multipart_put(handles[src.name], index, offset, data)

    sizes = {src.name: part_size_for(src.size, part_size) for src in sources}
    try:
        for src in sources:
            parts = max(1, -(-src.size // sizes[src.name]))
            digests[src.name] = [""] * parts
            if parts == 1:
                futures.append(pool.submit(put_single, src))
            else:
                handles[src.name] = backend.multipart_begin(key_of(src.name))
                futures += [pool.submit(put_part, src, i) for i in range(parts)]
        _run_all(futures)
        _run_all([pool.submit(backend.multipart_complete, h) for h in handles.values()])
        handles.clear()
    finally:
        if handles:  # failed: let started parts finish before their uploads are aborted
            wait(futures)
        for handle in handles.values():
            backend.multipart_abort(handle)
    return [
        ObjectEntry(name=s.name, key=key_of(s.name), size=s.size, part_size=sizes[s.name], parts=tuple(digests[s.name]))
        for s in sources
    ]


def download(
    backend: Backend, pool: ThreadPoolExecutor, entries: list[ObjectEntry], sink: Callable[[ObjectEntry], Any], where: str
) -> None:
    """Fetch every part of every entry in parallel, streamed in chunks that are hashed and handed to
    the writer sink(entry) returns, a callable (offset, chunk) -> None; each part's CRC32 must match."""
    writers = {e.name: sink(e) for e in entries}

    def fetch(entry: ObjectEntry, index: int) -> None:
        offset = index * entry.part_size
        length = min(entry.part_size, entry.size - offset)
        write = writers[entry.name]

        def consume(chunks: Iterator[bytes]) -> tuple[str, int]:
            hasher, position, end = _Crc32(), offset, offset + length
            for chunk in chunks:
                if position + len(chunk) > end:
                    raise CorruptCheckpointError(f"checkpoint {where}: data object {entry.name!r} is larger than recorded")
                hasher.update(chunk)
                write(position, chunk)
                position += len(chunk)
            return hasher.hexdigest(), position - offset

        try:
            if entry.size <= entry.part_size:
                digest, got = backend.read(entry.key, consume)  # one request, whole object
            else:
                digest, got = backend.read(entry.key, consume, offset, length)
        except ObjectMissing:
            raise CorruptCheckpointError(f"checkpoint {where}: data object {entry.name!r} ({entry.key}) is missing") from None
        if got != length:
            raise CorruptCheckpointError(
                f"checkpoint {where}: data object {entry.name!r} part {index + 1} has {got} bytes, expected {length}"
            )
        if digest != entry.parts[index]:
            raise CorruptCheckpointError(
                f"checkpoint {where}: data object {entry.name!r} part {index + 1} fails its CRC32 checksum"
            )

    _run_all([pool.submit(fetch, e, i) for e in entries for i in range(e.expected_parts())])


def file_writer(path: Path, size: int) -> tuple[Callable[[int, bytes], None], Callable[[], None]]:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        # allocate up front: parallel writes into a sparse file were 2-4x slower and jittery here
        os.posix_fallocate(fd, 0, size) if size else None
    except OSError:  # filesystems without fallocate
        os.ftruncate(fd, size)

    def write(offset: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written

    return write, lambda: os.close(fd)
