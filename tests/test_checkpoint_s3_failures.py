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
