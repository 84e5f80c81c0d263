"""Prometheus metrics of the scheduler, all named airflow_gpu_*.

One registry per Scheduler (not the global default) so that tests and two replicas in one process
never share counters.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

WAIT_BUCKETS = (0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600, 4 * 3600, 12 * 3600, 24 * 3600)
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)


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
        self.api_errors = Counter(
            "airflow_gpu_scheduler_api_errors", "Failed API writes by operation.", ["operation"], registry=r
        )

    def serve(self, port: int, addr: str = "127.0.0.1"):
        """Start the /metrics HTTP endpoint in a thread; returns (server, thread)."""
        return start_http_server(port, addr=addr, registry=self.registry)
