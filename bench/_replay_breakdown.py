"""Where the GPUs are while production waits, in one replay platform (issue 13 diagnosis), time-
weighted over the simulated time during which some production gang is pending. Not a benchmark
(the leading underscore keeps it out of `make bench`); as long as one replay (3-8 min at 0.003).

    .venv/bin/python -m bench._replay_breakdown --capacity 0.003 --seed 42 [--platform full]

Prints the average GPUs (of the cluster's) held by production (within / beyond its teams'
guarantees) and by best-effort (shares vs whole GPUs, on the head's reserved nodes or elsewhere),
and the free ones: on a node that is down (spot replacement); on the head's reserved nodes;
stranded (the node's free CPU or memory is below every waiting production pod's ask; of which by
CPU alone); partial GPUs elsewhere (a whole-GPU pod cannot use them); whole free GPUs elsewhere.
Also the share of that time a reservation of unknown start exists, and its nodes. The cycle's
reservation is read by wrapping core.queue.Queue.cycle (the replay itself is unchanged).
"""

from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

import numpy as np

TRACES = Path(__file__).resolve().parents[2] / "shared" / "traces" / "openb"


def main(argv: list[str] | None = None) -> None:
    import airflow_gpu.core.queue as queue_mod
    import airflow_gpu.sim.replay as replay_mod
    from airflow_gpu.constants import TIER_BEST_EFFORT_TRAINING as BE
    from airflow_gpu.constants import TIER_PRODUCTION_TRAINING as PROD
    from airflow_gpu.core.model import GPU_MILLI
    from airflow_gpu.sim.replay_report import summarize
    from airflow_gpu.sim.settings import openb_setting

    ap = argparse.ArgumentParser(prog="python -m bench._replay_breakdown")
    ap.add_argument("--capacity", type=float, default=0.003)
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--platform", default="full", choices=sorted(replay_mod.PLATFORMS))
    ap.add_argument("--traces", type=Path, default=TRACES)
    args = ap.parse_args(argv)
    setting = openb_setting(args.traces / "openb_node_list_gpu_node.csv",
                            args.traces / "openb_pod_list_default.csv", args.capacity, args.seed)
    last = {"res": None}
    real = queue_mod.Queue.cycle

    def spy(*a, **k):
        result = real(*a, **k)
        last["res"] = result.reservation
        return result

    queue_mod.Queue.cycle = spy
    acc: dict[str, float] = defaultdict(float)

    class Breakdown(replay_mod.Replay):
        def _advance(self, now: float) -> None:
            dt = now - self.last_t
            if dt > 0 and self.last_t > 0:
                self._sample(dt)  # the state between the last event and this one
            super()._advance(now)

        def _sample(self, dt: float) -> None:
            snap = self.snap
            waiting = [g for g in self.pending.values() if g.tier == PROD]
            if not waiting:
                return
            acc["seconds"] += dt
            acc["prod_waiting_gpus"] += dt * sum(g.gpu_milli_total for g in waiting) / GPU_MILLI
            res = last["res"]
            reserved = np.zeros(len(snap), dtype=bool)
            if res is not None:
                reserved[[snap.node_index(n) for n in res.nodes]] = True
                acc["reservation_unknown_start"] += dt * math.isinf(res.start)
                acc["reservation_nodes"] += dt * len(res.nodes)
            down = np.zeros(len(snap), dtype=bool)
            for n in self.down:
                down[snap.node_index(n)] = True
            asks = np.unique(np.array([(p.cpu_milli, p.memory_mib) for g in waiting for p in g.members]), axis=0)
            fits = ((asks[:, 0][:, None] <= snap.cpu_free[None, :])
                    & (asks[:, 1][:, None] <= snap.mem_free[None, :])).any(axis=0)
            cpu_fits = (asks[:, 0][:, None] <= snap.cpu_free[None, :]).any(axis=0)
            free = np.where(snap.shape.gpu_exists, snap.gpu_free, 0)
            node_free = free.sum(axis=1)
            whole = (free == GPU_MILLI).sum(axis=1) * GPU_MILLI
            other = ~down & ~reserved & fits
            for key, mask in (("free_down", down), ("free_reserved", ~down & reserved),
                              ("free_stranded", ~down & ~reserved & ~fits),
                              ("free_stranded_by_cpu", ~down & ~reserved & ~cpu_fits)):
                acc[key] += dt * node_free[mask].sum() / GPU_MILLI
            acc["free_other_whole"] += dt * whole[other].sum() / GPU_MILLI
            acc["free_other_partial"] += dt * (node_free - whole)[other].sum() / GPU_MILLI
            for unit, (job, placements, _) in self.placed.items():
                gang = self.states[job].units[unit]
                for p in placements:
                    gpus = dt * sum(m for _, m in p.gpu_shares) / GPU_MILLI
                    if gang.tier == PROD:
                        acc["prod_held"] += gpus
                        acc["prod_held_borrowed" if self.states[job].borrowed.get(unit) else "prod_held_own"] += gpus
                    else:
                        kind = "share" if gang.members[0].gpu_milli else "whole"
                        where = "reserved" if reserved[snap.node_index(p.node)] else "elsewhere"
                        acc[f"be_{kind}_{where}"] += gpus

    try:
        result = Breakdown(setting, replay_mod.PLATFORMS[args.platform]).run()
    finally:
        queue_mod.Queue.cycle = real
    seconds = acc.pop("seconds", 0.0)
    out = {k: round(v / seconds, 3) for k, v in sorted(acc.items())} if seconds else {}
    out["days_production_waits"] = round(seconds / 86400, 1)
    out["gpus"] = int(sum(n.gpu_count for n in setting.nodes))
    q = summarize(result)["queue_wait_seconds"]
    out["p95_wait_seconds"] = {tier: q[tier]["p95"] for tier in (PROD, BE) if tier in q}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
