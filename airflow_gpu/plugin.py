"""Airflow plugin registration. Kept import-light: the UI app is imported lazily by Airflow."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin


class AirflowGpuPlugin(AirflowPlugin):
    name = "airflow_gpu"
