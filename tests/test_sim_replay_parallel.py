"""The CLI with the platforms in parallel processes prints the --json and writes the --events of
`--jobs 1` (one after the other in one process): all but each platform's own wall clock, "seconds"."""

from __future__ import annotations

import json
import subprocess
import sys

from test_sim_replay import ROOT


NAMES = ["naive", "full", "no-gang", "interval-checkpoints"]


def _run(tmp_path, jobs: str) -> tuple[dict, dict[str, bytes]]:
    events = tmp_path / f"ev{jobs}"
    cmd = [sys.executable, "-m", "airflow_gpu", "simulate", "replay", "--seed-scenario", "--days", "0.5",
           "--platforms", ",".join(NAMES), "--jobs", jobs, "--json", "--events", str(events)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT)
    # off a terminal the progress is a line per platform on stderr (every 30 s, and when it is over)
    assert sorted(line.split(":")[0] for line in done.stderr.splitlines() if " over in " in line) == \
        sorted(f"replay {n}" for n in NAMES), done.stderr
    doc = json.loads(done.stdout)
    for summary in doc["platforms"].values():
        assert summary.pop("seconds") >= 0  # wall clock: the one field that differs from run to run
    return doc, {p.name: p.read_bytes() for p in sorted(events.iterdir())}


def test_parallel_cli_gives_the_sequential_json_and_events(tmp_path):
    sequential, seq_events = _run(tmp_path, "1")
    parallel, par_events = _run(tmp_path, "3")
    assert list(parallel["platforms"]) == ["naive", "full", "no-gang", "interval-checkpoints"]  # order asked
    assert parallel == sequential
    assert len(seq_events) == 11 and par_events == seq_events  # events + quota, estimates but for naive
    assert sequential["platforms"]["full"]["finished_jobs"] > 0


def test_jobs_below_one_is_refused_naming_the_option():
    bad = subprocess.run([sys.executable, "-m", "airflow_gpu", "simulate", "replay", "--seed-scenario", "--jobs", "0"],
                         capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "--jobs must be >= 1" in bad.stderr


def test_a_result_from_a_worker_is_the_in_process_result_but_for_the_queues_gangs():
    """Sent back as plain tuples (sim.replay._packed): every attempt, job state and book is the same;
    the jobs are the setting's own objects again."""
    from dataclasses import fields

    from airflow_gpu.sim.replay import ReplayResult, replay_platforms
    from airflow_gpu.sim.settings import seed_setting
    from airflow_gpu.sim.workload import SeedParams

    setting = seed_setting(SeedParams(days=0.5), 7)
    names = ["naive", "full"]
    here, there = replay_platforms(setting, names, 1), replay_platforms(setting, names, 2)
    for a, b in zip(here, there):
        assert a.attempts and b.attempts == a.attempts
        assert all(x.job is y.job for x, y in zip(a.attempts, b.attempts))  # the setting's, not copies
        for st in a.jobs.values():
            st.units = {}
        assert b.jobs == a.jobs
        for f in fields(ReplayResult):
            if f.name not in ("attempts", "jobs", "seconds", "cpu_seconds"):
                assert getattr(b, f.name) == getattr(a, f.name), f.name


def test_progress_counts_jobs_started_up_to_every_job_once_over():
    """Jobs started of the trace's jobs, never more than all of them (events grow as jobs end and
    restart, so they are not the measure), never going back, and all of them once the replay is over."""
    from airflow_gpu.sim.replay import PLATFORMS, replay
    from airflow_gpu.sim.settings import seed_setting
    from airflow_gpu.sim.workload import SeedParams

    setting = seed_setting(SeedParams(days=3.0), 7)
    seen: list[tuple[int, int]] = []
    result = replay(setting, PLATFORMS["full"], lambda done, total: seen.append((done, total)))
    jobs = len(setting.jobs)
    assert len(seen) > 5 and all(total == jobs and 0 <= done <= jobs for done, total in seen)
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert seen[-1] == (jobs, jobs)
    started = len({a.job.name for a in result.attempts})
    assert 0 < seen[-2][0] <= started <= jobs  # before the last report: no more than really started
