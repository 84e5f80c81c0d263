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
LONGEST_FILES_FIRST = (  # seconds per file in one `make test` (2 workers, this 2-core machine)
    "test_operator_airflow.py",  # 417
    "test_soak.py",  # 294: 3 minutes of soak plus the platform
    "test_demo.py",  # 168
    "test_trigger_gang.py",  # 99
    "test_operator_logs.py",  # 85
    "test_pools_airflow.py",  # 67
    "test_pools_sync.py",  # 66
    "test_operator_run.py",  # 62
    "test_dev_platform.py",  # 62
    "test_operator_kpo_args.py",  # 61
    "test_localcluster_kpo.py",  # 60
    "test_ui_plugin.py",  # 44
    "test_localcluster_durability.py",  # 36
    "test_scheduler_gangs.py",  # 35
    "test_checkpoint_kill.py",  # 34
    "test_scheduler_leader_load.py",  # 27
    "test_scheduler_recovery.py",  # 27
    "test_sim_inflation.py",  # 23
    "test_localcluster_deploy.py",  # 22
)


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FILES_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order
