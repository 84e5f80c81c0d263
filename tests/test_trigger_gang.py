"""GangTrigger against the local cluster (audit log on) and the real scheduler: its async run()
driven directly through every outcome; the checkpoint status channel mirrored onto the pods; the
Kubernetes API requests of a task that waits for a minute counted from the audit log."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import pytest
from kubernetes import client

from airflow_gpu import constants as C
from airflow_gpu.devtools import gangs as G
from airflow_gpu.kube import TaskInstanceRef, WorkloadSpec, build
from airflow_gpu.kube import state as S
from airflow_gpu.kube.outcome import GangOutcome, outcome_of
from airflow_gpu.operators.gpu_training import deferral_settle_setting
from airflow_gpu.provider import get_provider_info
from airflow_gpu.triggers.gang import CLASSPATH, USER_AGENT, GangTrigger, checkpoint_hint

NS = "team-trig"
WAIT_SECONDS = 75


@pytest.fixture(scope="module")
def kube_audit() -> bool:
    return True


@pytest.fixture(scope="module")
def api(kube_api):
    for ns in (NS, "team-trig-wait"):
        G.ensure_namespace(kube_api, ns)
    return kube_api


def submit(api, task: str, namespace: str = NS, workers: int = 2, gpus: int = 4, **kw):
    """Build and create a gang as the operator will; returns (manifests, pod name -> UID)."""
    ti = TaskInstanceRef("trigger_tests", task, "manual__2026-12-03T08:00:00+00:00")
    m = build(WorkloadSpec(team="trig", namespace=namespace, tier=C.TIER_PRODUCTION_TRAINING, image="python:3.11",
                           workers=workers, gpus_per_worker=gpus, task_instance=ti, attempt=1000,
                           capacity_type=C.CAPACITY_ON_DEMAND, termination_grace_period=1, **kw))
    return m, G.submit_gang(api, m)


def trigger_for(m, uids, kubeconfig, **kw) -> GangTrigger:
    res = m.group_resource
    kwargs = dict(namespace=m.pods[0]["metadata"]["namespace"], gang_name=m.name,
                  pod_names=[p["metadata"]["name"] for p in m.pods], attempt=1000, pod_uids=uids,
                  group={"group": res.group, "version": res.version, "plural": res.plural},
                  config_file=str(kubeconfig), poll_interval=1.0, settle_seconds=0)  # no Airflow scheduler here
    kwargs.update(kw)
    trigger = GangTrigger(**kwargs)
    classpath, data = trigger.serialize()  # what the triggerer stores is what runs
    assert classpath == CLASSPATH
    return GangTrigger(**json.loads(json.dumps(data)))


def first_event(trigger: GangTrigger, timeout: float, during=None) -> GangOutcome:
    """Run the trigger's async run() until its event; `during(seconds)` runs in a thread meanwhile."""
    async def main():
        gen = trigger.run()
        side = asyncio.create_task(asyncio.to_thread(during)) if during else None
        try:
            event = await asyncio.wait_for(gen.__anext__(), timeout)
        finally:
            await gen.aclose()
        if side:
            await side
        return event

    return GangOutcome.from_payload(asyncio.run(main()).payload)


def cleanup(api, m, namespace: str = NS) -> None:
    core = client.CoreV1Api(api)
    selector = f"{C.LABEL_GANG}={m.name}"
    core.delete_collection_namespaced_pod(namespace, label_selector=selector, grace_period_seconds=0)
    G.wait_until(lambda: not core.list_namespaced_pod(namespace, label_selector=selector).items, 30, what="pods gone")


def running(api, m, namespace: str = NS) -> bool:
    pods = client.CoreV1Api(api).list_namespaced_pod(namespace, label_selector=f"{C.LABEL_GANG}={m.name}").items
    return len(pods) == len(m.pods) and all(p.status.phase == "Running" for p in pods)


# --- no cluster ----------------------------------------------------------------------------------


def test_registered_and_serialisable():
    info = get_provider_info()
    assert {"integration-name": "airflow-gpu", "python-modules": ["airflow_gpu.triggers.gang"]} in info["triggers"]
    t = GangTrigger("ns", "g", ["g-0", "g-1"], config_file="/k/config", pod_uids={"g-0": "u"})
    classpath, data = t.serialize()
    assert GangTrigger(**json.loads(json.dumps(data))).serialize() == (classpath, data)
    assert "kube_config" not in json.dumps(data)  # a path, never the credentials it holds


def test_settle_seconds_is_bounded(monkeypatch):
    for bad in (-1, 301, float("nan"), "10", True):
        with pytest.raises(ValueError, match="settle_seconds: must be"):
            GangTrigger("ns", "g", ["g-0"], settle_seconds=bad)
    assert GangTrigger("ns", "g", ["g-0"]).settle_seconds == 15.0  # Airflow's min_heartbeat_interval 5 s + 10
    option = "AIRFLOW__AIRFLOW_GPU__DEFERRAL_SETTLE_SECONDS"
    monkeypatch.setenv(option, "2.5")
    assert deferral_settle_setting() == 2.5
    for bad in ("-1", "ten", "inf"):
        monkeypatch.setenv(option, bad)
        with pytest.raises(ValueError, match=rf"\[airflow_gpu\] deferral_settle_seconds \(env {option}\): must be"):
            deferral_settle_setting()


def test_checkpoint_hint_is_bounded():
    now = 1_800_000_000.0
    assert checkpoint_hint({"step": 1200, "time": now - 5}, now) == (1200, now - 5)
    for bad in ({"step": -1, "time": now}, {"step": True, "time": now}, {"step": "12", "time": now},
                {"step": 10**16, "time": now}, {"step": 1, "time": now + 3600}, {"step": 1, "time": float("nan")},
                {"step": 1}, None, ["x"]):
        assert checkpoint_hint(bad, now) is None, bad


def test_preemption_counts_from_the_first_reason_seen():
    """The Eviction API overwrites the scheduler's PreemptionByScheduler reason; the watcher keeps the first."""
    pod = {"metadata": {"name": "g-0"}, "spec": {"nodeName": "n"},
           "status": {"phase": "Failed", "conditions": [{"type": C.CONDITION_DISRUPTION_TARGET, "status": "True",
                                                         "reason": C.REASON_EVICTION_BY_EVICTION_API}]}}
    state = S.gang_state([pod], expected=1)
    assert outcome_of(state, "ns", "g", 1, 0.0).cause == S.CAUSE_INTERRUPTION
    preempted = outcome_of(state, "ns", "g", 1, 0.0, first_disruption={"g-0": C.REASON_PREEMPTION_BY_SCHEDULER})
    assert preempted.cause == S.CAUSE_PREEMPTION and preempted.disrupted_pods == {"g-0": C.REASON_PREEMPTION_BY_SCHEDULER}


# --- outcomes through the cluster ---------------------------------------------------------------


def test_success_through_a_kubernetes_connection(api, gpu_scheduler, kube_cluster, monkeypatch):
    monkeypatch.setenv("AIRFLOW_CONN_KUBE_LOCAL", json.dumps(
        {"conn_type": "kubernetes", "extra": {"kube_config_path": str(kube_cluster.kubeconfig)}}))
    m, uids = submit(api, "ok", annotations={C.ANNOTATION_SIM_DURATION: "2"})
    out = first_event(trigger_for(m, uids, None, config_file=None, kubernetes_conn_id="kube_local"), 90)
    assert out.status == S.SUCCEEDED, out
    assert out.exit_codes == {n: 0 for n in uids} and out.started_at and out.running_seconds >= 1.5
    cleanup(api, m)


def test_an_early_event_waits_for_the_deferral_to_settle(api, gpu_scheduler, kube_cluster):
    """A gang that ends right after the deferral: its event is held until settle_seconds after the
    trigger started (Airflow 3.3's executor-event race, triggers/gang.py), and is unchanged."""
    m, uids = submit(api, "settle", annotations={C.ANNOTATION_SIM_DURATION: "0"})
    G.wait_until(lambda: len(client.CoreV1Api(api).list_namespaced_pod(
        NS, label_selector=f"{C.LABEL_GANG}={m.name}", field_selector="status.phase=Succeeded").items) == len(m.pods),
        60, what="gang done before its trigger starts")
    t0 = time.monotonic()
    out = first_event(trigger_for(m, uids, kube_cluster.kubeconfig, settle_seconds=4), 90)
    held = time.monotonic() - t0
    assert out.status == S.SUCCEEDED and held >= 4, (out, held)
    cleanup(api, m)


def test_on_kill_deletes_every_object_of_the_task_instance(api, gpu_scheduler, kube_cluster):
    """A user marks the deferred task failed: Airflow calls the trigger's on_kill(), which deletes the
    pods, the Service and the PodGroup by the task instance's selector (every attempt)."""
    m, uids = submit(api, "killed", annotations={C.ANNOTATION_SIM_DURATION: "600"})
    ti = TaskInstanceRef("trigger_tests", "killed", "manual__2026-12-03T08:00:00+00:00")
    G.wait_until(lambda: running(api, m), 60, what="gang running")
    trigger = trigger_for(m, uids, kube_cluster.kubeconfig, cleanup_selector=ti.selector())
    asyncio.run(trigger.on_kill())
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)

    def left():
        names = [p.metadata.name for p in core.list_namespaced_pod(NS, label_selector=ti.selector()).items]
        names += [s.metadata.name for s in core.list_namespaced_service(NS, label_selector=ti.selector()).items]
        names += [g["metadata"]["name"] for g in custom.list_namespaced_custom_object(
            C.PODGROUP_GROUP, C.PODGROUP_VERSION, NS, C.PODGROUP_PLURAL, label_selector=ti.selector())["items"]]
        return names
    G.wait_until(lambda: not left(), 30, what="every object of the task instance deleted")
    asyncio.run(trigger.on_kill())  # again: nothing left is not an error


def test_an_api_server_restart_is_waited_out(api, gpu_scheduler, kube_cluster):
    m, uids = submit(api, "restart", annotations={C.ANNOTATION_SIM_DURATION: "8"})

    def restart_while_running():
        G.wait_until(lambda: running(api, m), 60, what="gang running")
        kube_cluster.restart_apiserver(down_seconds=1.5)

    out = first_event(trigger_for(m, uids, kube_cluster.kubeconfig), 90, during=restart_while_running)
    assert out.status == S.SUCCEEDED, out
    cleanup(api, m)


def test_application_failure_reports_exit_codes(api, gpu_scheduler, kube_cluster):
    m, uids = submit(api, "exit3", annotations={C.ANNOTATION_SIM_DURATION: "1", C.ANNOTATION_SIM_EXIT_CODE: "3"})
    out = first_event(trigger_for(m, uids, kube_cluster.kubeconfig), 90)
    assert out.status == S.FAILED and set(out.exit_codes.values()) == {3} and out.cause is None, out
    assert out.failed_pods and not out.disrupted_pods
    cleanup(api, m)


def test_interruption_and_checkpoint_mirror(api, gpu_scheduler, kube_cluster, tmp_path):
    store = tmp_path / "ckpt"
    store.mkdir()
    m, uids = submit(api, "spot", annotations={C.ANNOTATION_SIM_DURATION: "300"})
    core = client.CoreV1Api(api)
    names = list(uids)
    step_time = time.time() - 1

    def interrupt_after_mirror():
        G.wait_until(lambda: running(api, m), 60, what="gang running")
        (store / "status.json").write_text(json.dumps({"attempt": 1000, "step": 1200, "time": step_time}))
        mirrored = lambda: all((core.read_namespaced_pod(n, NS).metadata.annotations or {})  # noqa: E731
                               .get(C.ANNOTATION_LAST_CHECKPOINT_STEP) == "1200" for n in names)
        G.wait_until(mirrored, 30, what="last-checkpoint annotations on every pod")
        # a record the training code got wrong is not mirrored
        (store / "status.json").write_text(json.dumps({"attempt": 1000, "step": 1300, "time": time.time() + 86400}))
        time.sleep(2.0)
        assert all((core.read_namespaced_pod(n, NS).metadata.annotations or {})
                   [C.ANNOTATION_LAST_CHECKPOINT_STEP] == "1200" for n in names)
        node = core.read_namespaced_pod(names[0], NS).spec.node_name
        kube_cluster.interrupt(node, notice=1.0, replace_after=1.0)
        return node

    trigger = trigger_for(m, uids, kube_cluster.kubeconfig, checkpoint_status_uri=store.as_uri(),
                          checkpoint_mirror_interval=0.5)
    out = first_event(trigger, 120, during=interrupt_after_mirror)
    assert out.status == S.DISRUPTED and out.cause == S.CAUSE_INTERRUPTION, out
    assert set(out.disrupted_pods.values()) == {C.REASON_EVICTION_BY_EVICTION_API}
    assert (out.last_checkpoint_step, round(out.last_checkpoint_time, 3)) == (1200, round(step_time, 3))
    times = {core.read_namespaced_pod(n, NS).metadata.annotations[C.ANNOTATION_LAST_CHECKPOINT_TIME]
             for n in names if n in {p.metadata.name for p in core.list_namespaced_pod(NS).items}}
    assert times <= {f"{step_time:.3f}"}
    cleanup(api, m)


def test_partial_loss_and_a_foreign_pod(api, gpu_scheduler, kube_cluster):
    m, uids = submit(api, "partial", annotations={C.ANNOTATION_SIM_DURATION: "300"})
    victim = list(uids)[1]

    def delete_one_member():
        G.wait_until(lambda: running(api, m), 60, what="gang running")
        client.CoreV1Api(api).delete_namespaced_pod(victim, NS, grace_period_seconds=0)

    out = first_event(trigger_for(m, uids, kube_cluster.kubeconfig), 90, during=delete_one_member)
    assert out.status == S.DISRUPTED and out.cause == S.CAUSE_INTERRUPTION, out
    assert S.REASON_PARTIAL_LOSS in out.reason and victim in out.reason, out
    cleanup(api, m)

    # a pod under a member's name but with another UID (a leftover, a user's) is not the one we created
    m, uids = submit(api, "foreign", annotations={C.ANNOTATION_SIM_DURATION: "300"})
    G.wait_until(lambda: running(api, m), 60, what="gang running")
    foreign = list(uids)[1]
    uids[foreign] = "not-the-uid-of-that-pod"
    out = first_event(trigger_for(m, uids, kube_cluster.kubeconfig), 30)
    assert out.status == S.DISRUPTED and out.missing_pods == [foreign], out
    cleanup(api, m)


def test_a_waiting_task_costs_at_most_two_requests_a_minute(api, gpu_scheduler, kube_cluster, capfd):
    """A gang that cannot fit (2 x 8 GPUs on 4-GPU nodes) waits 75 s, past the provider client's
    60 s default request timeout: the scheduler writes its wait reason, the trigger logs it and
    otherwise only holds its two watches (no relist when a minute has passed)."""
    ns = "team-trig-wait"
    m, uids = submit(api, "wait", namespace=ns, gpus=8)
    G.wait_until(lambda: (G.get_podgroup(api, ns, m.name)["metadata"].get("annotations") or {})
                 .get(C.ANNOTATION_WAIT_REASON), 30, what="the scheduler's wait reason")
    trigger = trigger_for(m, uids, kube_cluster.kubeconfig)
    started = time.time()

    async def wait_a_minute():
        gen = trigger.run()
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(gen.__anext__(), WAIT_SECONDS)
        await gen.aclose()

    asyncio.run(wait_a_minute())
    ended = time.time()
    everyone = [e for e in kube_cluster.audit_events() if started <= _epoch(e["requestReceivedTimestamp"]) <= ended]
    events = [e for e in everyone if e.get("userAgent") == USER_AGENT]
    assert all((e.get("objectRef") or {}).get("namespace") == ns for e in events), events
    watches = [e for e in events if e["verb"] == "watch"]
    others = [e for e in events if e["verb"] != "watch"]
    logged = capfd.readouterr().out  # Airflow's structlog loggers print to stdout
    with capfd.disabled():
        print(f"\nrequests during a {WAIT_SECONDS} s wait: {len(others)} beyond {len(watches)} watches: "
              f"{[(e['verb'], e['objectRef'].get('resource')) for e in events]}")
    assert len(others) <= 2, others
    assert 1 <= len(watches) <= 2, watches  # the trigger is seen at all: its watches are counted
    assert f"Gang {m.name} waits: " in logged, logged[-2000:]
    client.CoreV1Api(api).delete_collection_namespaced_pod(ns, grace_period_seconds=0)


def _epoch(stamp: str) -> float:
    from airflow_gpu.kube.wire import api_time

    return api_time(stamp)
