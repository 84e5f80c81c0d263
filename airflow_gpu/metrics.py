"""Metrics from the Airflow side (operator, trigger) through Airflow's Stats, under the names the GPU
scheduler exports to Prometheus, so one dashboard reads both.

Airflow's task runner and triggerer set up Stats from `[metrics]` (StatsD, Datadog or OpenTelemetry);
these functions only emit. Labels travel as Stats tags: with plain StatsD set
`[metrics] statsd_influxdb_enabled = True` so that they reach the wire (`name,team=a,tier=b:1|c`,
which the Prometheus statsd_exporter turns into labels) and an empty `statsd_prefix` to get the bare
names below. Timers are sent in milliseconds, as StatsD expects; statsd_exporter exports them in seconds.

| name                                  | kind           | tags                                |
|---------------------------------------|----------------|-------------------------------------|
| airflow_gpu_queue_wait_seconds        | timer          | team, tier, gpu_product             |
| airflow_gpu_pending_gpu_demand        | gauge (deltas) | team, tier                          |
| airflow_gpu_interruptions             | counter        | team, tier, gpu_product, capacity_type |
| airflow_gpu_lost_gpu_seconds          | counter        | team, tier, cause                   |
| airflow_gpu_checkpoint_age_seconds    | gauge          | team, tier, dag_id, task_id         |
"""

from __future__ import annotations

import datetime
import math

from airflow.sdk.observability import stats

# One name per metric, shared with scheduler/metrics.py's Prometheus registry (tests compare them).
QUEUE_WAIT_SECONDS = "airflow_gpu_queue_wait_seconds"
PENDING_GPU_DEMAND = "airflow_gpu_pending_gpu_demand"
INTERRUPTIONS = "airflow_gpu_interruptions"
LOST_GPU_SECONDS = "airflow_gpu_lost_gpu_seconds"
CHECKPOINT_AGE_SECONDS = "airflow_gpu_checkpoint_age_seconds"

CAUSES = ("interruption", "preemption", "restart")  # restart: a relaunch's restart overhead (core.chargeback)


def _tags(**values: object) -> dict[str, str]:
    """Tag values made safe for every Stats backend (StatsD forbids ',', ':', '|', '=' and spaces)."""
    return {k: stats.normalize_name_for_stats(str(v), log_warning=False) for k, v in values.items()}


def _seconds(name: str, value: float) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise ValueError(f"{name} must be a finite number of seconds >= 0 (got {value!r})")
    return float(value)


def observe_queue_wait(team: str, tier: str, gpu_product: str, seconds: float) -> None:
    """A task's gang started: time from its submission until all of its pods were bound."""
    wait = _seconds("queue wait", seconds)
    stats.timing(QUEUE_WAIT_SECONDS, datetime.timedelta(seconds=wait),
                 tags=_tags(team=team, tier=tier, gpu_product=gpu_product))


def change_pending_gpu_demand(team: str, tier: str, gpus: float) -> None:
    """Add `gpus` (negative: remove) to the GPUs waiting for the team and tier. Many tasks report into
    one gauge, so each sends its own change: + when its gang starts to wait, - when it starts or ends."""
    if isinstance(gpus, bool) or not isinstance(gpus, (int, float)) or not math.isfinite(gpus):
        raise ValueError(f"pending GPU demand change must be a finite number (got {gpus!r})")
    if gpus:
        stats.gauge(PENDING_GPU_DEMAND, gpus, delta=True, tags=_tags(team=team, tier=tier))


def count_interruption(team: str, tier: str, gpu_product: str, capacity_type: str) -> None:
    """The capacity under a running task went away (spot reclaim, node loss), not by preemption."""
    stats.incr(INTERRUPTIONS, tags=_tags(team=team, tier=tier, gpu_product=gpu_product,
                                         capacity_type=capacity_type))


def count_lost_gpu_seconds(team: str, tier: str, cause: str, gpu_seconds: float) -> None:
    """GPU-seconds of work done since the last checkpoint and lost when the try was stopped, or (cause
    restart) held by a relaunched attempt while it restarted."""
    if cause not in CAUSES:
        raise ValueError(f"cause must be one of {', '.join(CAUSES)} (got {cause!r})")
    lost = _seconds("lost GPU-seconds", gpu_seconds)
    if lost:
        stats.incr(LOST_GPU_SECONDS, count=round(lost, 3), tags=_tags(team=team, tier=tier, cause=cause))


def set_checkpoint_age(team: str, tier: str, dag_id: str, task_id: str, seconds: float) -> None:
    """Seconds since the running task's newest complete checkpoint."""
    stats.gauge(CHECKPOINT_AGE_SECONDS, _seconds("checkpoint age", seconds),
                tags=_tags(team=team, tier=tier, dag_id=dag_id, task_id=task_id))
