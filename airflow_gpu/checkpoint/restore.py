"""Restoring: read a checkpoint's data back into what save() was given, verifying checksums, and
fall back to older checkpoints when the newest is broken."""

from __future__ import annotations

import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from airflow_gpu.checkpoint.errors import ConfigError, CorruptCheckpointError
from airflow_gpu.checkpoint.layout import MANIFESTS, Checkpoint, parse_manifest_key
from airflow_gpu.checkpoint.serialize import BYTES_OBJECT, NUMPY_OBJECT, TORCH_OBJECT, numpy_state, torch_state
from airflow_gpu.checkpoint.store import CheckpointStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Restored:
    """A restored checkpoint. `data` is bytes (kind "bytes"), a state dict ("numpy", "torch") or the
    directory the files were written to ("files")."""

    checkpoint: Checkpoint
    data: Any

    @property
    def step(self) -> int:
        return self.checkpoint.step

    @property
    def metadata(self) -> dict[str, Any]:
        return self.checkpoint.metadata


def materialize(store: CheckpointStore, ckpt: Checkpoint, dest: str | Path | None = None) -> Restored:
    """Read and verify a checkpoint's data into what save() was given (see serialize.py)."""
    try:
        return _materialize(store, ckpt, dest)
    except KeyError as exc:  # a kind without its object: a stray or foreign manifest
        raise CorruptCheckpointError(str(exc.args[0] if exc.args else exc)) from None


def _materialize(store: CheckpointStore, ckpt: Checkpoint, dest: str | Path | None) -> Restored:
    if ckpt.kind == "bytes":
        return Restored(ckpt, bytes(store.read(ckpt, BYTES_OBJECT)))
    if ckpt.kind == "numpy":
        return Restored(ckpt, numpy_state(store.read(ckpt, NUMPY_OBJECT), ckpt.extra.get("python_scalars", [])))
    if ckpt.kind == "torch":
        return Restored(ckpt, torch_state(store.read(ckpt, TORCH_OBJECT)))
    if ckpt.kind == "files":
        target = Path(dest) if dest is not None else Path(tempfile.mkdtemp(prefix="checkpoint-"))
        return Restored(ckpt, store.restore_files(ckpt, target))
    raise CorruptCheckpointError(f"checkpoint {ckpt.uri} has unknown kind {ckpt.kind!r}")


def restore_newest(store: CheckpointStore, dest: str | Path | None = None) -> Restored | None:
    """The newest checkpoint whose data verifies; broken ones are skipped with a warning."""
    for ckpt in store.checkpoints(verify="objects"):
        try:
            return materialize(store, ckpt, dest)
        except CorruptCheckpointError as exc:
            log.warning("cannot restore %s, trying the previous checkpoint: %s", ckpt.uri, exc)
    return None


def restore_from_uri(uri: str, dest: str | Path | None = None, **backend_options: Any) -> Restored | None:
    """A checkpoint URI (.../manifests/<key>.json) restores that checkpoint, falling back to older
    ones in its store if it is broken; a store URI restores that store's newest checkpoint."""
    base, sep, name = uri.partition(f"/{MANIFESTS}")
    store = CheckpointStore(base, **backend_options)
    try:
        if not sep:
            return restore_newest(store, dest)
        wanted = parse_manifest_key(name)
        if wanted is None:
            raise ConfigError(f"resume URI {uri!r} names no checkpoint manifest (expected {MANIFESTS}<attempt>-<step>.json)")
        for ckpt in store.checkpoints(verify="objects"):
            if (ckpt.attempt, ckpt.step) > wanted:
                continue
            try:
                return materialize(store, ckpt, dest)
            except CorruptCheckpointError as exc:
                log.warning("cannot restore %s, trying the previous checkpoint: %s", ckpt.uri, exc)
        return None
    finally:
        store.close()
