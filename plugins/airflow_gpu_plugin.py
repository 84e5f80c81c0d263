# Airflow also discovers the plugin through the `airflow.plugins` entry point; this file serves
# deployments that copy plugins/ instead of installing the package.
from airflow_gpu.plugin import AirflowGpuPlugin  # noqa: F401
