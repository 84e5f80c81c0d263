"""Test-wide setup. Airflow reads its configuration at first import, so the environment is set
here, before any test module imports airflow. Fixtures live in tests/fixtures/, one module per part."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
SHARED = (REPO_ROOT.parent / "shared").resolve()

_airflow_home = Path(tempfile.mkdtemp(prefix="airflow-gpu-test-home-"))
os.environ["AIRFLOW_HOME"] = str(_airflow_home)
os.environ.setdefault("AIRFLOW__CORE__LOAD_EXAMPLES", "False")
os.environ["AIRFLOW__CORE__DAGS_FOLDER"] = str(REPO_ROOT / "dags")
os.environ.setdefault("AIRFLOW__CORE__PARALLELISM", "4")
os.environ.setdefault("AIRFLOW__CORE__UNIT_TEST_MODE", "False")
os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] = f"sqlite:///{_airflow_home / 'airflow.db'}"

# Property tests explore new examples on every local run; CI replays a fixed sequence so that a
# landing never depends on the draw (a failure found locally becomes a fixed test case).
from hypothesis import settings as _hypothesis_settings  # noqa: E402

_hypothesis_settings.register_profile("ci", derandomize=True, database=None)
if os.environ.get("CI"):
    _hypothesis_settings.load_profile("ci")

pytest_plugins = [
    "fixtures.common",
    "fixtures.airflow_env",
    "fixtures.s3",
    "fixtures.kube",
]
