"""Queueing hints of the back-off (core.backoff.Backoff.wake / ready, kube-scheduler's QueueingHint): a
gang refused for room is tried again only once a node it may use gained room where it fits, a
reserved node it was kept off is open to it again, or usage fell on a GPU product quota limited it
on. The rest of the queue keeps waiting without a placement each."""

from __future__ import annotations

import hashlib
from pathlib import Path

from fixtures.core_gang import cluster, gang, profile, run_cycle, start

from airflow_gpu.core import reservation as reservation_module
from airflow_gpu.core.backoff import Backoff, Refusal
from airflow_gpu.core.reservation import StartMemo, estimate_start
from airflow_gpu.core.queue import CycleResult
from airflow_gpu.core.snapshot import Snapshot
from airflow_gpu.sim.replay import PLATFORMS, replay
from airflow_gpu.sim.replay_report import write_events
from airflow_gpu.sim.settings import seed_setting
from airflow_gpu.sim.workload import SeedParams

NEVER = 1e15  # the replay's back-off: only a hint wakes a gang


def _two_products():
    """n0000, n0001: H100 x 8; a0000: A100 x 8."""
    return Snapshot.from_nodes(cluster(2) + cluster(1, product="A100", prefix="a"))


def _end_last(snap: Snapshot, running: list, b: Backoff) -> None:
    """The last running gang ends: its pods go, and the back-off hears where room appeared."""
    gone = running.pop()
    for p in gone.placements:
        snap.forget(p.pod)
    b.wake(snap, sorted({snap.node_index(p.node) for p in gone.placements}))


def test_only_room_a_gang_may_use_wakes_it():
    snap = _two_products()
    prof = profile()
    running = [start(snap, gang("r0", 1, 8, priority=9, expected_duration=100.0, products=("H100",)), prof),
               start(snap, gang("r1", 1, 4, priority=9, expected_duration=1000.0, products=("H100",)), prof),
               start(snap, gang("r1b", 1, 2, priority=9, expected_duration=1000.0, products=("H100",)), prof),
               start(snap, gang("a0", 1, 8, priority=9, expected_duration=1000.0, products=("A100",)), prof)]
    head = gang("head", 1, 8, priority=5, products=("H100",))
    small = gang("small", 1, 4, priority=1, created_at=1.0, products=("H100",))
    pending = [head, small]
    b = Backoff(base=NEVER, cap=NEVER)
    res = run_cycle(snap, pending, running, prof, 0.0, backoff=b)
    assert res.reservation.gang.name == "head" and res.reservation.nodes == {"n0000"}
    assert res.refusals["small"].kept_off == {"n0000"}
    b.record(res, pending, 0.0)

    # 8 A100 GPUs free up: nothing for an H100-only gang. The head is tried (it comes first), the
    # gang behind it is not placed again.
    _end_last(snap, running, b)
    res = run_cycle(snap, pending, running, prof, 1.0, backoff=b)
    assert res.deferred == ["small"] and "small" not in res.waiting
    b.record(res, pending, 1.0)

    # 2 H100 GPUs free up beside 2 free ones on n0001: room for 4, so it is tried, and starts
    _end_last(snap, running, b)
    res = run_cycle(snap, pending, running, prof, 2.0, backoff=b)
    assert [d.gang.name for d in res.admitted] == ["small"]
    assert {p.node for p in res.admitted[0].placements} == {"n0001"}


def _refused(b: Backoff, g, kept_off=frozenset(), quota_products=frozenset(), pending=()) -> Refusal:
    refusal = Refusal(tuple(ps.request for ps in g.pod_sets), frozenset(kept_off), frozenset(quota_products),
                      profile().filters)
    b.record(CycleResult(waiting={g.name: "no room"}, refusals={g.name: refusal}), list(pending) or [g], 0.0)
    return refusal


def test_a_reserved_node_that_opens_wakes_a_gang_only_with_room_for_it():
    snap = Snapshot.from_nodes(cluster(3))
    prof = profile()
    start(snap, gang("fill", 1, 8), prof)  # n0000 full; n0001 and n0002 free
    small = gang("small", 1, 4)
    b = Backoff(base=NEVER, cap=NEVER)
    _refused(b, small, kept_off={"n0001"})
    assert not b.ready("small", 1.0, frozenset({"n0001"}), snap)  # still kept off the same node
    assert not b.ready("small", 1.0, frozenset({"n0001", "n0002"}), snap)
    assert b.ready("small", 1.0, frozenset({"n0002"}), snap)  # n0001 is open to it, with room
    assert b.ready("small", 1.0, frozenset({"n0002"}))  # without a snapshot: open counts as room

    # n0001 opens without room: it stays, and the check is folded in (the same node is not looked
    # at again until it gains room)
    start(snap, gang("fill1", 1, 6), prof)
    assert snap.whole_free_gpus()[snap.node_index("n0001")] == 2
    refusal = _refused(b, small, kept_off={"n0001", "n0002"})
    assert not b.ready("small", 2.0, frozenset({"n0002"}), snap)
    assert refusal.kept_off == {"n0002"} and "small" in b.failures


def test_room_on_a_node_the_gang_is_kept_off_waits_for_the_cycle_to_say():
    snap = Snapshot.from_nodes(cluster(2))
    prof = profile()
    filler = start(snap, gang("fill", 1, 8), prof)  # n0000
    start(snap, gang("fill1", 1, 8), prof)  # n0001
    small = gang("small", 1, 4)
    b = Backoff(base=NEVER, cap=NEVER)
    refusal = _refused(b, small)
    for p in filler.placements:
        snap.forget(p.pod)
    b.wake(snap, [snap.node_index("n0000")])
    assert "small" in b.failures  # noted, not woken yet
    assert not b.ready("small", 1.0, frozenset({"n0000"}), snap)  # the cycle reserved n0000 against it
    assert refusal.kept_off == {"n0000"}  # folded in: the wake is not looked at again
    assert not b.ready("small", 1.5, frozenset({"n0000"}), snap)
    assert b.ready("small", 2.0, frozenset(), snap)  # the next cycle does not


def test_usage_falling_on_a_limiting_product_wakes_a_quota_limited_gang():
    snap = Snapshot.from_nodes(cluster(1))
    b = Backoff(base=NEVER, cap=NEVER)
    q, c = gang("q", 1, 4), gang("c", 1, 4)
    _refused(b, q, quota_products={"H100"}, pending=[q, c])
    _refused(b, c, pending=[q, c])  # limited by room only
    b.wake(snap, [], quota_freed={"A100"})
    assert not b.ready("q", 1.0, snap=snap) and not b.ready("c", 1.0, snap=snap)
    b.wake(snap, [], quota_freed={"H100"})
    assert b.ready("q", 2.0, snap=snap) and not b.ready("c", 2.0, snap=snap)
    assert set(b.failures) == {"c"}  # q's back-off starts again
    b.reset()
    assert b.failures == {} and b.refusals == {}


def _gang_trace(directory: Path) -> tuple[Path, Path]:
    """A contended day of multi-node gangs (up to 4 x 8 GPUs) on 6 A100 and 4 H100 nodes."""
    import random

    rng = random.Random(3)
    jobs = ["job,submit_time,duration,workers,gpus_per_worker,tier,checkpointable"]
    for i in range(220):
        workers, gpus = rng.choice(((1, 1), (1, 2), (1, 8), (2, 8), (3, 8), (4, 8), (1, 4)))
        jobs.append(f"j{i},{rng.randint(0, 86400)},{rng.randint(300, 20000)},{workers},{gpus},"
                    f"{rng.choice(('production-training', 'best-effort-training'))},{rng.random() < 0.5}")
    nodes = ["sn,cpu_milli,memory_mib,gpu,model"] + [f"n{i},96000,786432,8,{'A100' if i < 6 else 'H100'}"
                                                       for i in range(10)]
    (directory / "jobs.csv").write_text("\n".join(jobs) + "\n")
    (directory / "nodes.csv").write_text("\n".join(nodes) + "\n")
    return directory / "jobs.csv", directory / "nodes.csv"


def test_hints_make_the_same_decisions_as_waking_every_gang_with_multi_node_gangs(tmp_path, monkeypatch):
    """As below, on gangs of up to four whole nodes over two GPU products with quotas: the count of
    members the nodes can hold does not change a decision."""
    from airflow_gpu.sim.settings import DEFAULT_CONFIG, trace_setting

    jobs, nodes = _gang_trace(tmp_path)
    setting, _ = trace_setting(nodes, jobs, 1.0, 42, DEFAULT_CONFIG, {}, {})
    with_hints = replay(setting, PLATFORMS["full"])
    assert with_hints.preemptions > 0
    monkeypatch.setattr(Backoff, "wake", lambda self, snap, nodes, quota_freed=(): self.reset())
    every_gang = replay(setting, PLATFORMS["full"])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert _events_hash(with_hints, tmp_path / "a") == _events_hash(every_gang, tmp_path / "b")


def _events_hash(result, tmp: Path) -> str:
    return hashlib.sha256(write_events(result, tmp).read_bytes()).hexdigest()


def test_start_memo_answers_as_estimate_start_and_only_looks_at_nodes_the_head_may_use():
    snap = _two_products()
    prof = profile()
    running = [start(snap, gang("r0", 1, 8, priority=9, products=("H100",)), prof, at=0.0),
               start(snap, gang("r1", 1, 8, priority=9, products=("H100",)), prof, at=1.0),
               start(snap, gang("a0", 1, 4, priority=9, products=("A100",)), prof, at=2.0)]
    head = gang("head", 1, 8, priority=5, products=("H100",))
    memo = StartMemo()
    first = memo.estimate(snap, head, running, prof, 10.0)
    assert first == estimate_start(snap, head, running, prof, 10.0) and first.nodes == {"n0000"}
    # the A100 node changes: the same answer, kept
    start(snap, gang("a1", 1, 2, priority=9, products=("A100",)), prof)
    assert memo.estimate(snap, head, running, prof, 20.0) is first
    # an H100 node changes (r0 ends): worked out again, on the node that is now free
    for p in running[0].placements:
        snap.forget(p.pod)
    again = memo.estimate(snap, head, running[1:], prof, 30.0)
    assert again is not first and again == estimate_start(snap, head, running[1:], prof, 30.0)


def test_start_memo_keeps_a_known_start_and_moves_only_the_clock(monkeypatch):
    """The release order (expected ends) and so the placement do not depend on the clock: a kept
    estimate answers as estimate_start at a later time, before and after the releasing gang's end."""
    snap = _two_products()
    prof = profile()
    running = [start(snap, gang("r0", 1, 8, priority=9, expected_duration=100.0, products=("H100",)), prof, at=0.0),
               start(snap, gang("r1", 1, 8, priority=9, expected_duration=500.0, products=("H100",)), prof, at=0.0)]
    head = gang("head", 1, 8, priority=5, products=("H100",))
    memo = StartMemo()
    first = memo.estimate(snap, head, running, prof, 10.0)
    assert first.start == 100.0 and first == estimate_start(snap, head, running, prof, 10.0)
    fresh = {now: estimate_start(snap, head, running, prof, now) for now in (50.0, 100.0, 250.0)}

    def placed_again(*args):
        raise AssertionError("a kept estimate was worked out again")

    monkeypatch.setattr(reservation_module, "estimate_start", placed_again)
    for now, want in fresh.items():  # r0 overdue at 250: the start is the clock
        kept = memo.estimate(snap, head, running, prof, now)
        assert kept == want and kept.start == max(now, 100.0) and kept.nodes == first.nodes


def test_hints_make_the_same_decisions_as_waking_every_gang(tmp_path, monkeypatch):
    """A contended seed scenario (5 nodes, spot interruptions): the replay with hints and start
    estimates kept (StartMemo) and the one that wakes every gang at each release (Backoff.reset,
    the back-off before hints) and estimates every time write the same events."""
    setting = seed_setting(SeedParams(days=3.0, nodes=5, interruptions_per_node_day=2.0), 11)
    with_hints = replay(setting, PLATFORMS["full"])
    assert with_hints.preemptions > 0 and with_hints.interruptions > 0  # the scenario is contended
    monkeypatch.setattr(Backoff, "wake", lambda self, snap, nodes, quota_freed=(): self.reset())
    monkeypatch.setattr(StartMemo, "estimate", lambda self, *args: estimate_start(*args))
    every_gang = replay(setting, PLATFORMS["full"])
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert _events_hash(with_hints, tmp_path / "a") == _events_hash(every_gang, tmp_path / "b")
