"""Any job trace (sim/jobtrace.py, sim/export.py): the generic job CSV replays and its events re-verify,
bad rows are refused naming the line and the column, teams and tiers map by the documented rules,
and the Kueue / Slurm exporters write the format from their example files."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from collections import Counter

import numpy as np
import pytest
from test_sim_replay import ROOT, verify_events

from airflow_gpu.core.tiers import TierPolicy
from airflow_gpu.sim.export import kueue_rows, slurm_rows, write
from airflow_gpu.sim.jobtrace import (JOB_COLUMNS, OPTIONAL_COLUMNS, default_tier, load_jobs, map_jobs, team_shares)
from airflow_gpu.sim.traces import TraceError

EXAMPLES = ROOT / "examples" / "traces"
COLUMNS = JOB_COLUMNS + OPTIONAL_COLUMNS


def _trace(path, n=300, seed=5):
    """n jobs over two days: gangs of whole GPUs, MIG-sized shares, teams known by name, by namespace,
    unknown and missing; tiers by name, by PriorityClass, a Slurm QOS and missing."""
    rng = np.random.default_rng(seed)
    teams = ["nlp", "vision", "team-recsys", "research", "ml-platform", ""]
    tiers = ["production-training", "best-effort-training", "airflow-gpu-inference", "high", ""]
    with path.open("w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=COLUMNS)
        w.writeheader()
        for i in range(n):
            share = rng.random() < 0.2
            w.writerow({"job": f"j{i}", "submit_time": f"{rng.uniform(0, 2 * 86400):.1f}",
                        "duration": f"{rng.lognormal(np.log(3600), 0.8):.0f}",
                        "workers": 1 if share else int(rng.integers(1, 3)),
                        "gpus_per_worker": "" if share else int(rng.choice([1, 2, 4, 8])),
                        "gpu_milli": 143 if share else "", "cpu_milli": 2000, "memory_mib": 8000,
                        "team": str(rng.choice(teams)), "tier": str(rng.choice(tiers)),
                        "products": "a100-80gb" if share else "",
                        "checkpointable": "true" if rng.random() < 0.7 else "false"})


def _nodes(path):
    rows = ["sn,cpu_milli,memory_mib,gpu,model"] + [f"a100-{i},96000,1000000,8,a100-80gb" for i in range(5)]
    path.write_text("\n".join(rows + ["h100-0,96000,1000000,8,h100-80gb"]) + "\n")


def test_a_generic_job_csv_replays_and_its_events_reverify(tmp_path):
    _trace(tmp_path / "jobs.csv")
    _nodes(tmp_path / "nodes.csv")
    events = tmp_path / "events"
    cmd = [sys.executable, "-m", "airflow_gpu", "simulate", "replay", "--trace", str(tmp_path / "jobs.csv"),
           "--nodes", str(tmp_path / "nodes.csv"), "--platforms", "naive,full", "--jobs", "1", "--json",
           "--events", str(events), "--tier-map", "high=production-training", "--team-map", "ml-platform=research"]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["jobs"] == 300 and doc["gpus"] == 48
    m = doc["mapping"]
    assert m["teams"]["team-recsys"] == "recsys" and m["teams"]["ml-platform"] == "research"
    assert m["tiers"] == {**m["tiers"], "airflow-gpu-inference": "inference", "high": "production-training",
                          "": "best-effort-training"}
    assert sum(m["shares"].values()) <= 1.0 + 1e-9
    for name in ("naive", "full"):
        waits = verify_events(events / f"{name}.csv", events / f"{name}.quota.json")
        rows = list(csv.DictReader((events / f"{name}.csv").open()))
        assert {r["team"] for r in rows} <= {"nlp", "vision", "recsys", "research", "serving"}
        assert sum(len(w) for w in waits.values()) == len({r["job"] for r in rows if r["start"]}) > 250
        assert doc["platforms"][name]["finished_jobs"] > 250
    quota = json.loads((events / "full.quota.json").read_text())["teams"]
    assert quota["recsys"]["nominal"]["a100-80gb"] > quota["nlp"]["nominal"]["a100-80gb"] > 0  # 24 vs 8 GPUs of quota


@pytest.mark.parametrize("header, row, expected", [
    ("job,submit_time", "a,0", "missing column(s) duration"),
    ("job,submit_time,duration,gpus_per_worker", "a,soon,60,1", ":2: column submit_time must be a number"),
    ("job,submit_time,duration,gpus_per_worker", "a,0,0,1", ":2: column duration must be > 0"),
    ("job,submit_time,duration,gpus_per_worker", "a,-5,60,1", ":2: column submit_time must be >= 0"),
    ("job,submit_time,duration,gpus_per_worker,gpu_milli", "a,0,60,1,500", ":2: columns gpus_per_worker and gpu_milli"),
    ("job,submit_time,duration", "a,0,60", ":2: no GPU ask"),
    ("job,submit_time,duration,gpu_milli", "a,0,60,1500", ":2: column gpu_milli must be 1..1000"),
    ("job,submit_time,duration,gpus_per_worker,workers", "a,0,60,1,0", ":2: column workers must be >= 1"),
    ("job,submit_time,duration,gpus_per_worker,workers", "a,0,60,1.5,1", ":2: column gpus_per_worker must be an integer"),
    ("job,submit_time,duration,gpus_per_worker,checkpointable", "a,0,60,1,maybe", ":2: column checkpointable"),
    ("job,submit_time,duration,gpus_per_worker", ",0,60,1", ":2: column job is empty"),
])
def test_a_bad_row_is_refused_naming_the_line_and_the_column(tmp_path, header, row, expected):
    path = tmp_path / "jobs.csv"
    path.write_text(f"{header}\n{row}\n")
    with pytest.raises(TraceError, match=expected.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        load_jobs(path)


def test_a_duplicate_job_names_both_lines_and_the_cli_says_it(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text("job,submit_time,duration,gpus_per_worker\na,0,60,1\nb,1,60,1\na,2,60,1\n")
    with pytest.raises(TraceError, match=r"jobs.csv:4: column job: 'a' is also the job of line 2"):
        load_jobs(path)
    _nodes(tmp_path / "nodes.csv")
    bad = subprocess.run([sys.executable, "-m", "airflow_gpu", "simulate", "replay", "--trace", str(path), "--nodes",
                          str(tmp_path / "nodes.csv")], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "jobs.csv:4: column job" in bad.stderr


def test_teams_and_tiers_map_by_the_documented_rules(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text("job,submit_time,duration,gpus_per_worker,team,tier\n"
                    "a,0,60,1,nlp,gold\nb,0,60,1,team-vision,airflow-gpu-inference\nc,0,60,1,acct-7,\n"
                    "d,0,60,1,acct-7,prod\ne,0,60,1,,best\n")
    tiers = {"prod": TierPolicy(100, False), "best": TierPolicy(1, True), "cheap": TierPolicy(5, True),
             "inference": TierPolicy(50, False)}
    assert default_tier(tiers) == "best"  # lowest-priority preemptible
    jobs = load_jobs(path)
    m = map_jobs(jobs, ["nlp", "vision", "x"], tiers, 3, {}, {"gold": "prod"}, {"team-vision": "vision"})
    by = {j.name: (j.team, j.tier) for j in m.jobs}
    assert by["a"] == ("nlp", "prod") and by["b"] == ("vision", "inference")
    assert by["c"][0] == by["d"][0] in ("nlp", "vision", "x")  # one trace team stays one team
    assert by["c"][1] == "best" and by["d"][1] == "prod"
    # only the fallback rules' names are said before the replay (not a map's, a namespace's, a PriorityClass's)
    assert (m.guessed_teams, m.guessed_tiers) == ({"acct-7", ""}, {""})
    spread = map_jobs(jobs, ["nlp", "vision", "x"], tiers, 3, {"*": "x"}, {"*": "cheap"})
    assert {j.name: (j.team, j.tier) for j in spread.jobs}["c"] == ("x", "cheap")
    assert not spread.guessed_teams and not spread.guessed_tiers
    with pytest.raises(ValueError, match="--team-map: nope not in the quota file"):
        map_jobs(jobs, ["nlp"], tiers, 3, {"acct-7": "nope"})
    assert team_shares({"a": 8, "b": 24}, 64) == {"a": 0.125, "b": 0.375}  # the file's GPUs as written
    assert team_shares({"a": 8, "b": 24}, 16) == {"a": 0.25, "b": 0.75}  # a smaller cluster: in proportion


def test_the_exporters_write_the_format_from_their_example_files(tmp_path):
    skipped = Counter()
    out = io.StringIO()
    write(kueue_rows(json.loads((EXAMPLES / "kueue-workloads.json").read_text()), skipped), out)
    assert skipped == {"not admitted and finished": 1}
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert [(r["job"], r["submit_time"], r["duration"], r["workers"], r["gpus_per_worker"], r["team"], r["tier"])
            for r in rows] == [("team-nlp/job-finetune-7f3a", "0", "7200", "2", "4", "team-nlp",
                                "airflow-gpu-production-training"),
                               ("team-research/job-sweep-11", "300", "14400", "4", "8", "team-research",
                                "airflow-gpu-best-effort-training")]  # the launcher podSet has no GPU
    skipped = Counter()
    out = io.StringIO()
    write(slurm_rows((EXAMPLES / "slurm-sacct.txt").read_text(), skipped), out)
    assert skipped == {"job steps": 1, "never started or still running": 1, "no GPU": 1}
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert [(r["job"], r["submit_time"], r["duration"], r["workers"], r["gpus_per_worker"], r["cpu_milli"],
             r["memory_mib"], r["team"], r["tier"]) for r in rows] == [
        ("1001", "0", "7200", "2", "4", "32000", "245760", "nlp", "high"),
        ("1002", "600", "14400", "1", "8", "32000", "245760", "research", "normal"),
        ("1005", "2400", "3600", "1", "1", "4000", "16384", "serving", "normal")]
    (tmp_path / "slurm.csv").write_text(out.getvalue())
    assert [j.workers for j in load_jobs(tmp_path / "slurm.csv")] == [2, 1, 1]  # what it writes, the loader reads


def test_the_example_trace_replays_from_the_readme_command(tmp_path):
    done = subprocess.run([sys.executable, "-m", "airflow_gpu", "simulate", "replay", "--trace",
                           str(EXAMPLES / "jobs.csv"), "--nodes", str(EXAMPLES / "nodes.csv"), "--platforms", "full",
                           "--jobs", "1", "--json", "--tier-map", "high=production-training"],
                          capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["platforms"]["full"]["finished_jobs"] == 10
    assert doc["mapping"]["teams"]["team-vision"] == "vision"
    # before the replay, stderr says what only a fallback rule mapped (not team-vision: its namespace says)
    guessed = next(line for line in done.stderr.splitlines() if line.strip().startswith("trace teams"))
    assert f"ml-platform -> {doc['mapping']['teams']['ml-platform']}" in guessed and "team-vision" not in guessed
