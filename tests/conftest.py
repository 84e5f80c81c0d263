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

# `make test` runs the files on pytest-xdist workers (--dist loadfile: a file's module-scoped servers
# start once, on one worker), handed out in collection order. The longest files go first so that
# no worker is left running one of them alone at the end; measured with `pytest --durations=0`.
LONGEST_FILES_FIRST = (
    "test_soak.py",  # about 7 minutes: 3 of soak plus the platform
    "test_operator_airflow.py",
    "test_demo.py",
    "test_localcluster_kpo.py",
    "test_sim_replay.py",
    "test_pools_airflow.py",
    "test_ui_plugin.py",
    "test_pools_sync.py",
    "test_scheduler_recovery.py",
    "test_scheduler_gangs.py",
    "test_localcluster_clients.py",
    "test_localcluster_faults.py",
    "test_checkpoint_kill.py",
    "test_localcluster_kubectl.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
