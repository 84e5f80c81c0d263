"""The scheduler publishes its queue (Kueue's visibility API: the queue manager serves what it knows).

After a leader cycle, at most every `publish_interval` seconds, and sooner (but not more than once a
second) when the set of waiting gangs changed, the leader writes one ConfigMap in its own namespace
(kube/queue_status.py): every waiting gang with its position in the cluster's queue and its team's,
the cycle's wait reason and the estimated start and nodes computed by core.visibility with the
cycle's own state, profile, quota book and reservation; the gangs whose members are not all there;
the running gangs; and the cluster picture. The UI plugin and `airflow-gpu queue` show exactly that.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from airflow_gpu import constants as C
from airflow_gpu.config.core import mig_gpus as config_mig_gpus
from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.estimate import RunLengths, StartCalibration
from airflow_gpu.core.framework import Profile
from airflow_gpu.core.queue import CycleResult
from airflow_gpu.core.visibility import cluster_picture, gpus_of, waiting_entries
from airflow_gpu.kube import queue_status as Q
from airflow_gpu.kube.convert import ConversionContext, gang_identity, key_of, pod_node
from airflow_gpu.scheduler.state import PLAN_NOMINATED, World

log = logging.getLogger(__name__)

MIN_GAP = 1.0  # seconds between two writes, however often the waiting set changes
COST_SHARE = 0.2  # publishing takes at most this share of the leader's time (its estimates cost, at scale)


class Publisher:
    """When to publish (bounded rate) and what: the document of one cycle."""

    def __init__(self, interval: float, clock: Callable[[], float] = time.monotonic):
        if interval <= 0:
            raise ValueError(f"publish interval: {interval} must be > 0 seconds")
        self.interval = interval
        self.clock = clock
        self._last: float | None = None
        self._waiting: frozenset[str] | None = None
        self._cost = 0.0

    def due(self, waiting: frozenset[str]) -> bool:
        """The interval passed, or the waiting set changed and MIN_GAP passed; and in both cases the
        last publication's cost times (1 - COST_SHARE) / COST_SHARE: with a thousand waiting gangs a
        document takes seconds (every gang's start estimate), and the cycles between must not wait
        for one every second (issue 31)."""
        now = self.clock()
        if self._last is None:
            return True
        since = now - self._last - self._cost * (1 - COST_SHARE) / COST_SHARE
        return since >= self.interval or (waiting != self._waiting and since >= min(MIN_GAP, self.interval))

    def done(self, waiting: frozenset[str], cost: float = 0.0) -> None:
        """`cost`: the seconds this publication took."""
        self._last, self._waiting, self._cost = self.clock(), waiting, cost


def document(world: World, state: CycleState, result: CycleResult, profile: Profile, profile_name: str,
             scheduler_name: str, cycle: int, now: float, interval: float,
             nominated: list, reasons: dict[str, str], ctx: ConversionContext | None = None,
             mig_gpus: Callable[[str], float] = config_mig_gpus, run_lengths: RunLengths | None = None,
             estimate_error: dict[str, float] | None = None,
             calibration: StartCalibration | None = None) -> dict:
    """The published queue of one cycle. `state`: the cycle's state before schedule_cycle;
    `nominated`: [(unit, gang)] of held preemption plans still waiting for their victims; `reasons`:
    gang name -> the last wait reason written, for gangs the cycle did not try (back-off) or that
    preempt. `ctx`: the scheduler's conversion context, for the team (the namespace's) and tier (the
    PriorityClass's) of gangs not read yet: never their labels. `mig_gpus`: GPUs of one MIG slice by
    the scheduler's config (config.core.mig_gpus). `run_lengths`: the runs the scheduler learned
    (core.estimate.RunLengths), for the estimated starts of gangs without a declared duration;
    `calibration`: the stretch learned from earlier estimates and real starts (StartCalibration);
    `estimate_error`: tier -> seconds (config scheduling.estimate_error_seconds, measured by the replay):
    an entry with an estimated start carries its tier's as `estimate_error` (None: not measured)."""
    ctx = ctx or ConversionContext()
    units = {g.name: u for u, g in world.pending} | {g.name: u for u, g in nominated}
    pending = [g for _, g in world.pending]
    entries = waiting_entries(state, pending, result, profile, now,
                              nominated=[(g, sorted({p.node for p in world.plans[u.key].placements.values()}))
                                         for u, g in nominated], reasons=reasons, mig_gpus=mig_gpus,
                              run_lengths=run_lengths, calibration=calibration)
    waiting = []
    errors = estimate_error or {}
    for e in entries:
        unit = units[e.gang]
        waiting.append(e.as_dict() | {"namespace": unit.key.partition("/")[0],
                                      "ti": Q.task_instance_of(unit.pods),
                                      "estimate_error": errors.get(e.tier) if e.estimated_start is not None else None})
    incomplete = []
    for unit, reason in list(world.incomplete) + list(world.invalid):
        who = gang_identity(unit.key, unit.podgroup, unit.pods, ctx)
        incomplete.append({"gang": unit.key, "namespace": unit.key.partition("/")[0], "team": who.team, "tier": who.tier,
                           "reason": reason, "ti": Q.task_instance_of(unit.pods)})
    running = []
    # rows encode would cut are not built (at 5,000 nodes, half the running gangs): counted instead
    shown = world.running[:Q.MAX_RUNNING]
    for rg in shown:
        unit = world.running_units[rg.gang.name]
        pods = []
        for pod in unit.pods:
            node = pod_node(pod)
            if node:
                known = world.nodes.get(node)
                pods.append({"name": key_of(pod), "node": node,
                             "capacity_type": known.capacity_type if known else "unknown"})
        interruptions, preemptions = Q.relaunches(unit.pods)
        running.append({"gang": unit.key, "namespace": unit.key.partition("/")[0], "team": rg.gang.team,
                        "tier": rg.gang.tier, "gpus": gpus_of(rg.gang.members, mig_gpus), "pods": pods,
                        "started_at": rg.started_at or None,
                        "last_checkpoint_at": Q.last_checkpoint_at(unit.annotation(C.ANNOTATION_LAST_CHECKPOINT_TIME)),
                        "interruptions": interruptions, "preemptions": preemptions,
                        "ti": Q.task_instance_of(unit.pods)})
    held = {p.node for plan in world.plans.values() for p in plan.placements.values()}
    typical = [m for g in pending for m in g.members] + [m for r in world.running for m in r.gang.members]
    return {"version": Q.VERSION, "generated_at": now, "cycle": cycle, "scheduler": scheduler_name,
            "profile": profile_name, "publish_interval": interval, "waiting": waiting, "incomplete": incomplete,
            "running": running, "cluster": cluster_picture(world.snapshot, held, typical),
            "truncated": {"running": len(world.running) - len(shown)}}


def nominated_gangs(world: World) -> list:
    """[(unit, gang)] of the held preemption plans whose gang still waits for its victims (its
    pending members, as build_world converted them; unreadable ones are left out)."""
    return [(world.units[key], world.units[key].gang) for key, plan in world.plans.items()
            if plan.state == PLAN_NOMINATED and world.units[key].gang is not None]
