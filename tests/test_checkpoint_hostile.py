"""Issue 10, items 5 and 7: a checkpoint manifest is untrusted input (AIRFLOW_GPU_RESUME_URI reads
other jobs' stores). Names and keys stay inside dest and the store, stray manifests are skipped,
ambiguous saves are refused, a fallback restores into a clean place. On file:// and SeaweedFS."""

from __future__ import annotations

import json
import logging
import os

import pytest

from airflow_gpu.checkpoint import Checkpointer, CheckpointStore
from airflow_gpu.checkpoint.errors import ConfigError
from airflow_gpu.checkpoint.layout import MANIFESTS, manifest_key


def _plant(store: CheckpointStore, attempt: int, step: int, body: dict) -> str:
    """Write a hand-made manifest as a hostile or broken writer would."""
    key = manifest_key(attempt, step)
    store.backend.put(key, json.dumps(body).encode())
    return key


def _manifest(store: CheckpointStore, key: str) -> dict:
    return json.loads(store.backend.get(key))


def _put_outside(store: CheckpointStore, uri: str, tmp_path, name: str) -> callable:
    """A file outside the store; returns a function telling whether it still exists / was written."""
    if uri.startswith("file://"):
        path = tmp_path / name
        return lambda: path.exists()
    backend = store.backend
    key = name  # bucket root, outside the store's prefix runs/r1/

    def exists() -> bool:
        try:
            backend.client.head_object(Bucket=backend.bucket, Key=key)
            return True
        except Exception:
            return False
    return exists


def test_object_name_cannot_escape_dest(checkpoint_store_uri, tmp_path):
    with Checkpointer(checkpoint_store_uri, attempt=1, handle_sigterm=False) as ckpt:
        good = ckpt.save(1, {"model.bin": b"good weights"})
        body = _manifest(ckpt.store, good.key)
        body["step"] = 2
        body["objects"][0]["name"] = "../../escaped.txt"
        _plant(ckpt.store, 1, 2, body)
        dest = tmp_path / "a" / "b" / "dest"
        restored = Checkpointer(checkpoint_store_uri, attempt=2, handle_sigterm=False).resume(dest=dest)
    assert restored.step == 1 and (dest / "model.bin").read_bytes() == b"good weights"
    escaped = [p for p in tmp_path.rglob("escaped.txt")]
    assert escaped == [] and sorted(p.name for p in dest.iterdir()) == ["model.bin"]


def test_retention_never_deletes_outside_the_store(checkpoint_store_uri, tmp_path):
    with Checkpointer(checkpoint_store_uri, attempt=1, keep_last=1, handle_sigterm=False) as ckpt:
        first = ckpt.save(1, b"one")
        if checkpoint_store_uri.startswith("file://"):
            (tmp_path / "victim.txt").write_text("not yours")
        else:
            ckpt.store.backend.client.put_object(Bucket=ckpt.store.backend.bucket, Key="victim.txt", Body=b"x")
        victim = _put_outside(ckpt.store, checkpoint_store_uri, tmp_path, "victim.txt")
        assert victim()
        body = _manifest(ckpt.store, first.key)
        body["step"] = 2
        body["objects"][0]["key"] = f"data/{body['save_id']}/../../../victim.txt"
        _plant(ckpt.store, 1, 2, body)
        ckpt.save(3, b"three")  # retention prunes steps 1 and 2 (keep_last=1)
        ckpt.save(4, b"four")
        assert [k for k in ckpt.store.manifest_keys()] == [manifest_key(1, 4)]
        assert victim(), "retention deleted a file outside the store"


def _stray_bodies(valid: dict) -> dict[str, dict]:
    deep: object = 1
    for _ in range(100_000):
        deep = [deep]
    return {
        "step 1e999": valid | {"step": 1e999},
        "size 1e999": valid | {"objects": [valid["objects"][0] | {"size": 1e999}]},
        "deep metadata": valid | {"metadata": {"x": "DEEP"}},
        "kind without objects": valid | {"objects": []},
        "unknown kind": valid | {"kind": "pickle"},
        "not an object": [],
    }


def test_stray_manifests_are_skipped(checkpoint_store_uri, tmp_path, caplog):
    with Checkpointer(checkpoint_store_uri, attempt=1, handle_sigterm=False) as ckpt:
        good = ckpt.save(1, b"good")
        valid = _manifest(ckpt.store, good.key)
        for attempt, (what, body) in enumerate(_stray_bodies(valid).items(), start=2):
            raw = json.dumps(body)
            if what == "deep metadata":
                raw = raw.replace('"DEEP"', "[" * 100_000 + "]" * 100_000)
            key = manifest_key(attempt, 1)
            ckpt.store.backend.put(key, raw.replace('"attempt": 1,', f'"attempt": {attempt},').encode())
    with caplog.at_level(logging.WARNING, logger="airflow_gpu.checkpoint"):
        with Checkpointer(checkpoint_store_uri, attempt=9, handle_sigterm=False) as again:
            assert again.latest().step == 1
            restored = again.resume()
    assert restored.data == b"good"
    assert sum("skipping checkpoint" in r.message for r in caplog.records) >= 6


def test_ambiguous_names_refused_at_save(checkpoint_store_uri):
    with Checkpointer(checkpoint_store_uri, attempt=1, handle_sigterm=False) as ckpt:
        with pytest.raises(ConfigError, match="'a' would be the directory of object 'a/b'"):
            ckpt.save(2, {"a": b"1", "a/b": b"2"})
        assert ckpt.store.backend.list(MANIFESTS) == []


def test_fallback_restores_into_a_clean_place(checkpoint_store_uri, tmp_path):
    src_old, src_new = tmp_path / "old", tmp_path / "new"
    src_old.mkdir()
    src_new.mkdir()
    (src_old / "weights.bin").write_bytes(b"old" * 1000)
    (src_new / "weights.bin").write_bytes(b"new" * 1000)
    (src_new / "optimizer.bin").write_bytes(b"opt" * 1000)
    with Checkpointer(checkpoint_store_uri, attempt=1, handle_sigterm=False) as ckpt:
        ckpt.save(1, src_old)
        newest = ckpt.save(2, src_new)
        broken = newest.object("weights.bin")  # same size, wrong bytes: its checksum fails on restore
        ckpt.store.backend.put(broken.key, b"bad" * 1000)
    dest = tmp_path / "dest"
    restored = Checkpointer(checkpoint_store_uri, attempt=2, handle_sigterm=False).resume(dest=dest)
    assert restored.step == 1
    assert sorted(p.name for p in dest.iterdir()) == ["weights.bin"]  # no optimizer.bin of the broken one
    assert (dest / "weights.bin").read_bytes() == b"old" * 1000
    assert not [p for p in tmp_path.iterdir() if ".restoring-" in p.name]


def test_symlink_out_of_a_saved_directory_is_not_followed(checkpoint_store_uri, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("private key")
    src = tmp_path / "src"
    src.mkdir()
    (src / "weights.bin").write_bytes(b"w")
    os.symlink(secret, src / "leak.txt")
    os.symlink(src / "weights.bin", src / "alias.bin")  # inside: saved as the file it names
    with Checkpointer(checkpoint_store_uri, attempt=1, handle_sigterm=False) as ckpt:
        saved = ckpt.save(1, src)
    assert sorted(o.name for o in saved.objects) == ["alias.bin", "weights.bin"]
