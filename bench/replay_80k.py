"""Queueing replay at a real platform's size: 80,000 generated jobs over 100 days at a contended
capacity, naive + full (target: both under 120 s on the 2-core machine). Per platform: wall clock,
CPU time and the events hash (bench.replay.events_hash), so a speed-up can show the decisions did
not change. Load average printed before and after: on a shared machine the wall clock is inflated.

The trace is the seed scenario's generator (sim/workload.py SeedParams) scaled by `--scale`: arrival
rates, nodes and team quotas times the scale, so the mix and the contention stay the seed's (about
95 % of the GPUs asked for on average, twice that in working hours).

    python -m bench replay_80k [--scale 7.7] [--days 100] [--seed 11] [--platforms naive,full] [--jobs N]
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace


def params(scale: float, days: float):
    from airflow_gpu.sim.workload import SeedParams

    base = SeedParams()
    return replace(base, days=days, nodes=max(1, round(base.nodes * scale * 0.42)),
                   quota_gpus=max(1, round(base.quota_gpus * scale * 0.42)),
                   production_per_hour=base.production_per_hour * scale,
                   best_effort_per_hour=base.best_effort_per_hour * scale,
                   inference_per_hour=base.inference_per_hour * scale)


def main(argv: list[str] | None = None) -> None:
    from airflow_gpu.sim.settings import seed_setting
    from bench.replay import load_average, run_and_print

    ap = argparse.ArgumentParser(prog="python -m bench replay_80k")
    ap.add_argument("--scale", type=float, default=7.7, help="times the seed scenario's rates, nodes and quotas")
    ap.add_argument("--days", type=float, default=100.0)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--platforms", default="naive,full")
    ap.add_argument("--jobs", type=int, default=None, help="platforms in parallel processes (default: one per CPU)")
    ap.add_argument("--estimates", default="learned", choices=("learned", "runs", "declared", "off"),
                    help="recording of the predicted starts (sim/start_accuracy.py; off: the replay alone)")
    args = ap.parse_args(sys.argv[2:] if argv is None and len(sys.argv) > 1 and sys.argv[1] == "replay_80k"
                         else argv or [])
    t0 = time.perf_counter()
    p = params(args.scale, args.days)
    setting = replace(seed_setting(p, args.seed), estimates=args.estimates)
    gpus = sum(n.gpu_count for n in setting.nodes)
    print(f"generator x{args.scale:g}, {args.days:g} days, seed {args.seed}: {len(setting.nodes)} nodes, {gpus} GPUs, "
          f"{len(setting.jobs)} jobs (built in {time.perf_counter() - t0:.1f} s), estimates {args.estimates}; load average "
          f"{load_average()}", flush=True)
    run_and_print(setting, args.platforms.split(","), args.jobs, target="120 s")


if __name__ == "__main__":
    main(sys.argv[1:])
