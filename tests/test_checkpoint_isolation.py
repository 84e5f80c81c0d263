"""The checkpoint library imports and works where Airflow cannot be imported: a training image
with the standard library, boto3 and numpy only. A meta-path blocker in a fresh interpreter refuses
every other top-level package, then the library saves and restores on file:// and S3 and the
example training script runs to the end."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

TRAINING_IMAGE = r'''
import importlib.abc, json, os, runpy, sys, tempfile
ALLOWED = set(sys.stdlib_module_names) | {
    "boto3", "botocore", "s3transfer", "jmespath", "dateutil", "urllib3", "six", "numpy", "airflow_gpu",
}
refused = []

class TrainingImage(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] not in ALLOWED:
            refused.append(name)
            raise ImportError(f"No module named {name!r} (not in the training image)")
        return None

sys.meta_path.insert(0, TrainingImage())
for name in [m for m in sys.modules if m.split(".")[0] not in ALLOWED and not m.startswith("_")]:
    sys.modules.pop(name)  # anything site.py pulled in must be importable again to count

from airflow_gpu.checkpoint import Checkpointer, CheckpointStore
from airflow_gpu import constants

results = {}
for uri in (f"file://{tempfile.mkdtemp()}", sys.argv[1]):
    with Checkpointer(uri, attempt=1, handle_sigterm=False) as ckpt:
        ckpt.save(1, b"weights")
        results[uri.split(":")[0]] = bytes(CheckpointStore(uri).read(ckpt.store.latest(), "data")).decode()

os.environ[constants.ENV_CHECKPOINT_URI] = sys.argv[1] + "-example"
sys.argv = ["train_numpy"]
try:
    runpy.run_module("airflow_gpu.checkpoint.examples.train_numpy", run_name="__main__")
except SystemExit as exc:
    results["example_exit"] = exc.code
results["airflow_modules"] = sorted(m for m in sys.modules if m == "airflow" or m.startswith("airflow."))
results["refused"] = sorted(set(refused))
print("RESULT " + json.dumps(results))
'''


def test_library_works_without_airflow(seaweedfs, s3_bucket):
    assert importlib.util.find_spec("airflow") is not None  # the test venv has Airflow: the blocker matters
    env = dict(os.environ) | seaweedfs.env() | {"AIRFLOW_GPU_EXAMPLE_EPOCHS": "3"}
    done = subprocess.run(
        [sys.executable, "-c", TRAINING_IMAGE, f"s3://{s3_bucket}/no-airflow"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (line,) = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    result = json.loads(line[len("RESULT "):])
    assert result["file"] == "weights" and result["s3"] == "weights"
    assert result["example_exit"] == 0 and '"event": "done"' in done.stdout
    assert result["airflow_modules"] == []
    # boto3/urllib3 probe optional accelerators (awscrt, brotli, OpenSSL, ...) and cope without them;
    # the library itself must not even try the project's other dependencies
    project = {"airflow", "pydantic", "kubernetes", "kubernetes_asyncio", "yaml", "pendulum", "sqlalchemy",
               "rich", "matplotlib", "prometheus_client", "fastapi", "httpx", "requests", "torch"}
    assert not project & set(result["refused"]), result["refused"]
