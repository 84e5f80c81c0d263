"""The seed's scheduled fine-tuning pipeline (issue 11 §5): prepare data -> fine-tune with checkpoints
(2 workers x 4 GPUs, production-training, on spot: spot="always" is the author's opt-in, the tier itself is
not spot-eligible)
-> evaluate on a MIG slice -> register the model. Within the team's quota it preempts the team's
best-effort work (nlp_ablation.py).

Runs on the local cluster with the example numpy trainer (`airflow_gpu.checkpoint.examples.train_numpy`,
run as the pod's process). Settings: `[airflow_gpu] config_file` (the quota config), and in the
environment AIRFLOW_GPU_EXAMPLE_CHECKPOINTS (checkpoint URI prefix, `{team}` replaced by the task's
team, default s3://airflow-gpu-demo-{team}/checkpoints) and AIRFLOW_GPU_EXAMPLE_S3_SECRET (the Secret in
each team namespace with that team's AWS_* variables, default s3-credentials). A lost node or a
preemption costs no retry: the gang resumes from its newest checkpoint within the same try.
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
TRAINER = [sys.executable, "-m", "airflow_gpu.checkpoint.examples.train_numpy"]


@dag(dag_id="finetune_pipeline", schedule="@daily", start_date=pendulum.datetime(2026, 12, 1, tz="UTC"),
     catchup=False, max_active_runs=1, tags=["airflow-gpu", "example"],
     default_args={"retries": 2, "retry_delay": dt.timedelta(seconds=10)})
def finetune_pipeline():
    @task
    def prepare_data() -> dict:
        return {"rows": 4096, "seed": 7}

    data = prepare_data()
    finetune = GpuTrainingOperator(
        task_id="finetune", team="nlp", tier="production-training", workers=2, gpus_per_worker=4,
        checkpoint=CHECKPOINTS.format(team="nlp") + "/finetune", spot="always", max_interruptions=3,
        deadline=dt.timedelta(hours=6),
        image="python:3.11", cmds=TRAINER, secrets=[{"secret": S3_SECRET}], termination_grace_period=20,
        env_vars={C.ENV_EXAMPLE_EPOCHS: "30", C.ENV_EXAMPLE_STEP_SECONDS: "0.02", C.ENV_EXAMPLE_SEED: "7"},
        container_resources={"requests": {"cpu": "1", "memory": "2Gi"}})
    evaluate = GpuTrainingOperator(
        task_id="evaluate", team="serving", tier="inference", mig_profile="1g.10gb", image="python:3.11",
        cmds=[sys.executable, "-c", "print('eval: loss ok')"], retries=1)

    @task
    def register_model(result: dict) -> str:
        print(f"registered model from {result['checkpoint_uri']} (step {result.get('resumed_from_step')}, "
              f"{result['interruptions']} interruption(s), {result['gpu_seconds']:.0f} GPU-seconds)")
        return result["checkpoint_uri"]

    data >> finetune >> evaluate
    register_model(finetune.output) << evaluate


finetune_pipeline()
