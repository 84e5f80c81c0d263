"""Example training scripts that use airflow_gpu.checkpoint (run as `python -m ...`)."""
