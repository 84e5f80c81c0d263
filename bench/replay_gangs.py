"""Queueing replay of a trace of large gangs (issue 30 item 6, beside `replay_80k`): the shape of the
real trace the replay was reviewed on (about 82,000 jobs over 109 days, multi-node gangs up to 128
GPUs, 640 GPUs), generated here, since that trace is not ours. Per 1,000 jobs it is several times the
work of `replay_80k`'s generator, whose gangs are one node at most: a 16 x 8-GPU gang waits for 16
free nodes, is tried again and again meanwhile and, as head of line, is estimated in most cycles.

The trace (seeded): arrivals uniform over `--days`; 55 % 1 GPU, 20 % 2-4 GPUs, 15 % 8 GPUs, 8 % 2-4
workers x 8 GPUs, 2 % 8-16 workers x 8 GPUs; log-normal work (median 24 min, sigma 1.6, 1 min to 7
days; gangs of 16 GPUs or more three times longer), about 98 % of the GPUs asked for on average; six
teams and three tiers the quota file does not know (so all of it runs as best-effort, as a trace
replayed without --tier-map does); 60 % checkpointable. Nodes: 48 A100 and 32 H100 nodes of 8 GPUs.
It goes through the generic job CSV and `simulate replay`'s own loading (sim.settings.trace_setting).

`--shape openb` writes the same jobs as the openb pod list instead, as the reviewed trace was converted:
a job of N GPUs is one pod of num_gpu = N (the loader makes it one pod of N GPUs where a node has N,
node-sized workers beyond: 16 x 8 GPUs for 128, the job CSV's own gangs), qos LS for the trace's
"prod" tier and BE for the others (so production preempts best-effort), every job checkpointable
(openb's rule).

    python -m bench replay_gangs [--days 109] [--seed 5] [--shape jobs|openb] [--platforms naive,full]
                                 [--estimates learned]
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

JOBS_PER_DAY = 82_247 / 109
NODES = (("A100", 48), ("H100", 32))


def write_trace(directory: Path, days: float, seed: int) -> tuple[Path, Path]:
    """The job CSV and the node list (sim/jobtrace.py's format, openb's node list)."""
    rng = random.Random(seed)
    rows = []
    for i in range(round(JOBS_PER_DAY * days)):
        submit = round(rng.uniform(0, days * 86400))
        u = rng.random()
        if u < 0.55:
            workers, gpus = 1, 1
        elif u < 0.75:
            workers, gpus = 1, rng.choice((2, 4))
        elif u < 0.90:
            workers, gpus = 1, 8
        elif u < 0.98:
            workers, gpus = rng.choice((2, 3, 4)), 8
        else:
            workers, gpus = rng.choice((8, 12, 16)), 8
        work = min(7 * 86400, max(60, 0.8 * rng.lognormvariate(math.log(1800), 1.6)))
        if workers * gpus >= 16:
            work = min(7 * 86400, 3 * work)
        rows.append({"job": f"j{i}", "submit_time": submit, "duration": round(work),
                     "workers": workers, "gpus_per_worker": gpus,
                     "team": rng.choice(("vision", "nlp", "speech", "recsys", "research", "infra")),
                     "tier": rng.choices(("prod", "batch", "dev"), (2, 5, 3))[0],
                     "checkpointable": rng.random() < 0.6})
    rows.sort(key=lambda r: r["submit_time"])
    jobs, nodes = directory / "jobs.csv", directory / "nodes.csv"
    with jobs.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    with nodes.open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(("sn", "cpu_milli", "memory_mib", "gpu", "model"))
        n = 0
        for model, count in NODES:
            for _ in range(count):
                w.writerow((f"node-{n:03d}", 128_000, 1_048_576, 8, model))
                n += 1
    return jobs, nodes


def write_openb(jobs_csv: Path, directory: Path) -> Path:
    """The job CSV as openb's pod list: one pod per job, num_gpu = its GPUs, qos LS for prod."""
    pods = directory / "pods.csv"
    with jobs_csv.open() as f, pods.open("w", newline="") as out:
        w = csv.writer(out)
        w.writerow(("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
                    "creation_time", "deletion_time", "scheduled_time"))
        for r in csv.DictReader(f):
            gpus = int(r["workers"]) * int(r["gpus_per_worker"])
            t = int(r["submit_time"])
            w.writerow((r["job"], 4000 * gpus, 16384 * gpus, gpus, 1000, "", "LS" if r["tier"] == "prod" else "BE",
                        "Succeeded", t, t + int(r["duration"]), t))
    return pods


def main(argv: list[str] | None = None) -> None:
    from airflow_gpu.sim.replay import SpotModel
    from airflow_gpu.sim.settings import DEFAULT_CONFIG, openb_setting, trace_setting
    from bench.replay import load_average, run_and_print

    ap = argparse.ArgumentParser(prog="python -m bench replay_gangs")
    ap.add_argument("--days", type=float, default=109.0)
    ap.add_argument("--seed", type=int, default=5, help="of the generated trace")
    ap.add_argument("--platforms", default="naive,full")
    ap.add_argument("--jobs", type=int, default=None, help="platforms in parallel processes (default: one per CPU)")
    ap.add_argument("--estimates", default="learned", choices=("learned", "runs", "declared", "off"))
    ap.add_argument("--shape", default="jobs", choices=("jobs", "openb"),
                    help="jobs: the generic job CSV (gangs of 8-GPU workers, tiers unknown); openb: the pod list "
                         "(gangs of one-GPU workers, LS/BE)")
    args = ap.parse_args(sys.argv[2:] if argv is None and len(sys.argv) > 1 and sys.argv[1] == "replay_gangs"
                         else argv or [])
    names = args.platforms.split(",")
    with tempfile.TemporaryDirectory(prefix="bench-replay-gangs-") as tmp:
        jobs_csv, nodes_csv = write_trace(Path(tmp), args.days, args.seed)
        if args.shape == "openb":
            setting = openb_setting(nodes_csv, write_openb(jobs_csv, Path(tmp)), 1.0, 42, DEFAULT_CONFIG)
        else:  # a quarter of the nodes spot, as the reviewed trace ran (openb's shape: --pods models 25 %)
            setting, _ = trace_setting(nodes_csv, jobs_csv, 1.0, 42, DEFAULT_CONFIG, {}, {}, spot=SpotModel(share=0.25))
    setting = replace(setting, estimates=args.estimates)
    gpus = sum(n.gpu_count for n in setting.nodes)
    offered = sum(j.work * j.gpu_milli / 1000 for j in setting.jobs) / (gpus * args.days * 86400)
    print(f"large gangs ({args.shape}), {args.days:g} days, seed {args.seed}: {len(setting.jobs)} jobs, {len(setting.nodes)} nodes, "
          f"{gpus} GPUs, {100 * offered:.0f} % of the GPUs asked for; estimates {args.estimates}; load average "
          f"{load_average()}", flush=True)
    run_and_print(setting, names, args.jobs)


if __name__ == "__main__":
    main(sys.argv[1:])
