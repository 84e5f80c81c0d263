"""The scheduling cycle: cache View -> World -> core.queue.schedule_cycle -> Bindings, Evictions,
PodGroup status, wait reasons and Events.

All-or-nothing on a cluster where a Binding is per pod. Before the first member of a gang is bound,
the gang's placement plan is written where only the scheduler writes: a ConfigMap in its own
namespace, named by the owner's UID, with the UIDs of the members and victims (state.Plan). Pod
owners can write annotations, so nothing the scheduler acts on is read from them. A plan read back
is re-checked by core.plans against the cluster as it is now (static fit of every placement,
victims still preemptible by this gang, quota) before it holds or does anything; one that fails
is dropped with a PlanRejected Event (its bound members rolled back). While
a plan exists its GPUs are held in every cycle's snapshot, so nothing else can take them. If the
scheduler dies between Bindings, the restarted one finds the plan with some members bound and
COMPLETES it (binds the rest where the plan says) - roll-forward, because a bound pod cannot be
unbound, only deleted, and deleting work that is already starting loses more than finishing the bind.
Only when completion is impossible (a planned node disappeared, or its capacity was taken by
something outside this scheduler) is the gang ROLLED BACK: its bound members are evicted, the plan
dropped, and the gang waits whole again.

Preemption uses the same plan in state "nominated": written before the first Eviction, it holds the
GPUs the victims free for the gang that asked; when they are free the gang binds. Victims get the
DisruptionTarget condition (PreemptionByScheduler) and an Eviction with their own grace period, so
the kubelet sends SIGTERM and the training loop checkpoints.

Back-off and timeout: a gang that did not fit is retried with exponential back-off
(core.queue.Queue: core.backoff.Backoff), reset whenever room may have appeared (a pod stopped holding resources, a
held plan was dropped, a node joined or changed, the reservation moved to another gang or ended).
With spec.scheduleTimeoutSeconds a PodGroup still waiting that long after scheduleStartTime (else
its creation) gets phase TimedOut and one ScheduleTimeout Event with its last wait reason; its pods
stay pending and it is still tried.

Bindings run off the cycle (scheduler/binding.py, as kube-scheduler's binding cycle): the cycle
assumes an admitted gang's placements in the cache and goes on; the gang's plan record, Bindings and
annotations are written meanwhile, and a failed binding forgets the pods it did not bind, so the
next cycle completes or rolls back the plan as above. Wait reasons and PodGroup status are written
off the cycle too, never after the bound annotations of a binding that started later.

Only the leader writes (LeaseElector.is_leader() is checked before every write batch and Binding).
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from functools import partial

from kubernetes import client
from kubernetes.client.rest import ApiException

from airflow_gpu import constants as C
from airflow_gpu.config.core import mig_gpus, preemption_policy_from_config, quota_book_from_config
from airflow_gpu.core.cycle import CycleState
from airflow_gpu.core.framework import Profile
from airflow_gpu.core.gang import GangDecision
from airflow_gpu.core.model import Placement
from airflow_gpu.core.plans import nomination_lapsed
from airflow_gpu.core.plugins.fgd import TypicalPods
from airflow_gpu.core.policies import DEFAULT_POLICY, make_profile
from airflow_gpu.core.preemption import PreemptionPlan
from airflow_gpu.core.backoff import Backoff
from airflow_gpu.core.estimate import RunLengths, StartCalibration
from airflow_gpu.core.reservation import ReservationHold
from airflow_gpu.core.queue import Queue
from airflow_gpu.kube import preemptions, queue_status
from airflow_gpu.kube.cleanup import expired_kept
from airflow_gpu.kube.convert import (
    ConversionContext,
    key_of,
    pod_is_terminating,
    pod_node,
    tiers_never_preempting,
)
from airflow_gpu.scheduler.actions import Api, default_identity, grace_seconds_of
from airflow_gpu.scheduler.binding import Writes, set_aside
from airflow_gpu.scheduler.cache import ClusterCache, View
from airflow_gpu.scheduler.heap import Heap
from airflow_gpu.scheduler.metrics import SchedulerMetrics
from airflow_gpu.scheduler.publish import Publisher, nominated_gangs
from airflow_gpu.scheduler.publish import document as publish_document
from airflow_gpu.scheduler.state import (
    PLAN_ADMITTED,
    PLAN_BINDING,
    PLAN_NOMINATED,
    Memo,
    Plan,
    Unit,
    World,
    build_world,
    plan_store_name,
)
from airflow_gpu.scheduler.waiting import RoomWatch, desired_podgroup_status, timeouts, wanted_status

__all__ = ["Scheduler", "Settings", "desired_podgroup_status"]

log = logging.getLogger(__name__)

REASON_WAITING = "FailedScheduling"
LEARNING = ("fgd", DEFAULT_POLICY)  # policies that need the workload's typical pods
REASON_REFRESH = 30.0
_DIGITS = re.compile(r"\d+(\.\d+)?")


OBSERVE_INTERVAL = 2.0  # seconds between refreshes of the gauges computed over every gang (metrics.observe)


@dataclass
class Settings:
    scheduler_name: str = C.DEFAULT_SCHEDULER_NAME
    policy: str = DEFAULT_POLICY  # the policy measured in sim/ is the one that runs
    interval: float = 2.0  # a cycle at least this often; watch events wake it sooner
    debounce: float = 0.02  # gather events arriving together into one cycle
    nomination_slack: float = 30.0  # a nomination lapses this long after its victims' grace periods
    bind_workers: int = 16  # Bindings of one gang in parallel; also the writes off the cycle (binding.py)
    backoff_base: float = 1.0  # first retry delay of a gang that did not fit; doubles per failure
    backoff_cap: float = 30.0  # ... up to this
    state_namespace: str = "default"  # the scheduler's own namespace: its Lease, plan records, published queue
    publish_interval: float = C.DEFAULT_PUBLISH_INTERVAL  # its queue is published at most this often (publish.py)
    kept_sweep_interval: float = 60.0  # kept pods past their keep-until time are deleted at most this late


class Scheduler:
    def __init__(
        self,
        api_client: client.ApiClient,
        quota_config=None,
        settings: Settings | None = None,
        elector=None,
        metrics: SchedulerMetrics | None = None,
        identity: str | None = None,
    ):
        self.settings = settings or Settings()
        self.identity = identity or default_identity()
        self.elector = elector
        self.metrics = metrics or SchedulerMetrics()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self.cache = ClusterCache(api_client, on_change=lambda *_: self._wake.set(),
                                  plan_namespace=self.settings.state_namespace,
                                  plan_selector=f"{C.LABEL_PLAN_OF}={self.settings.scheduler_name}")
        self.api = Api(api_client, component=f"{self.settings.scheduler_name}-scheduler", identity=self.identity)
        self.ctx = ConversionContext.from_config(quota_config)
        self.book = quota_book_from_config(quota_config)
        self.policy = preemption_policy_from_config(quota_config)
        self.mig_gpus = partial(mig_gpus, cfg=quota_config)  # what a MIG slice counts, by the config's rule
        profile: Profile = make_profile(self.settings.policy) if self.settings.policy not in LEARNING \
            else make_profile("bestfit")  # until there are pods to learn the workload's typical shapes from
        self._pool = ThreadPoolExecutor(max_workers=self.settings.bind_workers, thread_name_prefix="bind")
        self.writes = Writes(write_workers=self.settings.bind_workers)  # bindings, wait reasons, status: off the cycle
        self.metrics.writes_queued.set_function(self.writes.queued)
        self._written: dict[str, tuple] = {}  # owner key -> last annotations/status written (dedup only)
        # unit key -> (Unit, its has-plan and timed-out flags) whose PodGroup status needed no write: a
        # Unit the build kept (none of its objects changed) needs none again with the same flags
        self._settled: dict[str, tuple] = {}
        self._unsettled: set[str] = set()  # PodGroups whose status the last cycle left to write or to bind
        self._flagged: set[str] = set()  # with a plan or timed out at the last cycle
        self._status_cycle = -1  # the cycle whose World the statuses were last looked at in
        self._ignored: dict[str, tuple[str, ...]] = {}  # unit key -> this cycle's ignored hints (wait reasons)
        self.cycles = 0
        self._memo = Memo()  # conversions, the running snapshot and quota kept between cycles
        self._was_leader = False
        # the same bound on a reservation of unknown start as the replay measures (config `scheduling`)
        hold = (quota_config.scheduling.reservation_hold_seconds if quota_config is not None
                else C.DEFAULT_RESERVATION_HOLD_SECONDS)
        self.queue = Queue(profile, self.policy, Backoff(self.settings.backoff_base, self.settings.backoff_cap),
                           ReservationHold(hold, hold) if hold > 0 else None)
        self._room = RoomWatch()
        self._preempted: dict[str, preemptions.Preempted] | None = None  # the record, as last written
        self.publisher = Publisher(self.settings.publish_interval)
        self._swept = 0.0  # when kept pods were last swept
        self._observed = 0.0  # when the gauges were last refreshed
        self._cut = False  # the last cycle stopped at its admission limit (no room to bind)
        self.run_lengths = RunLengths()  # how long gangs ran, for the published estimated starts
        self.calibration = StartCalibration()  # how much later than estimated gangs started
        # tier -> the p90 error of the estimated start the replay measured (shown as an interval)
        self.estimate_error = dict(quota_config.scheduling.estimate_error_seconds) if quota_config is not None else {}

    @property
    def profile(self) -> Profile:
        """The placement profile the queue runs (learnt from the pods for FGD-based policies)."""
        return self.queue.profile

    @profile.setter
    def profile(self, profile: Profile) -> None:
        self.queue.profile = profile

    # --- lifecycle ------------------------------------------------------------------------
    def is_leader(self) -> bool:
        return self.elector is None or self.elector.is_leader()

    def _fenced(self) -> bool:
        """The fence before a Binding: a renewal in flight is waited for (up to renew_deadline), not refused."""
        return self.is_leader() or self.elector.wait_renewed(self.elector.renew_deadline)

    def run(self) -> None:
        self.cache.start()
        if not self.cache.wait_synced(timeout=60):
            log.warning("cache not synced after 60 s; scheduling with what is there")
        log.info("scheduler %s (%s) running", self.settings.scheduler_name, self.identity)
        heap = Heap()
        while not self._stop.is_set():
            self._wake.wait(self.settings.interval)
            if self._stop.is_set():
                break
            time.sleep(self.settings.debounce)
            self._wake.clear()
            try:
                self.cycle()
            except Exception:  # noqa: BLE001 - one bad cycle must not stop the scheduler
                log.exception("scheduling cycle failed")
                self._stop.wait(0.5)
            heap.after_cycle()
            if self._cut:  # the next cycle could admit next to nothing: let half the bindings end first
                self.writes.wait_room(self.writes.max_binding // 2, self.settings.interval)
        heap.close()
        self.writes.shutdown()  # the bindings in flight end first: their Bindings run on _pool
        self._pool.shutdown(wait=True)
        self.cache.stop()

    def stop(self) -> None:
        """Ask run() to return after the cycle in progress and the bindings in flight (a gang's
        Bindings are never cut in half)."""
        self._stop.set()
        self._wake.set()

    # --- one cycle ------------------------------------------------------------------------
    def cycle(self) -> World:
        began, began_cpu = time.perf_counter(), time.thread_time()
        now = time.time()
        # read before the view: a binding that ends after the view was read is still set aside (the
        # view is older than its end, e.g. it still assumes pods the binding has since forgotten)
        binding = self.writes.binding()
        view = self.cache.view()
        policy = self.policy.with_never_preempting(tiers_never_preempting(view.priorityclasses))
        world = build_world(view, self.settings.scheduler_name, self.ctx, now, self._memo, self.book, policy)
        # at once, so that no World's changes are missed (a standby learns too: it may lead next)
        self.run_lengths.observe(world.running, now, world.running_changed, world.running_by_name)
        self.calibration.observe(world.running_by_name, now)
        set_aside(world, binding)
        if self.cycles % 50 == 0:
            self._memo.prune(view)
            self._learn_profile()
        self.cycles += 1
        leader = self.is_leader()
        if leader and not self._was_leader:
            self._written.clear()  # another replica may have written since: trust only the API
            self._settled.clear()
        self._was_leader = leader
        self.metrics.is_leader.set(1 if leader else 0)
        if now - self._observed >= OBSERVE_INTERVAL:  # gauges over every gang: not each cycle of a churning cluster
            self._observed = now
            self.metrics.observe(world)
        if self.cycles % 50 == 1:
            self.calibration.forget(g.name for _, g in world.pending)
        mark = self._phase("world", began)
        if not leader:
            return world
        ignored: dict[str, dict[str, None]] = {}
        for unit, problem in world.ignored_hints:
            ignored.setdefault(unit.key, {})[problem] = None
        self._ignored = {key: tuple(problems) for key, problems in ignored.items()}
        self._sweep_kept(view, now)
        self._handle_plans(world, view, now)
        self._drop_plans(world, view)
        mark = self._phase("plans", mark)
        pending = [g for _, g in world.pending]
        units = {g.name: u for u, g in world.pending}
        if self._room.changed(world):
            self.queue.reset()
        state = world.state
        # no more admissions than can start binding: a cycle deciding 40,000 gangs of which a few
        # hundred may bind would decide them all again in the next (kube-scheduler takes one pod per cycle)
        result = self.queue.cycle(state, pending, now, policy, limit=self.writes.room())
        self._cut = result.cut
        mark = self._phase("queue", mark)
        if not result.cut and self._room.head_moved(result.reservation):  # cut: no head was looked for
            self.queue.reset()
        for d in result.admitted:  # not waited for: the next cycle sees their members assumed bound
            self._admit(units[d.gang.name], d, now)
        for plan in result.preemptions:
            self._preempt(world, units[plan.gang.name], plan, now)
        preempting = {p.gang.name for p in result.preemptions}
        waits = [(units[name], reason) for name, reason in result.waiting.items() if name not in preempting]
        waits += list(world.incomplete) + list(world.invalid)
        for unit, problem in world.ignored_hints:
            self._warn_once(unit, "InvalidHint", problem)
        timed_out, bad = timeouts(world, result.waiting, now)
        last = {u.key: (u, r) for u, r in waits + list(bad)}  # one write per gang: a later reason wins, as before
        for unit, reason in last.values():
            self._wait(unit, reason)
        mark = self._phase("writes", mark)
        self._sync_status(world, view, timed_out)
        mark = self._phase("status", mark)
        self._publish(world, view, state, result, now)
        self._phase("publish", mark)
        self.metrics.cycle_seconds.observe(time.perf_counter() - began)
        self.metrics.cycle_cpu_seconds.observe(time.thread_time() - began_cpu)
        return world

    def _phase(self, name: str, since: float) -> float:
        """Record a phase of the cycle that began at `since` (a perf_counter reading); returns now."""
        now = time.perf_counter()
        self.metrics.cycle_phase_seconds.labels(name).observe(now - since)
        return now

    def _publish(self, world: World, view: View, state: CycleState, result, now: float) -> None:
        """The queue as this cycle decided it, where the UI reads it (scheduler/publish.py); bounded rate."""
        admitted = {d.gang.name for d in result.admitted}
        waiting = frozenset(g.name for _, g in world.pending if g.name not in admitted) \
            | frozenset(k for k, plan in world.plans.items() if plan.state == PLAN_NOMINATED)
        if not self.publisher.due(waiting) or not self.is_leader():
            return
        started = time.perf_counter()
        nominated = nominated_gangs(world)
        units = {g.name: u for u, g in world.pending} | {g.name: u for u, g in nominated}
        tried = set(result.waiting) - {p.gang.name for p in result.preemptions}
        reasons = {name: self._written.get(("reason", u.key)) or u.annotation(C.ANNOTATION_WAIT_REASON) or ""
                   for name, u in units.items() if name not in tried}
        doc = publish_document(world, state, result, self.profile, self.settings.policy, self.settings.scheduler_name,
                               self.cycles, now, self.settings.publish_interval, nominated,
                               {k: v for k, v in reasons.items() if v}, self.ctx, mig_gpus=self.mig_gpus,
                               run_lengths=self.run_lengths, estimate_error=self.estimate_error,
                               calibration=self.calibration)
        try:
            blob = queue_status.encode(doc)
            self.api.write_queue_status(queue_status.manifest(self.settings.state_namespace,
                                                              self.settings.scheduler_name, blob))
        except Exception as exc:  # noqa: BLE001 - a failed publication must not fail the cycle's own work
            self.metrics.api_errors.labels("publish").inc()
            log.warning("queue not published: %s", getattr(exc, "status", None) or exc)
            return
        self.publisher.done(waiting, time.perf_counter() - started)

    def _learn_profile(self) -> None:
        """FGD-based policies score against the workload's typical pods: learnt from the pods seen
        (pending and running), refreshed every 50 cycles, as the simulator learns them from a trace."""
        if self.settings.policy not in LEARNING or not self._memo.pods:
            return
        self.profile = make_profile(self.settings.policy, typical=TypicalPods.from_pods(self._memo.pods.values()))

    # --- admission: plan, bind every member, finish ----------------------------------------
    def _admit(self, unit: Unit, decision: GangDecision, now: float) -> None:
        by_pod = {key_of(p): p for p in unit.pods}
        placements = [p for p in decision.placements if p.pod in by_pod]
        self._bind_off_cycle(unit, placements, lambda: self._plan_and_bind(unit, decision, placements, by_pod, now))

    def _plan_and_bind(self, unit: Unit, decision: GangDecision, placements: list[Placement],
                       by_pod: dict[str, dict], now: float) -> set[str]:
        recorded = len(placements) > 1  # one Binding is atomic by itself; several need the plan first
        if recorded:
            plan = Plan(PLAN_BINDING, {p.pod: p for p in placements}, now, borrowed=decision.borrowed)
            if not self._write_plan(unit, plan):
                return set()
        return self._bind_all(unit, placements, by_pod, decision.gang.created_at, decision.gang, decision.domain,
                              borrowed=decision.borrowed, recorded=recorded)

    def _bind_off_cycle(self, unit: Unit, placements: list[Placement], work) -> None:
        """Assume `placements` bound now (the next cycle counts them and does not decide the gang
        again) and run `work` (returns the pod keys it bound) in the binding cycle; the pods it did
        not bind are forgotten when it ends, failed or raised (kube-scheduler's ForgetPod)."""
        for p in placements:
            self.cache.assume_bound(p.pod, p.node)

        def binding() -> None:
            bound: set[str] = set()
            try:
                bound = work()
            finally:
                for p in placements:
                    if p.pod not in bound:
                        self.cache.forget_assumed(p.pod)
                if len(bound) < len(placements):
                    self._wake.set()  # forgotten pods are pending again: decide them without waiting for the interval

        self.writes.bind(unit.key, binding)

    def _write_plan(self, unit: Unit, plan: Plan | None) -> bool:
        """Store (or, with None, delete) the gang's plan record, tied to the UIDs of its owner, its
        members and its victims. False if it could not be: then nothing is done for the plan."""
        if not self.is_leader():
            return False
        ns, name = self.settings.state_namespace, plan_store_name(unit.owner_uid)
        if not unit.owner_uid:
            log.warning("gang %s: its owner has no uid; no plan can be tied to it", unit.key)
            return False
        try:
            if plan is None:
                gone = self.api.delete_plan(ns, name)
                self.cache.observe_delete("plans", gone or {"metadata": {"name": name, "namespace": ns}})
                return True
            uids = {key_of(p): (p.get("metadata") or {}).get("uid") or "" for p in unit.pods}
            plan = replace(plan, owner_key=unit.key, owner_uid=unit.owner_uid,
                           pod_uids={k: uids.get(k, "") for k in plan.placements})
            stored = self.api.write_plan(ns, name, self.settings.scheduler_name,
                                         plan.to_json(self.settings.scheduler_name))
            self.cache.observe_write("plans", stored)
            return True
        except ApiException as exc:
            self.metrics.api_errors.labels("plan").inc()
            log.warning("gang %s: plan record not %s (%s)", unit.key, "deleted" if plan is None else "written",
                        exc.status)
            return False

    def _close_plan(self, unit: Unit, borrowed: bool, nodes: dict[str, str]) -> None:
        """Every member is bound (`nodes`: pod key -> node): the plan is done. On borrowed quota the
        record stays (state admitted, with the bound pods' UIDs) so that reclaim knows it after a restart."""
        if borrowed:
            self._write_plan(unit, Plan(PLAN_ADMITTED, {k: Placement(k, n) for k, n in nodes.items()}, time.time(),
                                        borrowed=True))
        else:
            self._write_plan(unit, None)

    def _drop_plans(self, world: World, view: View) -> None:
        """Plans that failed the re-check (a bound part is rolled back) and stale records."""
        for unit, plan, reason in world.rejected_plans:
            log.warning("gang %s: plan rejected: %s", unit.key, reason)
            bound = unit.bound(view.assumed)
            if bound and plan.state == PLAN_BINDING:
                self._roll_back(unit, view, plan)
            else:
                self._write_plan(unit, None)
            if unit.owner is not None:
                self.api.event(unit.owner, "PlanRejected", f"the plan held for this gang is not acted on: "
                                                           f"{reason}; it queues again", "Warning")
        for key, reason in world.stale_plans:
            if not self.is_leader():
                return
            ns, _, name = key.partition("/")
            log.info("plan record %s deleted: %s", key, reason)
            try:
                gone = self.api.delete_plan(ns, name)
                self.cache.observe_delete("plans", gone or {"metadata": {"name": name, "namespace": ns}})
            except ApiException as exc:
                log.info("plan record %s not deleted (%s)", key, exc.status)

    def _bind_all(self, unit: Unit, placements: list[Placement], by_pod: dict[str, dict], created_at: float,
                  gang, domain: str = "", borrowed: bool = False, recovered: bool = False,
                  recorded: bool = True) -> set[str]:
        """Bind every placement (in parallel), then close the plan and tell the owner; returns the pod
        keys bound. Runs in the binding cycle (_bind_off_cycle): the placements are assumed already."""
        t0 = time.perf_counter()

        def bind(p: Placement) -> tuple[Placement, str]:
            if not self._fenced():
                self.metrics.fence_refusals.inc()
                return p, "not leader"
            pod = by_pod[p.pod]
            try:
                return p, self.api.bind(p.pod, p.node, (pod.get("metadata") or {}).get("uid"))
            except ApiException as exc:
                self.metrics.api_errors.labels("bind").inc()
                return p, f"{exc.status} {exc.reason}"

        results = list(self._pool.map(bind, placements)) if len(placements) > 1 else [bind(p) for p in placements]
        failed = [(p, r) for p, r in results if r not in ("bound", "already")]
        done = {p.pod for p, r in results if r in ("bound", "already")}
        self.metrics.bindings.inc(sum(1 for _, r in results if r == "bound"))
        if failed:
            # The plan stays: the next cycle completes it, or rolls it back if it cannot be completed.
            log.warning("gang %s: %d of %d bindings failed: %s", unit.key, len(failed), len(results), failed[:3])
            return done
        self.metrics.binding_latency.observe(time.perf_counter() - t0)
        team, tier = gang.team, gang.tier
        product = self._product_of(placements)
        self.metrics.queue_wait.labels(team, tier, product).observe(max(0.0, time.time() - created_at))
        self.metrics.gangs_admitted.labels(team, tier).inc()
        if recovered:
            self.metrics.recoveries.labels("completed").inc()
        if recorded or borrowed:
            nodes = {key_of(p): pod_node(p) or "" for p in unit.bound({})} | {p.pod: p.node for p in placements}
            self._close_plan(unit, borrowed, nodes)
        owner = unit.owner
        if owner is None:
            return done
        annotations = {C.ANNOTATION_WAIT_REASON: None}
        if unit.podgroup is not None:
            annotations[C.ANNOTATION_SCHEDULED] = f"{len(unit.bound({})) + len(placements)}/{unit.min_member}"
        if borrowed:  # shown to users; after a restart the scheduler reads its own plan record instead
            annotations[C.ANNOTATION_BORROWED] = "true"
        bound_on = self._gpu_product_name(placements)
        if bound_on and unit.podgroup is not None:
            annotations[C.ANNOTATION_GPU_PRODUCT] = bound_on
        needs_patch = unit.podgroup is not None or borrowed or unit.annotation(C.ANNOTATION_WAIT_REASON)
        message = ""
        if unit.podgroup is not None:
            nodes: dict[str, int] = {}
            for p in placements:
                nodes[p.node] = nodes.get(p.node, 0) + 1
            where = ", ".join(f"{n} x{c}" for n, c in sorted(nodes.items()))
            verb = "completed binding" if recovered else "bound"
            message = f"{verb} {len(placements)} pods: {where}" + (f" ({domain})" if domain else "")
        if needs_patch or message:
            # off the binding, as a wait reason is written: after one being written, never before
            self.writes.write("bound", unit.key, annotations,
                              partial(self._tell_bound, unit, annotations if needs_patch else None, message))
        return done

    def _tell_bound(self, unit: Unit, annotations: dict | None, message: str) -> None:
        if annotations is not None:
            try:
                self._patch_owner_annotations(unit, annotations)
            except ApiException as exc:
                log.info("gang %s: annotations not updated after binding (%s)", unit.key, exc.status)
        if message:
            self.api.event(unit.podgroup, "Scheduled", message)

    def _gpu_product_name(self, placements: list[Placement]) -> str:
        """The quota file's name of the one GPU product the GPU placements are on ("" for none or several)."""
        names = {label: name for name, label in self.ctx.product_labels.items()}
        labels = set()
        for p in placements:
            if not (p.gpu_shares or p.mig_profile):
                continue  # a CPU-only member (a launcher) says nothing of the gang's product
            node = self.cache.get("nodes", p.node)
            labels.add((((node or {}).get("metadata") or {}).get("labels") or {}).get(C.NODE_GPU_PRODUCT) or "")
        if len(labels) != 1 or "" in labels:
            return ""
        label = labels.pop()
        return names.get(label, label)

    def _product_of(self, placements: list[Placement]) -> str:
        for node in (self.cache.get("nodes", n) for n in sorted({p.node for p in placements})):
            if node is None:
                continue
            product = ((node.get("metadata") or {}).get("labels") or {}).get(C.NODE_GPU_PRODUCT)
            if product:
                return product
        return "none"

    # --- plans found on PodGroups: complete, wait for victims, or roll back ----------------
    def _handle_plans(self, world: World, view: View, now: float) -> None:
        for key, plan in world.plans.items():
            unit = world.units[key]
            pending = unit.pending(self.settings.scheduler_name, view.assumed)
            by_pod = {key_of(p): p for p in unit.pods}
            bound_before = len(unit.bound(view.assumed))
            if not pending:
                self._close_plan(unit, plan.borrowed, {key_of(p): pod_node(p) or view.assumed.get(key_of(p), "")
                                                       for p in unit.bound(view.assumed)})  # every member is bound
                continue
            todo = [plan.placements[key_of(p)] for p in pending if key_of(p) in plan.placements]
            if world.plan_ready.get(key) and todo:
                g = unit.gang  # converted once, by build_world
                recovered = plan.state == PLAN_BINDING and bound_before > 0
                self._bind_off_cycle(unit, todo, partial(self._bind_all, unit, todo, by_pod, g.created_at, g,
                                                         borrowed=plan.borrowed, recovered=recovered))
                continue
            alive = [v for v in plan.victims if v in view.pods]
            grace = max((grace_seconds_of(view.pods[v]) or 30 for v in alive), default=0)
            if plan.state == PLAN_NOMINATED and alive and not nomination_lapsed(plan.at, now, grace,
                                                                                self.settings.nomination_slack):
                self._in_parallel([lambda v=v: self._evict(v, view.pods[v], f"preempted for gang {unit.key}")
                                   for v in alive if not pod_is_terminating(view.pods[v])])  # a restart between plan and Eviction
                self._wait(unit, f"preempting: waiting for {len(alive)} pod(s) of lower priority to stop "
                                 f"(checkpoint grace period up to {grace} s)")
                continue
            if bound_before:
                self._roll_back(unit, view, plan)
            else:
                self._write_plan(unit, None)  # lapsed: the gang queues again from scratch
                if unit.owner is not None:
                    self.api.event(unit.owner, "PlanDropped", "the placement held for this gang is no longer "
                                                              "possible; it queues again", "Warning")

    def _roll_back(self, unit: Unit, view: View, plan: Plan) -> None:
        bound = unit.bound(view.assumed)
        log.warning("gang %s: plan cannot be completed; evicting its %d bound member(s)", unit.key, len(bound))
        for pod in bound:
            self._evict(key_of(pod), pod, f"gang {unit.key} could not be completed; rolled back")
        self._write_plan(unit, None)
        self.metrics.recoveries.labels("rolled_back").inc()
        if unit.owner is not None:
            self.api.event(unit.owner, "RolledBack", f"evicted {len(bound)} bound member(s): the rest of the gang "
                                                     f"could not be placed where its plan said", "Warning")

    # --- preemption -----------------------------------------------------------------------
    def _preempt(self, world: World, unit: Unit, plan: PreemptionPlan, now: float) -> None:
        victim_pods: list[tuple[str, dict]] = []
        for rg in plan.victims:
            vunit = world.running_units.get(rg.gang.name)
            if vunit is not None:
                victim_pods += [(key_of(p), p) for p in vunit.bound({})]
        by_pod = {key_of(p): p for p in unit.pods}
        placements = {p.pod: p for p in plan.placements if p.pod in by_pod}
        nomination = Plan(PLAN_NOMINATED, placements, now, victims=tuple(k for k, _ in victim_pods),
                          borrowed=plan.borrowed,
                          victim_uids={k: (p.get("metadata") or {}).get("uid") or "" for k, p in victim_pods})
        if unit.owner is None or not self._write_plan(unit, nomination):
            return
        names = ", ".join(plan.victim_names)
        whom = "of lower priority or borrowing this team's quota" if plan.reclaim else "of lower priority"
        message = (f"preempting {len(plan.victims)} gang(s) {whom} ({names}); about "
                   f"{plan.lost_gpu_seconds:.0f} GPU-seconds since their last checkpoints are lost, and "
                   f"{plan.restart_gpu_seconds:.0f} restarting them")
        self._record_preemptions(victim_pods, nomination, plan.gang.name, now)
        self.api.event(unit.owner, "Preempting", message)
        self._wait(unit, f"preempting: waiting for {len(victim_pods)} pod(s) {whom} to stop")
        writes = []  # hundreds of victims at scale: their Events and Evictions go out in parallel
        for rg in plan.victims:
            reason = "reclaim" if rg.gang.team != plan.gang.team else "priority"
            self.metrics.preemptions.labels(rg.gang.team, rg.gang.tier, reason).inc()
            vunit = world.running_units.get(rg.gang.name)
            if vunit is not None and vunit.owner is not None:
                why = "its team's quota is reclaimed" if reason == "reclaim" else f"priority {plan.gang.priority}"
                writes.append(lambda owner=vunit.owner, why=why: self.api.event(
                    owner, "Preempted", f"preempted by gang {plan.gang.name} ({why}); each pod gets its grace "
                                        f"period to checkpoint", "Warning"))
        message = f"preempted by gang {plan.gang.name} (priority {plan.gang.priority})"
        writes += [lambda key=key, pod=pod: self._evict(key, pod, message) for key, pod in victim_pods]
        self._in_parallel(writes)

    def _record_preemptions(self, victim_pods: list[tuple[str, dict]], nomination: Plan, preemptor: str,
                            now: float) -> None:
        """Say who preempted whom where only the scheduler writes, before any eviction: the Airflow
        side reads it to count a preemption, not an interruption (kube/preemptions.py says why).
        A failed write is logged, not fatal: the preemption goes on, reported as an interruption."""
        ns, name = self.settings.state_namespace, self.settings.scheduler_name
        entries = [preemptions.Preempted(nomination.victim_uids.get(k, ""), k, preemptor, now) for k, _ in victim_pods]
        try:
            if self._preempted is None:  # after a start: learn what is recorded, to expire it
                self._preempted = preemptions.read_record(self.api.read_preemptions(ns, name))
            self._preempted.update({e.uid: e for e in entries if e.uid})
            expired = preemptions.expired_uids(self._preempted, now)
            self.api.record_preemptions(ns, name, entries, expired)
            for uid in expired:
                self._preempted.pop(uid, None)
        except ApiException as exc:
            self._preempted = None  # read it again next time
            log.warning("gang %s: the record of its preempted pods was not written (%s); they will be "
                        "reported as interruptions", preemptor, exc.status)

    def _evict(self, key: str, pod: dict, message: str) -> None:
        if not self.is_leader():
            return
        try:
            self.api.mark_disruption(key, message)
        except ApiException as exc:
            log.info("pod %s: DisruptionTarget not set (%s)", key, exc.status)
        try:
            outcome = self.api.evict(key, grace_seconds_of(pod))
            if outcome == "evicted":
                self.metrics.evicted_pods.inc()
            elif outcome == "blocked":
                log.info("pod %s: eviction blocked by a PodDisruptionBudget; retrying next cycle", key)
        except ApiException as exc:
            self.metrics.api_errors.labels("evict").inc()
            log.warning("pod %s: eviction failed: %s %s", key, exc.status, exc.reason)

    def _sweep_kept(self, view: View, now: float) -> None:
        """Pods kept by on_finish_action go when their keep-until time has passed, whether or not Airflow
        runs anything (kube/cleanup.py's rule). Through the Eviction API, which deletes an ended pod at
        once (no PodDisruptionBudget applies to it), so the scheduler needs no right to delete pods."""
        if now - self._swept < self.settings.kept_sweep_interval:
            return
        self._swept = now
        for pod in expired_kept(view.pods.values(), dt.datetime.fromtimestamp(now, dt.timezone.utc)):
            key = key_of(pod)
            try:
                if self.api.evict(key, None) == "evicted":
                    log.info("pod %s: kept until %s, deleted", key,
                             pod["metadata"]["annotations"][C.ANNOTATION_KEEP_UNTIL])
            except ApiException as exc:
                self.metrics.api_errors.labels("evict").inc()
                log.warning("pod %s: kept pod past its time not deleted: %s %s", key, exc.status, exc.reason)

    # --- wait reasons, PodGroup status ----------------------------------------------------
    def _wait(self, unit: Unit, reason: str) -> None:
        """Write the gang's wait reason (annotation and Event) off the cycle, if it changed."""
        owner = unit.owner
        if owner is None or not self.is_leader() or self.writes.is_binding(unit.key):
            return  # a gang binding waits for nothing
        reason = "; ".join((reason, *self._ignored.get(unit.key, ())))  # ignored hints: said while it waits
        if unit.annotation(C.ANNOTATION_WAIT_REASON) == reason or self._written.get(("reason", unit.key)) == reason:
            return
        # A reason that differs only in its numbers ("starts in ~41 s" -> "~40 s") is rewritten at most
        # every REASON_REFRESH seconds: the API is not a ticker.
        shape = _DIGITS.sub("#", reason)
        last = self._written.get(("shape", unit.key))
        if last and last[0] == shape and time.monotonic() - last[1] < REASON_REFRESH:
            return
        self.writes.write("reason", unit.key, reason, partial(self._write_wait, unit, reason, shape))

    def _write_wait(self, unit: Unit, reason: str, shape: str) -> None:
        owner = unit.owner
        if not self.is_leader():
            return
        try:
            self._patch_owner_annotations(unit, {C.ANNOTATION_WAIT_REASON: reason})
        except ApiException as exc:
            log.info("gang %s: wait reason not written (%s)", unit.key, exc.status)
            return
        self._written[("reason", unit.key)] = reason
        self._written[("shape", unit.key)] = (shape, time.monotonic())
        self.api.event(owner, REASON_WAITING, reason, "Warning")

    def _warn_once(self, unit: Unit, reason: str, message: str) -> None:
        """A Warning Event on the gang's owner, once per message while this replica leads (a running
        gang's invalid hint is ignored, not a reason to stop it: no wait reason to write)."""
        owner = unit.owner or (unit.pods[0] if unit.pods else None)
        if owner is None or self._written.get((reason, unit.key, message)):
            return
        log.warning("gang %s: %s", unit.key, message)
        self._written[(reason, unit.key, message)] = True
        self.api.event(owner, reason, message, "Warning")

    def _patch_owner_annotations(self, unit: Unit, annotations: dict) -> None:
        if unit.podgroup is not None:
            self.cache.observe_write("podgroups", self.api.patch_podgroup_annotations(unit.key, annotations))
        else:
            self.cache.observe_write("pods", self.api.patch_pod_annotations(key_of(unit.owner), annotations))
        if C.ANNOTATION_WAIT_REASON in annotations:
            self._written[("reason", unit.key)] = annotations[C.ANNOTATION_WAIT_REASON]

    def _sync_status(self, world: World, view: View, timed_out: dict[str, str] | None = None) -> None:
        """PodGroup status as the coscheduling controller keeps it: phase and member counts. The
        first write of phase TimedOut also records a ScheduleTimeout Event (once: after a restart
        the phase read back from the API is already TimedOut)."""
        timed_out = timed_out or {}
        binding = self.writes.binding()  # their status is the next cycle's, once they are bound or forgotten
        flagged = set(world.plans) | set(timed_out)
        # the changes are since the World before: a cycle that did not get here (it failed, or this
        # replica did not lead) leaves changes unseen, so every PodGroup is looked at again
        missed, self._status_cycle = self._status_cycle != self.cycles - 1, self.cycles
        if world.touched is None or not self._settled or missed:
            self._settled = {}
            keys: Iterable[str] = world.units
        else:  # a settled unit stays so while it is the same Unit with the same flags: look at the others
            keys = sorted(world.touched | self._unsettled | flagged | self._flagged | binding)
        self._flagged, self._unsettled = flagged, set()
        for key in keys:
            unit = world.units.get(key)
            pg = unit.podgroup if unit is not None else None
            if pg is None or key in binding:
                self._settled.pop(key, None)
                if pg is not None:
                    self._unsettled.add(key)
                continue
            flags = (key in world.plans, key in timed_out)
            hit = self._settled.get(key)
            if hit is not None and hit[0] is unit and hit[1] == flags:
                continue
            self._settled.pop(key, None)
            self._unsettled.add(key)
            want = wanted_status(world, unit, flags[0], flags[1], view.assumed)
            if want is None:
                continue  # an invalid minMember: reported as the wait reason
            have = pg.get("status") or {}
            if all(have.get(k) == v for k, v in want.items()) or self._written.get(("status", key)) == want:
                self._settled[key] = (unit, flags)
                self._unsettled.discard(key)
                continue
            self.writes.write("status", key, want, partial(self._write_status, key, pg, want, have, timed_out))

    def _in_parallel(self, writes: list) -> None:
        """A cycle's independent writes (a preemption's Events and Evictions: one per victim) on the
        bind pool: with hundreds of victims, one after the other they made most of the cycle (issue
        31). Each write is a leaf (it waits on no other pool task), so sharing the pool with the
        Bindings of the gangs binding cannot deadlock."""
        if len(writes) > 1:
            list(self._pool.map(lambda write: write(), writes))
        elif writes:
            writes[0]()

    def _write_status(self, key: str, pg: dict, want: dict, have: dict, timed_out: dict[str, str]) -> None:
        if self.is_leader():
            try:
                self.cache.observe_write("podgroups", self.api.patch_podgroup_status(key, want))
                self._written[("status", key)] = want
                if want["phase"] == C.PODGROUP_PHASE_TIMED_OUT and have.get("phase") != C.PODGROUP_PHASE_TIMED_OUT:
                    self.api.event(pg, C.REASON_SCHEDULE_TIMEOUT, timed_out[key], "Warning")
            except ApiException as exc:
                log.info("PodGroup %s: status not updated (%s)", key, exc.status)
