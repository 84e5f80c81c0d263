"""A small numpy MLP regression, checkpointed every epoch, resumable, stopping cleanly on SIGTERM.

    python -m airflow_gpu.checkpoint.examples.train_numpy

The operator runs this as the pod's command; tests and the demo run it as a subprocess. All
configuration comes from the environment (ENV.md):
    AIRFLOW_GPU_CHECKPOINT_URI       where checkpoints go (required), s3://bucket/prefix or file:///dir
    AIRFLOW_GPU_RESUME_URI           where to resume from when the store above is empty (optional)
    AIRFLOW_GPU_ATTEMPT              this pod's attempt (fencing), AIRFLOW_GPU_INTERRUPTIONS (logged)
    AIRFLOW_GPU_EXAMPLE_EPOCHS       epochs to train (default 10)
    AIRFLOW_GPU_EXAMPLE_STEPS_PER_EPOCH  SGD steps per epoch (default 40)
    AIRFLOW_GPU_EXAMPLE_STEP_SECONDS sleep per step, to stand in for a real model's step time (default 0)
    AIRFLOW_GPU_EXAMPLE_SEED         data and initialisation seed (default 0)
    AIRFLOW_GPU_EXAMPLE_LEARNING_RATE  SGD learning rate (default LEARNING_RATE)
    AIRFLOW_GPU_EXAMPLE_KEEP_LAST    checkpoints kept (default: the Checkpointer's, 3)
    AWS_*                            S3 endpoint and credentials, as boto3 reads them

Prints one JSON object per line (events: start, resume, epoch, stopped, done, stale). Exit codes:
0 trained to the end; 143 (constants.EXIT_CODE_STOPPED) stopped by SIGTERM after saving a checkpoint;
1 error, including a stale attempt. Training is deterministic: an interrupted and resumed run ends
with the same weights as an uninterrupted one.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time

import numpy as np

from airflow_gpu import constants as C
from airflow_gpu.checkpoint import Checkpointer, StaleAttemptError, write_result
from airflow_gpu.checkpoint.env import env_number

SAMPLES, FEATURES, HIDDEN, BATCH = 512, 8, 32, 32
LEARNING_RATE, MOMENTUM = 0.03, 0.9


def emit(event: str, **fields: object) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def make_data(seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([seed, 1])
    x = rng.normal(size=(SAMPLES, FEATURES))
    direction = rng.normal(size=FEATURES)
    y = np.sin(x @ direction / np.sqrt(FEATURES) * 2.0) + 0.05 * rng.normal(size=SAMPLES)
    return x, y[:, None]


def init_state(seed: int) -> dict:
    rng = np.random.default_rng([seed, 2])
    params = {
        "w1": rng.normal(scale=1 / np.sqrt(FEATURES), size=(FEATURES, HIDDEN)),
        "b1": np.zeros(HIDDEN),
        "w2": rng.normal(scale=1 / np.sqrt(HIDDEN), size=(HIDDEN, 1)),
        "b2": np.zeros(1),
    }
    return {"params": params, "velocity": {k: np.zeros_like(v) for k, v in params.items()}, "step": 0}


def loss_and_grads(params: dict, x: np.ndarray, y: np.ndarray) -> tuple[float, dict]:
    hidden = np.tanh(x @ params["w1"] + params["b1"])
    error = hidden @ params["w2"] + params["b2"] - y
    d_out = 2 * error / len(x)
    d_hidden = (d_out @ params["w2"].T) * (1 - hidden**2)
    grads = {"w2": hidden.T @ d_out, "b2": d_out.sum(0), "w1": x.T @ d_hidden, "b1": d_hidden.sum(0)}
    return float(np.mean(error**2)), grads


def full_loss(params: dict, x: np.ndarray, y: np.ndarray) -> float:
    return loss_and_grads(params, x, y)[0]


def batch_indices(seed: int, step: int, steps_per_epoch: int) -> np.ndarray:
    epoch, within = divmod(step, steps_per_epoch)
    order = np.random.default_rng([seed, 3, epoch]).permutation(SAMPLES)
    start = (within * BATCH) % SAMPLES
    return np.take(order, range(start, start + BATCH), mode="wrap")


def meta(loss: float, initial_loss: float, step: int, steps_per_epoch: int) -> dict:
    return {"loss": loss, "initial_loss": initial_loss, "epoch": step / steps_per_epoch}


def main() -> int:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    env = os.environ
    epochs = int(env_number(env, C.ENV_EXAMPLE_EPOCHS, 10))
    steps_per_epoch = int(env_number(env, C.ENV_EXAMPLE_STEPS_PER_EPOCH, 40, minimum=1))
    step_seconds = float(env_number(env, C.ENV_EXAMPLE_STEP_SECONDS, 0.0, float))
    seed = int(env_number(env, C.ENV_EXAMPLE_SEED, 0))
    learning_rate = float(env_number(env, C.ENV_EXAMPLE_LEARNING_RATE, LEARNING_RATE, float))
    keep_last = env_number(env, C.ENV_EXAMPLE_KEEP_LAST, None, minimum=1)
    ckpt = Checkpointer.from_env(**({"keep_last": int(keep_last)} if keep_last else {}))
    x, y = make_data(seed)
    try:
        restored = ckpt.resume()
    except StaleAttemptError as exc:
        emit("stale", error=str(exc))
        return 1
    if restored is None:
        state, initial_loss = init_state(seed), None
        initial_loss = full_loss(state["params"], x, y)
        emit("start", attempt=ckpt.attempt, loss=initial_loss, checkpoint_uri=ckpt.uri)
    else:
        state = restored.data
        initial_loss = restored.metadata.get("initial_loss", full_loss(init_state(seed)["params"], x, y))
        emit("resume", attempt=ckpt.attempt, step=state["step"], checkpoint=restored.checkpoint.uri,
             interruptions=ckpt.interruptions)
    total_steps = epochs * steps_per_epoch
    params, velocity = state["params"], state["velocity"]
    try:
        while state["step"] < total_steps:
            idx = batch_indices(seed, state["step"], steps_per_epoch)
            _, grads = loss_and_grads(params, x[idx], y[idx])
            for name in params:
                velocity[name] = MOMENTUM * velocity[name] - learning_rate * grads[name]
                params[name] = params[name] + velocity[name]
            state["step"] += 1
            if step_seconds:
                time.sleep(step_seconds)
            if ckpt.should_stop():  # SIGTERM: save at this safe point, inside the grace period
                loss = full_loss(params, x, y)
                ckpt.save(state["step"], state, metadata=meta(loss, initial_loss, state["step"], steps_per_epoch))
                emit("stopped", step=state["step"], loss=loss)
                return C.EXIT_CODE_STOPPED
            if state["step"] % steps_per_epoch == 0:
                loss = full_loss(params, x, y)
                ckpt.save(state["step"], state, metadata=meta(loss, initial_loss, state["step"], steps_per_epoch))
                emit("epoch", epoch=state["step"] // steps_per_epoch, step=state["step"], loss=loss)
    except StaleAttemptError as exc:
        emit("stale", error=str(exc))
        return 1
    finally:
        ckpt.close()
    final_loss = full_loss(params, x, y)
    emit("done", step=state["step"], loss=final_loss, initial_loss=initial_loss)
    if os.environ.get(C.ENV_RESULT_PATH) and os.environ.get(C.ENV_RANK, "0") == "0":  # run by the operator
        write_result({"loss": final_loss, "step": state["step"], "initial_loss": initial_loss})
    return 0


if __name__ == "__main__":
    sys.exit(main())
