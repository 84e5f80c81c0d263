"""A sweep of best-effort jobs (issue 11 §5): one gang per learning rate by dynamic task mapping, on spot,
checkpointed, preemptible by the team's production work (they requeue and resume; no retry spent).
`pick_best` reads each trial's final loss from its XCom `result` (the training script's return.json).

Settings as in finetune_pipeline.py (the quota config, AIRFLOW_GPU_EXAMPLE_CHECKPOINTS, AIRFLOW_GPU_EXAMPLE_S3_SECRET).
"""

from __future__ import annotations

import datetime as dt
import os
import sys

import pendulum
from airflow.sdk import dag, task

from airflow_gpu import constants as C
from airflow_gpu.operators import GpuTrainingOperator

# one bucket per team: its namespace's Secret (and IAM role on AWS) allows that bucket only
CHECKPOINTS = os.environ.get(C.ENV_EXAMPLE_CHECKPOINTS, "s3://airflow-gpu-demo-{team}/checkpoints")
S3_SECRET = os.environ.get(C.ENV_EXAMPLE_S3_SECRET, "s3-credentials")
LEARNING_RATES = ["0.01", "0.03", "0.1"]


@dag(dag_id="sweep_best_effort", schedule=None, start_date=pendulum.datetime(2026, 12, 1, tz="UTC"), catchup=False,
     tags=["airflow-gpu", "example"], default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=10)})
def sweep_best_effort():
    @task
    def learning_rates() -> list[dict]:
        return [{C.ENV_EXAMPLE_LEARNING_RATE: lr, C.ENV_EXAMPLE_EPOCHS: "20", C.ENV_EXAMPLE_STEP_SECONDS: "0.02"}
                for lr in LEARNING_RATES]

    @task
    def pick_best(results: list[dict]) -> dict | None:
        """The trial with the lowest final loss, from each trial's XCom `result` (what rank 0 wrote with
        airflow_gpu.checkpoint.write_result): no checkpoint metadata read from S3."""
        done = [r for r in results if r and isinstance(r.get("result"), dict)]
        best = min(done, key=lambda r: r["result"]["loss"], default=None)
        return None if best is None else {"loss": best["result"]["loss"], "checkpoint_uri": best["checkpoint_uri"]}

    trials = GpuTrainingOperator.partial(
        task_id="sweep", team="research", tier="best-effort-training", workers=1, gpus_per_worker=2,
        checkpoint=CHECKPOINTS.format(team="research") + "/sweep", spot="always", image="python:3.11",
        cmds=[sys.executable, "-m", "airflow_gpu.checkpoint.examples.train_numpy"],
        secrets=[{"secret": S3_SECRET}], termination_grace_period=20,
    ).expand(env_vars=learning_rates())
    pick_best(trials.output)


sweep_best_effort()
