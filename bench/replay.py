"""Queueing replay of the openb default trace (149 days), every platform of one run (target: < 60 s
in all). Per platform: wall clock, CPU time (time.process_time) and a hash of the events rows
(write_events' CSV), so an optimisation can show the decisions did not change. The load average is
printed because wall clock on a shared machine is inflated by other work.

    python -m bench replay [--capacity 0.005] [--seed 42] [--platforms naive,full] [--profile FILE]
                           [--estimates learned|runs|declared|off]  (the recording of estimated starts; off: its cost out)
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import tempfile
import time
from pathlib import Path

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "openb"


def _file_hash(write) -> str:
    """The start of the sha256 of the file `write(directory)` writes and returns."""
    with tempfile.TemporaryDirectory() as d:
        return hashlib.sha256(write(Path(d)).read_bytes()).hexdigest()[:16]


def events_hash(result) -> str:
    from airflow_gpu.sim.replay_report import write_events

    return _file_hash(lambda d: write_events(result, d))


def estimates_hash(result) -> str:
    """Of the estimates CSV (every recorded estimated start): '-' when nothing was recorded. A
    speed-up of the estimator shows it recorded the same with this, as events_hash does for decisions."""
    from airflow_gpu.sim.start_accuracy import write_estimates

    if result.start_samples is None:
        return "-"
    return _file_hash(lambda d: write_estimates(result.start_samples, d / "estimates.csv"))


def load_average() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def run_and_print(setting, names: list[str], jobs: int | None, target: str = "") -> None:
    """`simulate replay`'s run (sim.replay.replay_platforms with its progress), then a line per
    platform: wall clock, CPU time, events and estimates hashes, GPU time allocated and useful, p95
    wait per tier and preemptions; then the whole run's wall clock and the load average."""
    from airflow_gpu.cli.simulate import replay_showing_progress
    from airflow_gpu.sim.replay_report import summarize

    w0 = time.perf_counter()
    results = replay_showing_progress(setting, names, jobs)
    wall = time.perf_counter() - w0
    for name, r in zip(names, results):
        s = summarize(r)
        p95 = "  ".join(f"{tier} p95 {w.get('p95')}" for tier, w in sorted(s["queue_wait_seconds"].items()))
        print(f"{name:8s} wall {r.seconds:6.1f} s  cpu {r.cpu_seconds:6.1f} s  events {events_hash(r)}  "
              f"estimates {estimates_hash(r)}  alloc {s['gpu_utilization_pct']:.2f} %  "
              f"useful {s['useful_gpu_utilization_pct']:.2f} %  {p95}  preemptions {s['preemptions']}", flush=True)
    procs = min(jobs or os.cpu_count() or 1, len(names))
    print(f"{'all':8s} wall {wall:6.1f} s in {procs} process(es), cpus {os.cpu_count()}"
          f"{', target ' + target if target else ''}; load average {load_average()}", flush=True)


def main(argv: list[str] | None = None) -> None:
    from airflow_gpu.sim.replay import PLATFORMS, replay, replay_platforms
    from airflow_gpu.sim.replay_report import summarize
    from airflow_gpu.sim.settings import openb_setting

    ap = argparse.ArgumentParser(prog="python -m bench replay")
    ap.add_argument("--capacity", type=float, default=0.005)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--platforms", default=",".join(PLATFORMS))
    ap.add_argument("--traces", type=Path, default=TRACES)
    ap.add_argument("--profile", type=Path, help="cProfile each platform to FILE.<platform> (runs them one by one)")
    ap.add_argument("--jobs", type=int, default=None, help="platforms in parallel processes (default: one per CPU)")
    ap.add_argument("--estimates", default="learned", choices=("learned", "runs", "declared", "off"),
                    help="record the estimated starts as `simulate replay` does (default learned; off: not recorded)")
    args = ap.parse_args(sys.argv[2:] if argv is None and len(sys.argv) > 1 and sys.argv[1] == "replay" else argv or [])
    setting = openb_setting(args.traces / "openb_node_list_gpu_node.csv", args.traces / "openb_pod_list_default.csv",
                            args.capacity, args.seed)
    from dataclasses import replace

    setting = replace(setting, estimates=args.estimates)
    print(f"openb default, capacity {args.capacity}, seed {args.seed}: {sum(n.gpu_count for n in setting.nodes)} GPUs, "
          f"{len(setting.jobs)} jobs, estimates {args.estimates}; load average {os.getloadavg()[0]:.2f}", flush=True)
    names = args.platforms.split(",")
    jobs = 1 if args.profile else (args.jobs or os.cpu_count() or 1)
    w0, c0 = time.perf_counter(), _cpu_with_children()
    if args.profile:
        import cProfile

        results = []
        for name in names:
            prof = cProfile.Profile()
            results.append(prof.runcall(replay, setting, PLATFORMS[name]))
            prof.dump_stats(f"{args.profile}.{name}")
    else:
        results = replay_platforms(setting, names, jobs)
    wall_all, cpu_all = time.perf_counter() - w0, _cpu_with_children() - c0
    for name, r in zip(names, results):
        s = summarize(r)
        prod = s["queue_wait_seconds"].get("production-training", {}).get("p95")
        print(f"{name:22s} wall {r.seconds:6.1f} s  cpu {r.cpu_seconds:6.1f} s  events {events_hash(r)}  "
              f"useful {s['useful_gpu_utilization_pct']:.2f} %  prod p95 {prod}  preemptions {s['preemptions']}",
              flush=True)
    print(f"{'all':22s} wall {wall_all:7.1f} s  cpu {cpu_all:7.1f} s (this process and its workers)  "
          f"{jobs} process(es)  cpus {os.cpu_count()}  load {os.getloadavg()[0]:.2f}  target 60 s  "
          f"ratio {wall_all / 60:.2f}")
    # on a machine loaded by others the wall clock says little: the CPU the platforms took, spread
    # over the workers, is what the run would take with the cores to itself (a lower bound)
    cpu_platforms = sum(r.cpu_seconds for r in results)
    print(f"{'':22s} cpu of the platforms {cpu_platforms:7.1f} s; / {jobs} process(es) = {cpu_platforms / jobs:.1f} s")


def _cpu_with_children() -> float:
    t = os.times()  # children: the worker processes, counted once they are reaped
    return t.user + t.system + t.children_user + t.children_system


if __name__ == "__main__":
    main(sys.argv[1:])
