"""GangTrigger through a real preemption: the scheduler (seed quotas) preempts team nlp's best-effort
gang for its production gang; the trigger of the best-effort gang reports cause "preemption", although
the Eviction API has overwritten the pods' DisruptionTarget reason by the time they are gone."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from kubernetes import client

from airflow_gpu import constants as C
from airflow_gpu.devtools import gangs as G
from airflow_gpu.kube import TaskInstanceRef, WorkloadSpec, build
from airflow_gpu.kube import state as S
from airflow_gpu.kube.outcome import GangOutcome
from airflow_gpu.kube.preemptions import record_name
from airflow_gpu.triggers.gang import GangTrigger

REPO = Path(__file__).resolve().parents[1]
NS = "team-nlp"


@pytest.fixture(scope="module")
def kube_spec():
    return {"name": "trigger-preemption", "pools": [
        {"name": "gpu-od", "count": 2, "cpu": "32", "memory": "256Gi", "capacityType": "on-demand",
         "gpu": {"product": "NVIDIA-A100-SXM4-80GB", "count": 4, "memoryMiB": 81920}}]}


@pytest.fixture(scope="module")
def seed_scheduler(kube_cluster, tmp_path_factory):
    proc = G.scheduler_process(kube_cluster.kubeconfig, tmp_path_factory.mktemp("sched") / "scheduler.log",
                               config_path=REPO / "examples" / "seed-quotas.yaml", identity="preemption").start()
    yield proc
    proc.stop()


def gang(task: str, tier: str):
    ti = TaskInstanceRef("trigger_preemption", task, "manual__2026-12-03T09:00:00+00:00")
    return build(WorkloadSpec(team="nlp", namespace=NS, tier=tier, image="python:3.11", workers=2, gpus_per_worker=4,
                              task_instance=ti, attempt=1000, capacity_type=C.CAPACITY_ON_DEMAND,
                              checkpoint_uri="s3://checkpoints/nlp/" + task, termination_grace_period=2,
                              annotations={C.ANNOTATION_SIM_DURATION: "600"}))


def test_preempted_gang_is_reported_as_preemption(kube_api, seed_scheduler, kube_cluster):
    G.ensure_namespace(kube_api, NS)
    best_effort = gang("sweep", C.TIER_BEST_EFFORT_TRAINING)
    uids = G.submit_gang(kube_api, best_effort)
    core = client.CoreV1Api(kube_api)

    def all_running(m) -> bool:
        pods = core.list_namespaced_pod(NS, label_selector=f"{C.LABEL_GANG}={m.name}").items
        return len(pods) == 2 and all(p.status.phase == "Running" for p in pods)

    G.wait_until(lambda: all_running(best_effort), 60, what=lambda: f"best-effort gang running: {seed_scheduler.log_tail()}")
    res = best_effort.group_resource
    trigger = GangTrigger(NS, best_effort.name, list(uids), attempt=1000, pod_uids=uids,
                          group={"group": res.group, "version": res.version, "plural": res.plural},
                          config_file=str(kube_cluster.kubeconfig), poll_interval=1.0)
    production = gang("finetune", C.TIER_PRODUCTION_TRAINING)

    async def main():
        gen = trigger.run()
        first = asyncio.create_task(gen.__anext__())
        # the trigger has seen the gang running (so it watches) before the production gang arrives:
        # under load its first list can take seconds, and a preemption is over in about three
        await asyncio.wait_for(trigger._running.wait(), 60)
        await asyncio.to_thread(G.submit_gang, kube_api, production)
        try:
            return await asyncio.wait_for(first, 90)
        finally:
            await gen.aclose()

    out = GangOutcome.from_payload(asyncio.run(main()).payload)
    assert out.status == S.DISRUPTED and out.cause == S.CAUSE_PREEMPTION, out
    assert C.REASON_PREEMPTION_BY_SCHEDULER in out.disrupted_pods.values(), out
    G.wait_until(lambda: all_running(production), 60, what="production gang running on the freed GPUs")


def _clear(kube_api, core) -> None:
    core.delete_collection_namespaced_pod(NS, grace_period_seconds=0)
    G.wait_until(lambda: not core.list_namespaced_pod(NS).items, 60, what="team-nlp empty")


def _late_outcome(kube_api, kube_cluster, manifests, uids, record: bool = True) -> GangOutcome:
    """A trigger that starts after the gang's pods are gone (a triggerer that restarted late)."""
    res = manifests.group_resource
    trigger = GangTrigger(NS, manifests.name, list(uids), attempt=1000, pod_uids=uids,
                          group={"group": res.group, "version": res.version, "plural": res.plural},
                          config_file=str(kube_cluster.kubeconfig), poll_interval=1.0, settle_seconds=0,
                          preemption_record={"namespace": C.DEFAULT_SCHEDULER_NAMESPACE,
                                             "name": record_name()} if record else None)

    async def first():
        gen = trigger.run()
        try:
            return await asyncio.wait_for(gen.__anext__(), 60)
        finally:
            await gen.aclose()

    return GangOutcome.from_payload(asyncio.run(first()).payload)


def test_a_trigger_that_starts_late_counts_preemptions_and_interruptions_right(kube_api, seed_scheduler,
                                                                               kube_cluster):
    """Preempted and interrupted gangs both end with pods deleted through the Eviction API
    (EvictionByEvictionAPI): once the pods are gone, only the scheduler's record tells them apart."""
    G.ensure_namespace(kube_api, NS)
    core = client.CoreV1Api(kube_api)
    _clear(kube_api, core)
    gone = lambda m: not core.list_namespaced_pod(NS, label_selector=f"{C.LABEL_GANG}={m.name}").items  # noqa: E731

    victim = gang("late-sweep", C.TIER_BEST_EFFORT_TRAINING)
    uids = G.submit_gang(kube_api, victim)
    G.wait_until(lambda: len([p for p in core.list_namespaced_pod(NS).items if p.status.phase == "Running"]) == 2,
                 60, what=lambda: f"best-effort gang running: {seed_scheduler.log_tail()}")
    G.submit_gang(kube_api, gang("late-finetune", C.TIER_PRODUCTION_TRAINING))
    G.wait_until(lambda: gone(victim), 60, what="the preempted pods gone")
    preempted = _late_outcome(kube_api, kube_cluster, victim, uids)
    assert preempted.status == S.DISRUPTED and preempted.cause == S.CAUSE_PREEMPTION, preempted
    assert "late-finetune" in preempted.reason, preempted
    # without the record, the same late trigger could only call it an interruption
    blind = _late_outcome(kube_api, kube_cluster, victim, uids, record=False)
    assert blind.status == S.DISRUPTED and blind.cause == S.CAUSE_INTERRUPTION, blind

    _clear(kube_api, core)
    spot = gang("late-ablation", C.TIER_BEST_EFFORT_TRAINING)
    uids = G.submit_gang(kube_api, spot)
    G.wait_until(lambda: len([p for p in core.list_namespaced_pod(NS).items if p.status.phase == "Running"]) == 2,
                 60, what="gang running")
    for node in {p.spec.node_name for p in core.list_namespaced_pod(NS).items}:
        kube_cluster.interrupt(node, notice=0.5, replace_after=1.0)
    G.wait_until(lambda: gone(spot), 60, what="the interrupted pods gone")
    interrupted = _late_outcome(kube_api, kube_cluster, spot, uids)
    assert interrupted.status == S.DISRUPTED and interrupted.cause == S.CAUSE_INTERRUPTION, interrupted
