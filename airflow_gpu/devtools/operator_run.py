"""Drive GpuTrainingOperator.execute() outside Airflow's task runner, for tests and benchmarks that
need one step of it (submit until the deferral, reattach, on_kill) against a real cluster: a task
instance stand-in and a durable state store that survives "worker restarts" (it is a dict the
caller keeps). Everything else is the real operator, the provider's KubernetesHook and the cluster."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FakeTaskInstance:
    dag_id: str
    task_id: str
    run_id: str
    try_number: int = 1
    map_index: int = -1
    start_date: dt.datetime = field(default_factory=lambda: dt.datetime.now(dt.timezone.utc))


class DictStateStore:
    """task_state_store's get/set on a dict (the retention argument is accepted and ignored)."""

    def __init__(self, data: dict | None = None):
        self.data = data if data is not None else {}

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def set(self, key: str, value: Any, retention: Any = None) -> None:
        self.data[key] = value


def context_for(ti: FakeTaskInstance, store: DictStateStore | None) -> dict:
    return {"ti": ti, "task_state_store": store}


def execute_until_deferred(operator, context: dict):
    """Run execute(); return the TaskDeferred it raises (trigger, method, kwargs, timeout)."""
    from airflow.sdk.exceptions import TaskDeferred

    try:
        operator.execute(context)
    except TaskDeferred as deferred:
        return deferred
    raise AssertionError("execute() returned without deferring")
