"""The CLI with the platforms in parallel processes prints the --json and writes the --events of
`--jobs 1` (one after the other in one process): all but each platform's own wall clock, "seconds"."""

from __future__ import annotations

import json
import subprocess
import sys

from test_sim_replay import ROOT


def _run(tmp_path, jobs: str) -> tuple[dict, dict[str, bytes]]:
    events = tmp_path / f"ev{jobs}"
    cmd = [sys.executable, "-m", "airflow_gpu", "simulate", "replay", "--seed-scenario", "--days", "0.5",
           "--platforms", "naive,full,no-gang,interval-checkpoints", "--jobs", jobs, "--json", "--events", str(events)]
    doc = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True, cwd=ROOT).stdout)
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
