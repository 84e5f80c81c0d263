"""Restart cost and minimum runtime (issue 30): core's rules, victim choice, the config adapter."""

from __future__ import annotations

import pytest
from fixtures.core_gang import full_cluster_of, gang, plan_for, profile

from airflow_gpu.constants import TIER_BEST_EFFORT_TRAINING, TIER_PRODUCTION_TRAINING
from airflow_gpu.core.model import (Gang, PodRequest, RunningGang, restart_lost_gpu_seconds, sigterm_checkpoint_commits,
                                    work_kept_at_stop)
from airflow_gpu.core.preemption import PreemptionPolicy, protected
from airflow_gpu.core.quota import QuotaBook, QuotaUsage, TeamQuota
from airflow_gpu.core.tiers import TierPolicy, decide

PROD, BE = TIER_PRODUCTION_TRAINING, TIER_BEST_EFFORT_TRAINING


def test_stop_rules_checkpoint_within_grace_else_periodic_and_restart_overhead_is_lost():
    assert sigterm_checkpoint_commits(20.0, 30.0) and sigterm_checkpoint_commits(30.0, 30.0)
    assert not sigterm_checkpoint_commits(90.0, 30.0)
    # 1000 s saved before, 2500 s run now, periodic every 1800 s: 3500 done -> 1800 saved by the last one
    assert work_kept_at_stop(1000.0, 2500.0, 1800.0, True) == 2500.0
    assert work_kept_at_stop(1000.0, 2500.0, 1800.0, False) == 800.0
    assert work_kept_at_stop(1000.0, 500.0, 1800.0, False) == 0.0  # no checkpoint since: nothing kept
    assert work_kept_at_stop(1000.0, 2500.0, 0.0, False) == 0.0
    assert restart_lost_gpu_seconds(8.0, 120.0, 3600.0) == 960.0
    assert restart_lost_gpu_seconds(8.0, 120.0, 30.0) == 240.0  # stopped during its restart
    assert restart_lost_gpu_seconds(8.0, 120.0, -5.0) == 0.0


def test_preemption_cost_counts_the_restart_overhead():
    g = Gang("g", "t", BE, 0, (PodRequest("p", gpus=4),), checkpointable=True, restart_overhead=300.0)
    rg = RunningGang(g, (), started_at=100.0, last_checkpoint_at=150.0)
    assert rg.gpu_seconds_at_risk(160.0) == 40.0
    assert rg.preemption_cost(160.0) == 40.0 + 4 * 300.0


def test_victim_order_prefers_the_gang_that_restarts_cheaply():
    # two checkpointable gangs of 4 GPUs, same priority, same work at risk; one restarts in 20 min
    snap, running = full_cluster_of([
        ("slow-restart", 1, 4, 0, {"checkpointable": True, "restart_overhead": 1200.0}, {"at": 0.0, "checkpoint": 90.0}),
        ("fast-restart", 1, 4, 0, {"checkpointable": True, "restart_overhead": 60.0}, {"at": 0.0, "checkpoint": 90.0}),
    ], nodes=1)
    plan, why = plan_for(snap, gang("prod", 1, 4, priority=100, tier=PROD), running, profile(), now=100.0)
    assert plan is not None, why
    assert plan.victim_names == ("fast-restart",)
    assert plan.restart_gpu_seconds == 4 * 60.0 and plan.lost_gpu_seconds == 4 * 10.0
    # without a restart cost the tie goes to the most recently started: the slow one, started later
    snap, running = full_cluster_of([
        ("a", 1, 4, 0, {"checkpointable": True}, {"at": 0.0, "checkpoint": 90.0}),
        ("b", 1, 4, 0, {"checkpointable": True, "restart_overhead": 1200.0}, {"at": 1.0, "checkpoint": 90.0}),
    ], nodes=1)
    plan, _ = plan_for(snap, gang("prod", 1, 4, priority=100, tier=PROD), running, profile(), now=100.0)
    assert plan.victim_names == ("a",)  # b would have been first (started last), but restarts dearly


def test_a_gang_younger_than_its_min_runtime_is_no_victim_until_it_ages():
    policy = PreemptionPolicy(min_runtime=((BE, 600.0),))
    snap, running = full_cluster_of([("young", 1, 8, 0, {}, {"at": 1000.0})], nodes=1)
    plan, why = plan_for(snap, gang("prod", 1, 8, priority=100, tier=PROD), running, profile(), 1500.0, policy=policy)
    assert plan is None and "no preemptible gang" in why
    plan, why = plan_for(snap, gang("prod", 1, 8, priority=100, tier=PROD), running, profile(), 1600.0, policy=policy)
    assert plan is not None and plan.victim_names == ("young",), why
    # other tiers have no minimum runtime
    snap, running = full_cluster_of([("other", 1, 8, 0, {"tier": "inference"}, {"at": 1000.0})], nodes=1)
    plan, _ = plan_for(snap, gang("prod", 1, 8, priority=100, tier=PROD), running, profile(), 1001.0, policy=policy)
    assert plan is not None and plan.victim_names == ("other",)


@pytest.mark.parametrize("ignores", [False, True])
def test_reclaim_of_borrowed_quota_waits_for_the_min_runtime_unless_the_tier_says_so(ignores):
    qb = QuotaBook({"a": TeamQuota.from_gpus("a", {"H100": 8}, {"H100": 8}),
                    "b": TeamQuota.from_gpus("b", {"H100": 8})}, borrowed_priority=0)
    snap, running = full_cluster_of([
        ("a-own", 1, 8, 5, {"team": "a"}, {"at": 990.0}),
        ("a-borrow", 1, 8, 5, {"team": "a"}, {"borrowed": True, "at": 1000.0}),
    ])
    usage = QuotaUsage.from_running(running, {n.name: n.gpu_product for n in snap.nodes}, qb)
    policy = PreemptionPolicy(min_runtime=((BE, 600.0),),
                              reclaim_ignores_min_runtime_tiers=frozenset({BE}) if ignores else frozenset())
    assert protected(running[1], 1100.0, policy, reclaim=False)
    assert protected(running[1], 1100.0, policy, reclaim=True) is not ignores
    plan, why = plan_for(snap, gang("b-job", 1, 4, priority=5, team="b"), running, profile(), 1100.0, qb, usage,
                         policy=policy)
    if ignores:
        assert plan is not None and plan.victim_names == ("a-borrow",) and plan.reclaim, why
    else:
        assert plan is None
    plan, why = plan_for(snap, gang("b-job", 1, 4, priority=5, team="b"), running, profile(), 1600.0, qb, usage,
                         policy=policy)
    assert plan is not None and plan.victim_names == ("a-borrow",), why


def test_tier_and_gang_restart_overhead_and_the_config_adapter(tmp_path, repo_root):
    import yaml

    from airflow_gpu.config import load_config
    from airflow_gpu.config.core import preemption_policy_from_config
    from airflow_gpu.constants import DEFAULT_RESTART_OVERHEAD_SECONDS

    members = (PodRequest("p", gpus=1),)
    assert decide(None, members, False).restart_overhead == DEFAULT_RESTART_OVERHEAD_SECONDS
    assert decide(TierPolicy(restart_overhead_seconds=300.0), members, False).restart_overhead == 300.0
    assert decide(TierPolicy(restart_overhead_seconds=300.0), members, False, restart_overhead=45.0).restart_overhead == 45.0
    doc = yaml.safe_load((repo_root / "examples" / "seed-quotas.yaml").read_text())
    best = next(t for t in doc["tiers"] if t["name"] == BE)
    best.update(restart_overhead_seconds=300, min_runtime_seconds=600, reclaim_ignores_min_runtime=True)
    doc["scheduling"] = {"restart_overhead_seconds": 90, "checkpoint_seconds": 45}
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump(doc))
    cfg = load_config(path)
    tiers = cfg.tier_policies()
    assert tiers[PROD].restart_overhead_seconds == 90 and tiers[BE].restart_overhead_seconds == 300
    policy = preemption_policy_from_config(cfg)
    assert policy.min_runtime == ((BE, 600.0),) and policy.min_runtime_of(PROD) == 0.0
    assert policy.reclaim_ignores_min_runtime_tiers == frozenset({BE})
    assert cfg.scheduling.checkpoint_seconds == 45
    best["min_runtime_seconds"] = -1
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(Exception, match="min_runtime_seconds"):
        load_config(path)


def test_the_scheduler_reads_a_gangs_restart_overhead_and_checkpoint_time_from_its_annotations():
    """kube.convert: the annotations (the operator's restart_overhead_seconds / checkpoint_seconds
    arguments) win over the tier's; an invalid one is ignored on a running gang, with the field named."""
    from airflow_gpu import constants as C
    from airflow_gpu.core.model import Placement
    from airflow_gpu.kube.convert import ConversionContext, running_gang_from_k8s

    def pod(notes):
        return {"metadata": {"name": "p", "namespace": "a", "annotations": notes,
                             "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"nodeName": "n", "containers": [{"name": "c"}], "priorityClassName": f"airflow-gpu-{BE}"},
                "status": {"phase": "Running", "startTime": "2026-01-01T10:00:00Z"}}

    ctx = ConversionContext(tiers={BE: TierPolicy(restart_overhead_seconds=300.0)})
    placement = (Placement("a/p", "n", ((0, 1000),)),)
    rg = running_gang_from_k8s("a/p", None, [pod({})], ctx, placement, hints=[])
    assert (rg.gang.restart_overhead, rg.gang.checkpoint_seconds) == (300.0, None)
    rg = running_gang_from_k8s("a/p", None, [pod({C.ANNOTATION_RESTART_OVERHEAD: "45",
                                                  C.ANNOTATION_CHECKPOINT_SECONDS: "90"})], ctx, placement, hints=[])
    assert (rg.gang.restart_overhead, rg.gang.checkpoint_seconds) == (45.0, 90.0)
    problems: list[str] = []
    rg = running_gang_from_k8s("a/p", None, [pod({C.ANNOTATION_RESTART_OVERHEAD: "-3"})], ctx, placement,
                               hints=problems)
    assert rg.gang.restart_overhead == 300.0 and C.ANNOTATION_RESTART_OVERHEAD in problems[0]


def test_the_operator_sets_the_annotations_and_refuses_a_negative_value():
    from airflow_gpu import constants as C
    from airflow_gpu.kube.manifests import scheduling_annotations
    from airflow_gpu.kube.spec import WorkloadSpec, WorkloadSpecError

    spec = WorkloadSpec(team="nlp", namespace="team-nlp", tier=BE, image="python:3.11", name="g", gpus_per_worker=1,
                        restart_overhead_seconds=300, checkpoint_seconds=60)
    notes = scheduling_annotations(spec)
    assert notes[C.ANNOTATION_RESTART_OVERHEAD] == "300" and notes[C.ANNOTATION_CHECKPOINT_SECONDS] == "60"
    assert C.ANNOTATION_RESTART_OVERHEAD not in scheduling_annotations(WorkloadSpec(
        team="nlp", namespace="team-nlp", tier=BE, image="python:3.11", name="g", gpus_per_worker=1))
    with pytest.raises(WorkloadSpecError, match="restart_overhead_seconds"):
        WorkloadSpec(team="nlp", namespace="team-nlp", tier=BE, image="python:3.11", name="g", gpus_per_worker=1,
                     restart_overhead_seconds=-1)
