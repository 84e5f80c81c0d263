"""Chargeback: totals equal the sum over the pods of a scripted run (one interruption, one
preemption), under each loss policy; pods as the cluster reports them, plus an XCom-only try."""

from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import pytest

from airflow_gpu import constants as C
from airflow_gpu.config import load_config
from airflow_gpu.core.chargeback import CAUSE_PREEMPTION, Usage, charge, clipped
from airflow_gpu.ui.service import prices_of, to_csv, usage_records

T0 = 1_800_000_000.0
SPOT_NODE, OD_NODE = "gpu-spot-0", "gpu-od-0"
REPO_ROOT = Path(__file__).resolve().parents[1]


def format_time(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def node(name: str, capacity: str) -> dict:
    return {"metadata": {"name": name, "labels": {C.NODE_GPU_PRODUCT: "NVIDIA-A100-SXM4-80GB",
                                                   C.NODE_CAPACITY_TYPE_KARPENTER: capacity}}}


def pod(name: str, gpus: int, node_name: str, start: float, end: float, disruption: str | None = None,
        checkpoint: float | None = None, try_number: int = 1) -> dict:
    ann = {C.ANNOTATION_LAST_CHECKPOINT_TIME: format_time(checkpoint)} if checkpoint else {}
    conds = [{"type": C.CONDITION_DISRUPTION_TARGET, "status": "True", "reason": disruption}] if disruption else []
    return {"metadata": {"name": name, "namespace": "team-nlp", "annotations": ann,
                         "labels": {C.LABEL_DAG_ID: "train", C.LABEL_TASK_ID: "fit", C.LABEL_RUN_ID: "r1",
                                    C.LABEL_TRY_NUMBER: str(try_number)}},
            "spec": {"nodeName": node_name, "containers": [{"name": "c", "resources": {"limits": {C.RESOURCE_GPU: str(gpus)}}}]},
            "status": {"phase": "Failed" if disruption else "Succeeded", "conditions": conds,
                       "containerStatuses": [{"name": "c", "state": {"terminated": {
                           "startedAt": format_time(start), "finishedAt": format_time(end)}}}]}}


@pytest.fixture
def cfg():
    return load_config(REPO_ROOT / "examples" / "seed-quotas.yaml")


def scripted_run():
    """Attempt 1 on spot (2 x 4 GPUs, 1 h, interrupted 600 s after its checkpoint); attempt 2 on
    on-demand, preempted 900 s after its checkpoint (2 x 4 GPUs, 30 min); attempt 3 finishes (4 GPUs, 2 h)."""
    nodes = {SPOT_NODE: node(SPOT_NODE, "spot"), OD_NODE: node(OD_NODE, "on-demand")}
    pods = [
        *(pod(f"a1-{r}", 4, SPOT_NODE, T0, T0 + 3600, C.REASON_EVICTION_BY_EVICTION_API, T0 + 3000) for r in range(2)),
        *(pod(f"a2-{r}", 4, OD_NODE, T0 + 3700, T0 + 5500, C.REASON_PREEMPTION_BY_SCHEDULER, T0 + 4600) for r in range(2)),
        pod("a3-0", 4, OD_NODE, T0 + 6000, T0 + 13200),
    ]
    return pods, nodes


def hand_sum(policy: str, cfg) -> dict:
    """The expected bill, from the scripted numbers alone."""
    od, spot = prices_of(cfg)["a100-80gb"]
    spot_h, od_h = 8 * 1.0, 8 * 0.5 + 4 * 2.0
    lost_int, lost_pre = 8 * 600 / 3600, 8 * 900 / 3600
    lost_rate = {"platform": 0.0, "spot": spot, "on-demand": od}[policy]
    return {"spot": (spot_h, lost_int, (spot_h - lost_int) * spot + lost_int * lost_rate),
            "on-demand": (od_h, lost_pre, (od_h - lost_pre) * od + lost_pre * lost_rate)}


@pytest.mark.parametrize("policy", ["platform", "spot", "on-demand"])
def test_totals_equal_the_sum_over_the_pods(cfg, policy):
    pods, nodes = scripted_run()
    records = usage_records(cfg, pods, nodes, [], now=T0 + 20000)
    rows = {r.capacity_type: r for r in charge(records, prices_of(cfg), T0 - 1, T0 + 86400, policy)}
    want = hand_sum(policy, cfg)
    assert set(rows) == {"spot", "on-demand"} and all(r.team == "nlp" for r in rows.values())
    assert rows["spot"].gpu_hours == pytest.approx(want["spot"][0])
    assert rows["spot"].lost_interruption_hours == pytest.approx(want["spot"][1])
    assert rows["spot"].lost_preemption_hours == 0
    assert rows["on-demand"].lost_preemption_hours == pytest.approx(want["on-demand"][1])
    for cap in rows:
        assert rows[cap].cost == pytest.approx(want[cap][2])
    csv_text = to_csv([r.as_dict() for r in rows.values()])
    assert csv_text.splitlines()[0].startswith("team,product,capacity_type,gpu_hours")


def test_xcom_covers_tries_whose_pods_are_gone(cfg):
    pods, nodes = scripted_run()
    xcom = [{"team": "nlp", "product": "a100-80gb", "try": ("train", "fit", "r1", "1"), "start": T0, "end": T0 + 3600,
             "value": {"gpu_seconds": 1.0}},  # covered by its pods: not counted twice
            {"team": "nlp", "product": "a100-80gb", "try": ("train", "fit", "r0", "1"), "start": T0, "end": T0 + 1800,
             "value": {"gpu_seconds": 4 * 1800, "lost_gpu_seconds": 600, "preemptions": 1,
                       "lost_interruption_gpu_seconds": 0.0, "lost_preemption_gpu_seconds": 600}}]
    records = usage_records(cfg, pods, nodes, xcom, now=T0 + 20000)
    gone = [r for r in records if r.capacity_type == "unknown"]
    assert sum(r.gpu_seconds for r in gone) == pytest.approx(4 * 1800)
    assert [(r.cause, r.lost_gpu_seconds) for r in gone if r.lost_gpu_seconds] == [(CAUSE_PREEMPTION, 600)]
    od = prices_of(cfg)["a100-80gb"][0]
    row = [r for r in charge(records, prices_of(cfg), T0 - 1, T0 + 86400, "platform") if r.capacity_type == "unknown"][0]
    assert row.cost == pytest.approx((4 * 1800 - 600) / 3600 * od)  # unknown capacity is priced on-demand


def test_period_clipping_and_bad_policy():
    u = Usage("nlp", "a100-80gb", "spot", 2, 0, 100, lost_gpu_seconds=50, cause="interruption")
    assert clipped(u, 50, 200) == (100, 50)  # lost work booked when lost, inside the period
    assert clipped(u, 0, 100) == (200, 0)  # ended at the period's end: next period
    with pytest.raises(ValueError, match="loss policy must be one of platform, spot, on-demand"):
        charge([u], {"a100-80gb": (2.0, 1.0)}, 0, 10, "team")


def xcom_try(value: dict) -> dict:
    return {"team": "nlp", "product": "a100-80gb", "try": ("ablation", "train", "r9", "1"), "start": T0,
            "end": T0 + 3600, "value": value}


@pytest.mark.parametrize("policy", ["platform", "spot", "on-demand"])
def test_a_try_interrupted_then_preempted_keeps_both_losses(cfg, policy):
    """The demo's ablation: one try, interrupted on spot (2 GPU-h used, 300 GPU-s lost), then on
    on-demand preempted (500 GPU-s lost) and finished (6 GPU-h in all there); its pods are gone, only
    the operator's XCom result is left."""
    value = {"gpu_seconds": 8 * 3600, "interruptions": 1, "preemptions": 1, "lost_gpu_seconds": 800,
             "lost_interruption_gpu_seconds": 300, "lost_preemption_gpu_seconds": 500,
             "usage_by_capacity": {
                 "spot": {"gpu_seconds": 2 * 3600, "lost_interruption_gpu_seconds": 300, "lost_preemption_gpu_seconds": 0},
                 "on-demand": {"gpu_seconds": 6 * 3600, "lost_interruption_gpu_seconds": 0,
                               "lost_preemption_gpu_seconds": 500}}}
    rows = {r.capacity_type: r for r in charge(usage_records(cfg, [], {}, [xcom_try(value)], now=T0 + 20000),
                                               prices_of(cfg), T0 - 1, T0 + 86400, policy)}
    od, spot = prices_of(cfg)["a100-80gb"]
    lost_rate = {"platform": 0.0, "spot": spot, "on-demand": od}[policy]
    assert set(rows) == {"spot", "on-demand"}
    assert (rows["spot"].gpu_hours, rows["on-demand"].gpu_hours) == pytest.approx((2.0, 6.0))
    assert (rows["spot"].lost_interruption_hours, rows["spot"].lost_preemption_hours) == pytest.approx((300 / 3600, 0))
    assert (rows["on-demand"].lost_interruption_hours, rows["on-demand"].lost_preemption_hours) == \
        pytest.approx((0, 500 / 3600))
    assert rows["spot"].cost == pytest.approx((2 * 3600 - 300) / 3600 * spot + 300 / 3600 * lost_rate)
    assert rows["on-demand"].cost == pytest.approx((6 * 3600 - 500) / 3600 * od + 500 / 3600 * lost_rate)


def test_a_result_with_the_causes_but_no_capacity_types(cfg):
    value = {"gpu_seconds": 8 * 3600, "interruptions": 1, "preemptions": 1, "lost_gpu_seconds": 800,
             "lost_interruption_gpu_seconds": 300, "lost_preemption_gpu_seconds": 500}
    (row,) = charge(usage_records(cfg, [], {}, [xcom_try(value)], now=T0 + 20000), prices_of(cfg),
                    T0 - 1, T0 + 86400, "platform")
    assert row.capacity_type == "unknown" and row.gpu_hours == pytest.approx(8.0)
    assert (row.lost_interruption_hours, row.lost_preemption_hours) == pytest.approx((300 / 3600, 500 / 3600))


def test_an_older_result_without_the_causes_is_split_by_disruptions(cfg):
    value = {"gpu_seconds": 8 * 3600, "interruptions": 1, "preemptions": 3, "lost_gpu_seconds": 800}
    (row,) = charge(usage_records(cfg, [], {}, [xcom_try(value)], now=T0 + 20000), prices_of(cfg),
                    T0 - 1, T0 + 86400, "platform")
    assert row.gpu_hours == pytest.approx(8.0)
    assert (row.lost_interruption_hours, row.lost_preemption_hours) == pytest.approx((200 / 3600, 600 / 3600))


def test_a_team_label_does_not_move_billing(cfg):
    """Issue 32: a pod of team-vision labelled airflow-gpu.io/team=nlp is billed to vision, the team
    whose quota it used (the namespace's), never to the team its label names; a pod in a namespace
    outside the quota config is billed to that namespace."""
    pods, nodes = scripted_run()
    for p in pods:
        p["metadata"]["labels"][C.LABEL_TEAM] = "nlp"  # what a KubernetesPodOperator or kubectl can set
    pods[-1]["metadata"]["namespace"] = "team-vision"
    pods[0]["metadata"]["namespace"] = "ml-sandbox"
    rows = charge(usage_records(cfg, pods, nodes, [], now=T0 + 20000), prices_of(cfg), T0 - 1, T0 + 86400, "platform")
    hours = {}
    for r in rows:
        hours[r.team] = hours.get(r.team, 0.0) + r.gpu_hours
    assert hours == pytest.approx({"vision": 4 * 2.0, "ml-sandbox": 4 * 1.0, "nlp": 4 * 1.0 + 8 * 0.5})


def test_the_queue_shows_the_namespace_team_and_the_priority_class_tier(cfg):
    """The queue page shows what the scheduler published, and the scheduler reads team and tier from
    the namespace and the PriorityClass: a waiting gang (complete or still incomplete) in team-vision
    labelled team=nlp, tier=interactive is vision's, at its PriorityClass's tier."""
    from test_scheduler_convert import _view, pod as k8s_pod, podgroup

    from airflow_gpu.core.policies import make_profile
    from airflow_gpu.core.queue import schedule_cycle
    from airflow_gpu.kube.convert import ConversionContext
    from airflow_gpu.scheduler.publish import document
    from airflow_gpu.scheduler.state import build_world

    liar = {C.LABEL_TEAM: "nlp", C.LABEL_TIER: C.TIER_INTERACTIVE}
    pods = [k8s_pod("lone", 1, ns="team-vision", pc="airflow-gpu-best-effort-training", priority=1000),
            k8s_pod("big-0", 8, ns="team-vision", group="big", pc="airflow-gpu-best-effort-training", priority=1000)]
    for p in pods:
        p["metadata"]["labels"].update(liar)
    ctx = ConversionContext.from_config(cfg)
    world = build_world(_view(pods, [podgroup("big", 2, ns="team-vision")]), C.DEFAULT_SCHEDULER_NAME, ctx, T0)
    state = world.state  # the cycle's one state, built with the World
    profile = make_profile("bestfit")
    result = schedule_cycle(state, [g for _, g in world.pending], profile, T0)
    doc = document(world, state, result, profile, "bestfit", C.DEFAULT_SCHEDULER_NAME, 1, T0, 5.0, [], {}, ctx)
    shown = [(e["gang"], e["team"], e["tier"]) for e in doc["waiting"] + doc["incomplete"]]
    shown += [(d.gang.name, d.gang.team, d.gang.tier) for d in result.admitted]  # admitted in this cycle
    assert sorted(shown) == [("team-vision/big", "vision", "best-effort-training"),
                             ("team-vision/lone", "vision", "best-effort-training")]


def test_running_rows_past_the_cap_are_counted_not_built(cfg, monkeypatch):
    """The published document builds at most queue_status.MAX_RUNNING running rows (encode would
    cut the rest: at 5,000 nodes half the running gangs) and counts the others; encode adds the
    count to what it cuts itself."""
    from test_scheduler_convert import _view, pod as k8s_pod

    from airflow_gpu.core.policies import make_profile
    from airflow_gpu.core.queue import schedule_cycle
    from airflow_gpu.kube import queue_status
    from airflow_gpu.kube.convert import ConversionContext
    from airflow_gpu.scheduler.publish import document
    from airflow_gpu.scheduler.state import build_world

    pods = [k8s_pod(f"run-{i}", 1, ns="team-vision", node_name="ab"[i % 2], phase="Running") for i in range(5)]
    world = build_world(_view(pods), C.DEFAULT_SCHEDULER_NAME, ConversionContext.from_config(cfg), T0)
    profile = make_profile("bestfit")
    result = schedule_cycle(world.state, [], profile, T0)
    monkeypatch.setattr(queue_status, "MAX_RUNNING", 2)
    doc = document(world, world.state, result, profile, "bestfit", C.DEFAULT_SCHEDULER_NAME, 1, T0, 5.0, [], {})
    assert [r["gang"] for r in doc["running"]] == [rg.gang.name for rg in world.running[:2]]
    assert doc["truncated"] == {"running": 3}
    back = queue_status.decode(queue_status.manifest("ns", "s", queue_status.encode(doc)))
    assert back["running"] == doc["running"] and back["truncated"]["running"] == 3
    # a cap of its own in encode counts on top of the rows the document left out
    monkeypatch.setattr(queue_status, "LISTS", tuple((n, 2 if n == "running" else c) for n, c in queue_status.LISTS))
    doubled = queue_status.encode(doc | {"running": doc["running"] * 2})
    back = queue_status.decode(queue_status.manifest("ns", "s", doubled))
    assert len(back["running"]) == 2 and back["truncated"]["running"] == 5


def test_reference_gpu_hours_scale_by_the_products_relative_speed(repo_root):
    # a job accepting H100 and A100: 2 GPU-hours on H100 (relative_speed 2.5) are 5 A100 GPU-hours of work
    cfg = load_config(repo_root / "examples" / "seed-quotas.yaml")
    records = [Usage("nlp", "h100-80gb", "on-demand", 2, 0.0, 3600.0),
               Usage("nlp", "a100-80gb", "on-demand", 2, 0.0, 3600.0)]
    rows = {r.product: r for r in charge(records, prices_of(cfg), 0.0, 3600.0, speeds=cfg.product_speeds())}
    assert (rows["h100-80gb"].gpu_hours, rows["h100-80gb"].reference_gpu_hours) == pytest.approx((2.0, 5.0))
    assert (rows["a100-80gb"].gpu_hours, rows["a100-80gb"].reference_gpu_hours) == pytest.approx((2.0, 2.0))
    assert "reference_gpu_hours" in rows["h100-80gb"].as_dict()


def test_a_relaunched_attempt_pays_its_restart_overhead_as_lost(cfg):
    """Issue 30: a pod of an attempt relaunched after a preemption (the operator's preemptions
    annotation) computed nothing for its tier's restart overhead (the config's default, 120 s): a
    record of cause restart, shown apart; the work it then lost to an interruption counts from after
    the restart. The XCom path keeps the operator's lost_restart_gpu_seconds apart too."""
    nodes = {OD_NODE: node(OD_NODE, "on-demand")}
    first = pod("a1-0", 4, OD_NODE, T0, T0 + 1000)
    again = pod("a2-0", 4, OD_NODE, T0 + 2000, T0 + 2600, C.REASON_EVICTION_BY_EVICTION_API)
    again["metadata"]["annotations"][C.ANNOTATION_PREEMPTIONS] = "1"
    again["spec"]["priorityClassName"] = "airflow-gpu-best-effort-training"
    (row,) = charge(usage_records(cfg, [first, again], nodes, [], now=T0 + 20000), prices_of(cfg), T0 - 1,
                    T0 + 86400, "platform")
    assert row.lost_restart_hours == pytest.approx(4 * 120 / 3600)
    assert row.lost_interruption_hours == pytest.approx(4 * (600 - 120) / 3600)
    assert row.gpu_hours == pytest.approx(4 * 1600 / 3600)  # the restart is held time: part of the GPU-hours
    own = dict(again, metadata={**again["metadata"], "annotations": {**again["metadata"]["annotations"],
                                                                      C.ANNOTATION_RESTART_OVERHEAD: "300"}})
    (row,) = charge(usage_records(cfg, [own], nodes, [], now=T0 + 20000), prices_of(cfg), T0 - 1, T0 + 86400)
    assert row.lost_restart_hours == pytest.approx(4 * 300 / 3600)  # the gang's own overhead wins
    value = {"gpu_seconds": 4 * 3600, "preemptions": 1, "lost_gpu_seconds": 900, "lost_interruption_gpu_seconds": 0,
             "lost_preemption_gpu_seconds": 420, "lost_restart_gpu_seconds": 480}
    (row,) = charge(usage_records(cfg, [], {}, [xcom_try(value)], now=T0 + 20000), prices_of(cfg), T0 - 1, T0 + 86400)
    assert (row.lost_preemption_hours, row.lost_restart_hours) == pytest.approx((420 / 3600, 480 / 3600))
    assert "lost_restart_hours" in to_csv([row.as_dict()]).splitlines()[0]


def test_a_record_of_an_unpriced_product_is_counted_not_fatal():
    """One record whose product has no price (an empty product from another backend, a product removed
    from the quota file) costs nothing known: its row says so, the other rows are priced as before."""
    prices = {"a100-80gb": (4.0, 1.5)}
    records = [Usage("team-a", "a100-80gb", "on-demand", 8, 0.0, 3600.0, ref="ref-1"),
               Usage("team-a", "", "on-demand", 8, 0.0, 3600.0, ref="ref-2")]
    rows = {r.product: r.as_dict() for r in charge(records, prices, 0.0, 3600.0)}
    assert rows["a100-80gb"]["cost"] == pytest.approx(32.0)
    assert rows[""]["gpu_hours"] == pytest.approx(8.0) and rows[""]["cost"] is None
