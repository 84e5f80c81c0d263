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
    with pytest.raises(TraceError, match=r"jobs.csv:4: column job 'a' is also the job of line 2"):
        load_jobs(path)
    _nodes(tmp_path / "nodes.csv")
    bad = subprocess.run([sys.executable, "-m", "airflow_gpu", "simulate", "replay", "--trace", str(path), "--nodes",
                          str(tmp_path / "nodes.csv")], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "jobs.csv:4: column job 'a'" in bad.stderr


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
    assert skipped == {"not finished (pending, running or deleted)": 1}
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


def _replay(tmp_path, trace, *extra, platforms="naive,full"):
    _nodes(tmp_path / "nodes.csv")
    done = subprocess.run([sys.executable, "-m", "airflow_gpu", "simulate", "replay", "--trace", str(trace), "--nodes",
                           str(tmp_path / "nodes.csv"), "--platforms", platforms, "--jobs", "1", "--json",
                           "--estimates", "off", *extra], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), done.stderr


def test_the_kueue_export_replays_with_its_namespaced_job_names(tmp_path):
    """The documented path, export then replay: job names are namespace/name (a '/' once crashed the replay)."""
    out = tmp_path / "sub" / "jobs.csv"  # a directory that does not exist yet
    done = subprocess.run([sys.executable, "-m", "airflow_gpu.sim.export", "kueue", str(EXAMPLES / "kueue-workloads.json"),
                           "-o", str(out)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    doc, _ = _replay(tmp_path, out, "--events", str(tmp_path / "events"))
    assert doc["jobs"] == 2 and all(p["finished_jobs"] == 2 for p in doc["platforms"].values())
    rows = list(csv.DictReader((tmp_path / "events" / "full.csv").open()))
    assert {r["job"] for r in rows} == {"team-nlp/job-finetune-7f3a", "team-research/job-sweep-11"}


def test_a_trace_in_epoch_seconds_replays_as_one_from_zero(tmp_path):
    _trace(tmp_path / "jobs.csv", n=80)
    rows = list(csv.DictReader((tmp_path / "jobs.csv").open()))
    first = min(float(r["submit_time"]) for r in rows)

    def shifted(name: str, origin: float):
        path = tmp_path / name
        with path.open("w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=COLUMNS)
            w.writeheader()
            w.writerows({**r, "submit_time": f"{origin + float(r['submit_time']) - first:.1f}"} for r in rows)
        return path

    epoch, zero = shifted("epoch.csv", 1_740_000_000), shifted("zero.csv", 0)
    a, said = _replay(tmp_path, epoch)
    b, _ = _replay(tmp_path, zero)
    assert "submit times counted from the first submission (submit_time 1,740,000,000)" in said
    for name in ("naive", "full"):
        pa, pb = ({k: v for k, v in d["platforms"][name].items() if k != "seconds"} for d in (a, b))
        assert pa == pb
        assert 10 < pa["gpu_utilization_pct"] <= 100 and pa["horizon_seconds"] > 86400


def test_a_batch_submitted_at_once_is_measured_over_its_packed_time(tmp_path):
    """No arrival window: utilisation and cost over the time the work takes packed on every GPU, not 0."""
    path = tmp_path / "batch.csv"
    path.write_text("job,submit_time,duration,workers,gpus_per_worker\n" +
                    "".join(f"b{i},0,3600,1,8\n" for i in range(12)))  # 12 x 8 GPUs for an hour on 48 GPUs
    doc, _ = _replay(tmp_path, path)
    for p in doc["platforms"].values():
        assert p["horizon_seconds"] == 7200.0  # 96 GPU-hours on 48 GPUs
        assert 60 <= p["gpu_utilization_pct"] <= 100 and p["cost"] > 0 and 3600 < p["end_seconds"] <= 10800


def test_a_faster_product_runs_the_reference_duration_faster(tmp_path):
    """duration is on the reference product: the quota file's relative_speed 2.5 makes an hour 1,440 s on an H100."""
    path = tmp_path / "jobs.csv"
    path.write_text("job,submit_time,duration,gpus_per_worker,products\na,0,3600,8,h100-80gb\nb,0,3600,8,a100-80gb\n")
    _replay(tmp_path, path, "--events", str(tmp_path / "events"))
    ends = {r["job"]: float(r["end"]) for r in csv.DictReader((tmp_path / "events" / "full.csv").open())}
    assert ends == {"a": 1440.0, "b": 3600.0}


def test_jobs_that_can_never_start_are_left_out_with_the_scheduler_s_reason(tmp_path):
    path = tmp_path / "jobs.csv"
    path.write_text("job,submit_time,duration,workers,gpus_per_worker,cpu_milli,memory_mib,products\n"
                    "ok,0,3600,1,8,,,\nhuge,10,3600,10,8,,,\nfat,20,3600,1,16,,,\ncpu,30,3600,1,1,200000,,\n"
                    "h100s,40,3600,2,8,,,h100-80gb\nlast,50,3600,1,1,,,\n")
    doc, said = _replay(tmp_path, path)
    assert doc["jobs"] == 2 and set(doc["left_out"]) == {"huge", "fat", "cpu", "h100s"}
    assert "needs 80 GPUs" in doc["left_out"]["huge"] and "insufficient cpu" in doc["left_out"]["cpu"]
    assert "4 jobs can never start on these nodes and are left out" in said
    assert all(p["finished_jobs"] == 2 and p["starved_jobs"] == 0 for p in doc["platforms"].values())
    path.write_text("job,submit_time,duration,gpus_per_worker\nhuge,0,60,9\n")
    bad = subprocess.run([sys.executable, "-m", "airflow_gpu", "simulate", "replay", "--trace", str(path), "--nodes",
                          str(tmp_path / "nodes.csv")], capture_output=True, text=True, cwd=ROOT)
    assert bad.returncode == 2 and "no job can start on the 6 nodes kept" in bad.stderr


def test_spot_is_what_the_node_list_says_unless_asked(tmp_path):
    _trace(tmp_path / "jobs.csv", n=120)
    listed, said = _replay(tmp_path, tmp_path / "jobs.csv", platforms="full")
    assert listed["spot_share"] == 0.0 and listed["platforms"]["full"]["interruptions"] == 0
    assert "no node is spot" in said
    asked, said = _replay(tmp_path, tmp_path / "jobs.csv", "--spot-share", "0.5", platforms="full")
    assert asked["spot_share"] == 0.5 and "50 % of the nodes are spot" in said
    assert asked["platforms"]["full"]["cost"] < listed["platforms"]["full"]["cost"]


@pytest.mark.parametrize("name, data", [
    ("bom", "\ufeffjob,submit_time,duration,gpus_per_worker\na,0,60,1\n".encode()),
    ("utf16", "job,submit_time,duration,gpus_per_worker\na,0,60,1\n".encode("utf-16")),
    ("tabs", b"job\tsubmit_time\tduration\tgpus_per_worker\na\t0\t60\t1\n"),
    ("semicolons", b"job;submit_time;duration;gpus_per_worker\na;0;60;1\n"),
    ("capitals and spaces", b"Job, Submit_Time, Duration, GPUs_per_worker\na, 0, 60, 1\n"),
    ("pandas floats", b"job,submit_time,duration,gpus_per_worker,workers\na,0.0,60.0,1.0,1.0\n"),
    ("an unrelated extra column", b"job,submit_time,duration,gpus_per_worker,time,user\na,0,60,1,x,y\n"),
])
def test_headers_and_numbers_as_spreadsheets_write_them_load(tmp_path, name, data):
    path = tmp_path / "jobs.csv"
    path.write_bytes(data)
    [job] = load_jobs(path)
    assert (job.name, job.submit, job.work, job.worker.gpus, job.workers) == ("a", 0.0, 60.0, 1, 1)


@pytest.mark.parametrize("data, expected", [
    (b"job,submit_time,duration,gpus_per_worker,worker\na,0,60,1,4\n", "column 'worker' is not one this format "
                                                                         "reads.*did you mean 'workers'"),
    (b"job,submit_time,duration,gpus_per_worker,teir\na,0,60,1,high\n", "did you mean 'tier'"),
    (b"job,submit_time,duration,gpus_per_worker,checkpointible\na,0,60,1,yes\n", "did you mean 'checkpointable'"),
    (b"jobid,submit,duration\na,0,60\n", "missing column.*found 'jobid', 'submit', 'duration'"),
    (b"", "found nothing \\(an empty file\\)"),
    ("job,submit_time,duration,gpus_per_worker,team\na,0,60,1,\xe9quipe\n".encode("latin-1"), "not UTF-8 text"),
])
def test_a_header_typo_or_an_unreadable_file_is_refused_naming_it(tmp_path, data, expected):
    path = tmp_path / "jobs.csv"
    path.write_bytes(data)
    with pytest.raises(TraceError, match=expected):
        load_jobs(path)


@pytest.mark.parametrize("rows, expected", [
    (["a,8,8,8,a100", "a,8,8,8,a100"], "column sn 'a' is also the node of line 2"),
    (["cpu-0,8,8,0,"], "no node has a GPU"),
])
def test_a_node_list_that_cannot_be_replayed_is_refused(tmp_path, rows, expected):
    from airflow_gpu.sim.traces import load_nodes

    path = tmp_path / "nodes.csv"
    path.write_text("\n".join(["sn,cpu_milli,memory_mib,gpu,model", *rows]) + "\n")
    with pytest.raises(TraceError, match=expected):
        load_nodes(path)


def test_the_exporters_read_what_clusters_write_and_say_what_they_approximated(tmp_path):
    """Kueue: YAML, MIG slices, podSets of different asks, a finished Workload whose Admitted went False
    (Kueue 0.15); Slurm: GPUs uneven over nodes, a requeued JobID listed twice, a pending job."""
    t = "2026-01-01T00:{:02d}:00Z"
    def workload(name, podsets, conditions):
        return {"metadata": {"name": name, "namespace": "team-nlp", "creationTimestamp": t.format(0)},
                "spec": {"podSets": [{"name": f"ps{i}", "count": c, "template": {"spec": {"containers": [
                    {"resources": {"requests": r}}]}}} for i, (c, r) in enumerate(podsets)]},
                "status": {"conditions": [{"type": k, "status": v, "lastTransitionTime": t.format(m)}
                                          for k, v, m in conditions]}}
    done = [("Admitted", "True", 1), ("Finished", "True", 31)]
    doc = {"items": [
        workload("mig", [(1, {"nvidia.com/mig-1g.10gb": "1"})], done),
        workload("mixed", [(1, {"nvidia.com/gpu": "8"}), (4, {"nvidia.com/gpu": "1"})], done),
        workload("kueue-015", [(2, {"nvidia.com/gpu": "4"})],
                 [("PodsReady", "True", 5), ("Admitted", "False", 45), ("Finished", "True", 45)]),
        workload("pending", [(1, {"nvidia.com/gpu": "1"})], [])]}
    import yaml

    src = tmp_path / "workloads.yaml"
    src.write_text(yaml.safe_dump(doc))
    out = subprocess.run([sys.executable, "-m", "airflow_gpu.sim.export", "kueue", str(src)],
                         capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    rows = {r["job"]: r for r in csv.DictReader(io.StringIO(out.stdout))}
    assert (rows["team-nlp/mig"]["gpu_milli"], rows["team-nlp/mig"]["gpus_per_worker"]) == ("143", "")
    assert (rows["team-nlp/mixed"]["workers"], rows["team-nlp/mixed"]["gpus_per_worker"]) == ("5", "8")
    assert rows["team-nlp/kueue-015"]["duration"] == "2400"  # PodsReady at :05 to Finished at :45
    assert "team-nlp/pending" not in rows
    assert "1 job with podSets of different GPU asks" in out.stderr and "1 not finished" in out.stderr
    sacct = ("JobID|Account|QOS|Submit|Start|End|NNodes|AllocTRES\n"
             "7|nlp|high|2026-01-01T00:00:00|2026-01-01T00:01:00|2026-01-01T01:01:00|2|cpu=8,gres/gpu=5\n"
             "8|nlp|high|2026-01-01T00:00:00|2026-01-01T00:01:00|2026-01-01T00:02:00|1|cpu=8,gres/gpu=4\n"
             "8|nlp|high|2026-01-01T00:03:00|2026-01-01T00:04:00|2026-01-01T01:04:00|1|cpu=8,gres/gpu=4\n"
             "9|nlp|high|2026-01-01T00:03:00|Unknown|Unknown|1|\n"
             "10|nlp|high|2026-01-01T00:05:00|2026-01-01T00:05:00|2026-01-01T00:06:00|1|gres/gpu:1g.10gb=1,gres/gpu=1\n")
    skipped, notes = Counter(), Counter()
    rows = {r["job"]: r for r in slurm_rows(sacct, skipped, notes=notes)}
    assert (rows["7"]["workers"], rows["7"]["gpus_per_worker"]) == (2, 3)
    assert rows["8"]["duration"] == 3600.0 and list(rows) == ["7", "8", "10"]
    assert (rows["10"]["gpus_per_worker"], rows["10"]["gpu_milli"]) == ("", 143)  # a MIG slice: a seventh
    assert skipped == {"never started or still running": 1} and sum(notes.values()) == 2


def test_the_openb_pods_left_out_are_counted_by_why(tmp_path):
    path = tmp_path / "pods.csv"
    path.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,"
                    "scheduled_time\n"
                    "p0,1000,1024,1,1000,,LS,Running,0,3600,0\np1,1000,1024,0,0,,LS,Running,0,3600,0\n"
                    "p2,1000,1024,1,1000,,Weird,Running,0,3600,0\np3,1000,1024,1,1000,,BE,Pending,0,3600,\n"
                    "p4,1000,1024,1,1000,,BE,Running,10,3600,10\n")
    _nodes(tmp_path / "nodes.csv")
    done = subprocess.run([sys.executable, "-m", "airflow_gpu", "simulate", "replay", "--pods", str(path), "--nodes",
                           str(tmp_path / "nodes.csv"), "--platforms", "naive", "--jobs", "1", "--json",
                           "--estimates", "off"], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    assert doc["jobs"] == 2 and sorted(doc["source_notes"]) == [
        "1 pod of qos Weird (not LS, Guaranteed, BE, Burstable) left out",
        "1 pod the trace never scheduled (no scheduled_time) left out", "1 pod without a GPU left out"]
    assert "1 pod without a GPU left out" in done.stderr


def test_an_openb_pod_of_several_gpus_runs_on_one_node_and_a_wider_one_in_node_sized_workers(tmp_path):
    """An openb pod of num_gpu N ran on one node: it replays as one pod of N GPUs where a node of a
    model it accepts has N, else as workers of the largest divisor of N such a node holds."""
    pods, nodes = tmp_path / "pods.csv", tmp_path / "nodes.csv"
    nodes.write_text("sn,cpu_milli,memory_mib,gpu,model\n"
                     + "".join(f"g{i},96000,1000000,8,G2\n" for i in range(4))
                     + "".join(f"t{i},64000,500000,4,T4\n" for i in range(2)))
    spec = {"p8": (8, ""), "p16": (16, ""), "p12": (12, ""), "p11": (11, ""), "t8": (8, "T4"), "t3": (3, "T4")}
    pods.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,"
                    "deletion_time,scheduled_time\n"
                    + "".join(f"{name},{gpus * 2000},{gpus * 1000},{gpus},1000,{s},LS,Running,{i * 10},"
                              f"{i * 10 + 3600},{i * 10}\n" for i, (name, (gpus, s)) in enumerate(spec.items())))
    events = tmp_path / "events"
    done = subprocess.run([sys.executable, "-m", "airflow_gpu", "simulate", "replay", "--pods", str(pods), "--nodes",
                           str(nodes), "--platforms", "full", "--jobs", "1", "--json", "--estimates", "off",
                           "--events", str(events)], capture_output=True, text=True, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    placed: dict[str, list[tuple[str, int]]] = {}  # job -> (node, GPUs) per pod of its first attempt
    for row in csv.DictReader((events / "full.csv").open()):
        if row["attempt"] == "1" and row["pods"]:
            for pod in row["pods"].split(";"):
                node, shares = pod.split("@")[0].split(":")
                placed.setdefault(row["job"], []).append((node, len(shares.split("+"))))
    expected = {"p8": [8], "p16": [8, 8], "p12": [6, 6], "p11": [1] * 11, "t8": [4, 4], "t3": [3]}
    assert {job: sorted(g for _, g in pods_) for job, pods_ in placed.items()} == expected
    assert {node[0] for node, _ in placed["t8"] + placed["t3"]} == {"t"}  # its model's nodes only
    verify_events(events / "full.csv", events / "full.quota.json")
