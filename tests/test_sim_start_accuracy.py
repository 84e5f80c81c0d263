"""The predicted start, measured (issue 30): the replay records the estimated start the scheduler
would publish and the real start; the error table is recomputed here from the events CSV with plain
csv code. And the learned run lengths (core.estimate.RunLengths) that give gangs without a declared
duration an estimate, in the scheduler's publication as in the replay."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from collections import defaultdict

from fixtures.core_gang import cluster, gang, profile, start, state_of
from test_sim_replay import ROOT

from airflow_gpu.core.estimate import NOTE_NO_END, RunLengths, StartCalibration, estimate_starts
from airflow_gpu.core.model import RunningGang
from airflow_gpu.core.queue import schedule_cycle
from airflow_gpu.core.preemption import PreemptionPolicy
from airflow_gpu.core.snapshot import Snapshot

NOW = 1000.0


def _percentile(values: list[float], q: float) -> float:
    """numpy's default (linear) percentile, written out."""
    s = sorted(values)
    k = (len(s) - 1) * q / 100
    lo = int(k)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)


def recompute(path) -> dict[str, dict]:
    """Per tier from <platform>.estimates.csv alone: |estimated - started| of the rows with both,
    within 900 s, within 25 % of (started - observed_at), and the share of rows without an estimate."""
    by_tier = defaultdict(list)
    for row in csv.DictReader(open(path, newline="")):
        by_tier[row["tier"]].append(row)
    out = {}
    for tier, rows in by_tier.items():
        known = [r for r in rows if r["estimated_start"] and r["started_at"]]
        err = [abs(float(r["estimated_start"]) - float(r["started_at"])) for r in known]
        ahead = [float(r["started_at"]) - float(r["observed_at"]) for r in known]
        out[tier] = {
            "median_s": round(_percentile(err, 50), 1) if err else None,
            "p90_s": round(_percentile(err, 90), 1) if err else None,
            "within_15min_pct": round(100 * sum(e <= 900 for e in err) / len(err), 1) if err else None,
            "within_25pct_pct": round(100 * sum(e <= 0.25 * a for e, a in zip(err, ahead)) / len(err), 1) if err else None,
            "unknown_pct": round(100 * sum(1 for r in rows if not r["estimated_start"]) / len(rows), 1),
        }
    return out


def test_error_table_recomputed_from_the_events_csv(tmp_path):
    cmd = [sys.executable, "-m", "airflow_gpu", "simulate", "replay", "--seed-scenario", "--days", "2",
           "--capacity", "0.4", "--platforms", "naive,full", "--jobs", "1", "--json", "--events", str(tmp_path),
           "--error-table", str(tmp_path / "error.yaml")]
    doc = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout)
    assert doc["platforms"]["naive"]["estimated_start_error"] is None  # a FIFO publishes no estimate
    mine = doc["platforms"]["full"]["estimated_start_error"]
    theirs = recompute(tmp_path / "full.estimates.csv")
    assert set(mine) == set(theirs) and mine
    for tier, row in theirs.items():
        for key, value in row.items():
            assert mine[tier][key] == value, (tier, key, mine[tier][key], value)
    assert sum(m["measured"] for m in mine.values()) > 50  # a contended setting: many estimates measured
    # every real start recorded is the start of an attempt of that job in the events CSV, at or after the sample
    starts = defaultdict(set)
    for row in csv.DictReader(open(tmp_path / "full.csv", newline="")):
        if row["start"]:
            starts[row["job"]].add(row["start"])
    kinds = set()
    for row in csv.DictReader(open(tmp_path / "full.estimates.csv", newline="")):
        kinds.add(row["kind"])
        if row["started_at"]:
            assert row["started_at"] in starts[row["gang"]], row
            assert float(row["started_at"]) >= float(row["observed_at"])
    assert {"submit", "hourly"} <= kinds
    snippet = (tmp_path / "error.yaml").read_text()
    assert "estimate_error_seconds:" in snippet
    for tier, row in mine.items():
        if row["p90_s"] is not None:
            assert f"    {tier}: {round(row['p90_s'])}" in snippet


def test_run_lengths_median_of_the_longer_runs_and_fallbacks():
    rl = RunLengths()
    assert rl.remaining("a", "t", 0.0) is None  # nothing learned
    for s in (100, 200, 300, 400, 1000):
        rl.record("a", "t", s)
    assert rl.remaining("a", "t", 0.0) == 300  # the median run
    assert rl.remaining("a", "t", 250.0) == 400 - 250  # of the runs longer than its age (300, 400, 1000)
    assert rl.remaining("a", "t", 5000.0) == 5000.0  # older than every run: as long again
    assert rl.remaining("b", "t", 0.0) == 300  # another team: its tier's runs
    assert rl.remaining("b", "u", 0.0) == 300  # another tier: all runs
    for _ in range(2 * RunLengths.KEEP):
        rl.record("a", "t", 50.0)  # the last KEEP runs of a team and tier are kept
    assert rl.remaining("a", "t", 0.0) == 50.0


def test_run_lengths_observe_records_the_gangs_that_left():
    snap = Snapshot.from_nodes(cluster(1, gpus=8))
    rl = RunLengths()
    a = start(snap, gang("a", 1, 1, team="x"), profile(), at=100.0)
    b = start(snap, gang("b", 1, 1, team="x"), profile(), at=200.0)
    rl.observe([a, b], 300.0)
    restarted = RunningGang(b.gang, b.placements, 900.0)
    rl.observe([restarted], 1000.0)  # a left, b restarted: both ran until now
    assert sorted(rl._sorted[("x", a.gang.tier)]) == [800.0, 900.0]


def test_run_lengths_observed_by_deltas_learn_what_observing_every_gang_learns():
    """The scheduler keeps its running gangs by deltas and tells RunLengths only the names that may
    have changed: the runs learned, and the order they are kept in (KEEP drops the oldest), are
    those of observing every running gang each time."""
    import random

    snap = Snapshot.from_nodes(cluster(1, gpus=8))
    gangs = {n: start(snap, gang(n, 1, 1, team="x"), profile(), at=0.0) for n in "abcdefgh"}
    rng = random.Random(7)
    full, deltas = RunLengths(), RunLengths()
    full.KEEP = deltas.KEEP = 6  # small, so the order runs are kept in matters
    running: dict[str, RunningGang] = {}
    for t in range(1, 60):
        before = dict(running)
        for n in rng.sample(sorted(gangs), 3):  # some leave, some start, some restart
            if n in running and rng.random() < 0.5:
                del running[n]
            else:
                running[n] = RunningGang(gangs[n].gang, gangs[n].placements, float(t * 10 - rng.randint(0, 9)))
        changed = {n for n in before.keys() | running.keys() if before.get(n) is not running.get(n)}
        full.observe(list(running.values()), t * 10.0)
        deltas.observe(list(running.values()), t * 10.0, changed, running)
    assert full._sorted == deltas._sorted
    assert {k: list(v) for k, v in full._order.items()} == {k: list(v) for k, v in deltas._order.items()}
    assert len(full._order[(None, None)]) == 24  # runs were dropped: 4 x KEEP kept across teams


def test_learned_runs_give_a_start_where_declared_durations_give_none():
    snap = Snapshot.from_nodes(cluster(1, gpus=8))
    running = start(snap, gang("r", 1, 8, created_at=1), profile(), at=NOW - 100)  # no declared duration
    waiting = gang("w", 1, 8, created_at=10)
    state = state_of(snap, [running])
    result = schedule_cycle(state, [waiting], profile(), NOW, PreemptionPolicy())
    assert estimate_starts(state, [waiting], result, profile(), NOW)["w"].note == NOTE_NO_END
    rl = RunLengths()
    for s in (50, 300, 400, 500, 600):
        rl.record(running.gang.team, running.gang.tier, s)
    est = estimate_starts(state, [waiting], result, profile(), NOW, run_lengths=rl)["w"]
    assert est.start == NOW + (500 - 100)  # the median of the runs longer than its 100 s, from now


def test_the_publication_carries_the_measured_error_and_the_page_shows_it():
    """scheduling.estimate_error_seconds (what `simulate replay --error-table` writes) reaches each
    published entry with an estimated start, and the queue page's row; none without an estimate."""
    from test_scheduler_convert import _view, pod as k8s_pod
    from test_ui_shared_queue import entry

    from airflow_gpu import constants as C
    from airflow_gpu.core.cycle import CycleState
    from airflow_gpu.core.policies import make_profile
    from airflow_gpu.kube.convert import ConversionContext
    from airflow_gpu.scheduler.publish import document
    from airflow_gpu.scheduler.state import build_world
    from airflow_gpu.ui import queue

    pods = [k8s_pod("big", 8, ns="team-vision", pc="airflow-gpu-best-effort-training", priority=1000)]
    pods += [k8s_pod(f"run-{n}", 8, node_name=n, phase="Running") for n in ("a", "b")]  # both nodes full
    world = build_world(_view(pods, []), C.DEFAULT_SCHEDULER_NAME, ConversionContext(), NOW)
    state = CycleState.build(world.snapshot, world.running)
    profile = make_profile("bestfit")
    result = schedule_cycle(state, [g for _, g in world.pending], profile, NOW)
    rl = RunLengths()
    for s in (100, 200, 300, 400, 500):
        rl.record("someone", "inference", s)
    doc = document(world, state, result, profile, "bestfit", C.DEFAULT_SCHEDULER_NAME, 1, NOW, 5.0, [], {},
                   run_lengths=rl, estimate_error={"best-effort-training": 1800.0, "inference": 60.0})
    (waiting,) = doc["waiting"]
    assert waiting["tier"] == "best-effort-training" and waiting["estimated_start"] is not None
    assert waiting["estimate_error"] == 1800.0  # its tier's
    pub = {"version": 1, "generated_at": 1.7e9, "cycle": 3, "scheduler": "s", "profile": "p", "publish_interval": 5.0,
           "waiting": [entry(0) | {"estimate_error": 1800.0}, entry(1)], "incomplete": [], "running": [],
           "cluster": queue.EMPTY_CLUSTER}
    rows = queue.build(queue.Inputs([], [], pub), now=1.7e9)["waiting"]
    assert [r["estimate_error"] for r in rows] == [1800.0, None]


def test_calibration_stretches_an_estimate_by_the_median_ratio_of_its_tier_and_band():
    cal = StartCalibration()
    for i in range(5):
        g = gang(f"g{i}", 1, 1)
        cal.first_seen(g, 1000 + 7200, 1000)  # predicted: in 2 h
        cal.first_seen(g, 1000 + 60, 1500)  # only the first estimate counts
        cal.started(g.name, 1000 + 3 * 7200 + i)  # started about 3 times as late
    tier = g.tier
    assert abs(cal.adjust(tier, NOW + 7200, NOW) - (NOW + 3 * 7200 + 2 * 7200 / 7200)) < 1e-6  # the median ratio
    assert cal.adjust(tier, NOW + 100, NOW) == NOW + 100  # too close to stretch
    assert cal.adjust(tier, NOW + 20 * 3600, NOW) > NOW + 2.9 * 20 * 3600  # a band not learned: the tier's
    assert cal.adjust("other-tier", NOW + 7200, NOW) == NOW + 7200  # nothing learned for it
    cal.first_seen(gang("gone", 1, 1), NOW + 7200, NOW)
    cal.forget([])  # deleted before it started: not learned from
    cal.started("gone", NOW + 10 * 7200)
    assert abs(cal.adjust(tier, NOW + 7200, NOW) - (NOW + 3 * 7200 + 2)) < 1e-6


def _contended_setting():
    from dataclasses import replace

    from airflow_gpu.sim.settings import seed_setting
    from airflow_gpu.sim.workload import SeedParams

    base = SeedParams()
    scale = 0.63  # the seed scenario's nodes and quotas x0.63, its arrival rates x1.5: contended
    return seed_setting(replace(base, days=3, nodes=round(base.nodes * scale), quota_gpus=round(base.quota_gpus * scale),
                                production_per_hour=base.production_per_hour * 1.5,
                                best_effort_per_hour=base.best_effort_per_hour * 1.5,
                                inference_per_hour=base.inference_per_hour * 1.5), 11)


def _samples_and_attempts(setting) -> tuple[list[tuple], list]:
    from airflow_gpu.sim.replay import PLATFORMS, replay

    r = replay(setting, PLATFORMS["full"])
    attempts = [(a.job.name, a.attempt, a.start, a.end, a.outcome, a.holds) for a in r.attempts]
    return [s.row() for s in r.start_samples], attempts


def test_shared_release_sequence_records_the_same_estimates_as_one_copy_per_estimate(monkeypatch):
    """The estimates of one publication share one release sequence and catch their own copy up only
    when a placement is tried (core.estimate._Releases): on a small contended replay the samples and
    the decisions are those of each estimate releasing on its own copy at once."""
    import airflow_gpu.core.estimate as estimate

    setting = _contended_setting()
    shared = _samples_and_attempts(setting)
    monkeypatch.setattr(estimate, "_SHARE_RELEASES", False)
    alone = _samples_and_attempts(setting)
    assert shared == alone
    samples = shared[0]
    later = [s for s in samples if s[6] and float(s[6]) > float(s[3])]  # an estimated start after the sample
    assert len(later) > 50 and max(s[5] for s in samples) > 5  # waiting gangs, deep in the queue


def test_the_whole_gpu_bound_rules_out_tried_times_and_records_the_same_estimates(monkeypatch):
    """core.estimate._WholeBound skips the tried times where the gangs ahead take the whole GPUs the
    releases give, before holding them: the samples and the decisions are those of holding them at
    every tried time, and it did rule times out."""
    import airflow_gpu.core.estimate as estimate

    setting = _contended_setting()
    verdicts: list[bool] = []
    may_hold = estimate._WholeBound.may_hold

    def counted(self, overlapping):
        verdicts.append(may_hold(self, overlapping))
        return verdicts[-1]

    monkeypatch.setattr(estimate._WholeBound, "may_hold", counted)
    bounded = _samples_and_attempts(setting)
    monkeypatch.setattr(estimate, "_WHOLE_BOUND", False)
    holding = _samples_and_attempts(setting)
    assert bounded == holding
    ruled_out, let_through = verdicts.count(False), verdicts.count(True)
    assert ruled_out > 100 and let_through > 0, (ruled_out, let_through)  # both ways, many times
