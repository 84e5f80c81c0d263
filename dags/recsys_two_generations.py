"""Two GPU generations (issue 29): team recsys's training of 2 workers x 4 GPUs accepts H100 or A100, H100
first. The scheduler keeps both workers on ONE product (a data-parallel job runs at its slowest GPU's
pace): on the on-demand H100 nodes of examples/cluster-seed.yaml when recsys's H100 quota (16) has
room, else on A100 (quota 8: the gang fits either, as the operator checks at parse time). Its expected
duration, if declared, is for the reference product (relative_speed 1.0: A100) and lasts
duration / 2.5 on H100; the chargeback shows its GPU-hours and reference GPU-hours per product.

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

CHECKPOINTS = os.environ.get(C.ENV_EXAMPLE_CHECKPOINTS, "s3://airflow-gpu-demo-{team}/checkpoints")
S3_SECRET = os.environ.get(C.ENV_EXAMPLE_S3_SECRET, "s3-credentials")


@dag(dag_id="recsys_two_generations", schedule=None, start_date=pendulum.datetime(2026, 12, 1, tz="UTC"),
     catchup=False, tags=["airflow-gpu", "example"],
     default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=10)})
def recsys_two_generations():
    GpuTrainingOperator(
        task_id="train", team="recsys", tier="production-training", workers=2, gpus_per_worker=4,
        gpu_products=["h100-80gb", "a100-80gb"],
        checkpoint=CHECKPOINTS.format(team="recsys") + "/two-generations", image="python:3.11",
        cmds=[sys.executable, "-m", "airflow_gpu.checkpoint.examples.train_numpy"],
        secrets=[{"secret": S3_SECRET}], termination_grace_period=20,
        env_vars={C.ENV_EXAMPLE_EPOCHS: "20", C.ENV_EXAMPLE_STEP_SECONDS: "0.02", C.ENV_EXAMPLE_SEED: "29"},
        container_resources={"requests": {"cpu": "1", "memory": "2Gi"}})


recsys_two_generations()
