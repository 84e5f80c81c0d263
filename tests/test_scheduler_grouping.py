"""The scheduler's kept grouping of pods into units (state.Grouping) against grouping every pod again
(state.group_units): the same units, in the same order, over random sequences of the changes a
watch delivers (pods created, replaced, relabelled, deleted; PodGroups created and deleted; pods
assumed bound and forgotten); a unit reported untouched is the very Unit of the call before."""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st

from airflow_gpu import constants as C
from airflow_gpu.core.model import Placement
from airflow_gpu.core.quota import QuotaBook, TeamQuota
from airflow_gpu.kube.convert import ConversionContext
from airflow_gpu.scheduler.cache import Changes, View
from airflow_gpu.scheduler.state import PLAN_ADMITTED, Grouping, Memo, Plan, build_world, group_units, plan_store_name
from tests.test_scheduler_convert import node, pod, podgroup

NAMES = ["a", "b", "c", "d", "e", "g1", "g2"]  # a lone pod named g1 or g2 collides with a unit key
GROUPS = [None, None, "g1", "g2", "g3"]  # g3 never has a PodGroup: its members wait for it

change = st.one_of(
    st.tuples(st.just("pod"), st.sampled_from(NAMES), st.sampled_from(GROUPS), st.booleans()),
    st.tuples(st.just("delete-pod"), st.sampled_from(NAMES)),
    st.tuples(st.just("podgroup"), st.sampled_from(["g1", "g2", "a"])),
    st.tuples(st.just("delete-podgroup"), st.sampled_from(["g1", "g2", "a"])),
    st.tuples(st.just("assume"), st.sampled_from(NAMES)),
    st.tuples(st.just("forget"), st.sampled_from(NAMES)),
)


def _shape(units):
    return [(key, id(u.podgroup), [id(p) for p in u.pods], list(u.keys)) for key, u in units.items()]


def _apply(stores, assumed, step):
    kind, name = step[0], step[1]
    key = f"team-nlp/{name}"
    if kind == "pod":
        stores["pods"][key] = pod(name, group=step[2], node_name="n" if step[3] else None)
    elif kind == "delete-pod":
        stores["pods"].pop(key, None)
        assumed.pop(key, None)
    elif kind == "podgroup":
        stores["podgroups"][key] = podgroup(name, 1)
    elif kind == "delete-podgroup":
        stores["podgroups"].pop(key, None)
    elif kind == "assume" and key in stores["pods"]:
        assumed[key] = "n"
    elif kind == "forget":
        assumed.pop(key, None)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.lists(change, max_size=6), st.sampled_from(["changes", "none", "gap"])),
                min_size=1, max_size=12),
       st.sampled_from([Grouping.REBUILD_SHARE, 2.0]))
@example([([("pod", "b", "g1", False), ("podgroup", "g1")], "changes"), ([("delete-podgroup", "g1")], "changes"),
          ([("podgroup", "g1")], "changes")], 2.0)  # a PodGroup deleted and created again
@example([([("pod", "b", "g1", False)], "changes"), ([("pod", "c", None, False), ("pod", "d", None, False)], "gap")],
         2.0)  # c changed in a view this grouping did not see
def test_kept_grouping_equals_grouping_every_pod_again(cycles, rebuild_share):
    """With or without the cache's changes (Changes: the keys changed since the view before; "gap":
    a view in between was read by someone else, so they are not the changes since the last grouping)."""
    stores = {"pods": {}, "podgroups": {}}
    assumed: dict[str, str] = {}
    grouping = Grouping()
    grouping.REBUILD_SHARE = rebuild_share  # 2.0: kept whatever share of the pods changed (as at scale)
    last: dict = {}
    last_assumed: dict = {}
    at = 0
    for steps, told in cycles:
        changed = {"pods": set(), "podgroups": set()}
        for i, step in enumerate(steps):
            _apply(stores, assumed, step)
            if told == "gap" and i < len(steps) - 1:
                continue  # told to the view in between: not in this view's changes
            if step[0] in ("pod", "delete-pod"):
                changed["pods"].add(f"team-nlp/{step[1]}")
            elif step[0] in ("podgroup", "delete-podgroup"):
                changed["podgroups"].add(f"team-nlp/{step[1]}")
        at += 2 if told == "gap" else 1
        changes = None if told == "none" else Changes(("cache", at - 1), ("cache", at), frozenset(changed["pods"]),
                                                        frozenset(changed["podgroups"]))
        view = View(pods=dict(stores["pods"]), nodes={}, podgroups=dict(stores["podgroups"]), priorityclasses={},
                    resourcequotas={}, assumed=dict(assumed), changes=changes)
        units, touched = grouping.group(view)
        assert _shape(units) == _shape(group_units(view))
        if touched is not None:
            for key, unit in units.items():
                if key not in touched:
                    assert last.get(key) is unit
                    assert [view.assumed.get(k) for k in unit.keys] == last_assumed[key]
        last = dict(units)
        last_assumed = {key: [view.assumed.get(k) for k in u.keys] for key, u in units.items()}


def test_a_kept_world_equals_a_fresh_one_as_gangs_arrive_bind_and_leave():
    """build_world with the Memo (kept units and their derivations) against a fresh build, cycle by
    cycle: the same queue (gangs, in order), the same running gangs and the same free capacity."""
    memo = Memo()
    nodes = {n: node(n) for n in ("a", "b", "c")}
    pods: dict[str, dict] = {}
    pgs: dict[str, dict] = {}
    assumed: dict[str, str] = {}

    def gang(name, members, bound_on=None):
        pgs[f"team-nlp/{name}"] = podgroup(name, members)
        for i in range(members):
            pods[f"team-nlp/{name}-{i}"] = pod(f"{name}-{i}", 2, group=name, node_name=bound_on,
                                               phase="Running" if bound_on else "Pending")

    steps = [
        lambda: gang("x", 2, "a"), lambda: gang("y", 3), lambda: gang("z", 2),
        lambda: assumed.update({"team-nlp/y-0": "b", "team-nlp/y-1": "b"}),  # y binding
        lambda: [pods.update({f"team-nlp/y-{i}": pod(f"y-{i}", 2, group="y", node_name="b", phase="Running")})
                 for i in range(3)] and assumed.clear(),
        lambda: [pods.pop(f"team-nlp/x-{i}") for i in range(2)] and pgs.pop("team-nlp/x"),  # x ended
        lambda: pods.update({"team-nlp/lone": pod("lone", 1)}),
        lambda: pgs.update({"team-nlp/z": podgroup("z", 2, annotations={C.ANNOTATION_WAIT_REASON: "r"})}),
    ]
    for step in steps:
        step()
        view = View(pods=dict(pods), nodes=nodes, podgroups=dict(pgs), priorityclasses={}, resourcequotas={},
                    assumed=dict(assumed))
        kept = build_world(view, "airflow-gpu", ConversionContext(), memo=memo)
        fresh = build_world(view, "airflow-gpu", ConversionContext())
        assert [(u.key, g) for u, g in kept.pending] == [(u.key, g) for u, g in fresh.pending]
        assert [u.key for u in kept.units.values()] == [u.key for u in fresh.units.values()]
        assert {k: u.gang for k, u in kept.units.items()} == {k: u.gang for k, u in fresh.units.items()}
        assert sorted(r.gang.name for r in kept.running) == sorted(r.gang.name for r in fresh.running)
        assert (kept.snapshot.whole_free_gpus() == fresh.snapshot.whole_free_gpus()).all()


GANGS = ["g0", "g1", "g2", "g3"]
lifecycle = st.one_of(
    st.tuples(st.just("arrive"), st.sampled_from(GANGS), st.integers(1, 3), st.integers(1, 6)),
    st.tuples(st.just("bind"), st.sampled_from(GANGS), st.sampled_from(["a", "b", "c"])),
    st.tuples(st.just("assume"), st.sampled_from(GANGS), st.sampled_from(["a", "b", "c"])),
    st.tuples(st.just("terminate"), st.sampled_from(GANGS)),
    st.tuples(st.just("checkpoint"), st.sampled_from(GANGS), st.sampled_from(["2026-12-01T11:00:00Z", "soon"])),
    st.tuples(st.just("borrow"), st.sampled_from(GANGS), st.sampled_from([None, False, True])),
    st.tuples(st.just("end"), st.sampled_from(GANGS)),
    st.tuples(st.just("node"), st.sampled_from(["a", "b", "c"]), st.sampled_from([8, 4])),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(lifecycle, max_size=4), min_size=1, max_size=10))
@example([[("arrive", "g0", 1, 1), ("bind", "g0", "a")], [("borrow", "g0", True)], [("borrow", "g0", None)]])
@example([[("arrive", "g0", 1, 1), ("bind", "g0", "a")], [("borrow", "g0", False)], [("borrow", "g0", True)]])
@example([[("node", "a", 4), ("arrive", "g0", 1, 4), ("bind", "g0", "a"), ("arrive", "g1", 1, 2), ("bind", "g1", "a")],
          [("end", "g0")], [("terminate", "g1")]])  # g1 held once g0 has gone: nothing of g1 changed
def test_running_gangs_kept_by_deltas_equal_a_fresh_build(cycles):
    """The running gangs, the preemption candidates, the quota usage, the ignored hints and the
    refused units of a World built with the Memo (only the units that changed looked at again)
    against a fresh build, cycle by cycle, over random lifecycles: gangs arrive, bind (some over a
    node's capacity), are assumed bound, get a member deleted, write checkpoint hints (some
    invalid), gain or lose a borrowed plan record, end; nodes shrink and grow."""
    book = QuotaBook({"team-nlp": TeamQuota.from_gpus("team-nlp", {"NVIDIA-A100-SXM4-80GB": 16})})
    memo = Memo()
    nodes = {n: node(n) for n in ("a", "b", "c")}
    pods: dict[str, dict] = {}
    pgs: dict[str, dict] = {}
    plans: dict[str, dict] = {}
    assumed: dict[str, str] = {}
    members = lambda g: sorted(k for k in pods if k.startswith(f"team-nlp/{g}-"))  # noqa: E731

    def step(s):
        kind, g = s[0], s[1]
        if kind == "arrive" and f"team-nlp/{g}" not in pgs:
            pgs[f"team-nlp/{g}"] = podgroup(g, s[2])
            for i in range(s[2]):
                pods[f"team-nlp/{g}-{i}"] = pod(f"{g}-{i}", s[3], group=g)
        elif kind in ("bind", "assume"):
            for k in members(g):
                if kind == "assume" and not pods[k]["spec"].get("nodeName"):
                    assumed[k] = s[2]
                elif kind == "bind":
                    p = pods[k]
                    pods[k] = pod(p["metadata"]["name"], int(p["spec"]["containers"][0]["resources"]["limits"][
                        C.RESOURCE_GPU]), group=g, node_name=p["spec"].get("nodeName") or s[2], phase="Running")
                    assumed.pop(k, None)
        elif kind == "terminate" and members(g):
            k = members(g)[0]
            pods[k] = {**pods[k], "metadata": {**pods[k]["metadata"], "deletionTimestamp": "2026-12-01T12:00:00Z"}}
        elif kind == "checkpoint" and f"team-nlp/{g}" in pgs:
            pg = pgs[f"team-nlp/{g}"]
            pgs[f"team-nlp/{g}"] = {**pg, "metadata": {**pg["metadata"], "annotations": {
                C.ANNOTATION_LAST_CHECKPOINT_TIME: s[2]}}}
        elif kind == "borrow":
            pg = pgs.get(f"team-nlp/{g}")
            name = plan_store_name(f"uid-pg-team-nlp-{g}")
            if pg is None or s[2] is None:
                plans.pop(f"airflow-gpu/{name}", None)
            else:
                plan = Plan(PLAN_ADMITTED, {k: Placement(k, pods[k]["spec"].get("nodeName") or "a")
                                            for k in members(g)}, 0.0, borrowed=s[2], owner_key=f"team-nlp/{g}",
                            owner_uid=f"uid-pg-team-nlp-{g}",
                            pod_uids={k: pods[k]["metadata"]["uid"] for k in members(g)})
                plans[f"airflow-gpu/{name}"] = {"metadata": {"name": name, "namespace": "airflow-gpu"},
                                                "data": {C.PLAN_DATA_KEY: plan.to_json()}}
        elif kind == "end":
            pgs.pop(f"team-nlp/{g}", None)
            for k in members(g):
                del pods[k]
                assumed.pop(k, None)
        elif kind == "node":
            nodes[g] = node(g, s[2])

    def picture(w):  # which GPU indices a node's running pods hold may differ (Memo's docstring)
        return ([(r.gang, [(p.pod, p.node, sorted(m for _, m in p.gpu_shares)) for p in r.placements], r.started_at,
                  r.last_checkpoint_at, r.borrowed, r.speed) for r in w.running],
                sorted(w.running_units), [r.gang.name for r in w.state.running],
                sorted((u.key, h) for u, h in w.ignored_hints), sorted((u.key, e) for u, e in w.invalid),
                {t: {k: v for k, v in used.items() if v} for t, used in w.state.usage.used.items() if any(used.values())},
                w.snapshot.whole_free_gpus().tolist())

    for steps in cycles:
        for s in steps:
            step(s)
        view = View(pods=dict(pods), nodes=dict(nodes), podgroups=dict(pgs), priorityclasses={}, resourcequotas={},
                    assumed=dict(assumed), plans=dict(plans))
        kept = build_world(view, "airflow-gpu", ConversionContext(), now=1e9, memo=memo, book=book)
        fresh = build_world(view, "airflow-gpu", ConversionContext(), now=1e9, book=book)
        if not memo.unheld:  # over-committed by someone else: which pods count depends on who came first
            assert picture(kept) == picture(fresh)
