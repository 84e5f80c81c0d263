"""Checkpoints for training code: atomic saves to S3 or a directory, resume from the newest complete
checkpoint, fencing of stale attempts, retention, and a SIGTERM-aware stop flag.

Runs inside the training container: needs only the standard library and boto3 (for s3:// URIs);
numpy and torch only for their state dicts; never Airflow. The operator/training environment
contract is ENV.md next to this file.

    from airflow_gpu.checkpoint import Checkpointer
    ckpt = Checkpointer.from_env()              # AIRFLOW_GPU_CHECKPOINT_URI, _ATTEMPT, ...
    restored = ckpt.resume()                    # None on a fresh start
    for step in range(start, steps):
        ...
        if step % every == 0 or ckpt.should_stop():
            ckpt.save(step, state_dict, metadata={"loss": loss})
        if ckpt.should_stop():
            sys.exit(constants.EXIT_CODE_STOPPED)
    write_result({"loss": loss})                # rank 0: the task's XCom `result` (ENV.md)
"""

from airflow_gpu.checkpoint.env import TrainingEnv
from airflow_gpu.checkpoint.errors import (
    CheckpointError,
    CheckpointExistsError,
    ConfigError,
    CorruptCheckpointError,
    StaleAttemptError,
    StoreUnavailableError,
)
from airflow_gpu.checkpoint.layout import Checkpoint
from airflow_gpu.checkpoint.store import CheckpointStore
from airflow_gpu.checkpoint.restore import Restored, materialize, restore_from_uri, restore_newest
from airflow_gpu.checkpoint.result import write_result
from airflow_gpu.checkpoint.writer import Checkpointer

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointExistsError",
    "CheckpointStore",
    "Checkpointer",
    "ConfigError",
    "CorruptCheckpointError",
    "Restored",
    "StaleAttemptError",
    "StoreUnavailableError",
    "TrainingEnv",
    "materialize",
    "restore_from_uri",
    "restore_newest",
    "write_result",
]
