"""The scheduler's kept grouping of pods into units (state.Grouping) against grouping every pod again
(state.group_units): the same units, in the same order, over random sequences of the changes a
watch delivers (pods created, replaced, relabelled, deleted; PodGroups created and deleted; pods
assumed bound and forgotten); a unit reported untouched is the very Unit of the call before."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpu import constants as C
from airflow_gpu.kube.convert import ConversionContext
from airflow_gpu.scheduler.cache import View
from airflow_gpu.scheduler.state import Grouping, Memo, build_world, group_units
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
@given(st.lists(st.lists(change, max_size=6), min_size=1, max_size=12), st.sampled_from([Grouping.REBUILD_SHARE, 2.0]))
def test_kept_grouping_equals_grouping_every_pod_again(cycles, rebuild_share):
    stores = {"pods": {}, "podgroups": {}}
    assumed: dict[str, str] = {}
    grouping = Grouping()
    grouping.REBUILD_SHARE = rebuild_share  # 2.0: kept whatever share of the pods changed (as at scale)
    last: dict = {}
    last_assumed: dict = {}
    for steps in cycles:
        for step in steps:
            _apply(stores, assumed, step)
        view = View(pods=dict(stores["pods"]), nodes={}, podgroups=dict(stores["podgroups"]), priorityclasses={},
                    resourcequotas={}, assumed=dict(assumed))
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
