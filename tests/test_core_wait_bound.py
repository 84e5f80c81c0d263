"""The wait bound (core.tiers.wait_bands, Gang.queue_key): tiers with `max_wait_seconds` are queued
by due time (submission + bound) in one band, so a lower tier gives way to newer higher-tier gangs
only during its first `bound` seconds of waiting; priority still decides preemption."""

from __future__ import annotations

from fixtures.core_gang import cluster, gang, profile, run_cycle, start
import pytest

from airflow_gpu.constants import TIER_INFERENCE, TIER_INTERACTIVE
from airflow_gpu.core.model import PodRequest
from airflow_gpu.core.preemption import PreemptionPolicy
from airflow_gpu.core.queue import queue_order
from airflow_gpu.core.snapshot import Snapshot
from airflow_gpu.core.tiers import TierPolicy, decide, wait_bands

PROD, BE = "production-training", "best-effort-training"
TIERS = {TIER_INTERACTIVE: TierPolicy(priority=1000, preemptible=False),
         PROD: TierPolicy(priority=100, preemptible=False, max_wait_seconds=0.0),
         TIER_INFERENCE: TierPolicy(priority=50, preemptible=False),
         BE: TierPolicy(priority=1, max_wait_seconds=100.0)}


def tiered(name: str, tier: str, created_at: float, tiers=None, gpus: int = 8, **kw):
    """A gang of `tier` as core.tiers.decide builds it (the scheduler's and the replay's path)."""
    d = decide((tiers or wait_bands(TIERS))[tier], (PodRequest(f"{name}-0", gpus=gpus),), checkpointable=True)
    return gang(name, 1, gpus, priority=d.priority, tier=tier, created_at=created_at, max_wait=d.max_wait,
                band_priority=d.band_priority, checkpointable=True, **kw)


def test_bounded_tiers_share_one_band_at_their_highest_priority():
    bands = wait_bands(TIERS)
    assert bands[PROD].band_priority == bands[BE].band_priority == 100
    assert bands[TIER_INTERACTIVE].band_priority is bands[TIER_INFERENCE].band_priority is None
    assert all(p.band_priority is None for p in wait_bands({PROD: TierPolicy(priority=100)}).values())


def test_a_lower_tier_gives_way_only_during_its_bound_then_keeps_its_place():
    be = tiered("be", BE, created_at=0.0)  # due at 100
    within = tiered("prod-50", PROD, created_at=50.0)  # due before it: goes first
    after = tiered("prod-150", PROD, created_at=150.0)  # due after it: the sweep keeps its place
    notebook = tiered("nb", TIER_INTERACTIVE, created_at=500.0)  # no bound, above the band: first
    serving = tiered("inf", TIER_INFERENCE, created_at=-50.0)  # no bound, below the band: after it
    order = [g.name for g in queue_order([serving, after, be, within, notebook])]
    assert order == ["nb", "prod-50", "be", "prod-150", "inf"]


def test_without_bounds_the_order_is_priority_then_creation_time():
    plain = {name: TierPolicy(priority=p.priority, preemptible=p.preemptible) for name, p in TIERS.items()}
    be = tiered("be", BE, 0.0, wait_bands(plain))
    prod = tiered("prod", PROD, 10_000.0, wait_bands(plain))
    assert be.queue_key == (-1, 0.0, "be") and [g.name for g in queue_order([be, prod])] == ["prod", "be"]


def test_an_overdue_sweep_takes_the_free_room_first_but_production_still_preempts_it():
    snap = Snapshot.from_nodes(cluster(2))
    running = [start(snap, tiered("r", BE, -1000.0), profile(), at=-500.0)]  # n0 busy, n1 free
    be = tiered("be", BE, created_at=0.0)
    prod = tiered("prod", PROD, created_at=150.0)
    policy = PreemptionPolicy(non_preemptible_tiers=frozenset({PROD, TIER_INTERACTIVE, TIER_INFERENCE}))
    res = run_cycle(snap, [prod, be], running, profile(), now=200.0, policy=policy)
    assert [d.gang.name for d in res.admitted] == ["be"]  # overdue: ahead of the newer production gang
    # production then preempts by priority (the order moved, preemption did not): a running sweep
    assert [p.victim_names for p in res.preemptions] == [("r",)] and res.reservation.gang.name == "prod"
    # within the bound production goes first and takes the free node itself
    early = tiered("prod-early", PROD, created_at=50.0)
    res = run_cycle(snap, [early, be], running, profile(), now=60.0, policy=policy)
    assert [d.gang.name for d in res.admitted] == ["prod-early"] and not res.preemptions


def test_the_config_knob_and_its_check(tmp_path, repo_root):
    import yaml

    from airflow_gpu.config import load_config

    cfg = load_config(repo_root / "examples" / "seed-quotas.yaml")  # the replay's default config
    tiers = cfg.tier_policies()
    assert tiers[BE].max_wait_seconds == 14400 and tiers[BE].band_priority == tiers[PROD].priority
    assert tiers[TIER_INTERACTIVE].band_priority is None
    doc = yaml.safe_load((repo_root / "examples" / "seed-quotas.yaml").read_text())
    next(t for t in doc["tiers"] if t["name"] == BE)["max_wait_seconds"] = -5
    path = tmp_path / "q.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(Exception, match="max_wait_seconds"):
        load_config(path)


def test_a_stopped_gang_is_due_a_bound_after_its_re_queue_not_at_once():
    """The replay re-queues a stopped gang with its place (created_at), as the scheduler relaunches
    it as a new gang: its due time counts from the re-queue, so a preempted sweep is not overdue at
    once (ahead of the production gang that just preempted it, to be preempted again)."""
    from airflow_gpu.sim.replay import _requeued

    be = tiered("be", BE, created_at=0.0)
    again = _requeued(be, now=5000.0)
    assert again.created_at == 0.0 and again.queue_key == (-100, 5100.0, "be")
    newer = tiered("prod", PROD, created_at=5050.0)
    assert [g.name for g in queue_order([again, newer])] == ["prod", "be"]
    plain = gang("plain", 1, 1)
    assert _requeued(plain, 5000.0) is plain  # no bound: nothing changes (today's replay, to the bit)


def test_the_scheduler_builds_its_gangs_with_the_tiers_band():
    """kube.convert (the scheduler's reader) gives a pending gang its tier's bound and band, so the
    scheduler queues as the replay does; a relaunch is a new PodGroup: due from its creation."""
    from airflow_gpu.kube.convert import ConversionContext, gang_from_k8s

    def pod(tier, created):
        return {"metadata": {"name": f"p-{tier}", "namespace": "a", "creationTimestamp": created},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                         "priorityClassName": f"airflow-gpu-{tier}"},
                "status": {"phase": "Pending"}}

    ctx = ConversionContext(tiers=wait_bands(TIERS))
    be = gang_from_k8s("a/be", None, [pod(BE, "2026-01-01T00:00:00Z")], ctx)
    prod = gang_from_k8s("a/prod", None, [pod(PROD, "2026-01-01T00:02:00Z")], ctx)
    assert (be.max_wait, be.band_priority, prod.max_wait, prod.band_priority) == (100.0, 100, 0.0, 100)
    assert [g.name for g in queue_order([prod, be])] == ["a/be", "a/prod"]  # due 00:01:40, before 00:02


def test_serving_work_behind_an_overdue_sweep_still_preempts_off_its_reserved_nodes():
    """core.queue.outranks_head: an overdue sweep at the head of line holds nodes for its start, but
    never preempts the inference gang behind it; that gang, of a tier without preempt_behind_head,
    may still preempt a running sweep elsewhere (the head keeps its reservation)."""
    snap = Snapshot.from_nodes(cluster(2))
    running = [start(snap, tiered("r0", BE, -9000.0, expected_duration=1000.0), profile(), at=0.0),  # n0 until 1000
               start(snap, tiered("r1", BE, -9000.0, gpus=4, expected_duration=5000.0), profile(), at=0.0)]
    tiers = wait_bands({**TIERS, TIER_INFERENCE: TierPolicy(priority=50, preemptible=False, max_wait_seconds=0.0)})
    be = tiered("be", BE, created_at=0.0, tiers=tiers)  # due at 100: overdue at 200
    serving = tiered("inf", TIER_INFERENCE, created_at=150.0, tiers=tiers, gpus=6)  # due at 150: behind it
    assert [g.name for g in queue_order([serving, be])] == ["be", "inf"]
    res = run_cycle(snap, [serving, be], running, profile(), now=200.0)
    assert res.reservation.gang.name == "be" and res.reservation.nodes == {"n0000"}
    assert [(p.gang.name, p.victim_names) for p in res.preemptions] == [("inf", ("r1",))]


def test_the_published_queue_says_when_a_sweep_keeps_its_place_and_nothing_for_a_bound_of_zero():
    """The scheduler publishes each waiting gang's due time (core.visibility: Gang.due_at, the same
    value its queue order reads) when its tier has a bound > 0; the page and `airflow-gpu queue` show
    it and decide nothing."""
    from fixtures.core_gang import state_of

    from airflow_gpu.core.queue import schedule_cycle
    from airflow_gpu.core.visibility import waiting_entries

    snap = Snapshot.from_nodes(cluster(1, gpus=8))
    busy = start(snap, gang("busy", 1, 8, created_at=0), profile(), at=0)
    pending = [tiered("sweep", BE, 10), tiered("prod", PROD, 50), tiered("plain", TIER_INFERENCE, 60)]
    state = state_of(snap, [busy])
    result = schedule_cycle(state, pending, profile(), 70, PreemptionPolicy())
    rows = {r.gang: r for r in waiting_entries(state, pending, result, profile(), 70)}
    assert rows["sweep"].due_at == 110 == pending[0].due_at and pending[0].queue_key[1] == 110
    assert rows["prod"].due_at is None and rows["plain"].due_at is None  # bound 0, and no bound
    assert rows["sweep"].as_dict()["due_at"] == 110


def test_the_replay_s_what_if_bounds_replace_the_file_s_and_none_is_strict_priority_order():
    """simulate replay --max-wait (sim.settings.with_wait_bounds): the bands are drawn again as the
    quota file's would be; {} leaves no band (queued by priority), an unknown tier names the known ones."""
    from dataclasses import make_dataclass

    from airflow_gpu.sim.settings import with_wait_bounds

    setting = make_dataclass("Tiered", ["tiers"], frozen=True)(wait_bands(TIERS))  # a Setting's field
    with pytest.raises(ValueError, match="no tier nope.*best-effort-training"):
        with_wait_bounds(setting, {"nope": 1.0})
    none = with_wait_bounds(setting, {}).tiers
    assert all(p.band_priority is None and p.max_wait_seconds is None for p in none.values())
    only_be = with_wait_bounds(setting, {BE: 60.0}).tiers
    assert only_be[BE].band_priority == TIERS[BE].priority and only_be[PROD].band_priority is None
