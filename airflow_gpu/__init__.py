"""airflow-gpu: GPU-aware scheduling for Airflow on Kubernetes.

Import cost matters (DAG parse time): this package imports nothing heavy at top level.
"""

__version__ = "0.1.0"
