"""The plugin in a real api-server (multi_team on) with the real `airflow-gpu scheduler` on the local
cluster: the queue the UI API and `airflow-gpu queue --json` show is, row for row, what the
scheduler published (kube/queue_status.py) in the same cycle - a quota-blocked gang, a gang holding
the head's capacity reservation and a preempting one -; auth (401/403 across teams); and the page in
headless Chromium inside the Airflow UI (screenshot under build/)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from kubernetes import client

from airflow_gpu import constants as C
from airflow_gpu.config import load_config
from airflow_gpu.core.estimate import NOTE_PREEMPTING
from airflow_gpu.devtools import gangs as G
from airflow_gpu.devtools.airflow_rows import insert_task_instances
from airflow_gpu.devtools.airflow_stack import AirflowStack
from airflow_gpu.kube import queue_status
from airflow_gpu.ui.queue import NOTE_IN_AIRFLOW, NOTE_INCOMPLETE

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
CONFIG = REPO / "examples" / "seed-quotas.yaml"
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]
PUBLISH_INTERVAL = 30  # the publication stays the same while the UI's shared build (5 s) is compared with it
PROD, BEST_EFFORT = "airflow-gpu-production-training", "airflow-gpu-best-effort-training"
FINETUNE_SECONDS, SWEEP_SECONDS = 3600, 600
DB_RUN_ID = "scheduled__2026-12-02T06:00:00+00:00"
# task instances only in Airflow's DB (no pods yet): one held back by its full pool, one queued
DB_TASKS = [{"dag_id": "nlp_sweep", "task_id": "trial_1", "state": "scheduled", "pool": "gpu.nlp.preemptible",
             "pool_slots": 8 * 7, "priority_weight": 10, "waited": 600},
            {"dag_id": "vision_batch", "task_id": "score", "state": "queued", "pool": "gpu.vision.guaranteed",
             "pool_slots": 7, "priority_weight": 10, "waited": 120}]
DB_TASK_LINK = "/dags/nlp_sweep/runs/scheduled__2026-12-02T06%3A00%3A00%2B00%3A00/tasks/trial_1"
IGNORE_SIGTERM = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(3600)"
COMPARED = ("cluster_position", "position", "reason", "estimated_start", "estimate_note", "team", "tier", "gang")


def ti_labels(dag: str, task: str, team: str, tier: str = C.TIER_PRODUCTION_TRAINING) -> dict:
    return {C.LABEL_DAG_ID: dag, C.LABEL_TASK_ID: task, C.LABEL_RUN_ID: "manual__2026-12-02", C.LABEL_TRY_NUMBER: "1",
            C.LABEL_TEAM: team, C.LABEL_TIER: tier}


def gang(api, ns: str, name: str, members: int, gpus: int, priority_class: str, labels: dict,
         expected: float | None = None, **pod_kw) -> None:
    """A PodGroup and its pods, checkpointable and tolerating spot nodes (so the 16 whole GPUs of the
    cluster are one pool for every tier)."""
    pg_ann = {C.ANNOTATION_CHECKPOINTABLE: "true"}
    if expected:
        pg_ann[C.ANNOTATION_EXPECTED_DURATION] = str(expected)
    if name == "finetune":
        pg_ann[C.ANNOTATION_LAST_CHECKPOINT_TIME] = "2026-12-02T00:00:00Z"
    G.create_podgroup(api, ns, name, members, pg_ann)
    for i in range(members):
        body = G.pod_manifest(f"{name}-{i}", ns, gpus, group=name, priority_class=priority_class, labels=labels, **pod_kw)
        body["spec"]["tolerations"] = [{"key": C.TAINT_SPOT, "operator": "Exists"}]
        client.CoreV1Api(api).create_namespaced_pod(ns, body, _preload_content=False)


def bound(api, ns: str, prefix: str) -> bool:
    pods = client.CoreV1Api(api).list_namespaced_pod(ns).items
    mine = [p for p in pods if p.metadata.name.startswith(prefix)]
    return bool(mine) and all(p.spec.node_name for p in mine)


def script_cluster(api) -> None:
    """Running (bound by the scheduler, the 16 whole GPUs full): nlp's finetune 2 x 4 (nlp at its quota
    of 8, ends in an hour), vision's best-effort scratch 1 x 4 (ignores SIGTERM: a long preemption),
    research's best-effort sweep 1 x 4 (ends in 10 min). Then waiting: nlp's `more` 1 x 4 (quota:
    starts when finetune ends, not when sweep frees its GPUs), vision's `train` 1 x 4 (preempts
    scratch), recsys's `big` 2 x 4 (capacity: the head's reservation), research's best-effort `sweep2`
    1 x 4 (under its tier's wait bound: the page says from when it keeps its place)."""
    G.install_priority_classes(api)
    for ns in ("team-nlp", "team-vision", "team-research", "team-recsys"):
        G.ensure_namespace(api, ns)
    gang(api, "team-nlp", "finetune", 2, 4, PROD, ti_labels("llm_finetune", "train", "nlp"), FINETUNE_SECONDS,
         sim_seconds=FINETUNE_SECONDS, annotations={C.ANNOTATION_INTERRUPTIONS: "1", C.ANNOTATION_PREEMPTIONS: "2"})
    gang(api, "team-vision", "scratch", 1, 4, BEST_EFFORT,
         ti_labels("vision_scratch", "fit", "vision", C.TIER_BEST_EFFORT_TRAINING),
         command=[sys.executable, "-c", IGNORE_SIGTERM], grace=600)
    gang(api, "team-research", "sweep", 1, 4, BEST_EFFORT,
         ti_labels("research_sweep", "trial", "research", C.TIER_BEST_EFFORT_TRAINING), SWEEP_SECONDS,
         sim_seconds=SWEEP_SECONDS)
    G.wait_until(lambda: all(bound(api, ns, p) for ns, p in (("team-nlp", "finetune"), ("team-vision", "scratch"),
                                                            ("team-research", "sweep"))), 90, 0.5,
                 what="the running gangs bound by the scheduler")
    gang(api, "team-nlp", "more", 1, 4, PROD, ti_labels("llm_pretrain", "train", "nlp"), 1800, sim_seconds=1800)
    gang(api, "team-vision", "train", 1, 4, PROD, ti_labels("vision_detector", "fit", "vision"), 1800,
         sim_seconds=1800)
    gang(api, "team-recsys", "big", 2, 4, PROD, ti_labels("recsys_big", "train", "recsys"), 1800, sim_seconds=1800)
    # a sweep waiting under its tier's wait bound (seed-quotas: best-effort 4 h): it keeps its place from then
    gang(api, "team-research", "sweep2", 1, 4, BEST_EFFORT,
         ti_labels("research_sweep", "trial2", "research", C.TIER_BEST_EFFORT_TRAINING), SWEEP_SECONDS,
         sim_seconds=SWEEP_SECONDS)
    # a gang whose second member was never created: not in the queue, shown after it with the scheduler's reason
    G.create_podgroup(api, "team-nlp", "half", 2)
    client.CoreV1Api(api).create_namespaced_pod("team-nlp", G.pod_manifest(
        "half-0", "team-nlp", 1, group="half", priority_class=PROD, labels=ti_labels("llm_half", "train", "nlp")),
        _preload_content=False)


def published(api) -> dict | None:
    return queue_status.read(api, C.DEFAULT_SCHEDULER_NAMESPACE, C.DEFAULT_SCHEDULER_NAME)


@pytest.fixture(scope="module")
def stack(kube_cluster, tmp_path_factory):
    kc = str(kube_cluster.kubeconfig)
    root = tmp_path_factory.mktemp("ui-stack")
    sched = G.scheduler_process(kc, root / "scheduler.log", CONFIG, identity="ui-scheduler",
                                extra=["--publish-interval", str(PUBLISH_INTERVAL)]).start()
    api = G.api_client(kc)
    s = None
    try:
        script_cluster(api)
        G.wait_until(lambda: {w["gang"] for w in (published(api) or {}).get("waiting", [])} >=
                     {"team-nlp/more", "team-vision/train", "team-recsys/big"}, 120, 0.5, what="the queue published")
        s = AirflowStack(home=root / "home", dags_folder=root / "dags", components=("api-server",),
                         users={"nlp_user": "viewer:nlp", "vision_user": "viewer:vision"},
                         extra_env={"AIRFLOW__CORE__MULTI_TEAM": "True", "AIRFLOW__AIRFLOW_GPU__KUBECONFIG": kc,
                                    "AIRFLOW__AIRFLOW_GPU__QUOTA_CONFIG": str(CONFIG)})
        s.migrate()
        for team in load_config(CONFIG).teams:
            s.airflow("teams", "create", team.airflow_team_name)
        sync = subprocess.run([sys.executable, "-m", "airflow_gpu", "pools", "sync", "--config", str(CONFIG)],
                              env=s.env(), capture_output=True, text=True, timeout=120)
        assert sync.returncode == 0, sync.stderr[-2000:]
        insert_task_instances(s, DB_RUN_ID, DB_TASKS)
        s.start(migrate=False)
        s.api = api
        yield s
    finally:
        if s is not None:
            s.stop()
        sched.stop()


def get(stack, path, user=None, **params):
    headers = {"Authorization": f"Bearer {stack.token(user)}"} if user else {}
    return httpx.get(f"{stack.base_url}/airflow-gpu{path}", headers=headers, params=params, timeout=30)


@pytest.mark.parametrize("path", ["/", "/api/queue", "/api/chargeback", "/api/chargeback.csv"])
def test_every_route_needs_a_user(stack, path):
    assert get(stack, path).status_code == 401


def same_cycle(stack, answer) -> tuple[dict, dict]:
    """(an answer of `answer()`, the publication it was built from): asked until the publication read
    right after it is the one it shows (the scheduler publishes at most every PUBLISH_INTERVAL s)."""
    got = {}

    def match() -> bool:
        got["q"], got["p"] = answer(), published(stack.api)
        return got["q"]["published_at"] == got["p"]["generated_at"]

    G.wait_until(match, 60, 0.5, what="the answer and the publication of the same cycle")
    return got["q"], got["p"]


def assert_shows_the_publication(q: dict, pub: dict, teams=None) -> None:
    rows = {w["gang"]: w for w in q["waiting"] if w["gang"]}
    want = {e["gang"]: e for e in pub["waiting"] if teams is None or e["team"] in teams}
    assert set(want) <= set(rows), (set(want), set(rows))
    for name, e in want.items():
        assert {k: rows[name][k] for k in COMPARED} == {k: e[k] for k in COMPARED}, name
    assert q["stale"] is False and q["profile"] == pub["profile"] == "fgd-lookahead" and q["cycle"] == pub["cycle"]


def test_queue_for_admin_is_what_the_scheduler_published(stack):
    q, pub = same_cycle(stack, lambda: get(stack, "/api/queue", "admin").json())
    assert_shows_the_publication(q, pub)
    by_gang = {w["gang"]: w for w in q["waiting"] if w["gang"]}
    starts = {r["gang"]: r["started_at"] for r in pub["running"]}
    # quota-blocked: nlp is at its quota until finetune ends; capacity frees earlier (sweep ends in 10 min)
    more = by_gang["team-nlp/more"]
    assert more["reason"].startswith("team quota") and more["position"] == 1
    assert more["estimated_start"] == pytest.approx(starts["team-nlp/finetune"] + FINETUNE_SECONDS, abs=2)
    # preempting vision's own best-effort scratch (it ignores SIGTERM: the victim is slow to leave)
    train = by_gang["team-vision/train"]
    assert train["estimate_note"] == NOTE_PREEMPTING and train["reason"].startswith("preempting")
    # capacity: recsys's big gang holds the head's reservation, its start the reservation's
    big = by_gang["team-recsys/big"]
    assert "reserved" in big["reason"] and big["estimated_start"] is not None and len(big["nodes"]) == 2
    assert big["estimated_start"] >= more["estimated_start"] - 1  # conservative: behind nlp's more in the queue
    # gangs not complete yet after the queue, with the scheduler's reason
    half = next(w for w in q["waiting"] if w["gang"] == "team-nlp/half")
    assert half["estimate_note"] == NOTE_INCOMPLETE and half["reason"] == pub["incomplete"][0]["reason"]
    assert half["reason"].startswith("gang has 1 of 2 pods") and half["cluster_position"] == len(pub["waiting"]) + 1
    # the scheduler's queue first, then what Airflow holds back, each with its run's link
    assert [w["cluster_position"] for w in q["waiting"]] == list(range(1, len(q["waiting"]) + 1))
    by_dag = {w["dag_id"]: w for w in q["waiting"]}
    assert {w["dag_id"] for w in q["waiting"][-2:]} == {"nlp_sweep", "vision_batch"}
    assert by_dag["llm_pretrain"]["link"].endswith("/dags/llm_pretrain/runs/manual__2026-12-02/tasks/train")
    assert by_dag["nlp_sweep"]["link"].endswith(DB_TASK_LINK) and by_dag["nlp_sweep"]["run_id"] == DB_RUN_ID
    assert by_dag["nlp_sweep"]["team"] == "nlp" and by_dag["nlp_sweep"]["gpus"] == 8
    assert by_dag["nlp_sweep"]["waiting_seconds"] >= 600 and by_dag["nlp_sweep"]["estimate_note"] == NOTE_IN_AIRFLOW
    assert all(w["estimate_note"] for w in q["waiting"] if w["estimated_start"] is None)
    pools = {t["pool"]: t for t in q["teams"]}
    assert pools["gpu.nlp.preemptible"]["queued"] == 8 * 7 and pools["gpu.vision.guaranteed"]["queued"] == 7
    assert pools["gpu.nlp.guaranteed"]["slots"] == pools["gpu.nlp.guaranteed"]["gpus"] * 7
    run = {r["dag_id"]: r for r in q["running"]}
    assert set(run) == {"llm_finetune", "vision_scratch", "research_sweep"}
    assert (run["llm_finetune"]["interruptions"], run["llm_finetune"]["preemptions"]) == (1, 2)
    assert run["llm_finetune"]["last_checkpoint_age_seconds"] > 0 and len(run["llm_finetune"]["pods"]) == 2
    c = q["cluster"]
    assert c["gpus_total"] == 17 and c["allocation_ratio"] > 0.9 and len(c["nodes"]) == 6
    # the node the nomination holds for train (the UI reads no plan records: the scheduler says it)
    assert {n["name"] for n in c["nodes"] if n["held"]} == set(train["nodes"]) and len(train["nodes"]) == 1
    assert q["warnings"] == []  # multi_team on: DAG ownership is enforced by the bundles' teams


@pytest.mark.parametrize("path", ["/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"])
def test_generated_docs_and_openapi_are_off(stack, path):
    """Issue 32: FastAPI's generated docs were public (200 without a login). They are turned off: not
    served without a user nor to an admin, and no page describes the API."""
    for user in (None, stack.username):
        r = get(stack, path, user)
        assert r.status_code in (401, 404), (user, r.status_code, r.text[:200])
        assert "swagger" not in r.text.lower() and '"openapi"' not in r.text and "redoc" not in r.text.lower()


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
    assert nlp and set(nlp) <= {"on-demand", "spot"} and all(r["gpu_hours"] > 0 for r in nlp.values())
    csv_text = get(stack, "/api/chargeback.csv", "nlp_user").text
    assert csv_text.startswith("team,product,capacity_type") and "vision" not in csv_text
    assert get(stack, "/api/chargeback", "admin", since="yesterday").status_code == 422


def test_queue_cli_json_is_what_the_scheduler_published(stack, tmp_path):
    token = tmp_path / "token"
    token.write_text(stack.token("nlp_user"))

    def cli() -> dict:
        out = subprocess.run([sys.executable, "-m", "airflow_gpu", "queue", "--json", "--api-url", stack.base_url,
                              "--token-file", str(token)], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout)

    data, pub = same_cycle(stack, cli)
    assert_shows_the_publication(data, pub, teams={"nlp"})
    assert {w["team"] for w in data["waiting"]} == {"nlp"}
    assert {"dag_id", "task_id", "run_id", "team", "tier", "gpus", "waiting_seconds", "position", "reason",
            "estimated_start"} <= set(data["waiting"][0])
    table = subprocess.run([sys.executable, "-m", "airflow_gpu", "queue", "--api-url", stack.base_url,
                            "--token-file", str(token)], capture_output=True, text=True, timeout=60)
    assert table.returncode == 0, table.stderr[-2000:]
    assert "llm_pretrain.train" in table.stdout and "vision_detector" not in table.stdout
    assert "published by the scheduler at" in table.stdout


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
            # the page shows the publication it was served; a later one may carry other reasons: the
            # comparison is with the publication of the page's cycle, read again until they meet
            def shown() -> bool:
                pub = published(stack.api)
                page_text = frame.inner_text("body")
                return all(e["reason"] in page_text for e in pub["waiting"])
            G.wait_until(shown, 60, 2.0, what="the page showing the scheduler's publication")
            pub = published(stack.api)
            node = next(p["node"] for r in pub["running"] if r["gang"] == "team-nlp/finetune" for p in r["pods"]
                        if p["name"] == "team-nlp/finetune-1")
            assert f"team-nlp/finetune-1 → {node}" in text
            # task instances only in Airflow's DB, linked to their task instance page
            link = frame.locator("#waiting a", has_text="nlp_sweep.trial_1")
            assert link.get_attribute("href").endswith(DB_TASK_LINK) and link.get_attribute("target") == "_top"
            assert DB_RUN_ID in text and "vision_batch.score" in text
            assert NOTE_IN_AIRFLOW in text and "as of " in text and "published by the scheduler" in text
            # the product each waiting gang is expected to start on, as published (issue 29)
            expected = {", ".join(e["expected_products"]) for e in pub["waiting"] if e["expected_products"]}
            shown_waiting = frame.inner_text("#waiting")
            assert expected and all(f"on {p}" in shown_waiting for p in expected), (expected, shown_waiting)
            # a sweep under its tier's wait bound says from when it keeps its place (issue 30), as published
            bounded = [e for e in pub["waiting"] if e.get("due_at") is not None]
            assert bounded and shown_waiting.count("keeps its place") == len(bounded), (bounded, shown_waiting)
            assert "STALE" not in text
            # GPUs first in the pools, slots in brackets: nlp's preemptible pool has 8 GPUs (56 slots) queued
            assert "8 (56)" in frame.inner_text("#teams")
            page.screenshot(path=str(shot), full_page=True)
            # the team filter keeps one team's rows
            frame.select_option("#team", "vision")
            assert {c.strip() for c in frame.locator("#waiting tbody td:nth-child(4)").all_inner_texts()} == {"vision"}
            assert {c.strip() for c in frame.locator("#running tbody td:nth-child(2)").all_inner_texts()} == {"vision"}
            frame.select_option("#team", "")
            assert frame.locator("#waiting tbody tr").count() == len(pub["waiting"]) + len(pub["incomplete"]) + len(DB_TASKS)
            nodes = frame.locator("canvas#nodes")
            assert nodes.get_attribute("data-nodes") == "6" and int(nodes.get_attribute("data-gpus-used")) >= 16
            assert nodes.bounding_box()["height"] > 10  # drawn, not an empty canvas
        finally:
            browser.close()
    assert shot.stat().st_size > 10_000
