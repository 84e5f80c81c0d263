"""Best-effort work of a team that also runs production (issue 15's demo): an ablation run of team nlp
(2 workers x 4 GPUs, checkpointed every epoch) on the team's idle quota. When the team's production
fine-tune (finetune_pipeline.py) needs that quota, the scheduler preempts this gang: it saves a
checkpoint on SIGTERM, waits in the queue with its reason ("team quota ...") and resumes from that
checkpoint once the quota is free again, within the same Airflow try.

Settings as in finetune_pipeline.py (the quota config, AIRFLOW_GPU_EXAMPLE_CHECKPOINTS, AIRFLOW_GPU_EXAMPLE_S3_SECRET).
"""

from __future__ import annotations

import datetime as dt
import os
import sys

import pendulum
from airflow.sdk import dag

from airflow_gpu import constants as C
from airflow_gpu.operators import GpuTrainingOperator

# one bucket per team: its namespace's Secret (and IAM role on AWS) allows that bucket only
CHECKPOINTS = os.environ.get(C.ENV_EXAMPLE_CHECKPOINTS, "s3://airflow-gpu-demo-{team}/checkpoints")
S3_SECRET = os.environ.get(C.ENV_EXAMPLE_S3_SECRET, "s3-credentials")


@dag(dag_id="nlp_ablation", schedule=None, start_date=pendulum.datetime(2026, 12, 1, tz="UTC"), catchup=False,
     tags=["airflow-gpu", "example"], default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=10)})
def nlp_ablation():
    GpuTrainingOperator(
        task_id="ablation", team="nlp", tier="best-effort-training", workers=2, gpus_per_worker=4,
        checkpoint=CHECKPOINTS.format(team="nlp") + "/ablation", spot="auto", image="python:3.11",
        cmds=[sys.executable, "-m", "airflow_gpu.checkpoint.examples.train_numpy"],
        secrets=[{"secret": S3_SECRET}], termination_grace_period=20,
        # this numpy example is back at work a second after a relaunch (no image pull, kilobytes of
        # state); the tier's default (120 s) is a real fine-tune's, and would book its short attempts
        # as restart overhead rather than as the work a preemption or an interruption threw away
        restart_overhead_seconds=2,
        env_vars={C.ENV_EXAMPLE_EPOCHS: "80", C.ENV_EXAMPLE_STEP_SECONDS: "0.02", C.ENV_EXAMPLE_SEED: "11"},
        container_resources={"requests": {"cpu": "1", "memory": "2Gi"}})


nlp_ablation()
