"""Pools on a running Airflow: the REST v2 backend against a real api-server, and the real scheduler
holding back a task whose pool_slots exceed its team pool's open slots until slots free up
(`dag.test()` ignores pools, so only the scheduler process can prove this)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from airflow_gpu import constants
from airflow_gpu.config import load_config
from airflow_gpu.devtools.processes import wait_until

pytestmark = pytest.mark.slow

SEED = Path(__file__).resolve().parent.parent / "examples" / "seed-quotas.yaml"

DAG_TEMPLATE = '''
import time
from pathlib import Path

import pendulum
from airflow.sdk import dag, task


@dag(dag_id="{dag_id}", schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False)
def build():
    @task(pool="{pool}", pool_slots={slots})
    def train():
        release = Path("{release}")
        while {wait} and not release.exists():
            time.sleep(0.2)

    train()


build()
'''


def two_team_config(path: Path, nlp_gpus: int = 8) -> Path:
    data = yaml.safe_load(SEED.read_text())
    data["teams"] = data["teams"][:2]
    data["teams"][0]["quota"]["a100-80gb"] = nlp_gpus
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def rest_sync(stack, config: Path, *extra: str, auth: tuple[str, ...] | None = None):
    auth = auth if auth is not None else ("--username", stack.username, "--password", stack.password)
    return subprocess.run(
        [sys.executable, "-m", "airflow_gpu", "pools", "sync", "--config", str(config), "--api-url", stack.base_url,
         *auth, *extra], capture_output=True, text=True, timeout=60)


def get_pool(api, name: str) -> dict:
    return api.request("GET", f"/api/v2/pools/{name}")


def test_rest_backend_sync(airflow_stack, tmp_path):
    api = airflow_stack.api()
    api.request("POST", "/api/v2/pools", json={"name": "adhoc", "slots": 2, "description": "by hand",
                                               "include_deferred": False})
    config = two_team_config(tmp_path / "q.yaml")

    out = rest_sync(airflow_stack, config, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert f"-> Airflow REST API {airflow_stack.base_url} (multi_team off)" in out.stdout
    assert "dry run, nothing written: 2 to create" in out.stdout
    names = {p["name"] for p in api.paginate("/api/v2/pools", "pools")}
    assert names == {"default_pool", "adhoc"}

    out = rest_sync(airflow_stack, config)
    assert out.returncode == 0, out.stderr
    nlp = get_pool(api, "gpu.nlp.a100-80gb")
    assert (nlp["slots"], nlp["include_deferred"], nlp["team_name"]) == (56, True, None)
    assert nlp["description"].startswith(constants.POOL_DESCRIPTION_MARKER)

    out = rest_sync(airflow_stack, config, auth=("--token", airflow_stack.token()))
    assert out.returncode == 0 and "no changes: 2 managed pool(s)" in out.stdout, out.stdout + out.stderr

    # update through PATCH with the full body: slots change, include_deferred stays True
    out = rest_sync(airflow_stack, two_team_config(config, nlp_gpus=4))
    assert out.returncode == 0, out.stderr
    assert "update gpu.nlp.a100-80gb: slots 56 -> 28 (4 GPU), description" in out.stdout
    nlp = get_pool(api, "gpu.nlp.a100-80gb")
    assert (nlp["slots"], nlp["include_deferred"]) == (28, True)
    assert get_pool(api, "adhoc")["slots"] == 2 and get_pool(api, "gpu.vision.a100-80gb")["slots"] == 56

    # delete through the API: only the managed pool of the removed team
    data = yaml.safe_load(config.read_text())
    data["teams"] = data["teams"][:1]
    config.write_text(yaml.safe_dump(data))
    out = rest_sync(airflow_stack, config)
    assert out.returncode == 0 and "delete gpu.vision.a100-80gb" in out.stdout, out.stdout + out.stderr
    names = {p["name"] for p in api.paginate("/api/v2/pools", "pools")}
    assert names == {"default_pool", "adhoc", "gpu.nlp.a100-80gb"}

    out = rest_sync(airflow_stack, config, auth=("--username", "admin", "--password", "wrong"))
    assert out.returncode == 1 and "/auth/token -> 401" in out.stderr


def _ti(api, dag_id: str, run_id: str) -> dict:
    return api.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/train")


def test_scheduler_holds_task_until_pool_slots_free(airflow_stack, tmp_path):
    api = airflow_stack.api()
    config = two_team_config(tmp_path / "q.yaml", nlp_gpus=8)
    out = rest_sync(airflow_stack, config)
    assert out.returncode == 0, out.stderr
    cfg = load_config(config)
    pool = "gpu.nlp.a100-80gb"
    hold_slots, big_slots = cfg.pool_slots("a100-80gb", gpus=6), cfg.pool_slots("a100-80gb", gpus=4)
    assert get_pool(api, pool)["slots"] == 56 and hold_slots + big_slots > 56

    release = tmp_path / "release"
    for dag_id, slots, wait in (("gpu_hold_6", hold_slots, True), ("gpu_big_4", big_slots, False)):
        (airflow_stack.dags_folder / f"{dag_id}.py").write_text(
            DAG_TEMPLATE.format(dag_id=dag_id, pool=pool, slots=slots, release=release, wait=wait))
    for dag_id in ("gpu_hold_6", "gpu_big_4"):
        wait_until(lambda: _dag_exists(api, dag_id), timeout=90, what=f"DAG {dag_id} parsed")

    hold = api.request("POST", "/api/v2/dags/gpu_hold_6/dagRuns", json={"logical_date": None})["dag_run_id"]
    wait_until(what="the 6-GPU task running", predicate=lambda: _ti(api, "gpu_hold_6", hold)["state"] == "running",
               timeout=90)
    assert get_pool(api, pool)["open_slots"] == 56 - hold_slots

    big = api.request("POST", "/api/v2/dags/gpu_big_4/dagRuns", json={"logical_date": None})["dag_run_id"]
    state = wait_until(what="the 4-GPU task considered by the scheduler",
                       predicate=lambda: _ti(api, "gpu_big_4", big)["state"], timeout=60)
    assert state == "scheduled"  # not queued: 28 slots needed, 14 open
    # several scheduler loops (heartbeat 1 s): 28 slots needed, 14 open -> it must not be queued
    for _ in range(8):
        time.sleep(1)
        assert _ti(api, "gpu_big_4", big)["state"] == "scheduled"
        assert _ti(api, "gpu_hold_6", hold)["state"] == "running"
    assert get_pool(api, pool)["scheduled_slots"] == big_slots

    release.touch()
    wait_until(what="the 4-GPU task done", timeout=120,
               predicate=lambda: _ti(api, "gpu_big_4", big)["state"] in ("success", "failed"))
    held, waited = _ti(api, "gpu_hold_6", hold), _ti(api, "gpu_big_4", big)
    assert (held["state"], waited["state"]) == ("success", "success")
    assert waited["start_date"] >= held["end_date"]  # it ran only once the slots were free


def _dag_exists(api, dag_id: str) -> bool:
    from airflow_gpu.airflow_api import AirflowApiError

    try:
        api.request("GET", f"/api/v2/dags/{dag_id}")
        return True
    except AirflowApiError:
        return False
