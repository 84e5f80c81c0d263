"""Prometheus metrics of the scheduler, all named airflow_gpu_*.

One registry per Scheduler (not the global default) so that tests and two replicas in one process
never share counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from airflow_gpu import constants as C
from airflow_gpu.core.model import GPU_MILLI
from airflow_gpu.scheduler.state import World

WAIT_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600)
# fine between 0.5 and 5 s, where a loaded scheduler's cycle falls: histogram_quantile interpolates within
# a bucket, so with 1 / 2.5 / 5 alone any p50 from 1 to 2.5 s read as one of a few values
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 1.5, 2, 2.5, 3, 4, 5, 7.5, 10, 15, 30)


class SchedulerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        r = self.registry
        self.queue_wait = Histogram(
            "airflow_gpu_queue_wait_seconds",
            "Time from a gang's creation until all its members were bound.",
            ["team", "tier", "gpu_product"],
            buckets=WAIT_BUCKETS,
            registry=r,
        )
        self.binding_latency = Histogram(
            "airflow_gpu_binding_latency_seconds",
            "Time to bind every member of an admitted gang (plan written to last Binding answered).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.cycle_seconds = Histogram(
            "airflow_gpu_scheduling_cycle_seconds", "Duration of one scheduling cycle.", buckets=LATENCY_BUCKETS, registry=r
        )
        # the cycle thread's own CPU: the duration less the time it waited for the interpreter and the
        # cores (the scheduler's other threads, the API server): what the cycle costs, apart from the machine
        self.cycle_cpu_seconds = Histogram(
            "airflow_gpu_scheduling_cycle_cpu_seconds", "CPU time of the scheduling thread in one cycle.",
            buckets=LATENCY_BUCKETS, registry=r
        )
        # where a cycle's time goes (kube-scheduler's framework_extension_point_duration_seconds): phase
        # world (read from the cache), plans (kept or closed), queue (the decisions), writes (handed
        # off: bindings started, wait reasons), status (PodGroups), publish (the queue page's document)
        self.cycle_phase_seconds = Histogram(
            "airflow_gpu_scheduling_cycle_phase_seconds", "Duration of each phase of a scheduling cycle.",
            ["phase"], buckets=LATENCY_BUCKETS, registry=r
        )
        self.pending_gangs = Gauge(
            "airflow_gpu_pending_gangs", "Gangs waiting to be admitted.", ["team", "tier", "reason"], registry=r
        )
        self.pending_gpus = Gauge(
            "airflow_gpu_pending_gpu_demand", "Whole GPUs asked for by pending gangs.", ["team", "tier"], registry=r
        )
        self.bindings = Counter("airflow_gpu_bindings", "Pods bound to a node.", registry=r)
        self.gangs_admitted = Counter(
            "airflow_gpu_gangs_admitted", "Gangs admitted (all members bound).", ["team", "tier"], registry=r
        )
        self.preemptions = Counter(
            "airflow_gpu_preemptions",
            "Gangs evicted to make room for a higher-priority or quota-owning gang.",
            ["team", "tier", "reason"],
            registry=r,
        )
        self.evicted_pods = Counter("airflow_gpu_evicted_pods", "Pods evicted by preemption.", registry=r)
        self.recoveries = Counter(
            "airflow_gpu_partial_gang_recoveries",
            "Gangs found partially bound after a restart and completed (or rolled back).",
            ["action"],
            registry=r,
        )
        self.allocation_ratio = Gauge(
            "airflow_gpu_allocation_ratio", "Allocated GPUs / allocatable GPUs.", ["gpu_product"], registry=r
        )
        self.fragmentation = Gauge(
            "airflow_gpu_fragmentation_ratio",
            "Share of free GPUs that sit on nodes which cannot host the largest pending per-node ask.",
            registry=r,
        )
        self.free_gpus = Gauge("airflow_gpu_free_gpus", "Free whole GPUs.", ["gpu_product"], registry=r)
        self.is_leader = Gauge("airflow_gpu_scheduler_is_leader", "1 when this replica holds the Lease.", registry=r)
        self.fence_refusals = Counter(
            "airflow_gpu_scheduler_fence_refusals",
            "Bindings not sent because the leader fence had expired (the Lease renewal lapsed).", registry=r
        )
        self.api_errors = Counter(
            "airflow_gpu_scheduler_api_errors", "Failed API writes by operation.", ["operation"], registry=r
        )
        self.writes_queued = Gauge(
            "airflow_gpu_scheduler_writes_queued",
            "Wait reasons, PodGroup statuses and bound annotations queued or being written (latest per gang and kind).",
            registry=r,
        )

    def serve(self, port: int, addr: str = "127.0.0.1"):
        """Start the /metrics HTTP endpoint in a thread; returns (server, thread)."""
        return start_http_server(port, addr=addr, registry=self.registry)

    def observe(self, world: World) -> None:
        """Gauges from one cycle's World: pending gangs and GPU demand, allocation, fragmentation."""
        self.pending_gangs.clear()
        self.pending_gpus.clear()
        counts: dict[tuple, int] = {}
        gpus: dict[tuple, int] = {}
        for unit, gang in world.pending:
            waits_on_quota = (unit.annotation(C.ANNOTATION_WAIT_REASON) or "").startswith(("team quota", "cohort quota"))
            key = (gang.team, gang.tier, "quota" if waits_on_quota else "capacity")
            counts[key] = counts.get(key, 0) + 1
            gpus[key[:2]] = gpus.get(key[:2], 0) + sum(m.gpus for m in gang.members)
        for labels, n in counts.items():
            self.pending_gangs.labels(*labels).set(n)
        for labels, n in gpus.items():
            self.pending_gpus.labels(*labels).set(n)
        per, frag = gpu_stats(world)
        for product, (used, total) in per.items():
            self.allocation_ratio.labels(product).set(used / total if total else 0.0)
            self.free_gpus.labels(product).set(total - used)
        self.fragmentation.set(frag)


def gpu_stats(world: World) -> tuple[dict[str, tuple[int, int]], float]:
    """Per product (allocated, allocatable) whole GPUs, and the fragmentation ratio: the share of free
    GPUs on nodes that cannot host the largest pending per-pod GPU ask."""
    snap = world.snapshot
    per: dict[str, tuple[int, int]] = {}
    free_whole = snap.whole_free_gpus()
    for i, node in enumerate(snap.nodes):
        if not node.gpu_count:
            continue
        a, t = per.get(node.gpu_product or "unknown", (0, 0))
        used = node.gpu_count - int(snap.gpu_free[i].sum()) / GPU_MILLI
        per[node.gpu_product or "unknown"] = (a + used, t + node.gpu_count)
    biggest = max((m.gpus for _, g in world.pending for m in g.members), default=0)
    total_free = int(free_whole.sum())
    if not total_free or biggest <= 1:
        return per, 0.0
    stranded = int(free_whole[free_whole < biggest].sum())
    return per, stranded / total_free
