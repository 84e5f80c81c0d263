"""The outcome of one attempt of a gang: the payload GangTrigger yields and
GpuTrainingOperator.execute_complete reads (JSON-safe both ways)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

from airflow_gpu.core.chargeback import CAUSE_RESTART
from airflow_gpu.kube import state as S
from airflow_gpu.kube.preemptions import Preempted

# status values: the gang's terminal phase, or "error" when the trigger could not watch it
STATUS_SUCCEEDED = S.SUCCEEDED
STATUS_FAILED = S.FAILED
STATUS_DISRUPTED = S.DISRUPTED
STATUS_ERROR = "error"

# keys of the operator's XCom result: GPU-seconds lost since the last checkpoint, per cause, so the
# chargeback keeps a try's interruptions and preemptions apart once its pods are gone; and the same
# per capacity type of its attempts: {capacity type: {"gpu_seconds", <the lost keys>}}
LOST_GPU_SECONDS_KEYS = {S.CAUSE_INTERRUPTION: "lost_interruption_gpu_seconds",
                         S.CAUSE_PREEMPTION: "lost_preemption_gpu_seconds",
                         CAUSE_RESTART: "lost_restart_gpu_seconds"}
USAGE_BY_CAPACITY = "usage_by_capacity"


@dataclass(frozen=True)
class GangOutcome:
    status: str  # succeeded | failed | disrupted | error
    namespace: str
    gang: str
    attempt: int = 0
    reason: str = ""
    cause: str | None = None  # disrupted: preemption | interruption (state.disruption_cause)
    exit_codes: dict[str, int] = field(default_factory=dict)
    failed_pods: list[str] = field(default_factory=list)
    disrupted_pods: dict[str, str] = field(default_factory=dict)  # pod -> the first disruption reason seen
    missing_pods: list[str] = field(default_factory=list)
    started_at: float | None = None  # the first member's start (epoch seconds)
    finished_at: float | None = None  # when the outcome was decided
    last_checkpoint_step: int | None = None  # the newest status.json the trigger mirrored
    last_checkpoint_time: float | None = None
    # the ranks the task log shows (failed ranks and rank 0), read when the attempt ended: {pod, rank,
    # node, phase, exit_code, reason, message (rank 0: its return.json), tail, cut} (triggers/ranklogs.py)
    ranks: list[dict] = field(default_factory=list)
    gpu_product: str = ""  # the product the scheduler bound the GPU pods on ("" unknown: another backend)

    def to_payload(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> "GangOutcome":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in payload.items() if k in known})

    @property
    def disruption_kind(self) -> str:
        """preemption, or interruption for every other disruption (one of unknown cause included)."""
        return S.CAUSE_PREEMPTION if self.cause == S.CAUSE_PREEMPTION else S.CAUSE_INTERRUPTION

    @property
    def running_seconds(self) -> float:
        """Wall time the gang held its GPUs in this attempt (0 if it never started)."""
        if self.started_at is None or self.finished_at is None:
            return 0.0
        return max(0.0, self.finished_at - self.started_at)


def outcome_of(state: S.GangState, namespace: str, gang: str, attempt: int, finished_at: float,
               first_disruption: dict[str, str] | None = None, checkpoint: tuple[int, float] | None = None,
               status: str | None = None, reason: str | None = None) -> GangOutcome:
    """A GangOutcome from the gang's terminal state. first_disruption: pod -> the first
    DisruptionTarget reason the watcher saw (it may since have been overwritten)."""
    seen = dict(first_disruption or {})
    for m in state.members:
        if m.disruption is not None:
            seen.setdefault(m.name, m.disruption)
    cause = None
    if state.phase == S.DISRUPTED:
        causes = {S.disruption_cause(r) for r in seen.values()}
        cause = S.CAUSE_PREEMPTION if S.CAUSE_PREEMPTION in causes else S.CAUSE_INTERRUPTION
    starts = [m.started_at for m in state.members if m.started_at is not None]
    return GangOutcome(
        status=status or state.phase, namespace=namespace, gang=gang, attempt=attempt,
        reason=state.reason if reason is None else reason, cause=cause,
        exit_codes=dict(state.exit_codes), failed_pods=list(state.failed_pods),
        disrupted_pods=seen if state.phase == S.DISRUPTED else {}, missing_pods=list(state.missing),
        started_at=min(starts) if starts else None, finished_at=finished_at,
        last_checkpoint_step=checkpoint[0] if checkpoint else None,
        last_checkpoint_time=checkpoint[1] if checkpoint else None, gpu_product=state.gpu_product,
    )


def with_recorded_preemption(outcome: GangOutcome, record: Mapping[str, Preempted], pod_uids: Iterable[str]) -> GangOutcome:
    """`outcome` as a preemption when the scheduler's record names one of the attempt's pods (by UID:
    a pod of an earlier attempt under the same name does not count)."""
    hits = [record[uid] for uid in pod_uids if uid in record]
    if outcome.status != STATUS_DISRUPTED or not hits:
        return outcome
    return replace(outcome, cause=S.CAUSE_PREEMPTION,
                   reason=f"preempted by gang {hits[0].by} (the scheduler's record); {outcome.reason}")
