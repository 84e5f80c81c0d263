"""Checkpoint overheads against plain boto3 on the same SeaweedFS server (loopback), side by side.

1. Save and restore of a 1 GiB checkpoint (one file) with airflow_gpu.checkpoint vs boto3's
   managed upload_file / download_file of the same bytes (its defaults: 8 MiB parts, 10 threads,
   CRC32 on upload). Ours includes the fence checks, the CRC32 of every part, the manifest commit
   and status record on save, and latest() plus CRC32 verification of every byte on restore.
   Each round uploads with both, then downloads with both twice; which goes first alternates, and
   the page cache is synced before every timed transfer. Medians and best runs are reported (the
   machine is shared: the best run shows each side undisturbed).
   Target: ours >= 0.9 x boto3 for both directions.
2. latest() with 10,000 checkpoints under the prefix (target < 200 ms), next to a full listing of
   the 10,000 manifests (what a naive reader would do). The newest 10 checkpoints are real saves;
   9,990 older ones are manifests written directly in the same format (without data objects, which
   latest() never reads for checkpoints older than the newest complete one) to keep set-up short.

    python -m bench checkpoint         (env BENCH_CHECKPOINT_GIB=1, BENCH_CHECKPOINT_ROUNDS=3)
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from airflow_gpu.checkpoint import Checkpointer, CheckpointStore
from airflow_gpu.checkpoint.layout import Checkpoint, encode_manifest, manifest_key, new_save_id
from airflow_gpu.devtools.seaweedfs import SeaweedFS

MiB = 1024 * 1024
DOWNLOADS_PER_UPLOAD = 2


def make_file(path: Path, size: int) -> None:
    block = os.urandom(64 * MiB)  # incompressible; repeated blocks keep generation fast
    with open(path, "wb") as f:
        for offset in range(0, size, len(block)):
            f.write(block[: min(len(block), size - offset)])


def timed(fn) -> float:
    os.sync()  # start from clean page-cache state: dirty data of the previous transfer must not tax this one
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def throughput(server: SeaweedFS, size: int, rounds: int, work: Path) -> None:
    bucket = server.create_bucket("bench-throughput")
    source, dest = work / "source.bin", work / "restored"
    make_file(source, size)
    client = server.client()  # plain boto3, default transfer settings
    options = server.client_options()
    results: dict[str, list[float]] = {"boto3 upload_file": [], "ours save": [], "boto3 download_file": [], "ours restore": []}

    def plain(round_: int, direction: str) -> None:
        key = f"plain/{round_}.bin"
        if direction == "up":
            results["boto3 upload_file"].append(timed(lambda: client.upload_file(str(source), bucket, key)))
        else:
            results["boto3 download_file"].append(timed(lambda: client.download_file(bucket, key, str(work / "plain.bin"))))
            (work / "plain.bin").unlink()

    def ours(round_: int, direction: str) -> None:
        uri = f"s3://{bucket}/ours/{round_}"
        if direction == "up":
            with Checkpointer(uri, attempt=1, handle_sigterm=False, **options) as ckpt:
                results["ours save"].append(timed(lambda: ckpt.save(1, source)))
            return
        with Checkpointer(uri, attempt=2, handle_sigterm=False, **options) as ckpt:
            restored: list = []
            results["ours restore"].append(timed(lambda: restored.append(ckpt.resume(dest))))  # latest() + verify
            assert (dest / "source.bin").stat().st_size == size and restored[0].step == 1
            shutil.rmtree(dest)

    for round_ in range(rounds):
        order = (plain, ours) if round_ % 2 == 0 else (ours, plain)  # neither always goes first
        for who in order:
            who(round_, "up")
        for repeat in range(DOWNLOADS_PER_UPLOAD):
            for who in order if repeat % 2 == 0 else order[::-1]:
                who(round_, "down")
        for o in client.list_objects_v2(Bucket=bucket).get("Contents", []):
            client.delete_object(Bucket=bucket, Key=o["Key"])
    gib = size / 1024**3
    print(f"1. {gib:.2f} GiB checkpoint, SeaweedFS on loopback; {rounds} uploads and {rounds * DOWNLOADS_PER_UPLOAD} "
          "downloads each, interleaved, order alternating:")
    median = {name: size / MiB / statistics.median(times) for name, times in results.items()}
    best = {name: size / MiB / min(times) for name, times in results.items()}
    for name, times in results.items():
        print(f"   {name:20s} median {median[name]:6.1f} MB/s  best {best[name]:6.1f} MB/s   runs: "
              + ", ".join(f"{t:.2f}s" for t in times))
    for ours_name, plain_name in (("ours save", "boto3 upload_file"), ("ours restore", "boto3 download_file")):
        print(f"   ratio {ours_name} / {plain_name}: median {median[ours_name] / median[plain_name]:.2f}, "
              f"best {best[ours_name] / best[plain_name]:.2f}  (target >= 0.9)")


def synthetic(store: CheckpointStore, attempt: int, step: int) -> None:
    """A committed checkpoint of `step` with no data objects: only manifests matter to latest()
    until it reaches the newest ones, which are real."""
    ckpt = Checkpoint(step=step, attempt=attempt, save_id=new_save_id(attempt, step), kind="bytes",
                      created_at=time.time(), metadata={}, objects=(), key=manifest_key(attempt, step))
    store.backend.put(ckpt.key, encode_manifest(ckpt), create_only=True)


def latest_at_scale(uri: str, options: dict, count: int = 10_000) -> None:
    with CheckpointStore(uri, **options) as store:
        with ThreadPoolExecutor(32) as pool:
            list(pool.map(lambda i: synthetic(store, 1, i), range(count - 10)))
    with Checkpointer(uri, attempt=1, handle_sigterm=False, keep_last=count, **options) as ckpt:
        for step in range(count - 10, count):
            ckpt.save(step, b"real checkpoint %d" % step)
    latest_ms, listing_ms = [], []
    for _ in range(15):
        with CheckpointStore(uri, **options) as store:  # a fresh reader each time: no cached manifests
            found: list = []
            latest_ms.append(timed(lambda: found.append(store.latest())) * 1000)
            assert found[0].step == count - 1
            listing_ms.append(timed(lambda: found.append(len(store.manifest_keys()))) * 1000)
            assert found[1] == count
    scheme = uri.split(":")[0]
    print(f"   {scheme:4s} latest(): median {statistics.median(latest_ms):6.1f} ms, max {max(latest_ms):6.1f} ms"
          f"   | full listing of {count} manifests: median {statistics.median(listing_ms):7.1f} ms  (target latest < 200 ms)")


def main() -> None:
    size = int(float(os.environ.get("BENCH_CHECKPOINT_GIB", "1")) * 1024**3)
    rounds = int(os.environ.get("BENCH_CHECKPOINT_ROUNDS", "3"))
    work = Path(tempfile.mkdtemp(prefix="bench-checkpoint-"))
    try:
        with SeaweedFS() as server:
            throughput(server, size, rounds, work)
            print("2. latest() with 10,000 checkpoints under the prefix (15 fresh readers):")
            bucket = server.create_bucket("bench-latest")
            latest_at_scale(f"s3://{bucket}/many", server.client_options())
            latest_at_scale(f"file://{work / 'many'}", {})
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
