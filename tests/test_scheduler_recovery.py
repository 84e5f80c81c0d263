"""Crash safety and leader election against the local cluster, with the scheduler as a real process:
kill -9 at random moments during 50 gang admissions leaves no partial gang and no double binding;
of two replicas only the Lease holder binds, and the standby takes over when the leader dies."""

from __future__ import annotations

import json
import random
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import replace

import pytest
from kubernetes import client

from airflow_gpu import constants as C
from airflow_gpu.core.model import Placement
from airflow_gpu.devtools import gangs as G
from airflow_gpu.devtools.processes import free_port
from airflow_gpu.cli.scheduler import USER_AGENT
from airflow_gpu.scheduler.access import REQUIRED
from airflow_gpu.scheduler.actions import Api
from airflow_gpu.scheduler.loop import Scheduler, Settings
from airflow_gpu.scheduler.state import PLAN_BINDING, Plan, plan_store_name

PRODUCT = "NVIDIA-H100-80GB-HBM3"
GANGS, MEMBERS = 50, 8


@pytest.fixture(scope="module")
def kube_audit():
    return True  # the API server logs every request: the last test checks the scheduler's against RBAC


@pytest.fixture(scope="module")
def kube_spec():
    # 50 nodes x 8 GPUs: room for all 50 gangs of 8 x 1 GPU at once, so every admission is a bind
    return {"name": "sched-recovery", "pools": [{"name": "h100", "count": 50, "cliques": ["c1", "c2", "c3", "c4", "c5"],
                                                 "gpu": {"product": PRODUCT, "count": 8}}]}


def _running_lines(proc) -> int:
    try:
        return proc.log_path.read_text(errors="replace").count(") running")
    except OSError:
        return 0


def test_kill_9_at_random_moments_during_50_gang_admissions(kube_cluster, tmp_path):
    api = G.api_client(kube_cluster.kubeconfig)
    ns = "crash"
    G.ensure_namespace(api, ns)
    rng = random.Random(6)
    log = tmp_path / "scheduler.log"
    # the same identity after a restart, as a pod restarted in place: it renews its own Lease at once.
    # Bindings one at a time (--bind-workers 1): a gang's binding then spans tens of milliseconds, so
    # more kills land in the middle of one
    def start():
        return G.scheduler_process(kube_cluster.kubeconfig, log, identity="replica-0",
                                   extra=["--bind-workers", "1"]).start()

    proc = start()
    overcommits, partial_seen, kills = [], Counter(), []
    stop_watch = threading.Event()

    def watch_invariants():
        while not stop_watch.is_set():
            bad = G.overcommitted_nodes(api)
            if bad:
                overcommits.append(bad)
            for gang, (bound, total) in G.gang_binding_state(G.list_pods(api, ns)).items():
                if 0 < bound < total:
                    partial_seen[gang] += 1
            stop_watch.wait(0.2)

    def create_gangs():
        # bursts of 1-4 gangs, so a cycle often binds several gangs at once when the kill comes
        i = 0
        while i < GANGS:
            for _ in range(min(rng.randint(1, 4), GANGS - i)):
                G.create_gang(api, ns, f"g{i:02d}", MEMBERS, 1)
                i += 1
            time.sleep(rng.uniform(0.2, 0.9))

    watcher = threading.Thread(target=watch_invariants, daemon=True)
    creator = threading.Thread(target=create_gangs, daemon=True)
    watcher.start()
    creator.start()
    try:
        started = 1
        while creator.is_alive() or len(kills) < 5:
            G.wait_until(lambda: _running_lines(proc) >= started, 60, interval=0.02, what="scheduler running")
            time.sleep(rng.uniform(0.0, 0.4))  # the backlog gathered during the restart is being bound
            proc.kill9()
            pods = G.list_pods(api, ns)
            state = G.gang_binding_state(pods)
            kills.append({"bound_pods": sum(b for b, _ in state.values()),
                          "partial_gangs_at_kill": sorted(g for g, (b, t) in state.items() if 0 < b < t)})
            proc = start()
            started += 1
            if len(kills) >= 15:
                break
        creator.join()

        def all_bound():
            state = G.gang_binding_state(G.list_pods(api, ns))
            return len(state) == GANGS and all(b == t == MEMBERS for b, t in state.values())

        G.wait_until(all_bound, 90, interval=0.2, what=f"all {GANGS} gangs bound after the last restart")
        events = G.events_for(api, ns)
        final = G.gang_binding_state(G.list_pods(api, ns))
    finally:
        stop_watch.set()
        watcher.join()
        proc.stop()
        client.CoreV1Api(api).delete_collection_namespaced_pod(ns, grace_period_seconds=0)  # the GPUs, for the next test
    scheduled = Counter(e["involvedObject"]["name"] for e in events if e["reason"] == "Scheduled")
    completed = sorted(e["involvedObject"]["name"] for e in events
                       if e["reason"] == "Scheduled" and e["message"].startswith("completed binding"))
    rolled_back = [e for e in events if e["reason"] == "RolledBack"]
    hit = [k for k in kills if k["partial_gangs_at_kill"]]
    # a gang seen partial right after the kill but not "completed" by the restart had Bindings in
    # flight that the API server finished after the client died; the restart then only drops the plan
    print(f"\nkill -9 runs: {len(kills)} kills; {len(hit)} left a gang partially bound "
          f"({sum(len(k['partial_gangs_at_kill']) for k in hit)} gangs), completed by the restarted scheduler: "
          f"{completed}; rolled back: {len(rolled_back)}; bound pods at each kill: {[k['bound_pods'] for k in kills]}")
    assert not overcommits, f"a node was over-committed (double binding): {overcommits[:3]}"
    assert all(n <= 1 for n in scheduled.values()), f"a gang was admitted twice: {scheduled.most_common(3)}"
    assert all(b == t == MEMBERS for b, t in final.values()) and len(final) == GANGS
    # every gang seen partial at a kill was completed by the restarted scheduler, not left behind
    for k in hit:
        for gang in k["partial_gangs_at_kill"]:
            assert final[gang] == (MEMBERS, MEMBERS)
    assert not rolled_back  # nothing here makes completion impossible: roll-forward every time
    assert len(kills) >= 5


_metric = G.scheduler_metric


def _lease_holder(api) -> str:
    lease = client.CoordinationV1Api(api).read_namespaced_lease("airflow-gpu-scheduler", C.DEFAULT_SCHEDULER_NAMESPACE,
                                                                _preload_content=False)
    return json.loads(lease.data)["spec"].get("holderIdentity") or ""


def test_two_replicas_only_the_leader_binds(kube_cluster, tmp_path):
    api = G.api_client(kube_cluster.kubeconfig)
    ns = "replicas"
    G.ensure_namespace(api, ns)
    ports = {"rep-a": free_port(), "rep-b": free_port()}
    procs = {name: G.scheduler_process(kube_cluster.kubeconfig, tmp_path / f"{name}.log", identity=name,
                                       metrics_port=port, lease=(4.0, 3.0, 0.5)).start()
             for name, port in ports.items()}
    try:
        G.wait_until(lambda: all(_running_lines(p) for p in procs.values()), 60, what="both replicas running")
        leader = G.wait_until(lambda: _lease_holder(api) in ports and _lease_holder(api), 20, what="a leader")
        standby = next(n for n in ports if n != leader)
        for i in range(6):
            G.create_gang(api, ns, f"r{i}", 2, 1)
        G.wait_until(lambda: sum(b for b, _ in G.gang_binding_state(G.list_pods(api, ns)).values()) == 12, 30,
                     what="first 6 gangs bound")
        G.wait_until(lambda: len({e["involvedObject"]["name"] for e in G.events_for(api, ns)
                                  if e["reason"] == "Scheduled"}) == 6, 15, what="the leader's Scheduled Events")
        binders = {e.get("reportingInstance") for e in G.events_for(api, ns) if e["reason"] == "Scheduled"}
        assert binders == {leader}, binders
        assert _metric(ports[leader], "airflow_gpu_bindings_total") == 12
        assert _metric(ports[standby], "airflow_gpu_bindings_total") == 0
        assert _metric(ports[leader], "airflow_gpu_scheduler_is_leader") == 1
        assert _metric(ports[standby], "airflow_gpu_scheduler_is_leader") == 0
        # 12 of the cluster's 400 GPUs are allocated (the gauges are refreshed every cycle)
        G.wait_until(lambda: abs(_metric(ports[leader], "airflow_gpu_allocation_ratio") - 12 / 400) < 1e-9, 10,
                     what="allocation ratio 12/400")
        text = urllib.request.urlopen(f"http://127.0.0.1:{ports[leader]}/metrics", timeout=5).read().decode()
        assert f'airflow_gpu_queue_wait_seconds_count{{gpu_product="{PRODUCT}",team="{ns}",tier="default"}} 6.0' in text

        procs[leader].kill9()  # the standby takes over once the Lease expires
        for i in range(6, 10):
            G.create_gang(api, ns, f"r{i}", 2, 1)
        G.wait_until(lambda: sum(b for b, _ in G.gang_binding_state(G.list_pods(api, ns)).values()) == 20, 30,
                     what="gangs bound by the standby")
        assert _lease_holder(api) == standby

        def scheduled_by() -> dict:  # the Scheduled Events are written after the Bindings: wait for them
            return {e["involvedObject"]["name"]: e.get("reportingInstance") for e in G.events_for(api, ns)
                    if e["reason"] == "Scheduled"}
        late = G.wait_until(lambda: all(f"r{i}" in scheduled_by() for i in range(6, 10)) and scheduled_by(), 15,
                            what="the standby's Scheduled Events")
        assert {late[f"r{i}"] for i in range(6, 10)} == {standby}
        assert not G.overcommitted_nodes(api)
        # SIGTERM: the new leader finishes its cycle, gives the Lease up at once and exits 0
        assert procs[standby].stop(timeout=15) == 0, procs[standby].log_tail()
        assert _lease_holder(api) == ""
    finally:
        for p in procs.values():
            p.stop()
        client.CoreV1Api(api).delete_collection_namespaced_pod(ns, grace_period_seconds=0)


def _store_plan(api, sched_api: Api, ns: str, group: str, plan: Plan) -> None:
    """Write a plan record as a scheduler that died right after writing it would have left it."""
    uid = G.get_podgroup(api, ns, group)["metadata"]["uid"]
    pods = {f"{ns}/{p['metadata']['name']}": p["metadata"]["uid"] for p in G.list_pods(api, ns)}
    plan = replace(plan, owner_key=f"{ns}/{group}", owner_uid=uid, pod_uids={k: pods[k] for k in plan.placements})
    sched_api.write_plan("default", plan_store_name(uid), C.DEFAULT_SCHEDULER_NAME, plan.to_json())


def _plan_records(api) -> list[dict]:
    resp = client.CoreV1Api(api).list_namespaced_config_map(
        "default", label_selector=f"{C.LABEL_PLAN_OF}={C.DEFAULT_SCHEDULER_NAME}", _preload_content=False)
    return json.loads(resp.data)["items"]


def test_partial_gang_is_completed_per_plan_or_rolled_back(kube_cluster, tmp_path):
    """What a scheduler dying between Bindings leaves behind, made on purpose: a plan on the PodGroup
    and some members bound. The next scheduler completes it; if the plan names a node that is gone,
    it rolls the gang back (evicts the bound members)."""
    api = G.api_client(kube_cluster.kubeconfig)
    core = client.CoreV1Api(api)
    ns = "partial"
    G.ensure_namespace(api, ns)
    ok = G.create_gang(api, ns, "ok", 4, 2)
    # members 0-2 on h100-40 (GPUs 0-1, 2-3, 4-5), member 3 on h100-41; 0 and 1 got bound, and a
    # lone pod on h100-40 as well, so the next scheduler's own choice of GPU indices for what runs
    # there collides with the plan's (which must not matter: the device plugin picks GPUs)
    where = ["h100-40", "h100-40", "h100-40", "h100-41"]
    plan = Plan(PLAN_BINDING, {f"{ns}/{p}": Placement(f"{ns}/{p}", where[i], ((2 * i % 8, 1000), (2 * i % 8 + 1, 1000)))
                               for i, p in enumerate(ok)}, time.time())
    sched_api = Api(api, "test", "dead-scheduler")
    _store_plan(api, sched_api, ns, "ok", plan)
    core.create_namespaced_pod(ns, G.pod_manifest("lone", ns, 1), _preload_content=False)
    for name, node in ((ok[0], "h100-40"), (ok[1], "h100-40"), ("lone", "h100-40")):
        sched_api.bind(f"{ns}/{name}", node)
    doomed = G.create_gang(api, ns, "doomed", 2, 8)
    plan2 = Plan(PLAN_BINDING, {f"{ns}/{doomed[0]}": Placement(f"{ns}/{doomed[0]}", "h100-45", ()),
                                f"{ns}/{doomed[1]}": Placement(f"{ns}/{doomed[1]}", "h100-vanished", ())}, time.time())
    _store_plan(api, sched_api, ns, "doomed", plan2)
    sched_api.bind(f"{ns}/{doomed[0]}", "h100-45")

    scheduler = Scheduler(G.api_client(kube_cluster.kubeconfig), None, Settings(), identity="next")
    runner = threading.Thread(target=scheduler.run, daemon=True)
    runner.start()
    try:
        G.wait_until(lambda: G.gang_binding_state(G.list_pods(api, ns)).get(f"{ns}/ok") == (4, 4), 20,
                     what="partial gang completed")
        pods = {p["metadata"]["name"]: p for p in G.list_pods(api, ns)}
        assert [pods[p]["spec"]["nodeName"] for p in ok] == where  # where the plan said, not a fresh choice
        G.wait_until(lambda: doomed[0] not in {p["metadata"]["name"] for p in G.list_pods(api, ns)}, 20,
                     what="bound member of the impossible plan evicted")
        G.wait_until(lambda: not _plan_records(api), 10, what="both plan records deleted")
        reasons = {(e["involvedObject"]["name"], e["reason"]) for e in G.events_for(api, ns)}
        assert ("ok", "Scheduled") in reasons and ("doomed", "RolledBack") in reasons
        get = scheduler.metrics.registry.get_sample_value
        assert get("airflow_gpu_partial_gang_recoveries_total", {"action": "completed"}) == 1
        assert get("airflow_gpu_partial_gang_recoveries_total", {"action": "rolled_back"}) == 1
        # the rolled-back gang waits whole again, with a reason (its evicted member is for its owner to recreate)
        G.wait_until(lambda: "1 of 2 pods" in ((G.get_podgroup(api, ns, "doomed")["metadata"].get("annotations") or {})
                                                .get(C.ANNOTATION_WAIT_REASON, "")), 10, what="doomed waits")
    finally:
        scheduler.stop()
        runner.join(10)
        core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)


def test_scheduler_processes_used_only_what_rbac_grants(kube_cluster):
    """Every request the scheduler processes of this module made (kill -9 restarts, two replicas),
    from the API server's audit log, is in deploy/rbac.yaml's grant (access.REQUIRED)."""
    used = set()
    for event in kube_cluster.audit_events():
        ref = event.get("objectRef")
        if not event.get("userAgent", "").startswith(USER_AGENT) or ref is None:
            continue  # our test client, or /version and discovery
        resource = ref["resource"] + (f"/{ref['subresource']}" if ref.get("subresource") else "")
        used.add((ref.get("apiGroup", ""), resource, event["verb"]))
    assert used <= REQUIRED, f"not granted by deploy/rbac.yaml: {sorted(used - REQUIRED)}"
    for needed in [("", "pods/binding", "create"), ("scheduling.x-k8s.io", "podgroups", "patch"),
                   ("coordination.k8s.io", "leases", "update"), ("", "pods", "watch")]:
        assert needed in used, f"{needed} never seen: is the audit log complete? {sorted(used)}"
