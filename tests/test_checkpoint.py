"""airflow_gpu.checkpoint against SeaweedFS and file://: every data kind round-trips with checksums,
broken checkpoints are skipped for the previous one, retention and GC, bad input, status record."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import pytest

from airflow_gpu import constants as C
from airflow_gpu.checkpoint import (
    CheckpointExistsError,
    Checkpointer,
    CheckpointStore,
    ConfigError,
    TrainingEnv,
    restore_from_uri,
)
from airflow_gpu.checkpoint.layout import DATA, manifest_key, new_save_id


def writer(uri: str, attempt: int = 1, **kw) -> Checkpointer:
    kw.setdefault("part_size", 5 << 20)
    return Checkpointer(uri, attempt=attempt, handle_sigterm=False, **kw)


def test_every_data_kind_round_trips(checkpoint_store_uri, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "model.bin").write_bytes(os.urandom(3000))
    (src / "sub" / "opt.bin").write_bytes(b"")
    state = {"w": np.arange(12.0).reshape(3, 4), "epoch": 7, "lr": 0.5, "name": "mlp", "inner": {"v": np.ones(2, np.float32)}}
    with writer(checkpoint_store_uri) as ckpt:
        assert ckpt.resume() is None
        c0 = ckpt.save(0, b"raw bytes", metadata={"note": "bytes"})
        c1 = ckpt.save(1, src, metadata={"note": "dir"})
        c2 = ckpt.save(2, {"a.txt": b"alpha", "b/c.txt": src / "model.bin"})
        c3 = ckpt.save(3, state, metadata={"loss": 0.25})
        store = ckpt.store
        assert [c.step for c in store.checkpoints()] == [3, 2, 1]  # keep_last=3 pruned step 0
        restored = ckpt.resume()
    assert (c0.kind, c1.kind, c2.kind, c3.kind) == ("bytes", "files", "files", "numpy")
    assert restored.step == 3 and restored.metadata == {"loss": 0.25}
    got = restored.data
    assert np.array_equal(got["w"], state["w"]) and got["inner"]["v"].dtype == np.float32
    assert (got["epoch"], got["lr"], got["name"]) == (7, 0.5, "mlp") and isinstance(got["epoch"], int)
    with CheckpointStore(checkpoint_store_uri) as reader:
        dest = reader.restore_files(reader.load(c1.key), tmp_path / "out")
        assert (dest / "model.bin").read_bytes() == (src / "model.bin").read_bytes()
        assert (dest / "sub" / "opt.bin").read_bytes() == b""
        assert bytes(reader.read(reader.load(c2.key), "b/c.txt")) == (src / "model.bin").read_bytes()
        assert reader.latest(verify="checksums").step == 3


def test_multipart_object_and_corrupt_part_falls_back(checkpoint_store_uri, caplog):
    big = os.urandom(11 << 20)  # three 5 MiB parts
    with writer(checkpoint_store_uri) as ckpt:
        ckpt.save(1, big)
        second = ckpt.save(2, big[::-1])
        assert len(second.objects[0].parts) == 3
        # flip bytes inside the middle part of the newest checkpoint, keeping its size
        backend = ckpt.store.backend
        obj = second.objects[0]
        data = bytearray(backend.get(obj.key))
        data[(5 << 20) + 100] ^= 0xFF
        backend.put(obj.key, bytes(data))
        assert ckpt.store.latest().step == 2  # sizes still match: only checksums can tell
        with caplog.at_level(logging.WARNING):
            assert ckpt.store.latest(verify="checksums").step == 1
            restored = ckpt.resume()
    assert restored.step == 1 and restored.data == big
    assert "part 2 fails its CRC32 checksum" in caplog.text


def test_incomplete_and_unreadable_checkpoints_are_skipped(checkpoint_store_uri, caplog):
    with writer(checkpoint_store_uri, keep_last=10) as ckpt:
        for step in range(3):
            ckpt.save(step, f"step {step}".encode())
        newest = ckpt.store.latest()
        ckpt.store.backend.delete([newest.objects[0].key])  # data lost after the commit
        ckpt.store.backend.put(manifest_key(1, 99), b"{not json")  # a torn/garbage manifest
        with caplog.at_level(logging.WARNING):
            assert ckpt.store.latest().step == 1
            assert ckpt.resume().data == b"step 1"
    assert "is missing" in caplog.text and "not a valid checkpoint manifest" in caplog.text


def test_latest_falls_back_past_a_full_page_of_broken_manifests(tmp_path):
    uri = f"file://{tmp_path}"
    with writer(uri, keep_last=100) as ckpt:
        ckpt.save(1, b"good")
        for step in range(2, 22):  # 20 newer manifests, all garbage: more than the first page (16)
            ckpt.store.backend.put(manifest_key(1, step), b"garbage")
        assert ckpt.store.latest().step == 1


def test_retention_keeps_last_n_plus_every_kth_and_collects_garbage(checkpoint_store_uri):
    with writer(checkpoint_store_uri, keep_last=3, keep_every=5, gc_grace_seconds=0, gc_every=1) as ckpt:
        # data of saves that never committed: own attempt, an older attempt, a newer attempt
        backend = ckpt.store.backend
        orphans = {a: new_save_id(a, 1000) for a in (0, 1, 2)}
        for save_id in orphans.values():
            backend.put(f"{DATA}{save_id}/x/y.bin", b"orphan")
        for step in range(21):
            ckpt.save(step, f"s{step}".encode())
        store = ckpt.store
        steps = sorted(c.step for c in store.checkpoints())
        assert steps == [0, 5, 10, 15, 18, 19, 20]
        live = {store.load(k).save_id for k in store.manifest_keys()}
        dirs = set(backend.list_dirs(DATA))
    assert dirs == live | {orphans[2]}  # a newer attempt's in-flight save is never touched


def test_gc_grace_protects_recent_saves_of_earlier_attempts(tmp_path):
    uri = f"file://{tmp_path}"
    with writer(uri, attempt=5, gc_grace_seconds=3600, gc_every=1) as ckpt:
        old = new_save_id(4, 7)
        ckpt.store.backend.put(f"{DATA}{old}/a", b"maybe a zombie still uploading")
        ckpt.save(1, b"x")
        assert old in ckpt.store.backend.list_dirs(DATA)


def test_same_step_twice(checkpoint_store_uri):
    with writer(checkpoint_store_uri) as ckpt:
        first = ckpt.save(4, b"a")
        assert ckpt.save(4, b"a") == first  # e.g. the SIGTERM save right after an epoch save
    with writer(checkpoint_store_uri) as again:  # same attempt, new process (container restart)
        with pytest.raises(CheckpointExistsError, match="already committed step 4"):
            again.save(4, b"b")
        assert again.save(5, b"c").step == 5


def test_status_record(checkpoint_store_uri):
    with writer(checkpoint_store_uri, attempt=3, interruptions=2) as ckpt:
        assert ckpt.store.read_status() is None
        saved = ckpt.save(12, b"x" * 10)
        status = CheckpointStore(checkpoint_store_uri).read_status()
    assert status["step"] == 12 and status["attempt"] == 3 and status["interruptions"] == 2
    assert status["checkpoint_uri"] == saved.uri and status["bytes"] == 10
    assert abs(status["time"] - saved.created_at) < 1e-6 and status["stop_requested_at"] is None


def test_resume_uri(tmp_path):
    source = f"file://{tmp_path / 'a'}"
    with writer(source, keep_last=5) as ckpt:
        c1 = ckpt.save(1, b"one")
        c2 = ckpt.save(2, b"two")
        ckpt.save(3, b"three")
    assert restore_from_uri(source).step == 3
    assert restore_from_uri(c2.uri).data == b"two"
    CheckpointStore(source).backend.delete([c2.objects[0].key])
    assert restore_from_uri(c2.uri).step == 1  # broken: the one before it
    # a new job warm-starts from another job's checkpoint, then prefers its own
    with writer(f"file://{tmp_path / 'b'}", resume_uri=c1.uri) as fresh:
        assert fresh.resume().data == b"one"
        fresh.save(10, b"own")
        assert fresh.resume().data == b"own"


def test_bad_input_is_rejected_with_the_fix(tmp_path, monkeypatch):
    uri = f"file://{tmp_path}"
    with pytest.raises(ConfigError, match="scheme 'gs' is not supported"):
        Checkpointer("gs://bucket/x")
    with pytest.raises(ConfigError, match="must be absolute"):
        Checkpointer("file://relative/path")
    with pytest.raises(ConfigError, match="has no bucket"):
        Checkpointer("s3:///prefix")
    with pytest.raises(ConfigError, match="attempt must be an int"):
        Checkpointer(uri, attempt=-1)
    with pytest.raises(ConfigError, match="below the store's minimum part size"):
        Checkpointer("s3://bucket/p", part_size=1024, endpoint_url="http://127.0.0.1:9")
    ckpt = writer(uri)
    with pytest.raises(ConfigError, match="step must be an int"):
        ckpt.save(-1, b"x")
    with pytest.raises(ConfigError, match="metadata must be JSON-serialisable"):
        ckpt.save(1, b"x", metadata={"when": object()})
    with pytest.raises(ConfigError, match="no such file or directory"):
        ckpt.save(1, str(tmp_path / "missing"))
    with pytest.raises(ConfigError, match="got int"):
        ckpt.save(1, 42)
    with pytest.raises(ConfigError, match="object name '../x'"):
        ckpt.save(1, {"../x": b"1"})
    with pytest.raises(ConfigError, match="numpy state dicts hold arrays"):
        ckpt.save(1, {"w": [1, 2]})
    assert ckpt.store.latest() is None  # nothing was written by any of these
    monkeypatch.setenv(C.ENV_ATTEMPT, "two")
    with pytest.raises(ConfigError, match="AIRFLOW_GPU_ATTEMPT='two' must be an integer"):
        Checkpointer.from_env()
    monkeypatch.setenv(C.ENV_ATTEMPT, "2")
    monkeypatch.delenv(C.ENV_CHECKPOINT_URI, raising=False)
    with pytest.raises(ConfigError, match="AIRFLOW_GPU_CHECKPOINT_URI is not set"):
        Checkpointer.from_env()
    monkeypatch.setenv(C.ENV_DEADLINE, "2026-12-02T15:00:00")
    with pytest.raises(ConfigError, match="has no timezone"):
        TrainingEnv.from_environ()


def test_environment_contract(tmp_path):
    env = {
        C.ENV_CHECKPOINT_URI: f"file://{tmp_path}",
        C.ENV_RESUME_URI: "s3://other/run/manifests/x.json",
        C.ENV_ATTEMPT: "7",
        C.ENV_INTERRUPTIONS: "2",
        C.ENV_DEADLINE: "2026-12-02T15:00:00Z",
        C.ENV_CHECKPOINT_KEEP_LAST: "4",
        C.ENV_CHECKPOINT_KEEP_EVERY: "100",
    }
    ckpt = Checkpointer.from_env(env, handle_sigterm=False)
    assert (ckpt.attempt, ckpt.interruptions, ckpt.keep_last, ckpt.keep_every) == (7, 2, 4, 100)
    assert ckpt.resume_uri == env[C.ENV_RESUME_URI] and ckpt.env.deadline.isoformat() == "2026-12-02T15:00:00+00:00"
    saved = ckpt.save(1, b"x")
    assert saved.extra["interruptions"] == 2 and json.loads(ckpt.store.backend.get("status.json"))["attempt"] == 7


def test_file_backend_survives_short_writes(tmp_path, monkeypatch):
    """os.write/os.pwrite may write less than asked, several times in a row: the bytes on disk are
    still the payload, each part at its own offset (parts written out of order)."""
    from airflow_gpu.checkpoint.storage.file import FileBackend

    real_write, real_pwrite, calls = os.write, os.pwrite, {"write": 0, "pwrite": 0}

    def short_write(fd, data):
        calls["write"] += 1
        return real_write(fd, bytes(data[:7]))

    def short_pwrite(fd, data, offset):
        calls["pwrite"] += 1
        return real_pwrite(fd, bytes(data[:7]), offset)

    backend = FileBackend(f"file://{tmp_path}", fsync=False)
    payload = os.urandom(100)
    monkeypatch.setattr(os, "write", short_write)
    monkeypatch.setattr(os, "pwrite", short_pwrite)
    backend.put("whole.bin", payload)
    handle = backend.multipart_begin("parts.bin")
    part = 40
    for index in (2, 0, 1):  # the last part first: the other parts land at their offsets regardless
        backend.multipart_put(handle, index, index * part, payload[index * part : (index + 1) * part])
    backend.multipart_complete(handle)
    monkeypatch.undo()
    assert calls["write"] > 10 and calls["pwrite"] > 10  # the short writes happened, many in a row
    assert (tmp_path / "whole.bin").read_bytes() == payload
    assert (tmp_path / "parts.bin").read_bytes() == payload
