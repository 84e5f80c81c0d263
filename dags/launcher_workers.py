"""Launcher + workers from a DAG (issue 29 item 5): an MPI-style job of team recsys, one gang of two
pod sets that start together or not at all:
- `launcher`: 1 CPU-only pod (rank 0 of the gang: its output is the task log's live log and its
  result the XCom `result`), reaching the workers by their Service names
  (AIRFLOW_GPU_HOSTS_WORKER, `<pod>.<gang>.team-recsys.svc`);
- `worker`: 2 pods x 8 GPUs, on ONE GPU product (recsys has 16 H100 and 8 A100 of quota: only H100
  fits both, as the operator checks at parse time), each with RANK 0..1, WORLD_SIZE 2,
  LOCAL_WORLD_SIZE 8 and MASTER_ADDR (the launcher's address).
Each set has its own command here; it could have its own image, env_vars and container_resources.
A real job would run `mpirun --host $AIRFLOW_GPU_HOSTS_WORKER ...` in the launcher, or torchrun in the
workers with `--rdzv-endpoint $MASTER_ADDR:$MASTER_PORT` against a rendezvous server in the launcher.

Runs on the local cluster with the stdlib example `airflow_gpu.checkpoint.examples.launcher_workers`
(settings as in finetune_pipeline.py: `[airflow_gpu] config_file`).
"""

from __future__ import annotations

import sys

import pendulum
from airflow.sdk import dag

from airflow_gpu.operators import GpuTrainingOperator

EXAMPLE = [sys.executable, "-m", "airflow_gpu.checkpoint.examples.launcher_workers"]


@dag(dag_id="launcher_workers", schedule=None, start_date=pendulum.datetime(2026, 12, 1, tz="UTC"),
     catchup=False, tags=["airflow-gpu", "example"])
def launcher_workers():
    GpuTrainingOperator(
        task_id="mpi_job", team="recsys", tier="production-training", image="python:3.11",
        pod_sets=[
            {"name": "launcher", "replicas": 1, "cmds": [*EXAMPLE, "launcher"],
             "container_resources": {"requests": {"cpu": "1", "memory": "1Gi"}}},
            {"name": "worker", "replicas": 2, "gpus": 8, "cmds": [*EXAMPLE, "worker"],
             "container_resources": {"requests": {"cpu": "4", "memory": "8Gi"}}},
        ],
        termination_grace_period=10)


launcher_workers()
