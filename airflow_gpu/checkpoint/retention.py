"""Retention (keep the last N checkpoints plus every K-th step) and garbage collection of data that
no manifest references (saves killed before their commit, checkpoints pruned by retention).

Run by the writer after each commit. Order matters for readers: a manifest is deleted before its
data, so a checkpoint stops existing before anything it needs disappears."""

from __future__ import annotations

import logging
import time

from airflow_gpu.checkpoint.errors import CorruptCheckpointError
from airflow_gpu.checkpoint.layout import DATA, parse_manifest_key, parse_save_id
from airflow_gpu.checkpoint.store import CheckpointStore

log = logging.getLogger(__name__)


def apply_retention(store: CheckpointStore, attempt: int, keep_last: int, keep_every: int | None) -> list[str]:
    """Delete checkpoints outside the policy (manifest first, then its data); returns the deleted
    manifest keys. Checkpoints of attempts newer than `attempt` are never touched."""
    keys = store.manifest_keys()
    doomed = []
    for key in keys[keep_last:]:
        key_attempt, step = parse_manifest_key(key)  # type: ignore[misc]
        if key_attempt > attempt or (keep_every and step % keep_every == 0):
            continue
        doomed.append(key)
    if not doomed:
        return []
    pruned = []
    for key in doomed:
        try:
            pruned.append(store.load(key))
        except CorruptCheckpointError:
            pass  # its data (if any) is left to collect_garbage
    store.backend.delete(doomed)
    for key in doomed:
        store.forget(key)
    for ckpt in pruned:
        delete_objects(store, ckpt.save_id, [o.key for o in ckpt.objects])
    log.info("retention: deleted %d checkpoint(s) of %s", len(doomed), store.uri)
    return doomed


def collect_garbage(store: CheckpointStore, attempt: int, grace_seconds: float) -> int:
    """Delete data of saves no manifest references. Own attempt: at once (this writer is the only
    one of its attempt and is not mid-save). Earlier attempts: only when their newest object is
    older than grace_seconds (store clock). Newer attempts: never. Also removes temp files and
    multipart uploads of writers killed mid-write. Returns the number of saves deleted."""
    referenced_saves: set[str] = set()
    referenced_steps: set[tuple[int, int]] = set()
    for key in store.manifest_keys():
        try:
            referenced_saves.add(store.load(key).save_id)
        except CorruptCheckpointError:
            referenced_steps.add(parse_manifest_key(key))  # type: ignore[arg-type]  # unreadable: keep its data
    deleted = 0
    cutoff = time.time() - grace_seconds
    for save_id in store.backend.list_dirs(DATA):
        parsed = parse_save_id(save_id)
        if parsed is None or save_id in referenced_saves or parsed in referenced_steps or parsed[0] > attempt:
            continue
        objects = store.backend.list(f"{DATA}{save_id}/")
        if parsed[0] < attempt and objects and max(o.modified for o in objects) >= cutoff:
            continue
        delete_objects(store, save_id, [o.key for o in objects])
        deleted += 1
    if deleted:
        log.info("gc: deleted data of %d uncommitted or pruned save(s) under %s", deleted, store.uri)
    store.backend.clean_temp(grace_seconds)
    return deleted


def delete_objects(store: CheckpointStore, save_id: str, keys: list[str] | None = None) -> None:
    """Delete a save's data objects, then its directory entries: some S3 servers (SeaweedFS) keep
    empty "directories" that would otherwise pile up in every later listing."""
    if keys is None:
        keys = [o.key for o in store.backend.list(f"{DATA}{save_id}/")]
    if keys:
        store.backend.delete(keys)
    dirs = {f"{DATA}{save_id}/"}
    for key in keys:
        parts = key.split("/")[2:-1]  # data/<save_id>/<sub dirs...>/<name>
        dirs.update(f"{DATA}{save_id}/{'/'.join(parts[:i])}/" for i in range(1, len(parts) + 1))
    store.backend.delete(sorted(dirs, key=lambda d: d.count("/"), reverse=True))
