"""The chaos soak's DAGs (`airflow-gpu soak`, airflow_gpu/soak.py): short checkpointed gangs of the
example numpy trainer, one GPU task per DAG, so that every Airflow try beyond the first is a retry the
soak's faults spent (the trainer itself never fails).

- soak_best_effort: team nlp, best-effort-training, 2 x 4 GPUs (the team's whole quota), spot allowed
- soak_production:  team nlp, production-training, 2 x 4 GPUs: preempts soak_best_effort
- soak_sweep:       team research, best-effort-training, 2 x 2 GPUs on spot (three at once borrow idle quota)

Settings as in dags/finetune_pipeline.py (AIRFLOW_GPU_EXAMPLE_CHECKPOINTS, AIRFLOW_GPU_EXAMPLE_S3_SECRET).
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
TRAINER = [sys.executable, "-m", "airflow_gpu.checkpoint.examples.train_numpy"]
# the pods run the trainer of the checkout Airflow runs (a worktree not installed in the venv too)
CHECKOUT = {"PYTHONPATH": os.environ["PYTHONPATH"]} if os.environ.get("PYTHONPATH") else {}
# (dag_id, team, tier, workers, GPUs per worker, spot, epochs of 40 steps x 20 ms)
GANGS = (
    ("soak_best_effort", "nlp", "best-effort-training", 2, 4, "auto", 50),
    ("soak_production", "nlp", "production-training", 2, 4, "never", 20),
    ("soak_sweep", "research", "best-effort-training", 2, 2, "always", 25),
)


def soak_dag(dag_id: str, team: str, tier: str, workers: int, gpus: int, spot: str, epochs: int):
    @dag(dag_id=dag_id, schedule=None, start_date=pendulum.datetime(2026, 12, 1, tz="UTC"), catchup=False,
         tags=["airflow-gpu", "soak"], default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=5)})
    def soak():
        GpuTrainingOperator(
            task_id="train", team=team, tier=tier, workers=workers, gpus_per_worker=gpus, spot=spot,
            checkpoint=CHECKPOINTS.format(team=team) + f"/{dag_id}", max_interruptions=20,
            image="python:3.11", cmds=TRAINER, secrets=[{"secret": S3_SECRET}], termination_grace_period=20,
            # every checkpoint kept: the soak reads the one each task resumed from at the end
            env_vars={C.ENV_EXAMPLE_EPOCHS: str(epochs), C.ENV_EXAMPLE_STEP_SECONDS: "0.02", C.ENV_EXAMPLE_SEED: "3",
                      C.ENV_EXAMPLE_KEEP_LAST: "100000", **CHECKOUT},
            container_resources={"requests": {"cpu": "500m", "memory": "1Gi"}})

    return soak()


for _gang in GANGS:
    soak_dag(*_gang)
