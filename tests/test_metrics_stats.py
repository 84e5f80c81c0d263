"""The operator-side metrics (airflow_gpu.metrics) through Airflow's Stats to a real StatsD UDP
socket, set up from `[metrics]` as Airflow's task runner does; names equal the scheduler's."""

from __future__ import annotations

import socket

import pytest
from airflow.sdk._shared.observability.metrics.base_stats_logger import NoStatsLogger
from airflow.sdk.observability import stats
from airflow.sdk.observability.metrics.stats_utils import get_stats_factory

from airflow_gpu import metrics
from airflow_gpu.scheduler.metrics import SchedulerMetrics


@pytest.fixture
def statsd_socket(monkeypatch):
    """A UDP socket on a free port, with Stats initialised to send StatsD (influx tags) to it."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))
    sock.settimeout(5)
    for key, value in {"STATSD_ON": "True", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(sock.getsockname()[1]),
                       "STATSD_PREFIX": "af", "STATSD_INFLUXDB_ENABLED": "True"}.items():
        monkeypatch.setenv(f"AIRFLOW__METRICS__{key}", value)
    stats.initialize(factory=get_stats_factory(), export_legacy_names=False)
    try:
        yield sock
    finally:
        stats.initialize(factory=NoStatsLogger, export_legacy_names=False)
        sock.close()


def received(sock: socket.socket, count: int) -> list[tuple[str, dict[str, str], str, str]]:
    """`count` datagrams parsed as (name, tags, value, type) from `prefix.name,k=v,...:value|type`;
    the value keeps its sign (a gauge delta) and is otherwise compared as a number."""
    out = []
    for _ in range(count):
        line = sock.recv(65536).decode()
        head, _, rest = line.partition(":")
        value, _, kind = rest.partition("|")
        name, *pairs = head.split(",")
        number = f"{float(value):g}"
        out.append((name, dict(p.split("=", 1) for p in pairs), "+" + number if value[0] == "+" else number, kind))
    return out


def test_each_metric_reaches_statsd_with_its_tags(statsd_socket):
    metrics.observe_queue_wait("vision", "production-training", "A100-80GB", 12.5)
    metrics.change_pending_gpu_demand("vision", "production-training", 8)
    metrics.change_pending_gpu_demand("vision", "production-training", -8)
    metrics.count_interruption("nlp", "best-effort-training", "H100", "spot")
    metrics.count_lost_gpu_seconds("nlp", "best-effort-training", "interruption", 480.25)
    metrics.set_checkpoint_age("nlp", "best-effort-training", "finetune", "train", 95)

    assert received(statsd_socket, 6) == [
        ("af.airflow_gpu_queue_wait_seconds", {"team": "vision", "tier": "production-training",
                                               "gpu_product": "A100-80GB"}, "12500", "ms"),
        ("af.airflow_gpu_pending_gpu_demand", {"team": "vision", "tier": "production-training"}, "+8", "g"),
        ("af.airflow_gpu_pending_gpu_demand", {"team": "vision", "tier": "production-training"}, "-8", "g"),
        ("af.airflow_gpu_interruptions", {"team": "nlp", "tier": "best-effort-training", "gpu_product": "H100",
                                          "capacity_type": "spot"}, "1", "c"),
        ("af.airflow_gpu_lost_gpu_seconds", {"team": "nlp", "tier": "best-effort-training", "cause": "interruption"},
         "480.25", "c"),
        ("af.airflow_gpu_checkpoint_age_seconds", {"team": "nlp", "tier": "best-effort-training",
                                                   "dag_id": "finetune", "task_id": "train"}, "95", "g"),
    ]


def test_tag_values_cannot_break_the_statsd_line(statsd_socket):
    metrics.count_interruption("a,b=c", "t:1", "A100 80GB|x", "spot")
    [(name, tags, value, kind)] = received(statsd_socket, 1)
    assert (name, value, kind) == ("af.airflow_gpu_interruptions", "1", "c")
    assert tags == {"team": "a_b_c", "tier": "t_1", "gpu_product": "A100_80GB_x", "capacity_type": "spot"}


def test_bad_values_are_refused_before_anything_is_sent(statsd_socket):
    with pytest.raises(ValueError, match="queue wait must be a finite number of seconds"):
        metrics.observe_queue_wait("t", "x", "H100", -1)
    with pytest.raises(ValueError, match="cause must be one of interruption, preemption"):
        metrics.count_lost_gpu_seconds("t", "x", "oops", 5)
    with pytest.raises(ValueError, match="checkpoint age"):
        metrics.set_checkpoint_age("t", "x", "d", "k", float("nan"))
    with pytest.raises(ValueError, match="pending GPU demand change"):
        metrics.change_pending_gpu_demand("t", "x", True)
    metrics.count_lost_gpu_seconds("t", "x", "preemption", 0)  # nothing lost: nothing sent
    metrics.change_pending_gpu_demand("t", "x", 0)
    statsd_socket.settimeout(0.5)
    with pytest.raises(socket.timeout):
        statsd_socket.recv(65536)


def test_names_and_labels_match_the_scheduler_prometheus_metrics():
    exported = {m.name: m for m in SchedulerMetrics().registry.collect()}
    queue_wait = exported[metrics.QUEUE_WAIT_SECONDS]
    pending = exported[metrics.PENDING_GPU_DEMAND]
    assert queue_wait.type == "histogram" and pending.type == "gauge"
    sample_labels = SchedulerMetrics()
    sample_labels.queue_wait.labels("t", "x", "H100").observe(1)
    sample_labels.pending_gpus.labels("t", "x").set(1)
    got = {s.name: set(s.labels) - {"le"} for m in sample_labels.registry.collect() for s in m.samples}
    assert got[metrics.QUEUE_WAIT_SECONDS + "_count"] == {"team", "tier", "gpu_product"}
    assert got[metrics.PENDING_GPU_DEMAND] == {"team", "tier"}
