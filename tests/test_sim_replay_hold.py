"""Held placements in the replay (core/holding.py, as Scheduler.cycle runs them): on one GPU, a share
that strands capacity is held; a whole-GPU job arriving 10 s later takes its room instead of waiting
for it to finish; the share runs after it, and the books say what holding cost (GPUs reserved idle,
wait added) next to `no-hold`, which is full without it."""

from __future__ import annotations

from dataclasses import replace

from test_sim_replay import _node, _setting

from airflow_gpu.core.model import PodRequest
from airflow_gpu.sim.replay import PLATFORMS, replay
from airflow_gpu.sim.replay_report import markdown, summarize
from airflow_gpu.sim.workload import Job


def _jobs():
    share = PodRequest("s", cpu_milli=1000, memory_mib=1000, gpu_milli=810)
    whole = PodRequest("w", cpu_milli=1000, memory_mib=1000, gpus=1)
    return [Job("s", "a", "best-effort-training", share, 1, 0.0, 1000.0, checkpointable=False),
            Job("w", "a", "best-effort-training", whole, 1, 10.0, 100.0, checkpointable=False)]


def test_a_held_share_gives_its_room_to_a_whole_gpu_job_and_the_cost_is_booked():
    setting = replace(_setting(_jobs(), [_node("n0", gpus=1)], {"a": 1.0}), placement_hold=0.9,
                      placement_hold_seconds=60.0)
    held = replay(setting, PLATFORMS["full"])
    assert held.jobs["w"].first_start == 10.0  # took the held share's room at once
    # displaced at 10 s; placed again when w ends (110 s), held again (it strands the GPU) until 170 s
    assert held.jobs["s"].first_start == 170.0
    h = held.holds
    assert (h.held, h.displaced) == (2, 1)
    assert abs(h.added_wait_seconds - 70.0) < 1e-6 and abs(h.idle_gpu_seconds - 0.81 * 70) < 1e-6
    plain = replay(setting, PLATFORMS["no-hold"])
    assert plain.holds is None and plain.jobs["s"].first_start == 0.0 and plain.jobs["w"].first_start == 1000.0
    doc = {"trace": "t", "capacity": 1, "seed": 1,
           "platforms": {"full": summarize(held), "no-hold": summarize(plain)}}
    assert doc["platforms"]["full"]["held_placements"] == {
        "pods": 2, "displaced": 1, "idle_gpu_seconds": 56.7, "added_wait_seconds": 70.0,
        "added_wait_per_held_pod_seconds": 35.0}
    assert doc["platforms"]["no-hold"]["held_placements"] is None
    assert "Held placements (full): 2 pods held, 1 displaced; cost 0.02 GPU-h reserved idle, 70 s" in markdown(doc)


def test_a_held_share_binds_where_it_was_reserved_when_its_time_is_up_and_is_off_by_default():
    jobs = [_jobs()[0], replace(_jobs()[1], submit=5000.0)]  # w only teaches what strands the GPU
    setting = replace(_setting(jobs, [_node("n0", gpus=1)], {"a": 1.0}), placement_hold=0.9,
                      placement_hold_seconds=45.0)
    r = replay(setting, PLATFORMS["full"])
    assert r.jobs["s"].first_start == 45.0 and (r.holds.held, r.holds.displaced) == (1, 0)
    assert r.jobs["s"].finished_at == 1045.0
    default = replay(_setting(jobs, [_node("n0", gpus=1)], {"a": 1.0}), PLATFORMS["full"])
    assert default.holds is None and default.jobs["s"].first_start == 0.0


def test_the_cli_reports_the_cost_per_platform_and_refuses_a_bad_budget():
    import json
    import subprocess
    import sys
    from pathlib import Path

    examples = Path(__file__).resolve().parents[1] / "examples" / "traces"
    base = [sys.executable, "-m", "airflow_gpu", "simulate", "replay", "--trace", str(examples / "jobs.csv"),
            "--nodes", str(examples / "nodes.csv"), "--platforms", "full,no-hold", "--jobs", "1", "--json"]
    done = subprocess.run(base + ["--placement-hold", "0.5", "--placement-hold-seconds", "30"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert (doc["placement_hold"], doc["placement_hold_seconds"]) == (0.5, 30.0)
    full, plain = doc["platforms"]["full"], doc["platforms"]["no-hold"]
    assert set(full["held_placements"]) == {"pods", "displaced", "idle_gpu_seconds", "added_wait_seconds",
                                            "added_wait_per_held_pod_seconds"}
    assert plain["held_placements"] is None and full["finished_jobs"] == plain["finished_jobs"] == 10
    bad = subprocess.run(base + ["--placement-hold", "2"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--placement-hold must be in [0, 1]" in bad.stderr and not bad.stdout
