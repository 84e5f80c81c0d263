"""The read side of a checkpoint store: find the newest complete checkpoint, verify, restore.

Readers never need a lock: a checkpoint exists exactly when its manifest exists, manifests are
written once (create-only) after all their data, and they sort newest-first (layout.py), so
latest() reads a handful of keys however many checkpoints the prefix holds."""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Iterator

from airflow_gpu.checkpoint.storage import Backend, ObjectMissing, open_backend
from airflow_gpu.checkpoint.errors import ConfigError, CorruptCheckpointError
from airflow_gpu.checkpoint.layout import (
    DATA,
    FENCES_LIVE,
    MANIFESTS,
    STATUS,
    Checkpoint,
    decode_manifest,
    parse_fence_key,
    parse_manifest_key,
)
from airflow_gpu.checkpoint.transfer import download, file_writer

log = logging.getLogger(__name__)

VERIFY_LEVELS = ("manifest", "objects", "checksums")
_FIRST_PAGE = 16  # manifests read by latest() before it falls back to a longer listing


class CheckpointStore:
    """Checkpoints under one URI (s3://bucket/prefix or file:///path)."""

    def __init__(self, uri: str, *, workers: int = 10, backend: Backend | None = None, **backend_options: Any) -> None:
        if workers < 1:
            raise ConfigError(f"workers must be >= 1, got {workers}")
        self.backend = backend or open_backend(uri, **backend_options)
        self.uri = self.backend.uri
        self.workers = workers
        self._pool: ThreadPoolExecutor | None = None
        self._manifests: dict[str, Checkpoint] = {}  # manifests are immutable: cache by key

    @property
    def pool(self) -> ThreadPoolExecutor:
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.workers, thread_name_prefix="checkpoint")
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None

    def __enter__(self) -> "CheckpointStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- finding checkpoints ---------------------------------------------------------------
    def manifest_keys(self, limit: int | None = None) -> list[str]:
        """Manifest keys, newest first (a bounded listing when limit is given)."""
        listed = self.backend.list(MANIFESTS, max_keys=limit)
        return [o.key for o in listed if parse_manifest_key(o.key) is not None]

    def load(self, key: str) -> Checkpoint:
        """The checkpoint whose manifest is `key` (or its full URI); CorruptCheckpointError if unreadable."""
        if "://" in key:
            if not key.startswith(self.uri + "/"):
                raise ConfigError(f"checkpoint {key} is not in store {self.uri}")
            key = key[len(self.uri) + 1 :]
        if key in self._manifests:
            return self._manifests[key]
        if parse_manifest_key(key) is None:
            raise ConfigError(f"{key!r} is not a manifest key of {self.uri} (expected {MANIFESTS}<attempt>-<step>.json)")
        try:
            raw = self.backend.get(key)
        except ObjectMissing:
            raise CorruptCheckpointError(f"checkpoint {self.uri}/{key} does not exist (deleted by retention?)") from None
        ckpt = decode_manifest(raw, key, f"{self.uri}/{key}")
        self._manifests[key] = ckpt
        return ckpt

    def forget(self, key: str) -> None:
        """Drop a deleted manifest from the cache."""
        self._manifests.pop(key, None)

    def checkpoints(self, verify: str = "manifest") -> Iterator[Checkpoint]:
        """Committed checkpoints, newest first; unreadable or incomplete ones are skipped with a warning."""
        if verify not in VERIFY_LEVELS:
            raise ConfigError(f"verify must be one of {VERIFY_LEVELS}, got {verify!r}")
        seen = 0
        limit: int | None = _FIRST_PAGE
        while True:
            keys = self.manifest_keys(limit)
            for key in keys[seen:]:
                try:
                    ckpt = self.load(key)
                    self.check(ckpt, verify)
                except CorruptCheckpointError as exc:
                    log.warning("skipping checkpoint: %s", exc)
                    continue
                yield ckpt
            if limit is None or len(keys) < limit:
                return
            seen, limit = len(keys), None  # the first page was all bad or consumed: list everything

    def latest(self, verify: str = "objects") -> Checkpoint | None:
        """The newest complete checkpoint: its manifest parses and (verify="objects", the default)
        every data object exists with the recorded size; verify="checksums" also reads and checks
        every byte. Older checkpoints are used when newer ones fail, with a warning."""
        return next(self.checkpoints(verify), None)

    def check(self, ckpt: Checkpoint, verify: str = "objects") -> None:
        if verify == "manifest":
            return
        if verify == "checksums":
            download(self.backend, self.pool, list(ckpt.objects), lambda e: (lambda offset, data: None), ckpt.uri)
            return
        present = {o.key: o.size for o in self.backend.list(f"{DATA}{ckpt.save_id}/")}
        for entry in ckpt.objects:
            if entry.key not in present:
                raise CorruptCheckpointError(f"checkpoint {ckpt.uri}: data object {entry.name!r} ({entry.key}) is missing")
            if present[entry.key] != entry.size:
                raise CorruptCheckpointError(
                    f"checkpoint {ckpt.uri}: data object {entry.name!r} has {present[entry.key]} bytes, expected {entry.size}"
                )

    # --- reading data ----------------------------------------------------------------------
    def read(self, ckpt: Checkpoint, name: str) -> bytearray:
        """One object's bytes, checksum-verified."""
        entry = ckpt.object(name)
        buf = bytearray(entry.size)
        view = memoryview(buf)

        def sink(_entry: Any) -> Any:
            def write(offset: int, data: bytes) -> None:
                view[offset : offset + len(data)] = data

            return write

        download(self.backend, self.pool, [entry], sink, ckpt.uri)
        return buf

    def restore_files(self, ckpt: Checkpoint, dest: str | os.PathLike[str]) -> Path:
        """Write every object of `ckpt` under directory `dest`, verifying checksums. The files go to a
        fresh staging directory next to dest first and are moved in only once all verify, so a broken
        checkpoint leaves nothing behind (a fallback restores into a clean place) and nothing is written
        through a symlink that happens to be in dest."""
        root = Path(dest)
        root.parent.mkdir(parents=True, exist_ok=True)
        stage = Path(tempfile.mkdtemp(prefix=f".{root.name}.restoring-", dir=root.parent))
        closers = []

        def sink(entry: Any) -> Any:
            write, close = file_writer(stage / entry.name, entry.size)
            closers.append(close)
            return write

        try:
            try:
                download(self.backend, self.pool, list(ckpt.objects), sink, ckpt.uri)
            finally:
                for close in closers:
                    close()
            _move_into(stage, root)
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        return root

    # --- fences and status -----------------------------------------------------------------
    def highest_attempt(self) -> int | None:
        """The highest attempt that has claimed this store (one bounded listing). Only fences of
        attempts a writer may claim count (layout.MAX_RUN_ATTEMPT): one beyond cannot fence forever."""
        for obj in self.backend.list(FENCES_LIVE, max_keys=4):
            attempt = parse_fence_key(obj.key)
            if attempt is not None:
                return attempt
        return None

    def read_status(self) -> dict[str, Any] | None:
        """The status record the newest writer keeps (see ENV.md, "Status channel")."""
        try:
            return json.loads(self.backend.get(STATUS))
        except ObjectMissing:
            return None
        except ValueError as exc:
            log.warning("status record %s/%s is unreadable: %s", self.uri, STATUS, exc)
            return None


STATUS_READ_OUTAGE_SECONDS = 15.0


def read_status_of(uri: str, outage_seconds: float = STATUS_READ_OUTAGE_SECONDS) -> dict[str, Any] | None:
    """The status record under `uri`, for a reader outside the training (the operator, its trigger):
    its reads are best effort with a fallback, so an S3 outage is waited out briefly, not for the
    training's AIRFLOW_GPU_S3_OUTAGE_SECONDS."""
    options = {"outage_seconds": outage_seconds} if uri.lower().startswith("s3://") else {}
    with CheckpointStore(uri, **options) as store:
        return store.read_status()


def _move_into(stage: Path, root: Path) -> None:
    """Move the staged files into root: root itself if it does not exist (one rename), else each
    top-level entry, replacing what is there (a symlink is replaced, never followed)."""
    if not root.exists() and not root.is_symlink():
        os.rename(stage, root)
        stage.mkdir()  # the caller removes it
        return
    if root.is_symlink() or not root.is_dir():
        raise ConfigError(f"restore destination {root} is not a directory; pass a directory path")
    for child in stage.iterdir():
        target = root / child.name
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        os.rename(child, target)
