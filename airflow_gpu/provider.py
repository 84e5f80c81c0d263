"""Provider metadata for Airflow's `apache_airflow_provider` entry point."""

from __future__ import annotations

from airflow_gpu import __version__


def get_provider_info() -> dict:
    return {
        "package-name": "airflow-gpu",
        "name": "airflow-gpu",
        "description": "GPU-aware scheduling on Kubernetes: team quota pools, gang scheduling, spot with checkpoint resume.",
        "versions": [__version__],
        "plugins": [{"name": "airflow_gpu", "plugin-class": "airflow_gpu.plugin.AirflowGpuPlugin"}],
        "operators": [{"integration-name": "airflow-gpu", "python-modules": ["airflow_gpu.operators.gpu_training"]}],
        "triggers": [{"integration-name": "airflow-gpu", "python-modules": ["airflow_gpu.triggers.gang"]}],
    }
