"""kube.preemptions: the scheduler's record of preempted pods, both ways, and how an outcome reads it."""

from __future__ import annotations

from airflow_gpu.kube import state as S
from airflow_gpu.kube.outcome import GangOutcome, with_recorded_preemption
from airflow_gpu.kube.preemptions import (Preempted, expired_uids, read_record, record_manifest, record_name,
                                          record_patch)


def test_record_round_trip_merge_patch_and_expiry():
    a, b = Preempted("uid-a", "team-nlp/sweep-0", "team-nlp/finetune", 100.0), Preempted("uid-b", "x/y", "z", 50.0)
    made = record_manifest("airflow-gpu-system", "airflow-gpu", [a])
    assert made["metadata"]["name"] == record_name() == "airflow-gpu-preemptions-airflow-gpu"
    assert read_record(made) == {"uid-a": a}
    patch = record_patch([b], expired=["uid-old"])
    assert patch["data"]["uid-old"] is None and read_record({"data": {"uid-b": patch["data"]["uid-b"]}}) == {"uid-b": b}
    # unreadable entries are skipped, never fatal
    assert read_record({"data": {"bad": "{", "worse": '{"pod": 1}', "uid-a": made["data"]["uid-a"]}}) == {"uid-a": a}
    record = {e.uid: e for e in (a, b, Preempted("uid-c", "p", "q", 99.0))}
    assert expired_uids(record, now=100.0 + 7 * 86400 - 10) == ["uid-b"]  # older than the TTL
    assert expired_uids(record, now=120.0, keep=1) == ["uid-b", "uid-c"]  # the oldest beyond the cap


def test_a_recorded_pod_of_this_attempt_makes_the_disruption_a_preemption():
    outcome = GangOutcome(S.DISRUPTED, "team-nlp", "sweep", cause=S.CAUSE_INTERRUPTION, reason="AllMembersLost")
    record = {"uid-a": Preempted("uid-a", "team-nlp/sweep-0", "team-nlp/finetune", 1.0)}
    hit = with_recorded_preemption(outcome, record, ["uid-a", "uid-b"])
    assert hit.cause == S.CAUSE_PREEMPTION and "team-nlp/finetune" in hit.reason
    # a pod of an earlier attempt under the same name has another UID: not this attempt's preemption
    assert with_recorded_preemption(outcome, record, ["uid-new"]).cause == S.CAUSE_INTERRUPTION
    failed = GangOutcome(S.FAILED, "team-nlp", "sweep")
    assert with_recorded_preemption(failed, record, ["uid-a"]) == failed
