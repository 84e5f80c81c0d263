"""The time replay: the events CSV re-verified by code that shares nothing with the simulator's books
(plain csv + json: no over-commit of any GPU, no team above quota + borrowing, waits recomputed),
plus the behaviours the platforms must show on small crafted workloads."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

import pytest

from airflow_gpu.core.model import Node, PodRequest
from airflow_gpu.sim.replay import PLATFORMS, Setting, SpotModel, replay
from airflow_gpu.sim.replay_report import summarize, write_events
from airflow_gpu.sim.settings import seed_setting
from airflow_gpu.sim.workload import Job, SeedParams

ROOT = Path(__file__).resolve().parents[1]
TRACES = ROOT.parent / "shared" / "traces" / "openb"
EPS = 1e-6


def _pods(cell: str):
    """'node:0=1000+1=1000@12.5;node2:3=500@13' -> [(node, gpu, milli, since)]"""
    out = []
    for pod in filter(None, cell.split(";")):
        where, since = pod.rsplit("@", 1)
        node, shares = where.split(":", 1)
        for share in filter(None, shares.split("+")):
            gpu, milli = share.split("=")
            out.append((node, int(gpu), int(milli), float(since)))
    return out


def verify_events(csv_path: Path, quota_path: Path) -> dict:
    """Independent check of one platform's attempts: returns recomputed waits per tier (first start
    - submit per job) and raises AssertionError on over-commit or quota excess."""
    meta = json.loads(quota_path.read_text())
    rows = list(csv.DictReader(csv_path.open()))
    assert rows, f"{csv_path}: no attempts"
    gpu_use = defaultdict(list)  # (node, gpu) -> [(t, +milli / -milli)]
    team_use = defaultdict(list)  # (team, product) -> [(t, delta)]
    first_start: dict[str, float] = {}
    tier_of: dict[str, str] = {}
    submit: dict[str, float] = {}
    for r in rows:
        assert r["outcome"] in ("finished", "preempted", "interrupted", "failed"), r["outcome"]
        end = float(r["end"])
        job = r["job"]
        tier_of[job], submit[job] = r["tier"], float(r["submit"])
        if r["start"]:
            first_start[job] = min(first_start.get(job, float("inf")), float(r["start"]))
            assert float(r["start"]) >= float(r["submit"]) - EPS
        for node, gpu, milli, since in _pods(r["pods"]):
            assert since >= float(r["submit"]) - EPS and end >= since - EPS
            gpu_use[(node, gpu)] += [(since, milli), (end, -milli)]
            team_use[(r["team"], meta["nodes"][node]["product"])] += [(since, milli), (end, -milli)]
    for (node, gpu), deltas in gpu_use.items():
        assert gpu < meta["nodes"][node]["gpus"], f"{node} has no GPU {gpu}"
        level = 0
        for _, d in sorted(deltas, key=lambda x: (x[0], x[1])):  # releases before takes at one instant
            level += d
            assert level <= 1000, f"GPU {node}/{gpu} over-committed: {level} milli"
    for (team, product), deltas in team_use.items():
        q = meta["teams"].get(team)
        if q is None:
            continue
        ceiling = q["nominal"].get(product, 0) + q["borrowing_limit"].get(product, 0)
        level = 0
        for _, d in sorted(deltas, key=lambda x: (x[0], x[1])):
            level += d
            assert level <= ceiling, f"team {team} uses {level} milli of {product}, above quota + borrowing {ceiling}"
    waits = defaultdict(list)
    for job, tier in tier_of.items():
        if job in first_start:
            waits[tier].append(first_start[job] - submit[job])
    return waits


def _setting(jobs, nodes, teams=None, spot=SpotModel(share=0.0)):
    base = seed_setting(SeedParams(days=0.1), 1)
    return Setting(tuple(nodes), tuple(jobs), base.tiers, teams or {"a": 0.5, "b": 0.5}, base.preemption_policy,
                   base.borrowed_priority, base.prices, spot, 1)


def _node(name, gpus=8):
    return Node(name, cpu_milli=64_000, memory_mib=512_000, gpu_count=gpus, gpu_product="A100-80GB")


def _job(name, team, tier, gpus, workers, submit, work, interval=600.0):
    return Job(name, team, tier, PodRequest(name, cpu_milli=1000, memory_mib=1000, gpus=gpus), workers, submit, work,
               checkpointable=True, checkpoint_interval=interval)


def test_production_preempts_best_effort_and_the_victim_resumes_from_its_checkpoint():
    jobs = [_job("be", "b", "best-effort-training", 8, 1, 0, 10_000),
            _job("prod", "a", "production-training", 8, 1, 1000, 500)]
    teams = {"a": 1.0, "b": 0.0}  # b's sweep runs on a's idle quota
    r = replay(_setting(jobs, [_node("n0")], teams), PLATFORMS["full"])
    st = r.jobs
    assert st["prod"].first_start == 1000  # no wait: best-effort borrowed a's idle quota and is reclaimed
    assert r.preemptions == 1
    be = [a for a in r.attempts if a.job.name == "be"]
    assert [a.outcome for a in be] == ["preempted", "finished"]
    assert be[0].kept == 1000  # SIGTERM checkpoint: nothing lost
    # the restart computes nothing for the tier's restart overhead (the default 120 s), charged as lost
    assert be[1].overhead == 120 and be[0].overhead == 0
    assert st["be"].finished_at == 1500 + 120 + 9000
    summary = summarize(r)
    assert summary["restart_lost_gpu_seconds"] == 8 * 120 and summary["lost_gpu_seconds"] == 8 * 120
    assert summary["preemptions_per_job"] == 0.5
    naive = replay(_setting(jobs, [_node("n0")], teams), PLATFORMS["naive"])
    assert naive.jobs["prod"].first_start == 10_000  # FIFO, no preemption: it waits for the sweep
    interval = replay(_setting(jobs, [_node("n0")], teams), PLATFORMS["interval-checkpoints"])
    assert [a.kept for a in interval.attempts if a.job.name == "be"][0] == 600  # last periodic checkpoint


def test_restart_overhead_checkpoint_time_and_min_runtime_in_the_replay():
    """A checkpoint longer than the grace period is lost (the last periodic one counts), a restart pays
    its tier's overhead, and a best-effort gang younger than its minimum runtime is no victim: the
    production job waits until the sweep may be preempted, then preempts it."""
    from airflow_gpu.sim.settings import with_restart_cost

    jobs = [_job("be", "b", "best-effort-training", 8, 1, 0, 10_000),
            _job("prod", "a", "production-training", 8, 1, 1000, 500)]
    teams = {"a": 1.0, "b": 0.0}
    slow = replace(_setting(jobs, [_node("n0")], teams), checkpoint_seconds=90.0, grace_seconds=30.0)
    r = replay(with_restart_cost(slow, 300.0), PLATFORMS["full"])
    be = [a for a in r.attempts if a.job.name == "be"]
    assert be[0].kept == 600  # its SIGTERM checkpoint did not fit in 30 s: the periodic one at 600 s
    assert be[1].overhead == 300 and r.jobs["be"].finished_at == 1500 + 300 + 9400
    s = summarize(r)
    assert s["restart_lost_gpu_seconds"] == 8 * 300 and s["lost_gpu_seconds"] == 8 * (300 + 400)
    aged = with_restart_cost(_setting(jobs, [_node("n0")], teams), 0.0, {"best-effort-training": 1800.0})
    r = replay(aged, PLATFORMS["full"])
    assert r.jobs["prod"].first_start == 1800 and r.preemptions == 1  # the sweep was protected until then
    assert [a.kept for a in r.attempts if a.job.name == "be"][0] == 1800
    r = replay(with_restart_cost(aged, None, {"best-effort-training": 20_000.0}), PLATFORMS["full"])
    assert r.jobs["prod"].first_start == 10_000 and r.preemptions == 0  # never old enough: it finishes first


def test_best_effort_takes_spot_first_and_production_overflows_onto_spot():
    """One on-demand and one spot node. Best-effort arrives first and takes the spot node (spot first),
    so production finds the on-demand node free; a second production job, with on-demand full, runs
    on spot (its tier's spot_fallback) instead of waiting behind the first: without the fallback it
    waits for the on-demand node while the spot node idles."""
    from airflow_gpu.constants import CAPACITY_SPOT

    nodes = [_node("od0"), replace(_node("spot0"), capacity_type=CAPACITY_SPOT)]
    jobs = [_job("be", "a", "best-effort-training", 4, 1, 0, 3000),
            _job("prod1", "a", "production-training", 8, 1, 10, 5000),
            _job("prod2", "a", "production-training", 4, 1, 20, 1000)]
    setting = _setting(jobs, nodes, {"a": 1.0, "b": 0.0}, SpotModel(share=0.0, interruptions_per_node_day=0.0))
    full = replay(setting, PLATFORMS["full"])
    where = {a.job.name: {p.node for _, _, p in a.holds} for a in full.attempts}
    assert where == {"be": {"spot0"}, "prod1": {"od0"}, "prod2": {"spot0"}}
    assert full.jobs["prod1"].first_start == 10 and full.jobs["prod2"].first_start == 20  # nobody waits
    pinned = replay(setting, PLATFORMS["no-spot-fallback"])
    assert pinned.jobs["prod2"].first_start == 10 + 5000  # waits for on-demand while half of spot0 idles


def test_a_reclaiming_gang_binds_its_plan_before_its_older_victim_can_return():
    """Team b's older sweep borrows a's half of the node; a's sweep (same priority) reclaims it. The
    nomination holds the freed GPUs for a, as the scheduler's held plan does: the victim, first in
    the queue by age, must not take them back (it did, and a preempted it again, over and over)."""
    jobs = [_job("b-sweep", "b", "best-effort-training", 8, 1, 0, 10_000),
            _job("a-sweep", "a", "best-effort-training", 4, 1, 100, 1000)]
    r = replay(_setting(jobs, [_node("n0")]), PLATFORMS["full"])
    assert r.preemptions == 1
    assert r.jobs["a-sweep"].first_start == 100
    assert [a.outcome for a in r.attempts if a.job.name == "b-sweep"] == ["preempted", "finished"]


def test_gpus_no_team_is_guaranteed_are_lent_to_the_cohort():
    """Guarantees cover a quarter of the node: the rest is the cohort's to borrow, not idle for good."""
    jobs = [_job("big", "a", "best-effort-training", 8, 1, 0, 1000)]
    r = replay(_setting(jobs, [_node("n0")], {"a": 0.125, "b": 0.125}), PLATFORMS["full"])
    assert r.jobs["big"].first_start == 0
    assert replay(_setting(jobs, [_node("n0")], {"a": 0.125, "b": 0.125}),
                  PLATFORMS["no-borrowing"]).jobs["big"].first_start is None  # beyond its guarantee


def test_naive_partial_gangs_hold_gpus_while_full_gangs_start_whole():
    # a 2 x 8-GPU gang behind a one-node job on two nodes: placed one by one, its first worker
    # holds a node for nothing until the other ends; the gang platform holds nothing while it waits
    jobs = [_job("blocker", "b", "production-training", 8, 1, 0, 5000),
            _job("gang", "a", "production-training", 8, 2, 1, 1000),
            _job("late", "a", "production-training", 1, 1, 8000, 10)]  # sets the horizon
    nodes = [_node("n0"), _node("n1")]
    full = summarize(replay(_setting(jobs, nodes), PLATFORMS["full"]))
    assert full["gpu_utilization_pct"] == full["useful_gpu_utilization_pct"]
    naive = summarize(replay(_setting(jobs, nodes), PLATFORMS["naive"]))
    assert naive["gpu_utilization_pct"] > naive["useful_gpu_utilization_pct"] + 20  # held, not computing
    assert naive["useful_gpu_utilization_pct"] == full["useful_gpu_utilization_pct"]


def test_replay_events_reverified_independently(tmp_path):
    params = SeedParams(days=1.0, interruptions_per_node_day=2.0)
    setting = seed_setting(params, 7)
    summaries = {}
    for name in ("naive", "full", "no-gang", "interval-checkpoints"):
        r = replay(setting, PLATFORMS[name])
        write_events(r, tmp_path)
        summaries[name] = summarize(r)
        waits = verify_events(tmp_path / f"{name}.csv", tmp_path / f"{name}.quota.json")
        for tier, mine in summaries[name]["queue_wait_seconds"].items():
            ran = waits.get(tier, [])
            if len(ran) == mine["jobs"]:  # every job of the tier ran: the means must agree
                assert abs(sum(ran) / len(ran) - mine["mean"]) < 0.1, (name, tier)
    assert summaries["full"]["interruptions"] > 0
    assert summaries["naive"]["interruptions"] == 0
    assert summaries["full"]["lost_gpu_seconds"] < summaries["interval-checkpoints"]["lost_gpu_seconds"]


def test_verifier_catches_an_over_commit(tmp_path):
    (tmp_path / "x.quota.json").write_text(json.dumps({"teams": {}, "nodes": {"n0": {"gpus": 1, "product": "A"}}}))
    with (tmp_path / "x.csv").open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(("job", "attempt", "team", "tier", "gpu_milli", "submit", "start", "end", "outcome", "kept_seconds",
                    "pods"))
        w.writerow(("j1", 1, "a", "t", 1000, 0, 0, 10, "finished", 10, "n0:0=1000@0"))
        w.writerow(("j2", 1, "a", "t", 500, 0, 5, 10, "finished", 5, "n0:0=500@5"))
    with pytest.raises(AssertionError, match="over-committed"):
        verify_events(tmp_path / "x.csv", tmp_path / "x.quota.json")


def test_cli_replay_json_and_bad_input(tmp_path):
    cmd = [sys.executable, "-m", "airflow_gpu", "simulate", "replay", "--seed-scenario", "--days", "1",
           "--platforms", "naive,full", "--json", "--events", str(tmp_path / "ev"), "--plots", str(tmp_path / "pl"),
           "--report", str(tmp_path / "r.md"), "--restart-overhead", "300",
           "--min-runtime", "best-effort-training=600", "--max-wait", "production-training=0,best-effort-training=7200"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    doc = json.loads(out.stdout)
    assert set(doc["platforms"]) == {"naive", "full"}
    for key in ("gpu_utilization_pct", "useful_gpu_utilization_pct", "queue_wait_seconds", "lost_gpu_seconds",
                "cost", "starved_jobs", "preemptions", "interruptions", "preemptions_per_job",
                "restart_lost_gpu_seconds"):
        assert key in doc["platforms"]["full"]
    full = doc["platforms"]["full"]
    assert full["preemptions_per_job"] == pytest.approx(full["preemptions"] / doc["jobs"], abs=1e-4)
    assert full["restart_lost_gpu_seconds"] <= full["lost_gpu_seconds"]
    assert doc["min_runtime"] == {"best-effort-training": 600.0} and set(doc["restart_overhead"].values()) == {300.0}
    assert doc["max_wait"] == {"production-training": 0.0, "best-effort-training": 7200.0}  # replaces the file's
    assert doc["platforms"]["full"]["cost"] < doc["platforms"]["naive"]["cost"]  # spot is cheaper
    assert (tmp_path / "pl" / "ablations.png").stat().st_size > 1000
    assert "| full |" in (tmp_path / "r.md").read_text()
    bad = subprocess.run(cmd[:5] + ["--capacity", "0"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--capacity" in bad.stderr
    bad = subprocess.run(cmd[:6] + ["--min-runtime", "best-effort-training"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "TIER=SECONDS" in bad.stderr
    bad = subprocess.run(cmd[:6] + ["--max-wait", "best-effort=60"], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--max-wait: no tier best-effort" in bad.stderr and "best-effort-training" in bad.stderr
    bad = subprocess.run([sys.executable, "-m", "airflow_gpu", "simulate", "replay", "--pods",
                          str(TRACES / "openb_pod_list_default.csv")], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--nodes" in bad.stderr
