"""`airflow-gpu demo` end to end (issue 15): the example DAGs through real Airflow processes, the GPU
scheduler, the local cluster and SeaweedFS; asserts on the demo's --report JSON."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_runs_the_seed_scenario_through_airflow(tmp_path):
    report_path = tmp_path / "report.json"
    result = subprocess.run([sys.executable, "-m", "airflow_gpu", "demo", "--headless", "--report", str(report_path),
                             "--workdir", str(tmp_path / "work")], capture_output=True, text=True, timeout=600)
    tail = result.stdout[-6000:] + result.stderr[-3000:]
    assert report_path.exists(), tail
    report = json.loads(report_path.read_text())
    assert result.returncode == 0 and report["problems"] == [], tail
    assert report["dag_runs"] == {"nlp_ablation": "success", "finetune_pipeline": "success",
                                  "sweep_best_effort": "success", "recsys_two_generations": "success"}
    # two generations (issue 29): the gang accepting H100 and A100 ran on one of them, and the report says which
    recsys = report["where_ran"]["recsys_two_generations.train"]
    assert recsys["products"] in (["h100-80gb"], ["a100-80gb"]) and all(len(p) == 1 for p in recsys["gangs"].values())
    assert "Where the GPU tasks ran" in result.stdout
    # the interrupted ablation resumed from its checkpoint within try 1, then was preempted by production
    ablation = report["resumed_from_step"]["nlp_ablation.ablation"]
    assert ablation["step"] > 0 and ablation["try_number"] == 1
    assert ablation["interruptions"] >= 1 and ablation["preemptions"] >= 1
    assert report["interruptions"] >= 1 and report["preemptions"] >= 1
    assert any("team quota" in r for reasons in report["wait_reasons"].values() for r in reasons)
    assert report["mig_pods"] >= 1
    assert report["orphaned_objects"] == 0, report["orphaned"]
    assert {"production-training", "best-effort-training", "inference"} <= set(report["queue_wait_seconds"])
    assert 0 < report["gpu_utilization_pct"] < 100
    assert {"nlp", "research", "serving"} <= set(report["chargeback"])
    assert all(c["gpu_hours"] > 0 for c in report["chargeback"].values())
    # every try's pods are gone: the ledger is the operator's XCom results, interruptions and preemptions apart
    results = [t["result"] for t in report["tasks"].values() if isinstance(t.get("result"), dict)]
    for cause in ("interruption", "preemption"):
        booked = sum(c[f"lost_{cause}_hours"] for c in report["chargeback"].values())
        assert booked == pytest.approx(sum(r[f"lost_{cause}_gpu_seconds"] for r in results) / 3600, abs=1e-4)
    ablation_result = report["tasks"]["nlp_ablation.ablation"]["result"]
    assert ablation_result["lost_interruption_gpu_seconds"] > 0 and ablation_result["lost_preemption_gpu_seconds"] > 0
    assert report["chargeback"]["nlp"]["lost_interruption_hours"] > 0 and report["chargeback"]["nlp"]["lost_preemption_hours"] > 0
    assert "password" in result.stdout and "/airflow-gpu/" in result.stdout  # the UI's URL and login
    # the terminal tells the resumption as it happens: the step from rank 0's log, the Airflow try
    assert re.search(r"resumed nlp_ablation\.ablation from checkpoint step [1-9]\d*, in Airflow try 1", result.stdout), tail
