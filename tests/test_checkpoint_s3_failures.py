"""S3 unreachable: retries with back-off, then a clear error naming the endpoint; nothing corrupted.

A small TCP proxy stands between the writer and SeaweedFS so the outage can start in the middle of
a save (after its first data part went through) and end again."""

from __future__ import annotations

import logging
import os
import threading

import pytest

from airflow_gpu.checkpoint import Checkpointer, CheckpointStore, StoreUnavailableError
from airflow_gpu.devtools.processes import free_port
from airflow_gpu.devtools.tcpproxy import Proxy


def test_unreachable_endpoint_retries_then_names_it(tmp_path, caplog):
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    ckpt = Checkpointer("s3://bucket/run", endpoint_url=endpoint, aws_access_key_id="a", aws_secret_access_key="b",
                        max_attempts=4, backoff_base=0.05, handle_sigterm=False)
    with caplog.at_level(logging.WARNING), pytest.raises(StoreUnavailableError) as err:
        ckpt.save(1, b"x")
    message = str(err.value)
    assert f"S3 endpoint {endpoint} unreachable" in message and "failed 4 times" in message
    assert "s3://bucket/run/fences/" in message  # which operation on which key
    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert [m.split("retry ")[1].split(" in ")[0] for m in retries] == ["1/3", "2/3", "3/3"]


def test_outage_during_save_corrupts_nothing(seaweedfs, s3_bucket, caplog):
    proxy = Proxy(int(seaweedfs.endpoint_url.rsplit(":", 1)[1])).start()
    options = seaweedfs.client_options() | {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}
    uri = f"s3://{s3_bucket}/outage"
    ckpt = Checkpointer(uri, attempt=1, part_size=5 << 20, max_attempts=3, backoff_base=0.05, handle_sigterm=False,
                        gc_grace_seconds=0, **options)
    good = os.urandom(11 << 20)
    ckpt.save(1, good)
    put_part = ckpt.store.backend.multipart_put
    first_part_sent = threading.Event()

    def cut_after_first_part(handle, index, offset, data):
        if index > 0:
            first_part_sent.wait(30)
            proxy.cut()  # the network goes away in the middle of the upload
        put_part(handle, index, offset, data)
        if index == 0:
            first_part_sent.set()

    ckpt.store.backend.multipart_put = cut_after_first_part
    with pytest.raises(StoreUnavailableError, match=f"S3 endpoint http://127.0.0.1:{proxy.port} unreachable"):
        ckpt.save(2, os.urandom(11 << 20))
    assert first_part_sent.is_set()  # the outage really began mid-save
    # a reader straight at the server: the last complete checkpoint, every byte intact
    with CheckpointStore(uri, **seaweedfs.client_options()) as reader:
        latest = reader.latest(verify="checksums")
        assert latest.step == 1 and bytes(reader.read(latest, "data")) == good
        assert len(reader.manifest_keys()) == 1
    # the network comes back: the same writer saves step 2, and GC removes the broken upload
    proxy.start()
    ckpt.store.backend.multipart_put = put_part
    ckpt.gc_every = 1
    ckpt.save(2, b"after the outage")
    with CheckpointStore(uri, **seaweedfs.client_options()) as reader:
        assert reader.latest(verify="checksums").step == 2
        live = {reader.load(k).save_id for k in reader.manifest_keys()}
        assert set(reader.backend.list_dirs("data/")) == live
    assert seaweedfs.client().list_multipart_uploads(Bucket=s3_bucket).get("Uploads", []) == []
    proxy.cut()


def test_an_outage_shorter_than_the_window_is_ridden_out(seaweedfs, s3_bucket):
    """The default outage window (AIRFLOW_GPU_S3_OUTAGE_SECONDS, 300 s) outlasts a 12 s outage: the
    save waits it out and commits, instead of failing the training (and spending an Airflow retry)."""
    import time

    proxy = Proxy(int(seaweedfs.endpoint_url.rsplit(":", 1)[1])).start()
    options = seaweedfs.client_options() | {"endpoint_url": f"http://127.0.0.1:{proxy.port}"}
    ckpt = Checkpointer(f"s3://{s3_bucket}/ride-out", attempt=1, handle_sigterm=False, backoff_max=2.0, **options)
    assert ckpt.store.backend.outage_seconds == 300
    ckpt.save(1, b"before")
    proxy.cut()
    threading.Timer(12.0, proxy.start).start()
    started = time.monotonic()
    ckpt.save(2, b"through the outage")
    assert time.monotonic() - started >= 11
    with CheckpointStore(f"s3://{s3_bucket}/ride-out", **seaweedfs.client_options()) as reader:
        latest = reader.latest(verify="checksums")
        assert latest.step == 2 and bytes(reader.read(latest, "data")) == b"through the outage"
    proxy.cut()


def test_a_trainer_that_outlives_the_window_exits_as_an_infrastructure_failure(tmp_path):
    """Past the window the training process exits EXIT_CODE_STORE_UNAVAILABLE (not 1), which the
    operator relaunches as the next attempt of the same try; kube.state reads it so."""
    import subprocess
    import sys

    from airflow_gpu import constants as C
    from airflow_gpu.kube import state as S

    script = (
        "from airflow_gpu.checkpoint import Checkpointer\n"
        f"ck = Checkpointer('s3://bucket/run', endpoint_url='http://127.0.0.1:{free_port()}',"
        " aws_access_key_id='a', aws_secret_access_key='b', backoff_base=0.05, backoff_max=0.2)\n"
        "ck.save(1, b'x')\n"
    )
    env = {**os.environ, C.ENV_S3_OUTAGE_SECONDS: "1.5"}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert out.returncode == C.EXIT_CODE_STORE_UNAVAILABLE, out.stderr[-2000:]
    assert "StoreUnavailableError" in out.stderr and "infrastructure failure" in out.stderr
    bad = subprocess.run([sys.executable, "-c", "raise ValueError('a bug in training')"], capture_output=True, env=env)
    assert bad.returncode == 1  # any other error stays an application failure

    def pod(name, code):
        return {"metadata": {"name": name, "uid": name},
                "spec": {"nodeName": "n0"},
                "status": {"phase": "Failed", "containerStatuses": [
                    {"name": "main", "state": {"terminated": {"exitCode": code}}}]}}

    infra = S.gang_state([pod("g-0", C.EXIT_CODE_STORE_UNAVAILABLE), pod("g-1", C.EXIT_CODE_STORE_UNAVAILABLE)])
    assert infra.phase == S.DISRUPTED and infra.reason.startswith(S.REASON_STORE_UNAVAILABLE)
    mixed = S.gang_state([pod("g-0", C.EXIT_CODE_STORE_UNAVAILABLE), pod("g-1", 1)])
    assert mixed.phase == S.FAILED  # a rank that failed on its own is the application's failure
