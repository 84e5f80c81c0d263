"""Kubernetes objects -> core model, and the cycle's World built from a cache view (no cluster needed)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from kubernetes import client

from airflow_gpu import constants as C
from airflow_gpu.config import load_config
from airflow_gpu.core.model import Placement, TopologyLevel
from airflow_gpu.kube.convert import (
    ConversionContext,
    ConversionError,
    gang_from_k8s,
    node_from_k8s,
    pod_request_from_k8s,
    schedule_timeout,
)
from airflow_gpu.scheduler.cache import View
from airflow_gpu.scheduler.state import PLAN_NOMINATED, Plan, build_world, plan_store_name


def node(name, gpus=8, labels=None, taints=None, mig=None, unschedulable=False):
    alloc = {"cpu": "64", "memory": "512Gi", C.RESOURCE_GPU: str(gpus)}
    alloc.update({f"{C.RESOURCE_MIG_PREFIX}{p}": str(n) for p, n in (mig or {}).items()})
    return {
        "metadata": {"name": name, "labels": {C.NODE_GPU_PRODUCT: "NVIDIA-A100-SXM4-80GB", **(labels or {})}},
        "spec": {"taints": taints or [], "unschedulable": unschedulable},
        "status": {"allocatable": alloc, "conditions": [{"type": "Ready", "status": "True"}]},
    }


def pod(name, gpus=1, ns="team-nlp", group=None, node_name=None, phase="Pending", **extra):
    labels = {C.LABEL_COSCHEDULING_POD_GROUP: group} if group else {}
    return {
        "metadata": {"name": name, "namespace": ns, "labels": labels, "annotations": extra.get("annotations", {}),
                     "creationTimestamp": "2026-12-01T10:00:00Z", "uid": f"uid-{ns}-{name}"},
        "spec": {"schedulerName": "airflow-gpu", "priority": extra.get("priority", 0),
                 "priorityClassName": extra.get("pc"), **({"nodeName": node_name} if node_name else {}),
                 "containers": [{"name": "c", "resources": {"limits": {C.RESOURCE_GPU: str(gpus)},
                                                            "requests": {"cpu": "500m", "memory": "1Gi"}}}]},
        "status": {"phase": phase},
    }


def podgroup(name, min_member, ns="team-nlp", annotations=None):
    return {"apiVersion": "scheduling.x-k8s.io/v1alpha1", "kind": "PodGroup",
            "metadata": {"name": name, "namespace": ns, "annotations": annotations or {},
                         "creationTimestamp": "2026-12-01T09:00:00Z", "uid": f"uid-pg-{ns}-{name}"},
            "spec": {"minMember": min_member}}


def test_node_capacity_labels_mig_spot_and_cordon():
    n = node_from_k8s(node("a", gpus=4, mig={"1g.10gb": 14}, unschedulable=True, labels={
        C.NODE_CAPACITY_TYPE_KARPENTER: "spot", C.NODE_GPU_CLIQUE: "c1", C.NODE_ZONE: "z1", C.NODE_GPU_MEMORY: "81920"},
        taints=[{"key": C.TAINT_SPOT, "value": "true", "effect": "NoSchedule"}]))
    assert (n.gpu_count, n.cpu_milli, n.memory_mib, n.gpu_memory_mib) == (4, 64000, 512 * 1024, 81920)
    assert n.mig_slices == (("1g.10gb", 14),)
    assert (n.capacity_type, n.clique, n.zone) == ("spot", "c1", "z1")
    assert {t.key for t in n.taints} == {C.TAINT_SPOT, "node.kubernetes.io/unschedulable"}


def test_client_model_objects_convert_like_dicts():
    v1 = client.V1Node(metadata=client.V1ObjectMeta(name="m", labels={C.NODE_GPU_PRODUCT: "H100"}),
                       status=client.V1NodeStatus(allocatable={"cpu": "8", "memory": "64Gi", C.RESOURCE_GPU: "8"}))
    n = node_from_k8s(v1)
    assert (n.name, n.gpu_count, n.gpu_product) == ("m", 8, "H100")


def test_pod_requests_take_init_container_max_and_limits_default():
    p = pod("p", gpus=2)
    p["spec"]["initContainers"] = [{"name": "i", "resources": {"requests": {"cpu": "4"}}}]
    req = pod_request_from_k8s(p)
    assert (req.name, req.gpus, req.cpu_milli, req.memory_mib) == ("team-nlp/p", 2, 4000, 1024)


def test_mig_request_and_bad_quantities_name_the_field():
    p = pod("m", gpus=0)
    p["spec"]["containers"][0]["resources"] = {"limits": {f"{C.RESOURCE_MIG_PREFIX}1g.10gb": "1"}}
    assert pod_request_from_k8s(p).mig_profile == "1g.10gb"
    bad = pod("b")
    bad["spec"]["containers"][0]["resources"]["limits"][C.RESOURCE_GPU] = "1.5"
    with pytest.raises(ConversionError, match="nvidia.com/gpu=1.5 must be a whole number"):
        pod_request_from_k8s(bad)
    bad["spec"]["containers"][0]["resources"]["limits"][C.RESOURCE_GPU] = "lots"
    with pytest.raises(ConversionError, match=r"containers\[0\].resources\[nvidia.com/gpu\]"):
        pod_request_from_k8s(bad)


def test_gang_team_tier_priority_and_products_from_config(repo_root):
    ctx = ConversionContext.from_config(load_config(repo_root / "examples" / "seed-quotas.yaml"))
    pg = podgroup("train", 2, annotations={C.ANNOTATION_CHECKPOINTABLE: "true", C.ANNOTATION_TOPOLOGY: "rack:hard"})
    pods = [pod(f"w{i}", gpus=8, group="train", priority=1000, pc="airflow-gpu-best-effort-training",
                annotations={C.ANNOTATION_GPU_PRODUCTS: "a100-80gb"}) for i in range(2)]
    g = gang_from_k8s("team-nlp/train", pg, pods, ctx)
    assert (g.team, g.tier, g.priority, g.checkpointable, g.preemptible, g.spot_eligible) == (
        "nlp", "best-effort-training", 1000, True, True, True)
    assert g.topology.level is TopologyLevel.RACK and g.topology.hard
    assert g.members[0].gpu_products == ("NVIDIA-A100-SXM4-80GB",)  # quota product -> node label
    assert g.members[0].capacity_types == ("spot", "on-demand")  # checkpointable best-effort: spot first
    pg["metadata"]["annotations"][C.ANNOTATION_CHECKPOINTABLE] = "false"
    assert gang_from_k8s("team-nlp/train", pg, pods, ctx).members[0].capacity_types == ("on-demand",)
    pg["metadata"]["annotations"][C.ANNOTATION_TOPOLOGY] = "galaxy"
    with pytest.raises(ConversionError, match="level must be one of"):
        gang_from_k8s("team-nlp/train", pg, pods, ctx)


def test_mixing_gpu_products_is_an_annotated_opt_in(repo_root):
    ctx = ConversionContext.from_config(load_config(repo_root / "examples" / "seed-quotas.yaml"))
    pods = [pod(f"w{i}", gpus=8, group="train", pc="airflow-gpu-best-effort-training",
                annotations={C.ANNOTATION_GPU_PRODUCTS: "h100-80gb,a100-80gb"}) for i in range(2)]
    g = gang_from_k8s("team-nlp/train", podgroup("train", 2), pods, ctx)
    assert g.members[0].gpu_products == ("NVIDIA-H100-80GB-HBM3", "NVIDIA-A100-SXM4-80GB") and not g.products_mixed
    pg = podgroup("train", 2, annotations={C.ANNOTATION_GPU_PRODUCTS_MIXED: "true"})
    assert gang_from_k8s("team-nlp/train", pg, pods, ctx).products_mixed


def test_a_pod_that_selects_spot_keeps_it_on_a_tier_that_defaults_to_on_demand(repo_root):
    """The operator's spot="always" on production-training (not spot-eligible) selects spot nodes: the
    scheduler must not pin it to on-demand as well (it could then bind nowhere)."""
    ctx = ConversionContext.from_config(load_config(repo_root / "examples" / "seed-quotas.yaml"))
    pg = podgroup("ft", 1, annotations={C.ANNOTATION_CHECKPOINTABLE: "true"})
    spot = pod("w0", gpus=4, group="ft", pc="airflow-gpu-production-training")
    spot["spec"]["nodeSelector"] = {C.NODE_CAPACITY_TYPE_KARPENTER: "spot"}
    assert gang_from_k8s("team-nlp/ft", pg, [spot], ctx).members[0].capacity_types == ("spot",)
    spot["spec"]["nodeSelector"] = {C.NODE_GKE_SPOT: "true"}
    assert gang_from_k8s("team-nlp/ft", pg, [spot], ctx).members[0].capacity_types == ("spot",)
    spot["spec"]["nodeSelector"] = {"kubernetes.io/os": "linux"}  # no capacity choice: the tier's default,
    # on-demand first and spot when on-demand is full (spot_fallback in seed-quotas.yaml)
    assert gang_from_k8s("team-nlp/ft", pg, [spot], ctx).members[0].capacity_types == ("on-demand", "spot")
    pg["metadata"]["annotations"][C.ANNOTATION_CHECKPOINTABLE] = "false"  # no checkpoint: never spot
    assert gang_from_k8s("team-nlp/ft", pg, [spot], ctx).members[0].capacity_types == ("on-demand",)


def test_labels_never_decide_team_or_tier_pending_or_running(repo_root):
    """Issue 32's reproductions, converted: research's borrower labelled tier=interactive at the
    best-effort PriorityClass stays best-effort (preemptible, so reclaimable); a team-vision pod
    labelled team=nlp is vision's. Neither label stops the gang (it is no invalid hint): each is
    reported as an ignored hint of the gang, pending and running alike."""
    ctx = ConversionContext.from_config(load_config(repo_root / "examples" / "seed-quotas.yaml"))
    liar = {C.LABEL_TEAM: "nlp", C.LABEL_TIER: C.TIER_INTERACTIVE}
    borrower = pod("sweep", 4, ns="team-research", pc="airflow-gpu-best-effort-training", priority=1000)
    borrower["metadata"]["labels"].update({C.LABEL_TIER: C.TIER_INTERACTIVE})
    g = gang_from_k8s("team-research/sweep", None, [borrower], ctx)  # hints=None: still no ConversionError
    assert (g.team, g.tier, g.preemptible, g.priority) == ("research", "best-effort-training", True, 1000)
    hints: list[str] = []
    pg = podgroup("ft", 1, ns="team-vision")
    pg["metadata"]["labels"] = dict(liar)
    member = pod("ft-0", 4, ns="team-vision", group="ft", pc="airflow-gpu-production-training", priority=100000)
    member["metadata"]["labels"].update(liar)
    g = gang_from_k8s("team-vision/ft", pg, [member], ctx, hints=hints)
    assert (g.team, g.tier, g.preemptible) == ("vision", "production-training", False)
    assert hints == [f"gang team-vision/ft: label {C.LABEL_TEAM}='nlp' contradicts namespace 'team-vision' "
                     "(team 'vision'); ignored: the namespace decides the team",
                     f"gang team-vision/ft: label {C.LABEL_TIER}='interactive' contradicts PriorityClass "
                     "'airflow-gpu-production-training' (tier 'production-training'); ignored: the PriorityClass "
                     "decides the tier"]
    running = pod("run", 4, ns="team-vision", node_name="a", phase="Running", pc="airflow-gpu-production-training",
                  priority=100000)
    running["metadata"]["labels"].update(liar)
    w = build_world(_view([borrower, member, running], [pg]), "airflow-gpu", ctx)
    assert {g.name: (g.team, g.tier) for _, g in w.pending} == {
        "team-research/sweep": ("research", "best-effort-training"), "team-vision/ft": ("vision", "production-training")}
    assert [(rg.gang.name, rg.gang.team, rg.gang.tier) for rg in w.running] == [
        ("team-vision/run", "vision", "production-training")]
    assert not w.invalid and not w.incomplete
    said = {}
    for unit, problem in w.ignored_hints:
        said.setdefault(unit.key, []).append(problem.split(" contradicts ")[0].split(": ", 1)[1])
    assert said == {"team-research/sweep": [f"label {C.LABEL_TIER}='interactive'"],
                    "team-vision/ft": [f"label {C.LABEL_TEAM}='nlp'", f"label {C.LABEL_TIER}='interactive'"],
                    "team-vision/run": [f"label {C.LABEL_TEAM}='nlp'", f"label {C.LABEL_TIER}='interactive'"]}


def _view(pods, podgroups=(), nodes=("a", "b"), plans=()):
    from airflow_gpu.kube.convert import key_of

    return View(pods={key_of(p): p for p in pods}, nodes={n: node(n) for n in nodes},
                podgroups={key_of(g): g for g in podgroups}, priorityclasses={}, resourcequotas={},
                plans={f"default/{plan_store_name(p.owner_uid)}": _record(p) for p in plans})


def _record(plan):
    """A plan record as the scheduler stores it: a ConfigMap in its namespace named by the owner's UID."""
    return {"metadata": {"name": plan_store_name(plan.owner_uid), "namespace": "default"},
            "data": {C.PLAN_DATA_KEY: plan.to_json()}}


def test_world_waits_for_every_member_and_orders_by_priority():
    pods = [pod("g0", 8, group="big"), pod("lone", 1, priority=5), pod("old", 1)]
    w = build_world(_view(pods, [podgroup("big", 2)]), "airflow-gpu", ConversionContext())
    assert [g.name for _, g in w.pending] == ["team-nlp/lone", "team-nlp/old"]
    assert [(u.key, r) for u, r in w.incomplete] == [
        ("team-nlp/big", "gang has 1 of 2 pods; waiting for the rest to be created")]


def test_a_partly_bound_gang_pins_its_pending_members_and_counts_bound_ones_toward_min_member():
    pods = [pod("g0", 1, group="pg", node_name="a", phase="Running"), pod("g1", 1, group="pg"),
            pod("g2", 1, group="pg"), pod("g3", 1, group="pg")]
    w = build_world(_view(pods, [podgroup("pg", 3)]), "airflow-gpu", ConversionContext())
    ((_, g),) = w.pending
    assert g.pinned == ("a",) and len(g.members) == 3 and g.min_member == 2


def _nomination() -> Plan:
    """Gang team-nlp/big's two 8-GPU members on nodes a and b, preempting team-nlp/r0."""
    plan = Plan(PLAN_NOMINATED, {f"team-nlp/g{i}": Placement(f"team-nlp/g{i}", n, tuple((k, 1000) for k in range(8)),
                                                             cpu_milli=500, memory_mib=1024)
                                 for i, n in enumerate("ab")}, 0.0, victims=("team-nlp/r0",))
    return replace(plan, owner_key="team-nlp/big", owner_uid="uid-pg-team-nlp-big",
                   pod_uids={f"team-nlp/g{i}": f"uid-team-nlp-g{i}" for i in range(2)},
                   victim_uids={"team-nlp/r0": "uid-team-nlp-r0"})


def test_running_pods_and_nominated_plans_hold_gpus():
    running = [pod(f"r{i}", 1, node_name="a", phase="Running") for i in range(6)]
    members = [pod(f"g{i}", 8, group="big", priority=10) for i in range(2)]
    plan = _nomination()
    pg = podgroup("big", 2)
    w = build_world(_view(running + members, [pg], plans=[plan]), "airflow-gpu", ConversionContext())
    assert len(w.running) == 6 and not w.pending
    assert w.plan_ready["team-nlp/big"] is False  # node a is still busy with the victims
    # every GPU is taken: b by the plan, a by the running pods plus the plan's hold on what was free
    assert int(w.snapshot.whole_free_gpus().sum()) == 0
    assert Plan.from_json(plan.to_json()).victims == ("team-nlp/r0",)
    assert not w.rejected_plans and not w.stale_plans


def test_required_node_affinity_and_scheduling_gates():
    from airflow_gpu.kube.convert import pod_is_pending_for

    p = pod("aff")
    term = {"matchExpressions": [{"key": C.NODE_ZONE, "operator": "In", "values": ["z1"]}]}
    p["spec"]["affinity"] = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [term]}}}
    assert pod_request_from_k8s(p).node_selector == ((C.NODE_ZONE, "z1"),)
    term["matchExpressions"][0]["operator"] = "NotIn"
    with pytest.raises(ConversionError, match=r"matchExpressions\[0\]: only operator In with one value"):
        pod_request_from_k8s(p)
    assert pod_is_pending_for(pod("free"), "airflow-gpu")
    gated = pod("gated")
    gated["spec"]["schedulingGates"] = [{"name": "kueue.x-k8s.io/admission"}]
    assert not pod_is_pending_for(gated, "airflow-gpu")


def test_schedule_timeout_is_read_from_the_podgroup_spec_and_bad_values_name_the_field():
    pg = {"metadata": {"name": "g", "namespace": "ns"}, "spec": {"minMember": 1}}
    assert schedule_timeout(pg) is None and schedule_timeout(None) is None
    assert schedule_timeout({**pg, "spec": {"minMember": 1, "scheduleTimeoutSeconds": 90}}) == 90
    for bad in (0, -5, "60", 1.5, True):
        with pytest.raises(ConversionError, match=r"ns/g: spec.scheduleTimeoutSeconds=.* integer >= 1"):
            schedule_timeout({**pg, "spec": {"minMember": 1, "scheduleTimeoutSeconds": bad}})


def test_a_memo_keeps_the_running_snapshot_by_deltas_and_equals_a_fresh_build():
    """Pods that end, start or move between cycles change the kept snapshot; held plans and the
    cycle's what-ifs never reach it; each cycle's capacity equals a World built from scratch."""
    from airflow_gpu.scheduler.state import Memo

    memo = Memo()
    running = [pod(f"r{i}", 1 + i % 2, node_name="ab"[i % 2], phase="Running") for i in range(6)]
    members = [pod(f"g{i}", 8, group="big", priority=10) for i in range(2)]
    pg = podgroup("big", 2)
    plan = Plan(PLAN_NOMINATED, {"team-nlp/g0": Placement("team-nlp/g0", "b", tuple((k, 1000) for k in range(8)),
                                                          cpu_milli=500, memory_mib=1024),
                                 "team-nlp/g1": Placement("team-nlp/g1", "c", tuple((k, 1000) for k in range(8)),
                                                          cpu_milli=500, memory_mib=1024)}, 0.0)
    plan = replace(plan, owner_key="team-nlp/big", owner_uid="uid-pg-team-nlp-big",
                   pod_uids={f"team-nlp/g{i}": f"uid-team-nlp-g{i}" for i in range(2)})
    moved = dict(running[5], spec={**running[5]["spec"], "nodeName": "c"},
                 metadata={**running[5]["metadata"], "uid": "uid-again"})
    cycles = [running, running[1:], running[1:5] + [moved, pod("new", 4, node_name="c", phase="Running")],
              running[1:5] + [moved]]
    for pods in cycles:
        view = _view(pods + members, [pg], nodes=("a", "b", "c"), plans=[plan])
        kept = build_world(view, "airflow-gpu", ConversionContext(), memo=memo)
        fresh = build_world(view, "airflow-gpu", ConversionContext())
        assert (kept.snapshot.whole_free_gpus() == fresh.snapshot.whole_free_gpus()).all()
        assert (kept.snapshot.cpu_free == fresh.snapshot.cpu_free).all()
        assert set(kept.snapshot.placements) == set(fresh.snapshot.placements)
        assert len(kept.running) == len(pods)
        # the kept snapshot holds the running pods only (the plan's holds are on the cycle's copy)
        assert set(memo.live.placements) == {f"team-nlp/{p['metadata']['name']}" for p in pods}
    assert int(memo.live.whole_free_gpus()[2]) == 8 - 2  # c: the moved 2-GPU pod only, "new" ended


def test_one_world_per_cycle_its_state_counts_plans_once_and_each_gang_is_converted_once(monkeypatch):
    """The World carries the cycle's CycleState: the world's snapshot with the plan held, every
    running gang's quota plus the nomination's charge (its own-team victim counted once), and as
    preemption candidates neither the nomination's victim nor a terminating gang. Each unit's gang
    is converted once, and the plan's unit carries it."""
    from airflow_gpu.core.quota import QuotaBook, TeamQuota
    from airflow_gpu.scheduler import state as S

    running = [pod(f"r{i}", 1, node_name="a", phase="Running") for i in range(6)]
    running[5]["metadata"]["deletionTimestamp"] = "2026-12-01T10:05:00Z"  # terminating: holds GPUs until gone
    members = [pod(f"g{i}", 8, group="big", priority=10) for i in range(2)]
    plan = _nomination()
    book = QuotaBook({"nlp": TeamQuota.from_gpus("nlp", {"NVIDIA-A100-SXM4-80GB": 32})})
    calls = []
    convert = S.gang_from_k8s
    monkeypatch.setattr(S, "gang_from_k8s", lambda key, *a, **k: calls.append(key) or convert(key, *a, **k))
    ctx = ConversionContext(team_by_namespace={"team-nlp": "nlp"})
    w = build_world(_view(running + members + [pod("lone", 2)], [podgroup("big", 2)], plans=[plan]),
                    "airflow-gpu", ctx, book=book)
    assert sorted(calls) == ["team-nlp/big", "team-nlp/lone"]  # running gangs: running_gang_from_k8s
    assert w.units["team-nlp/big"].gang.name == "team-nlp/big" and "team-nlp/big" in w.plans
    assert w.state.snap is w.snapshot and int(w.snapshot.whole_free_gpus().sum()) == 0
    assert sorted(rg.gang.name for rg in w.state.running) == [f"team-nlp/r{i}" for i in range(1, 5)]
    # 6 running GPUs, and the plan's 16 less its own-team victim's 1 while the victim still runs
    assert sum(w.state.usage.used["nlp"].values()) == (6 + 16 - 1) * 1000


def test_a_victim_of_a_nomination_whose_members_are_all_bound_is_no_candidate_again():
    victim = pod("r0", 1, node_name="a", phase="Running")
    other = pod("r1", 1, node_name="a", phase="Running")
    members = [pod(f"g{i}", 8, group="big", priority=10, node_name="bc"[i], phase="Running") for i in range(2)]
    w = build_world(_view([victim, other] + members, [podgroup("big", 2)], nodes=("a", "b", "c"),
                          plans=[_nomination()]), "airflow-gpu", ConversionContext())
    assert "team-nlp/big" in w.plans and not w.rejected_plans  # every member bound: the loop closes it
    assert {rg.gang.name for rg in w.running} == {"team-nlp/r0", "team-nlp/r1", "team-nlp/big"}
    assert {rg.gang.name for rg in w.state.running} == {"team-nlp/r1", "team-nlp/big"}


def test_a_unit_whose_objects_are_the_same_is_not_converted_again_and_each_world_equals_a_fresh_one(monkeypatch):
    """The Memo keeps what each unit's objects gave (state.Derived) while they are the very same
    objects (the cache replaces a changed object): an unchanged unit is converted once over many
    cycles; a replaced pod, a pod assumed bound, a unit gone are seen at once, and every World
    equals one built from scratch."""
    from airflow_gpu.scheduler import state as S
    from airflow_gpu.scheduler.state import Memo

    calls: list[str] = []
    for name in ("gang_from_k8s", "running_gang_from_k8s"):
        real = getattr(S, name)
        monkeypatch.setattr(S, name, lambda key, *a, _real=real, _name=name, **k: calls.append(f"{_name} {key}")
                            or _real(key, *a, **k))
    memo = Memo()
    run = [pod(f"r{i}", 2, group="run", node_name="a", phase="Running") for i in range(2)]
    wait = [pod(f"w{i}", 4, group="wait") for i in range(2)]
    lone = pod("lone", 1)
    groups = [podgroup("run", 2), podgroup("wait", 2)]

    def world(pods, assumed=None):
        view = _view(pods, groups, nodes=("a", "b", "c"))
        view.assumed = dict(assumed or {})
        kept = build_world(view, "airflow-gpu", ConversionContext(), memo=memo)
        fresh = build_world(view, "airflow-gpu", ConversionContext())
        assert [(u.key, g) for u, g in kept.pending] == [(u.key, g) for u, g in fresh.pending]
        assert sorted(kept.running, key=lambda r: r.gang.name) == sorted(fresh.running, key=lambda r: r.gang.name)
        assert (kept.snapshot.whole_free_gpus() == fresh.snapshot.whole_free_gpus()).all()
        return kept

    world(run + wait + [lone])
    calls.clear()
    for _ in range(3):  # nothing changed: nothing converted (the fresh builds count: 3 each)
        w = world(run + wait + [lone])
    assert sorted(calls) == sorted(["running_gang_from_k8s team-nlp/run", "gang_from_k8s team-nlp/wait",
                                    "gang_from_k8s team-nlp/lone"] * 3)
    assert {g.name for _, g in w.pending} == {"team-nlp/lone", "team-nlp/wait"}
    calls.clear()
    # the lone pod assumed bound on c (a Binding in flight): running at once, c's GPU held
    w = world(run + wait + [lone], assumed={"team-nlp/lone": "c"})
    assert {rg.gang.name for rg in w.running} == {"team-nlp/run", "team-nlp/lone"}
    assert int(w.snapshot.whole_free_gpus()[2]) == 7
    # a running member replaced (moved to b): its unit converted again; the lone pod gone: forgotten
    moved = dict(run[1], spec={**run[1]["spec"], "nodeName": "b"})
    calls.clear()
    w = world([run[0], moved] + wait)
    assert calls.count("running_gang_from_k8s team-nlp/run") == 2 and "gang_from_k8s team-nlp/wait" in calls
    assert calls.count("gang_from_k8s team-nlp/wait") == 1  # the fresh build only
    assert {rg.gang.name for rg in w.running} == {"team-nlp/run"}
    assert [int(x) for x in w.snapshot.whole_free_gpus()] == [6, 6, 8]
    assert set(memo.units) == {"team-nlp/run", "team-nlp/wait"} and set(memo.live.placements) == {
        "team-nlp/r0", "team-nlp/r1"}
    # a PodGroup replaced with only its status changed (the scheduler's own write): nothing converted;
    # one whose annotations changed (a hint the gang reads): converted again
    groups[1] = dict(groups[1], status={"phase": "Pending"},
                     metadata={**groups[1]["metadata"], "resourceVersion": "7"})
    calls.clear()
    w = world([run[0], moved] + wait)
    assert sorted(calls) == ["gang_from_k8s team-nlp/wait", "running_gang_from_k8s team-nlp/run"]  # the fresh build's
    groups[1] = dict(groups[1], metadata={**groups[1]["metadata"],
                                          "annotations": {C.ANNOTATION_EXPECTED_DURATION: "3600"}})
    calls.clear()
    w = world([run[0], moved] + wait)
    assert sorted(calls) == ["gang_from_k8s team-nlp/wait"] * 2 + ["running_gang_from_k8s team-nlp/run"]
    assert w.pending[0][1].expected_duration == 3600
