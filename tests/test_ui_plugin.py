"""The plugin in a real api-server (multi_team on) against a scripted cluster state on the local
cluster: auth (401/403 across teams), the queue JSON and CLI, and the page in headless Chromium
inside the Airflow UI (screenshot under build/)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from kubernetes import client

from airflow_gpu import constants as C
from airflow_gpu.config import load_config
from airflow_gpu.devtools.airflow_rows import insert_task_instances
from airflow_gpu.devtools.airflow_stack import AirflowStack
from airflow_gpu.devtools.gangs import api_client, create_gang, ensure_namespace, pod_manifest
from airflow_gpu.ui.queue import NOTE_IN_AIRFLOW

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "seed-quotas.yaml"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
WAIT_REASON = "needs 12 x NVIDIA-A100-SXM4-80GB in one NVLink clique (3 pods x 4); largest free block is 8"
QUOTA_REASON = "team quota: vision uses 4 of 4 a100-80gb; gang needs 4"
DB_RUN_ID = "scheduled__2026-12-02T06:00:00+00:00"
# task instances only in Airflow's DB (no pods yet): one held back by its full pool, one queued
DB_TASKS = [{"dag_id": "nlp_sweep", "task_id": "trial_1", "state": "scheduled", "pool": "gpu.nlp.preemptible",
             "pool_slots": 8 * 7, "priority_weight": 10, "waited": 600},
            {"dag_id": "vision_batch", "task_id": "score", "state": "queued", "pool": "gpu.vision.guaranteed",
             "pool_slots": 7, "priority_weight": 10, "waited": 120}]
DB_TASK_LINK = "/dags/nlp_sweep/runs/scheduled__2026-12-02T06%3A00%3A00%2B00%3A00/tasks/trial_1"


def ti_labels(dag: str, task: str, team: str, tier: str = C.TIER_PRODUCTION_TRAINING) -> dict:
    return {C.LABEL_DAG_ID: dag, C.LABEL_TASK_ID: task, C.LABEL_RUN_ID: "manual__2026-12-02", C.LABEL_TRY_NUMBER: "1",
            C.LABEL_TEAM: team, C.LABEL_TIER: tier}


def script_cluster(kubeconfig: str) -> None:
    """nlp: a running 2 x 4 GPU gang (one pod on spot) and a pending 3 x 4 gang with the scheduler's
    reason; vision: a pending lone pod held by its quota."""
    with api_client(kubeconfig) as api:
        core = client.CoreV1Api(api)
        for ns in ("team-nlp", "team-vision"):
            ensure_namespace(api, ns)
        client.CustomObjectsApi(api).create_namespaced_custom_object(
            "scheduling.x-k8s.io", "v1alpha1", "team-nlp", "podgroups",
            {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
             "metadata": {"name": "finetune", "annotations": {C.ANNOTATION_LAST_CHECKPOINT_TIME: "2026-12-02T00:00:00Z"}},
             "spec": {"minMember": 2}})
        for i, node in enumerate(("gpu-od-0", "gpu-spot-0")):
            body = pod_manifest(f"finetune-{i}", "team-nlp", 4, group="finetune", sim_seconds=3600,
                                labels=ti_labels("llm_finetune", "train", "nlp"),
                                annotations={C.ANNOTATION_INTERRUPTIONS: "1", C.ANNOTATION_PREEMPTIONS: "2"})
            body["spec"]["nodeName"] = node
            body["spec"]["tolerations"] = [{"key": C.TAINT_SPOT, "operator": "Exists"}]
            core.create_namespaced_pod("team-nlp", body, _preload_content=False)
        create_gang(api, "team-nlp", "pretrain", 3, 4, pg_annotations={C.ANNOTATION_WAIT_REASON: WAIT_REASON},
                    labels=ti_labels("llm_pretrain", "train", "nlp"))
        core.create_namespaced_pod("team-vision", pod_manifest(
            "detector", "team-vision", 4, labels=ti_labels("vision_detector", "fit", "vision"),
            annotations={C.ANNOTATION_WAIT_REASON: QUOTA_REASON}), _preload_content=False)


@pytest.fixture(scope="module")
def stack(kube_cluster, tmp_path_factory):
    script_cluster(str(kube_cluster.kubeconfig))
    root = tmp_path_factory.mktemp("ui-stack")
    s = AirflowStack(home=root / "home", dags_folder=root / "dags", components=("api-server",),
                     users={"nlp_user": "viewer:nlp", "vision_user": "viewer:vision"},
                     extra_env={"AIRFLOW__CORE__MULTI_TEAM": "True",
                                "AIRFLOW__AIRFLOW_GPU__KUBECONFIG": str(kube_cluster.kubeconfig),
                                "AIRFLOW__AIRFLOW_GPU__QUOTA_CONFIG": str(CONFIG)})
    s.migrate()
    for team in load_config(CONFIG).teams:
        s.airflow("teams", "create", team.airflow_team_name)
    sync = subprocess.run([sys.executable, "-m", "airflow_gpu", "pools", "sync", "--config", str(CONFIG)],
                          env=s.env(), capture_output=True, text=True, timeout=120)
    assert sync.returncode == 0, sync.stderr[-2000:]
    insert_task_instances(s, DB_RUN_ID, DB_TASKS)
    s.start(migrate=False)
    try:
        yield s
    finally:
        s.stop()


def get(stack, path, user=None, **params):
    headers = {"Authorization": f"Bearer {stack.token(user)}"} if user else {}
    return httpx.get(f"{stack.base_url}/airflow-gpu{path}", headers=headers, params=params, timeout=30)


@pytest.mark.parametrize("path", ["/", "/api/queue", "/api/chargeback", "/api/chargeback.csv"])
def test_every_route_needs_a_user(stack, path):
    assert get(stack, path).status_code == 401


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"])
def test_generated_docs_and_openapi_are_off(stack, path):
    """Issue 32: FastAPI's generated docs were public (200 without a login). They are turned off: not
    served without a user nor to an admin, and no page describes the API."""
    for user in (None, stack.username):
        r = get(stack, path, user)
        assert r.status_code in (401, 404), (user, r.status_code, r.text[:200])
        assert "swagger" not in r.text.lower() and '"openapi"' not in r.text and "redoc" not in r.text.lower()


def test_queue_for_admin(stack):
    r = get(stack, "/api/queue", "admin")
    assert r.status_code == 200, r.text
    q = r.json()
    assert {t["team"] for t in q["teams"]} >= {"nlp", "vision"}
    nlp_pool = next(t for t in q["teams"] if t["pool"] == "gpu.nlp.guaranteed")
    assert nlp_pool["slots"] == nlp_pool["gpus"] * 7
    by_dag = {w["dag_id"]: w for w in q["waiting"]}
    assert by_dag["llm_pretrain"]["reason"] == WAIT_REASON and by_dag["llm_pretrain"]["gpus"] == 12
    assert by_dag["vision_detector"]["reason"] == QUOTA_REASON
    assert by_dag["llm_pretrain"]["link"].endswith("/dags/llm_pretrain/runs/manual__2026-12-02/tasks/train")
    # the scheduler's queue first, then what Airflow holds back, each with its run's link
    assert [w["cluster_position"] for w in q["waiting"]] == [1, 2, 3, 4]
    assert {w["dag_id"] for w in q["waiting"][2:]} == {"nlp_sweep", "vision_batch"}
    assert by_dag["nlp_sweep"]["link"].endswith(DB_TASK_LINK) and by_dag["nlp_sweep"]["run_id"] == DB_RUN_ID
    assert by_dag["nlp_sweep"]["team"] == "nlp" and by_dag["nlp_sweep"]["gpus"] == 8
    assert by_dag["nlp_sweep"]["waiting_seconds"] >= 600
    # no estimated start without saying why
    assert all(w["estimate_note"] for w in q["waiting"] if w["estimated_start"] is None)
    assert by_dag["nlp_sweep"]["estimate_note"] == NOTE_IN_AIRFLOW
    pools = {t["pool"]: t for t in q["teams"]}
    assert pools["gpu.nlp.preemptible"]["queued"] == 8 * 7 and pools["gpu.vision.guaranteed"]["queued"] == 7
    (run,) = q["running"]
    assert run["dag_id"] == "llm_finetune" and (run["interruptions"], run["preemptions"]) == (1, 2)
    assert {p["node"]: p["capacity_type"] for p in run["pods"]} == {"gpu-od-0": "on-demand", "gpu-spot-0": "spot"}
    assert run["last_checkpoint_age_seconds"] > 0
    c = q["cluster"]
    assert c["gpus_total"] == 17 and 0 < c["allocation_ratio"] < 1 and len(c["nodes"]) == 6
    assert q["warnings"] == []  # multi_team on: DAG ownership is enforced by the bundles' teams


def test_multi_team_user_sees_own_rows_and_cluster_totals(stack):
    q = get(stack, "/api/queue", "nlp_user").json()
    assert {t["team"] for t in q["teams"]} == {"nlp"}
    assert {w["team"] for w in q["waiting"]} == {"nlp"} and {r["team"] for r in q["running"]} == {"nlp"}
    assert q["cluster"]["gpus_total"] == 17


@pytest.mark.parametrize("path", ["/api/queue", "/api/chargeback", "/api/chargeback.csv"])
def test_another_teams_rows_are_forbidden(stack, path):
    assert get(stack, path, "vision_user", team="nlp").status_code == 403
    assert get(stack, path, "vision_user", team="vision").status_code == 200


def test_chargeback_api_and_csv(stack):
    rows = get(stack, "/api/chargeback", "admin", since="2026-01-01").json()["rows"]
    nlp = {r["capacity_type"]: r for r in rows if r["team"] == "nlp"}
    assert set(nlp) == {"on-demand", "spot"} and all(r["gpu_hours"] > 0 for r in nlp.values())
    csv_text = get(stack, "/api/chargeback.csv", "nlp_user").text
    assert csv_text.startswith("team,product,capacity_type") and "vision" not in csv_text
    assert get(stack, "/api/chargeback", "admin", since="yesterday").status_code == 422


def test_queue_cli_json_against_the_api(stack, tmp_path):
    token = tmp_path / "token"
    token.write_text(stack.token("nlp_user"))
    out = subprocess.run([sys.executable, "-m", "airflow_gpu", "queue", "--json", "--api-url", stack.base_url,
                          "--token-file", str(token)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    data = json.loads(out.stdout)
    assert set(data) >= {"teams", "waiting", "running"}
    assert {"dag_id", "task_id", "run_id", "team", "tier", "gpus", "waiting_seconds", "position", "reason",
            "estimated_start"} <= set(data["waiting"][0])
    table = subprocess.run([sys.executable, "-m", "airflow_gpu", "queue", "--api-url", stack.base_url,
                            "--token-file", str(token)], capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr[-2000:]
    assert "llm_pretrain.train" in table.stdout and "vision_detector" not in table.stdout


def test_page_in_airflow_ui_headless_chromium(stack, tmp_path):
    from playwright.sync_api import sync_playwright

    shot = REPO / "build" / "ui-gpu-queue.png"
    shot.parent.mkdir(exist_ok=True)
    with sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / "chromium-profile"), executable_path=CHROMIUM, args=CHROMIUM_FLAGS, headless=True,
            viewport={"width": 1400, "height": 1000})
        try:
            browser.add_cookies([{"name": "_token", "value": stack.token("admin"), "url": stack.base_url}])
            page = browser.new_page()
            page.goto(f"{stack.base_url}/plugin/gpu-queue", wait_until="domcontentloaded")
            frame_el = page.wait_for_selector("iframe", timeout=60_000)
            frame = frame_el.content_frame()
            frame.wait_for_selector("body[data-ready=all]", timeout=60_000)
            text = frame.inner_text("body")
            assert "gpu.nlp.guaranteed" in text and "gpu.vision.preemptible" in text
            assert WAIT_REASON in text and QUOTA_REASON in text
            assert "team-nlp/finetune-1 → gpu-spot-0" in text
            # task instances only in Airflow's DB, linked to their task instance page
            link = frame.locator("#waiting a", has_text="nlp_sweep.trial_1")
            assert link.get_attribute("href").endswith(DB_TASK_LINK) and link.get_attribute("target") == "_top"
            assert DB_RUN_ID in text and "vision_batch.score" in text
            assert NOTE_IN_AIRFLOW in text and "as of " in text
            # GPUs first in the pools, slots in brackets: nlp's preemptible pool has 8 GPUs (56 slots) queued
            assert "8 (56)" in frame.inner_text("#teams")
            page.screenshot(path=str(shot), full_page=True)
            # the team filter keeps one team's rows
            frame.select_option("#team", "vision")
            assert {c.strip() for c in frame.locator("#waiting tbody td:nth-child(4)").all_inner_texts()} == {"vision"}
            assert frame.locator("#running tbody tr").count() == 0
            frame.select_option("#team", "")
            assert frame.locator("#waiting tbody tr").count() == 4
            nodes = frame.locator("canvas#nodes")
            assert (nodes.get_attribute("data-nodes"), nodes.get_attribute("data-gpus-used")) == ("6", "8")
            assert nodes.bounding_box()["height"] > 10  # drawn, not an empty canvas
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
