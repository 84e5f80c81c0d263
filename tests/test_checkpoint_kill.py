"""kill -9 of a real writer process at random points of 200 saves, against SeaweedFS and file://.

The writer (this file run as a script) announces each phase of every save on stdout; the test
kills it with SIGKILL during the data upload, between the data and the manifest, or while the
manifest is being written, then checks that latest() is a complete checkpoint whose every byte
matches its checksums and the content written for that step. The manifest PUT to S3 is sent slowly
(byte by byte from a slow reader) so kills really land mid-request."""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import subprocess
import sys
import time
from collections import Counter

SAVES = 200
PHASES = ("upload", "between", "manifest")
MARKERS = {"U": "upload", "D": "between", "M": "manifest"}


def payload(step: int) -> dict[str, bytes]:
    """Content of the checkpoint of `step`: three objects, one big enough for multipart on file://."""
    def blob(tag: int, size: int) -> bytes:
        seed = hashlib.sha256(f"{step}/{tag}".encode()).digest()
        return (seed * (size // len(seed) + 1))[:size]

    return {"a.bin": blob(0, 3000), "b.bin": blob(1, 9000), "sub/c.bin": blob(2, 700)}


def store_options(uri: str) -> dict:
    return {} if uri.startswith("file://") else {"max_attempts": 2, "backoff_base": 0.05}


def contents(store, checkpoint) -> dict[str, bytes]:
    """Every object of a checkpoint, read back with checksum verification."""
    return {o.name: bytes(store.read(checkpoint, o.name)) for o in checkpoint.objects}


# --- the writer process ---------------------------------------------------------------------
class SlowReader(io.RawIOBase):
    """A request body that trickles out, so the manifest PUT is in flight for a while."""

    def __init__(self, data: bytes) -> None:
        self._buf = io.BytesIO(data)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._buf.seek(offset, whence)

    def tell(self) -> int:
        return self._buf.tell()

    def read(self, size: int = -1) -> bytes:
        time.sleep(0.001)
        return self._buf.read(min(size if size >= 0 else 64, 64))


def writer(uri: str, attempt: int) -> None:
    from airflow_gpu.checkpoint import Checkpointer

    ckpt = Checkpointer(uri, attempt=attempt, part_size=4096 if uri.startswith("file") else 5 << 20,
                        keep_last=3, gc_grace_seconds=0, handle_sigterm=False, workers=4, **store_options(uri))
    backend, current = ckpt.store.backend, {"step": -1}

    def say(marker: str) -> None:
        os.write(1, f"{marker} {current['step']}\n".encode())  # one write(2): lines from threads never interleave

    put, multipart_put, commit = backend.put, backend.multipart_put, ckpt._commit

    def traced_put(key: str, data: bytes, *, create_only: bool = False) -> None:
        if key.startswith("data/"):
            say("U")
            time.sleep(0.001)
        elif key.startswith("manifests/"):
            say("M")
        put(key, data, create_only=create_only)

    def traced_part(handle, index, offset, data):
        say("U")
        time.sleep(0.001)
        multipart_put(handle, index, offset, data)

    def traced_commit(checkpoint, body):
        say("D")
        time.sleep(0.004)
        commit(checkpoint, body)

    backend.put, backend.multipart_put, ckpt._commit = traced_put, traced_part, traced_commit
    if hasattr(backend, "client"):
        put_object = backend.client.put_object

        def slow_put_object(**kwargs):
            if "/manifests/" in "/" + kwargs["Key"]:
                kwargs["Body"] = SlowReader(kwargs["Body"])
            return put_object(**kwargs)

        backend.client.put_object = slow_put_object
    ckpt.claim()
    latest = ckpt.store.latest()
    step = 0
    if latest is not None:
        assert contents(ckpt.store, latest) == payload(latest.step), "resumed content does not match its step"
        step = latest.step + 1
    os.write(1, f"R {step - 1}\n".encode())
    while True:
        current["step"] = step
        ckpt.save(step, payload(step), metadata={"step": step})
        os.write(1, f"C {step}\n".encode())
        step += 1


# --- the test --------------------------------------------------------------------------------
def verify_latest(uri: str) -> int | None:
    """Step of latest(), after reading every byte of it back and comparing with what was written."""
    from airflow_gpu.checkpoint import CheckpointStore

    with CheckpointStore(uri, **store_options(uri)) as store:
        latest = store.latest(verify="checksums")
        if latest is None:
            return None
        assert contents(store, latest) == payload(latest.step), f"latest {latest.uri} verified but holds other content"
        return latest.step


def leftovers(uri: str) -> tuple[set[str], set[str]]:
    from airflow_gpu.checkpoint import CheckpointStore

    with CheckpointStore(uri, **store_options(uri)) as store:
        referenced = {store.load(k).save_id for k in store.manifest_keys()}
        return set(store.backend.list_dirs("data/")), referenced


def run_kill_campaign(uri: str, env: dict[str, str], seed: int) -> dict:
    rng = random.Random(seed)
    saves = commits = processes = attempt = 0
    kills: Counter[str] = Counter()
    landed: Counter[str] = Counter()  # the killed save was committed anyway (kill after the commit point)
    last_committed = -1
    while saves < SAVES:
        if rng.random() < 0.7:
            attempt += 1  # a new pod; otherwise the same pod's container restarts
        target_phase, target_save = rng.choice(PHASES), rng.randint(2, 8)
        proc = subprocess.Popen(
            [sys.executable, __file__, "writer", uri, str(attempt)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True, env=env,
        )
        processes += 1
        started_in_proc, killed_step, killed_phase = 0, None, None
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                marker, raw_step = line.split()
                step = int(raw_step)
                if marker == "R":
                    assert step == last_committed, f"resumed from {step}, last committed was {last_committed}"
                elif marker == "C":
                    commits += 1
                    last_committed = step
                elif marker in MARKERS:
                    if step != killed_step:  # the first marker of a new save
                        killed_step = step
                        saves += 1
                        started_in_proc += 1
                    phase = MARKERS[marker]
                    if (phase == target_phase and started_in_proc > target_save) or saves >= SAVES:
                        time.sleep(rng.uniform(0, 0.003))
                        proc.kill()
                        killed_phase = phase
                        break
        finally:
            proc.kill()
            proc.wait()
            # what the writer wrote before it died and this loop had not read yet: on a loaded
            # machine it may have finished the save in flight and begun (even committed) the next
            rest = proc.stdout.read()  # type: ignore[union-attr]
            stderr = proc.stderr.read()  # type: ignore[union-attr]
            proc.stdout.close()  # type: ignore[union-attr]
            proc.stderr.close()  # type: ignore[union-attr]
        for line in rest.splitlines() if killed_phase is not None else ():
            marker, raw_step = line.split()
            step = int(raw_step)
            if marker == "C":
                commits += 1
                last_committed = step
            elif marker in MARKERS:
                if step != killed_step:
                    killed_step = step
                    saves += 1
                killed_phase = MARKERS[marker]
        assert killed_phase is not None, f"writer exited early (rc={proc.returncode}):\n{stderr[-3000:]}"
        kills[killed_phase] += 1
        observed = verify_latest(uri)
        assert observed is not None or last_committed < 0
        if observed is not None:
            # never older than what was known committed, never newer than the save in flight
            assert last_committed <= observed <= killed_step, (observed, last_committed, killed_step)
            if observed == killed_step:
                landed[killed_phase] += 1
                last_committed = observed
    return {
        "saves": saves, "commits": commits, "processes": processes, "attempts": attempt,
        "kills": dict(kills), "killed_but_committed": dict(landed), "latest_step": last_committed,
    }


def _campaign(uri: str, env: dict[str, str], seed: int) -> None:
    report = run_kill_campaign(uri, env, seed)
    print("kill -9 campaign", uri.split(":")[0], json.dumps(report, sort_keys=True))
    assert report["saves"] >= SAVES
    assert sum(report["kills"].values()) == report["processes"]
    assert all(report["kills"].get(p, 0) >= 5 for p in PHASES), report
    # a final, uninterrupted save collects the garbage of every killed save
    final = subprocess.run(
        [sys.executable, __file__, "writer-once", uri, "99999"], capture_output=True, text=True, env=env, timeout=60
    )
    assert final.returncode == 0, final.stderr[-3000:]
    dirs, referenced = leftovers(uri)
    assert dirs == referenced, f"garbage left: {sorted(dirs - referenced)}"
    assert len(referenced) == 3  # keep_last


def test_kill9_during_200_saves_file(tmp_path):
    env = dict(os.environ)
    _campaign(f"file://{tmp_path / 'store'}", env, seed=1)
    assert not list((tmp_path / "store" / ".tmp").iterdir()), "temp files of killed writers were not collected"


def test_kill9_during_200_saves_seaweedfs(seaweedfs, s3_bucket):
    env = dict(os.environ) | seaweedfs.env()
    os.environ.update(seaweedfs.env())  # the verifying reader in this process uses the same endpoint
    try:
        _campaign(f"s3://{s3_bucket}/kill", env, seed=2)
        uploads = seaweedfs.client().list_multipart_uploads(Bucket=s3_bucket).get("Uploads", [])
        assert uploads == []
    finally:
        for key in seaweedfs.env():
            os.environ.pop(key, None)


if __name__ == "__main__":
    if sys.argv[1] == "writer":
        writer(sys.argv[2], int(sys.argv[3]))
    elif sys.argv[1] == "writer-once":
        from airflow_gpu.checkpoint import Checkpointer

        c = Checkpointer(sys.argv[2], attempt=int(sys.argv[3]), keep_last=3, gc_grace_seconds=0, handle_sigterm=False,
                         part_size=4096 if sys.argv[2].startswith("file") else 5 << 20, **store_options(sys.argv[2]))
        c.claim()
        latest = c.store.latest()
        c.save(latest.step + 1, payload(latest.step + 1))
