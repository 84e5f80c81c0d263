"""GpuTrainingOperator's logs, result and kept objects (issue 26), apart from its run logic:
- the ranks' ends and log tails an attempt's event carries, written to the worker log (kept per try);
- rank 0's return.json -> the XCom `result`;
- on_finish_action (KubernetesPodOperator's names): which objects of an ended gang stay for debugging,
  marked with a keep-until time, and deleting them once it has passed.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow_gpu import constants as C
from airflow_gpu.kube.cleanup import expired_kept, is_kept
from airflow_gpu.kube.podlog import RankEnd, ResultError, failure_message, parse_result, rank_block

ON_FINISH_ACTIONS = ("delete_pod", "delete_succeeded_pod", "keep_pod")
KEPT_TTL = dt.timedelta(hours=24)  # how long kept pods stay (their keep-until annotation)
DEFAULT_LOGGING_INTERVAL = 30


def argument_problems(get_logs, logging_interval, log_tail_lines, on_finish_action) -> list[tuple[str, str]]:
    """(argument, what is wrong) for the logging arguments."""
    out = []
    if not isinstance(get_logs, bool):
        out.append(("get_logs", f"must be True or False (got {get_logs!r})"))
    if logging_interval is not None and (isinstance(logging_interval, bool) or
                                         not isinstance(logging_interval, (int, float)) or logging_interval < 0):
        out.append(("logging_interval", "must be a number of seconds >= 0 (0: lines as they come), or None for no "
                                        f"live logs (got {logging_interval!r})"))
    if isinstance(log_tail_lines, bool) or not isinstance(log_tail_lines, int) or not 1 <= log_tail_lines <= 100_000:
        out.append(("log_tail_lines", f"must be a whole number of lines between 1 and 100000 (got {log_tail_lines!r})"))
    if on_finish_action not in ON_FINISH_ACTIONS:
        out.append(("on_finish_action", f"must be one of {', '.join(ON_FINISH_ACTIONS)} (got {on_finish_action!r})"))
    return out


def ends_of(outcome) -> list[RankEnd]:
    return [RankEnd(r["pod"], r.get("rank"), r.get("node"), r.get("phase") or "", r.get("exit_code"),
                    r.get("reason") or "", r.get("message") or "") for r in outcome.ranks]


def log_ranks(log, outcome, namespace: str) -> None:
    """Each rank the event carries: its header, what was cut, its tail."""
    for entry, end in zip(outcome.ranks, ends_of(outcome)):
        if entry.get("tail") is None and not end.failed and end.rank != 0:
            continue
        log.info("%s", rank_block(end, namespace, outcome.attempt, entry.get("tail"), entry.get("cut")))


def application_failure(outcome, run: dict) -> str:
    ends = ends_of(outcome)
    failed = [e for e in ends if e.failed] or [e for e in ends if e.pod in outcome.failed_pods]
    text = failure_message(outcome.gang, failed, {r["pod"]: r.get("tail") for r in outcome.ranks},
                           outcome.reason)
    return text + disruptions_note(run)


def disruptions_note(run: dict) -> str:
    """The try's relaunches, for a failure message ("" when there were none)."""
    if not (run.get("interruptions") or run.get("preemptions")):
        return ""
    return (f" (this try relaunched the gang after {run.get('interruptions', 0)} interruption(s) and "
            f"{run.get('preemptions', 0)} preemption(s); attempts: {run.get('attempts')})")


def result_of(outcome) -> Any:
    """The value of rank 0's return.json (None when it wrote none); ResultError when it is unusable."""
    rank0 = next((e for e in ends_of(outcome) if e.rank == 0), None)
    if rank0 is None or not rank0.message.strip():
        return None
    return parse_result(rank0.message)


def keeps(action: str, succeeded: bool) -> bool:
    return action == "keep_pod" or (action == "delete_succeeded_pod" and not succeeded)


def keep_ended_pods(kube, namespace: str, selector: str, log, now: dt.datetime) -> list[str]:
    """Mark the ended pods of `selector` kept until now + KEPT_TTL; return their names. Pods still
    running are not kept (they hold GPUs and quota): the caller deletes them with the rest."""
    until = (now + KEPT_TTL).strftime("%Y-%m-%dT%H:%M:%SZ")
    kept = []
    for pod in kube.pods(namespace, selector):
        if (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            continue
        kube.annotate_pod(namespace, pod["metadata"]["name"], {C.ANNOTATION_KEEP_UNTIL: until})
        kept.append(pod["metadata"]["name"])
    if kept:
        log.info("on_finish_action kept %d ended pod(s) of this gang until %s (they hold no quota; the next try "
                 "starts fresh pods): %s. Read them with: %s", len(kept), until, ", ".join(kept),
                 "; ".join(f"kubectl logs -n {namespace} {name}" for name in kept))
    return kept


def delete_expired_kept(kube, namespace: str, now: dt.datetime, log) -> int:
    """Delete the namespace's kept pods whose keep-until time has passed (kube/cleanup.py's rule; the GPU
    scheduler applies it too, on its own clock)."""
    n = 0
    for pod in expired_kept(kube.pods(namespace, f"{C.LABEL_MANAGED_BY}={C.MANAGED_BY_VALUE}"), now):
        n += kube.delete_pod(namespace, pod["metadata"]["name"])
    if n:
        log.info("deleted %d kept pod(s) past their %s time", n, C.ANNOTATION_KEEP_UNTIL)
    return n


__all__ = ["ON_FINISH_ACTIONS", "ResultError", "application_failure", "argument_problems", "delete_expired_kept",
           "is_kept", "keep_ended_pods", "keeps", "log_ranks", "result_of"]
