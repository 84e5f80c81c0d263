"""scheduler.waiting without a cluster: when room may have appeared (what resets the back-off) and
which PodGroups are past spec.scheduleTimeoutSeconds."""

from __future__ import annotations

from dataclasses import replace

from fixtures.core_gang import cluster, gang, profile, start

from airflow_gpu import constants as C
from airflow_gpu.core.reservation import Reservation
from airflow_gpu.core.snapshot import Snapshot
from airflow_gpu.scheduler.state import Unit, World
from airflow_gpu.scheduler.waiting import RoomWatch, timeouts


def world(running=(), plans=(), nodes=None, pending=(), incomplete=()) -> World:
    return World(None, {}, list(pending), list(incomplete), list(running), {}, {k: None for k in plans}, {}, [],
                 dict(nodes if nodes is not None else {n.name: n for n in cluster(2)}))


def test_room_watch_reports_ended_pods_dropped_plans_new_nodes_and_a_moved_head():
    snap = Snapshot.from_nodes(cluster(2))
    a, b = start(snap, gang("a", 1, 4), profile()), start(snap, gang("b", 1, 4), profile())
    w = RoomWatch()
    assert not w.changed(world([a, b], ["ns/p"]))  # first look: nothing to compare with
    assert not w.changed(world([a, b], ["ns/p"]))
    assert not w.changed(world([a, b, start(snap, gang("c", 1, 4), profile())], ["ns/p"]))  # more in use: no room
    assert w.changed(world([a], ["ns/p"]))  # pods of b and c stopped holding resources
    assert w.changed(world([a], []))  # the held plan was dropped
    nodes = {n.name: n for n in cluster(3)}
    assert w.changed(world([a], [], nodes))  # a node joined
    bigger = {**nodes, "n0002": replace(nodes["n0002"], gpu_count=16)}
    assert w.changed(world([a], [], bigger)) and not w.changed(world([a], [], bigger))
    head = Reservation(gang("h", 1, 8), frozenset({"n0000"}), 10.0, ())
    assert not w.head_moved(head) and not w.head_moved(head)
    assert w.head_moved(None) and not w.head_moved(None)  # admitted or gone: its nodes are free to others


def pg(name, timeout, created="2026-01-01T00:00:00Z", start=None, reason=None):
    obj = {"metadata": {"name": name, "namespace": "ns", "creationTimestamp": created,
                        "annotations": {C.ANNOTATION_WAIT_REASON: reason} if reason else {}},
           "spec": {"minMember": 1, **({"scheduleTimeoutSeconds": timeout} if timeout is not None else {})}}
    if start:
        obj["status"] = {"scheduleStartTime": start}
    return Unit(f"ns/{name}", obj, [])


def test_timeouts_count_from_schedule_start_else_creation_and_carry_the_last_reason():
    t0 = 1767225600.0  # 2026-01-01T00:00:00Z
    units = [pg("late", 60, reason="needs 16 x H100; largest free block is 8"), pg("fresh", 60, start="2026-01-01T00:01:00Z"),
             pg("none", None), pg("bad", "soon")]
    parts = [(gang(u.key, 1, 1)) for u in units]
    out, bad = timeouts(world(pending=list(zip(units, parts)), incomplete=[(pg("short", 30), "gang has 1 of 2 pods")]),
                        {}, t0 + 61)
    assert set(out) == {"ns/late", "ns/short"}
    assert out["ns/late"].startswith("not scheduled within spec.scheduleTimeoutSeconds=60 (waiting 61 s)")
    assert "last wait reason: needs 16 x H100; largest free block is 8" in out["ns/late"]
    assert "last wait reason: gang has 1 of 2 pods" in out["ns/short"]
    assert [(u.key, "spec.scheduleTimeoutSeconds='soon'" in e) for u, e in bad] == [("ns/bad", True)]
    # this cycle's reason wins over the annotation written earlier
    out, _ = timeouts(world(pending=[(units[0], parts[0])]), {"ns/late": "would delay ns/head"}, t0 + 61)
    assert "last wait reason: would delay ns/head" in out["ns/late"]
    assert timeouts(world(pending=[(units[0], parts[0])]), {}, t0 + 59)[0] == {}


def test_the_queue_is_published_at_a_bounded_rate():
    from airflow_gpu.scheduler.publish import COST_SHARE, MIN_GAP, Publisher

    clock = [0.0]
    p = Publisher(5.0, clock=lambda: clock[0])
    a, b = frozenset({"ns/a"}), frozenset({"ns/a", "ns/b"})
    assert p.due(a)  # first cycle
    p.done(a)
    clock[0] = 4.9
    assert not p.due(a)  # same waiting set, within the interval
    clock[0] = 0.5
    assert not p.due(b)  # a change, but less than MIN_GAP since the last write
    clock[0] = MIN_GAP
    assert p.due(b)  # a change: sooner than the interval
    p.done(b)
    clock[0] = MIN_GAP + 5.0
    assert p.due(b)  # the interval passed
    # a publication that took 2 s: the next waits 2 * (1 - COST_SHARE) / COST_SHARE more (8 s at 0.2)
    p.done(b, cost=2.0)
    extra = 2.0 * (1 - COST_SHARE) / COST_SHARE
    clock[0] = MIN_GAP + 5.0 + MIN_GAP + extra - 0.01
    assert not p.due(a)  # a change, but too soon after a costly publication
    clock[0] += 0.02
    assert p.due(a)
