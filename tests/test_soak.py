"""`airflow-gpu soak` (issue 32, item 8), 3 minutes: checkpointed DAGs through real Airflow under
every fault kind once (seeded), with the invariants checked all along; asserts on its --json report.
The 15-minute version is `python -m bench soak` (numbers in README.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from airflow_gpu import constants as C
from airflow_gpu.soak import FAULT_KINDS, Monitor, fault_schedule


def test_fault_schedule_is_seeded_and_covers_every_kind():
    assert fault_schedule(5, 3) == fault_schedule(5, 3) != fault_schedule(6, 3)
    for minutes, rounds in ((3, 1), (15, 5)):
        schedule = fault_schedule(5, minutes)
        assert sorted(f.kind for f in schedule) == sorted(FAULT_KINDS * rounds)
        assert all(0 < f.at < minutes * 60 for f in schedule)
    downs = {f.kind: f.seconds for f in fault_schedule(5, 15) if f.seconds}
    assert set(downs) == {"s3_outage", "apiserver_restart"}
    assert all(11 <= f.seconds <= 38 for f in fault_schedule(5, 15) if f.kind == "s3_outage")
    assert all(0.9 <= f.seconds <= 4.9 for f in fault_schedule(5, 15) if f.kind == "apiserver_restart")


def _pod(ns: str, name: str, node: str, gpus: int, attempt: str = "1000", rank: str = "0", run: str = "r1") -> dict:
    labels = {C.LABEL_DAG_ID: "d", C.LABEL_TASK_ID: "t", C.LABEL_RUN_ID: run, C.LABEL_ATTEMPT: attempt,
              C.LABEL_GANG_RANK: rank}
    return {"metadata": {"namespace": ns, "name": name, "uid": name, "labels": labels},
            "spec": {"nodeName": node, "containers": [{"resources": {"limits": {C.RESOURCE_GPU: str(gpus)}}}]},
            "status": {"phase": "Running"}}


def _node(name: str, gpus: int) -> dict:
    return {"metadata": {"name": name, "labels": {C.NODE_GPU_PRODUCT: "NVIDIA-A100-SXM4-80GB"}},
            "status": {"allocatable": {C.RESOURCE_GPU: str(gpus)}}}


def test_monitor_reports_each_broken_invariant_and_nothing_else():
    from airflow_gpu.config import load_config
    from airflow_gpu.demo import SEED_QUOTAS

    def sampled(pods: list[dict]) -> set[str]:
        monitor = Monitor(api=None, config=load_config(SEED_QUOTAS), started=0.0)
        monitor.listing = lambda: (pods, {n: _node(n, 8) for n in ("n1", "n2", "n3")})
        monitor.sample()
        return {v.kind for v in monitor.violations.values()}

    # nlp: quota 8, no borrowing; research: 8 + 8 borrowing; nodes of 8 GPUs
    assert sampled([_pod("team-nlp", "a", "n1", 4), _pod("team-nlp", "b", "n1", 4, rank="1"),
                    _pod("team-research", "c", "n2", 8, run="r2"), _pod("team-research", "d", "n3", 8, run="r3")]) == set()
    assert sampled([_pod("team-nlp", "a", "n1", 4), _pod("team-nlp", "b", "n2", 8, run="r2")]) == {
        "team above quota + borrowing"}
    assert sampled([_pod("team-research", "a", "n1", 6), _pod("team-research", "b", "n1", 4, run="r2")]) == {
        "node over-committed"}
    assert sampled([_pod("team-nlp", "a", "n1", 2), _pod("team-nlp", "b", "n2", 2, attempt="1001")]) == {
        "gang bound twice"}
    assert sampled([_pod("team-nlp", "a", "n1", 2), _pod("team-nlp", "b", "n2", 2)]) == {"gang bound twice"}
    # finished pods and pods on a node that is gone hold nothing on any node
    done = _pod("team-nlp", "b", "n1", 8, run="r2")
    done["status"]["phase"] = "Succeeded"
    assert sampled([_pod("team-nlp", "a", "n1", 8), done, _pod("team-vision", "c", "gone", 8, run="r3")]) == set()
    # ... but count on their team's quota
    assert sampled([_pod("team-nlp", "a", "n1", 8), _pod("team-nlp", "c", "gone", 4, run="r3")]) == {
        "team above quota + borrowing"}


@pytest.mark.slow
def test_soak_three_minutes_every_fault_no_violation(tmp_path):
    report_path = tmp_path / "soak.json"
    result = subprocess.run([sys.executable, "-m", "airflow_gpu", "soak", "--minutes", "3", "--seed", "1",
                             "--json", str(report_path), "--workdir", str(tmp_path / "work")],
                            capture_output=True, text=True, timeout=1500)
    tail = result.stdout[-8000:] + result.stderr[-3000:]
    assert report_path.exists(), tail
    report = json.loads(report_path.read_text())
    assert all(report["faults"][kind] >= 1 for kind in FAULT_KINDS), (report["faults"], report["faults_failed"])
    assert report["violations"] == [], tail
    assert report["retries_spent"] == 0
    assert report["dag_runs"] >= 4 and report["dag_runs_by_state"] == {"success": report["dag_runs"]}
    # the faults reached the work: a gang interrupted and one preempted, each resumed in its try
    assert report["interruptions"] >= 1 and report["preemptions"] >= 1, tail
    assert report["resumed_from_checkpoint"] >= 1
    assert report["samples"] > 100  # the invariants were sampled all along (about 1/s)
    assert result.returncode == 0, tail
