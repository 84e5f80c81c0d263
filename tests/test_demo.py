"""`make demo` end to end: the seed scenario on the local cluster with the real scheduler, S3 and Airflow DB."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_demo_seed_scenario(tmp_path):
    summary = tmp_path / "summary.json"
    result = subprocess.run([sys.executable, "-m", "airflow_gpu.demo", "--workdir", str(tmp_path / "work"),
                             "--summary-json", str(summary)], capture_output=True, text=True, timeout=400)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    outcome = json.loads(summary.read_text())
    # production reclaimed the borrowed sweep, not the vision gang running inside its own quota
    assert outcome["preempted"] == ["sweep-wide-0"]
    assert outcome["inference_nodes"].startswith("a100-mig")
    # the spot interruption was saved on SIGTERM and the retry resumed from that very step
    assert outcome["stopped"] and outcome["stopped"]["step"] > 0, result.stdout[-3000:]
    assert outcome["resumed"]["step"] == outcome["stopped"]["step"]
    assert outcome["resumed"]["interruptions"] == 1
    assert outcome["done"]["loss"] < 0.25 * outcome["done"]["initial_loss"]
