"""Pools on a running Airflow: the REST v2 backend against a real api-server, and the real scheduler
holding back a task whose pool_slots exceed its team pool's open slots until slots free up
(`dag.test()` ignores pools, so only the scheduler process can prove this)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest
import yaml

from airflow_gpu import constants
from airflow_gpu.config import load_config
from airflow_gpu.devtools.processes import wait_until
from airflow_gpu.triggers.gang import default_settle_seconds

pytestmark = pytest.mark.slow

SEED = Path(__file__).resolve().parent.parent / "examples" / "seed-quotas.yaml"

DAG_TEMPLATE = '''
import time
from pathlib import Path

import pendulum
from airflow.providers.standard.triggers.file import FileTrigger
from airflow.sdk import BaseOperator, dag

RELEASE = "{release}"


class Hold(BaseOperator):
    # holds its pool slots until RELEASE exists: running (polling) or deferred (in the triggerer)
    def __init__(self, mode, **kwargs):
        super().__init__(**kwargs)
        self.mode = mode
        self.team = self.pool.split(".")[1]  # the team's own pool (the cluster policy refuses another's)

    def execute(self, context):
        if self.mode == "defer":
            self.defer(trigger=FileTrigger(filepath=RELEASE, poke_interval=0.5), method_name="resume")
        while self.mode == "run" and not Path(RELEASE).exists():
            time.sleep(0.2)

    def resume(self, context, event=None):
        return None


@dag(dag_id="{dag_id}", schedule=None, start_date=pendulum.datetime(2026, 1, 1), catchup=False)
def build():
    Hold(task_id="train", mode="{mode}", pool="{pool}", pool_slots={slots})


build()
'''


def two_team_config(path: Path, nlp_gpus: int = 8) -> Path:
    data = yaml.safe_load(SEED.read_text())
    data["teams"] = data["teams"][:2]
    data["teams"][0]["quota"]["a100-80gb"] = nlp_gpus
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def rest_sync(stack, config: Path, *extra: str, auth: tuple[str, ...] | None = None, password: str | None = None):
    """Secrets go by environment (or --token-file / --password-file), never argv."""
    auth = auth if auth is not None else ("--username", stack.username)
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_GPU_API_")}
    env[constants.ENV_API_PASSWORD] = password if password is not None else stack.password
    return subprocess.run(
        [sys.executable, "-m", "airflow_gpu", "pools", "sync", "--config", str(config), "--api-url", stack.base_url,
         *auth, *extra], capture_output=True, text=True, timeout=60, env=env)


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
    assert "dry run, nothing written: 4 to create" in out.stdout
    names = {p["name"] for p in api.paginate("/api/v2/pools", "pools")}
    assert names == {"default_pool", "adhoc"}

    out = rest_sync(airflow_stack, config)
    assert out.returncode == 0, out.stderr
    nlp = get_pool(api, "gpu.nlp.guaranteed")
    assert (nlp["slots"], nlp["include_deferred"], nlp["team_name"]) == (56, True, None)
    assert nlp["description"].startswith(constants.POOL_DESCRIPTION_MARKER)

    token_file = tmp_path / "token"
    token_file.write_text(airflow_stack.token() + "\n")
    out = rest_sync(airflow_stack, config, auth=("--token-file", str(token_file)), password="")
    assert out.returncode == 0 and "no changes: 4 managed pool(s)" in out.stdout, out.stdout + out.stderr
    out = rest_sync(airflow_stack, config, auth=("--token-file", str(tmp_path / "missing")), password="")
    assert out.returncode == 2 and "--token-file" in out.stderr and "No such file" in out.stderr, out.stderr

    # update through PATCH with the full body: slots change, include_deferred stays True
    out = rest_sync(airflow_stack, two_team_config(config, nlp_gpus=4))
    assert out.returncode == 0, out.stderr
    assert "update gpu.nlp.guaranteed: slots 56 -> 28 (4 GPU), description" in out.stdout
    nlp = get_pool(api, "gpu.nlp.guaranteed")
    assert (nlp["slots"], nlp["include_deferred"]) == (28, True)
    assert get_pool(api, "adhoc")["slots"] == 2 and get_pool(api, "gpu.vision.guaranteed")["slots"] == 56

    # delete through the API: only the managed pool of the removed team
    data = yaml.safe_load(config.read_text())
    data["teams"] = data["teams"][:1]
    config.write_text(yaml.safe_dump(data))
    out = rest_sync(airflow_stack, config)
    assert out.returncode == 0 and "delete gpu.vision.guaranteed" in out.stdout, out.stdout + out.stderr
    names = {p["name"] for p in api.paginate("/api/v2/pools", "pools")}
    assert names == {"default_pool", "adhoc", "gpu.nlp.guaranteed", "gpu.nlp.preemptible"}

    out = rest_sync(airflow_stack, config, password="wrong")
    assert out.returncode == 1 and "/auth/token -> 401" in out.stderr


def _ti(api, dag_id: str, run_id: str) -> dict:
    """The task instance; on this shared 2-core machine the api-server can miss the client's 30 s timeout
    while task processes start, so a timed-out read is "not known yet" and the caller's wait goes on."""
    from airflow_gpu.airflow_api import AirflowApiError

    try:
        return api.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/train")
    except AirflowApiError as exc:
        if "timed out" not in str(exc):
            raise
        return {"state": None}


def test_scheduler_holds_task_until_pool_slots_free(airflow_stack, tmp_path):
    """3 GPUs running + 3 GPUs deferred (include_deferred: still held) leave 2 of 8 GPUs open; a 4-GPU
    task waits in `scheduled` through many scheduler loops and runs once the holders finish."""
    api = airflow_stack.api()
    config = two_team_config(tmp_path / "q.yaml", nlp_gpus=8)
    out = rest_sync(airflow_stack, config)
    assert out.returncode == 0, out.stderr
    cfg = load_config(config)
    pool = "gpu.nlp.preemptible"
    hold_slots, big_slots = cfg.pool_slots("a100-80gb", gpus=3), cfg.pool_slots("a100-80gb", gpus=4)
    assert get_pool(api, pool)["slots"] == 56 and 2 * hold_slots + big_slots > 56

    release = tmp_path / "release"
    dags = {"gpu_run_3": ("run", hold_slots), "gpu_defer_3": ("defer", hold_slots), "gpu_big_4": ("none", big_slots)}
    for dag_id, (mode, slots) in dags.items():
        (airflow_stack.dags_folder / f"{dag_id}.py").write_text(
            DAG_TEMPLATE.format(dag_id=dag_id, pool=pool, slots=slots, release=release, mode=mode))
    for dag_id in dags:
        wait_until(lambda: _dag_exists(api, dag_id), timeout=90, what=f"DAG {dag_id} parsed")

    runs = {}
    for dag_id, state in (("gpu_run_3", "running"), ("gpu_defer_3", "deferred")):
        runs[dag_id] = api.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", json={"logical_date": None})["dag_run_id"]
    for dag_id, state in (("gpu_run_3", "running"), ("gpu_defer_3", "deferred")):
        wait_until(lambda: _ti(api, dag_id, runs[dag_id])["state"] == state, timeout=90, what=f"{dag_id} {state}")
    stats = get_pool(api, pool)
    assert (stats["running_slots"], stats["deferred_slots"], stats["open_slots"]) == (hold_slots, hold_slots, 14)

    runs["gpu_big_4"] = api.request("POST", "/api/v2/dags/gpu_big_4/dagRuns", json={"logical_date": None})["dag_run_id"]
    state = wait_until(lambda: _ti(api, "gpu_big_4", runs["gpu_big_4"])["state"], timeout=60,
                       what="the 4-GPU task considered by the scheduler")
    assert state == "scheduled"  # not queued: 28 slots needed, 14 open
    for _ in range(8):  # several scheduler loops (heartbeat 1 s)
        time.sleep(1)
        assert _ti(api, "gpu_big_4", runs["gpu_big_4"])["state"] == "scheduled"
    assert _ti(api, "gpu_defer_3", runs["gpu_defer_3"])["state"] == "deferred"
    assert get_pool(api, pool)["scheduled_slots"] == big_slots

    released_at = datetime.now(timezone.utc)
    release.touch()
    for dag_id, run_id in runs.items():
        wait_until(lambda: _ti(api, dag_id, run_id)["state"] in ("success", "failed"), timeout=120,
                   what=f"{dag_id} done")
    tis = {dag_id: _ti(api, dag_id, run_id) for dag_id, run_id in runs.items()}
    assert {dag_id: ti["state"] for dag_id, ti in tis.items()} == dict.fromkeys(runs, "success")
    # it ran only after the holders let go of their slots
    assert datetime.fromisoformat(tis["gpu_big_4"]["start_date"]) >= released_at


def _dag_exists(api, dag_id: str) -> bool:
    from airflow_gpu.airflow_api import AirflowApiError

    try:
        api.request("GET", f"/api/v2/dags/{dag_id}")
        return True
    except AirflowApiError:
        return False


def test_migration_retires_a_pool_in_use_and_deletes_it_once_empty(airflow_stack, tmp_path):
    """`pools sync` over REST from the per-product layout while a deferred task holds slots in an old pool:
    the old pool keeps its slots (marked retired) until the task is done, then the next sync deletes it."""
    api = airflow_stack.api()
    marker = constants.POOL_DESCRIPTION_MARKER
    for pool in api.paginate("/api/v2/pools", "pools"):
        if pool["name"].startswith("gpu."):
            api.request("DELETE", f"/api/v2/pools/{pool['name']}")
    for team in ("nlp", "vision"):
        api.request("POST", "/api/v2/pools", json={"name": f"gpu.{team}.a100-80gb", "slots": 56, "include_deferred": True,
                                                   "description": f"{marker} team={team} product=a100-80gb: quota 8 GPU"})
    release = tmp_path / "release"
    (airflow_stack.dags_folder / "gpu_old_pool.py").write_text(DAG_TEMPLATE.format(
        dag_id="gpu_old_pool", pool="gpu.nlp.a100-80gb", slots=21, release=release, mode="defer"))
    wait_until(lambda: _dag_exists(api, "gpu_old_pool"), timeout=90, what="DAG gpu_old_pool parsed")
    run_id = api.request("POST", "/api/v2/dags/gpu_old_pool/dagRuns", json={"logical_date": None})["dag_run_id"]
    wait_until(lambda: _ti(api, "gpu_old_pool", run_id)["state"] == "deferred", timeout=240, what="task deferred")
    deferred_at = time.monotonic()

    config = two_team_config(tmp_path / "q.yaml")
    out = rest_sync(airflow_stack, config, "--dry-run")
    assert out.returncode == 0, out.stderr
    assert ("retire gpu.nlp.a100-80gb: 21 of 56 slots still in use, kept with its slots until no task uses it, then "
            "deleted by a later sync (replaced by gpu.nlp.guaranteed, gpu.nlp.preemptible)") in out.stdout
    assert "delete gpu.vision.a100-80gb: slots 56 -> (deleted) (replaced by gpu.vision.guaranteed" in out.stdout
    assert "dry run, nothing written: 4 to create, 0 to update, 1 to retire, 1 to delete" in out.stdout
    assert {p["name"] for p in api.paginate("/api/v2/pools", "pools")} >= {"gpu.nlp.a100-80gb", "gpu.vision.a100-80gb"}

    out = rest_sync(airflow_stack, config)
    assert out.returncode == 0, out.stderr
    old = get_pool(api, "gpu.nlp.a100-80gb")
    assert (old["slots"], old["deferred_slots"]) == (56, 21) and "retired" in old["description"]
    names = {p["name"] for p in api.paginate("/api/v2/pools", "pools")}
    assert names >= {"gpu.nlp.guaranteed", "gpu.nlp.preemptible", "gpu.vision.guaranteed", "gpu.vision.preemptible"}
    assert "gpu.vision.a100-80gb" not in names
    out = rest_sync(airflow_stack, config)
    assert "no changes" in out.stdout and "retired pool gpu.nlp.a100-80gb still has 21 slot(s) in use" in out.stdout

    # Airflow 3.3 fails a try whose trigger fires before the scheduler drained the deferring worker's
    # "success" (apache/airflow#66374; GangTrigger waits deferral_settle_seconds for the same reason):
    # FileTrigger has no such wait, so the release comes no earlier than the default settle time.
    time.sleep(max(0.0, default_settle_seconds() - (time.monotonic() - deferred_at)))
    release.touch()
    wait_until(lambda: _ti(api, "gpu_old_pool", run_id)["state"] == "success", timeout=240, what="task done")
    out = rest_sync(airflow_stack, config)
    assert out.returncode == 0 and "delete gpu.nlp.a100-80gb" in out.stdout, out.stdout + out.stderr
    assert "gpu.nlp.a100-80gb" not in {p["name"] for p in api.paginate("/api/v2/pools", "pools")}
