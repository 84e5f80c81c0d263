"""The file:// backend: a directory as an object store (interface: base.py)."""

from __future__ import annotations

import os
import secrets
import time
from pathlib import Path
from typing import Any, Callable, Iterator, TypeVar
from urllib.parse import unquote, urlparse

from airflow_gpu.checkpoint.errors import ConfigError
from airflow_gpu.checkpoint.layout import check_key
from airflow_gpu.checkpoint.storage.base import CHUNK, AlreadyExists, Backend, ListedObject, ObjectMissing


T = TypeVar("T")


class FileBackend(Backend):
    """A directory as an object store. Atomic create-only puts use link(2), which fails if the
    name exists; other writes go to a temp file first and are renamed into place."""

    def __init__(self, uri: str, fsync: bool = True) -> None:
        parsed = urlparse(uri)
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise ConfigError(f"file URI {uri!r} must be absolute: file:///path/to/checkpoints")
        self.root = Path(unquote(parsed.path))
        self.uri = "file://" + str(self.root)
        self.endpoint = str(self.root)
        self.fsync = fsync
        self._tmp = self.root / ".tmp"

    def _path(self, key: str) -> Path:
        return self.root / check_key(key)

    def _tmp_file(self) -> tuple[Path, int]:
        self._tmp.mkdir(parents=True, exist_ok=True)
        path = self._tmp / f"{os.getpid()}-{secrets.token_hex(8)}"
        return path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)

    def _finish(self, fd: int) -> None:
        if self.fsync:
            os.fsync(fd)
        os.close(fd)

    @staticmethod
    def _place(tmp: Path, final: Path, create_only: bool) -> None:
        """Move a finished temp file into place. Another writer's GC may remove an empty parent
        directory between our mkdir and our link/rename: make it again and retry."""
        for _ in range(5):
            final.parent.mkdir(parents=True, exist_ok=True)
            try:
                if create_only:
                    os.link(tmp, final)
                else:
                    os.replace(tmp, final)
                return
            except FileNotFoundError:
                if not Path(tmp).exists():
                    raise
        raise OSError(f"could not create {final}: its directory keeps disappearing")

    def put(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        final = self._path(key)
        tmp, fd = self._tmp_file()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            self._finish(fd)
            fd = -1
            try:
                self._place(tmp, final, create_only)
            except FileExistsError:
                raise AlreadyExists(f"{self.uri}/{key} already exists") from None
            if create_only:
                self._sync_dir(final.parent)
        finally:
            if fd >= 0:
                os.close(fd)
            tmp.unlink(missing_ok=True)

    def _sync_dir(self, path: Path) -> None:
        if self.fsync:
            fd = os.open(path, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def read(self, key: str, consume: Callable[[Iterator[bytes]], T], start: int | None = None, length: int | None = None) -> T:
        try:
            f = open(self._path(key), "rb")
        except (FileNotFoundError, NotADirectoryError):
            raise ObjectMissing(f"{self.uri}/{key} does not exist") from None
        with f:
            if start:
                f.seek(start)

            def chunks() -> Iterator[bytes]:
                todo = length
                while todo is None or todo > 0:
                    chunk = f.read(CHUNK if todo is None else min(CHUNK, todo))
                    if not chunk:
                        return
                    if todo is not None:
                        todo -= len(chunk)
                    yield chunk

            return consume(chunks())

    def list(self, prefix: str, *, max_keys: int | None = None) -> list[ListedObject]:
        base, _, name_prefix = prefix.rpartition("/")
        top = self.root / base if base else self.root
        found: list[ListedObject] = []
        try:
            entries = sorted(os.scandir(top), key=lambda e: e.name)
        except (FileNotFoundError, NotADirectoryError):
            return []
        for entry in entries:
            if not entry.name.startswith(name_prefix) or (not base and entry.name == ".tmp"):
                continue
            key = f"{base}/{entry.name}" if base else entry.name
            if entry.is_dir(follow_symlinks=False):
                found.extend(self.list(key + "/", max_keys=None if max_keys is None else max_keys - len(found)))
            else:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:  # deleted while listing
                    continue
                found.append(ListedObject(key, st.st_size, st.st_mtime))
            if max_keys is not None and len(found) >= max_keys:
                return found[:max_keys]
        return found

    def list_dirs(self, prefix: str) -> list[str]:
        try:
            return sorted(e.name for e in os.scandir(self.root / prefix) if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def delete(self, keys: list[str]) -> None:
        parents = set()
        for key in keys:
            path = self._path(key)
            if key.endswith("/"):  # a "directory" key: remove the empty directories under it
                for top, _dirs, files in os.walk(path, topdown=False):
                    if not files:
                        try:
                            os.rmdir(top)
                        except OSError:
                            pass
                parents.add(path)
                continue
            path.unlink(missing_ok=True)
            parents.add(path.parent)
        for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
            while parent != self.root and self.root in parent.parents:
                try:
                    parent.rmdir()  # only empty directories go
                except OSError:
                    break
                parent = parent.parent

    def multipart_begin(self, key: str) -> Any:
        tmp, fd = self._tmp_file()
        return {"key": key, "tmp": tmp, "fd": fd}

    def multipart_put(self, handle: Any, index: int, offset: int, data: bytes) -> None:
        view = memoryview(data)
        while view:  # pwrite may write less than asked: go on after the bytes it did write
            written = os.pwrite(handle["fd"], view, offset)
            view, offset = view[written:], offset + written

    def multipart_complete(self, handle: Any) -> None:
        self._finish(handle["fd"])
        handle["fd"] = -1
        self._place(handle["tmp"], self._path(handle["key"]), create_only=False)

    def multipart_abort(self, handle: Any) -> None:
        if handle["fd"] >= 0:
            os.close(handle["fd"])
            handle["fd"] = -1
        Path(handle["tmp"]).unlink(missing_ok=True)

    def clean_temp(self, older_than: float) -> int:
        """Remove temp files of writers killed mid-write (older than `older_than` seconds)."""
        removed = 0
        cutoff = time.time() - older_than
        for entry in os.scandir(self._tmp) if self._tmp.is_dir() else ():
            try:
                if entry.stat().st_mtime < cutoff:
                    os.unlink(entry.path)
                    removed += 1
            except FileNotFoundError:
                pass
        return removed
