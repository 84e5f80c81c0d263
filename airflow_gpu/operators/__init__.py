"""Airflow operators of airflow-gpu."""

from airflow_gpu.kube.spec import PodSetSpec
from airflow_gpu.operators.gpu_training import GpuTrainingOperator

__all__ = ["GpuTrainingOperator", "PodSetSpec"]
