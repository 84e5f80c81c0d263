"""The example training script, run as a pod would run it: loss goes down, SIGTERM saves and stops
(exit 143), the next attempt resumes there and ends exactly where an uninterrupted run ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np

from airflow_gpu import constants as C
from airflow_gpu.checkpoint import CheckpointStore, restore_newest

MODULE = "airflow_gpu.checkpoint.examples.train_numpy"
SHAPE = {C.ENV_EXAMPLE_EPOCHS: "6", C.ENV_EXAMPLE_STEPS_PER_EPOCH: "25", C.ENV_EXAMPLE_SEED: "3"}


def run(env: dict[str, str]) -> tuple[int, list[dict]]:
    done = subprocess.run([sys.executable, "-m", MODULE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode in (0, C.EXIT_CODE_STOPPED), done.stderr[-3000:]
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()]


def test_example_stops_on_sigterm_and_resumes_to_the_same_result(seaweedfs, s3_bucket, tmp_path):
    uri = f"s3://{s3_bucket}/train"
    env = dict(os.environ) | seaweedfs.env() | SHAPE | {C.ENV_CHECKPOINT_URI: uri, C.ENV_ATTEMPT: "1",
                                                        C.ENV_EXAMPLE_STEP_SECONDS: "0.01"}
    proc = subprocess.Popen([sys.executable, "-m", MODULE], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    events = []
    for line in proc.stdout:
        events.append(json.loads(line))
        if events[-1]["event"] == "epoch" and events[-1]["epoch"] == 2:
            proc.send_signal(signal.SIGTERM)  # the kubelet's notice: grace period starts
            break
    rest, stderr = proc.communicate(timeout=60)
    events += [json.loads(line) for line in rest.splitlines()]
    assert proc.returncode == C.EXIT_CODE_STOPPED, stderr[-3000:]
    stopped = events[-1]
    assert stopped["event"] == "stopped" and stopped["step"] >= 50  # saved at the next step boundary
    status = CheckpointStore(uri, **seaweedfs.client_options()).read_status()
    assert status["step"] == stopped["step"] and status["attempt"] == 1 and status["stop_requested_at"]

    code, resumed = run(env | {C.ENV_ATTEMPT: "2", C.ENV_INTERRUPTIONS: "1", C.ENV_EXAMPLE_STEP_SECONDS: "0"})
    assert code == 0
    assert resumed[0]["event"] == "resume" and resumed[0]["step"] == stopped["step"] and resumed[0]["interruptions"] == 1
    final = resumed[-1]
    assert final["event"] == "done" and final["step"] == 150
    assert final["loss"] < final["initial_loss"] / 4  # it really learns

    # an uninterrupted run of the same job on file:// ends with the same weights
    reference_uri = f"file://{tmp_path / 'reference'}"
    code, straight = run(dict(os.environ) | SHAPE | {C.ENV_CHECKPOINT_URI: reference_uri})
    assert code == 0 and straight[-1]["loss"] == final["loss"]
    epoch_losses = [e["loss"] for e in straight if e["event"] == "epoch"]
    assert epoch_losses[-1] < epoch_losses[0]
    interrupted = restore_newest(CheckpointStore(uri, **seaweedfs.client_options())).data["params"]
    reference = restore_newest(CheckpointStore(reference_uri)).data["params"]
    assert all(np.array_equal(interrupted[k], reference[k]) for k in reference)


def test_example_rejects_bad_configuration(tmp_path):
    env = dict(os.environ) | {C.ENV_CHECKPOINT_URI: f"file://{tmp_path}", C.ENV_EXAMPLE_EPOCHS: "many"}
    done = subprocess.run([sys.executable, "-m", MODULE], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "AIRFLOW_GPU_EXAMPLE_EPOCHS='many' must be an integer" in done.stderr
