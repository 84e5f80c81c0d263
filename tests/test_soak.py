"""`airflow-gpu soak` (issue 32, item 8), 3 minutes: checkpointed DAGs through real Airflow under
every fault kind once (seeded), with the invariants checked all along; asserts on its --json report.
The 15-minute version is `python -m bench soak` (numbers in README.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from airflow_gpu.soak import FAULT_KINDS, fault_schedule


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
