"""Airflow operators of airflow-gpu."""

from airflow_gpu.operators.gpu_training import GpuTrainingOperator

__all__ = ["GpuTrainingOperator"]
