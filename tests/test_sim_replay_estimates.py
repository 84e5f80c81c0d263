"""Duration estimates in the replay: with none (gangs without the expected-duration annotation) a
head-of-line reservation that waits on work of unknown length holds its nodes against every gang
behind it; with estimates, work known to end before the head's start backfills there, and the head
starts no later."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

from test_sim_replay import ROOT, _job, _node, _setting

from airflow_gpu.sim.replay import PLATFORMS, replay


def _backfill_case():
    jobs = [_job("long", "a", "production-training", 8, 1, 0, 10_000),
            _job("mid", "a", "production-training", 4, 1, 0, 5_000),
            _job("big", "a", "production-training", 8, 2, 1, 2_000),  # 16 GPUs: waits for both nodes
            _job("short", "a", "production-training", 4, 1, 2, 1_000)]  # fits beside "mid" at once
    # a quota above the cluster, so capacity, not the cohort pool, stops "big": only a gang refused
    # for capacity becomes head of line and holds a reservation
    return _setting(jobs, [_node("n0"), _node("n1")], teams={"a": 2.0})


def test_estimates_let_short_work_through_a_reservation_without_delaying_the_head():
    setting = _backfill_case()
    blind = replay(setting, PLATFORMS["full"]).jobs
    assert blind["big"].first_start == 10_000
    assert blind["short"].first_start >= 10_000  # held off the reserved nodes until the head ran
    known = replay(replace(setting, duration_estimate=1.0), PLATFORMS["full"]).jobs
    assert known["short"].first_start == 2  # ends at 1,002, long before the head can start
    assert known["big"].first_start == 10_000  # the head is not delayed


def test_cli_duration_estimate_is_checked_and_recorded():
    base = [sys.executable, "-m", "airflow_gpu", "simulate", "replay", "--seed-scenario", "--days", "0.2",
            "--platforms", "full", "--json"]
    out = subprocess.run(base + ["--duration-estimate", "1.5"], capture_output=True, text=True, check=True, cwd=ROOT)
    doc = json.loads(out.stdout)
    assert doc["duration_estimate"] == 1.5 and doc["reservation_hold"] == 3600.0
    bad = subprocess.run(base + ["--duration-estimate", "-1"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--duration-estimate" in bad.stderr
    bad = subprocess.run(base + ["--reservation-hold", "-5"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--reservation-hold" in bad.stderr
