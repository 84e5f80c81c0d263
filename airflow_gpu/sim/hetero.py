"""Two GPU generations in the replay (issue 29 item 7): the seed scenario's generator with H100 nodes
beside its A100 nodes and training jobs that accept one product or both, replayed on the full platform
under three product rules:

- `pinned`: each job runs only on the first product it names (no fungibility);
- `fungible-listed`: a job accepting both may take either, tried in the quota file's product order;
- `cheapest-per-work`: the same, tried by on-demand price / relative_speed (cheapest work first).

A job's work is in seconds on the reference product (relative_speed 1.0) and runs `speed` times as
fast on another (Setting.speeds). Reported per rule: mean and p95 job completion time (finish -
submit), mean and p95 queue wait (first start - submit), and the cost of the GPU time the jobs held
(each hold priced at its node's product and capacity type).

    python -m airflow_gpu.sim.hetero [--seed N] [--json]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from airflow_gpu.core.model import GPU_MILLI, Node
from airflow_gpu.constants import CAPACITY_SPOT
from airflow_gpu.sim.replay import PLATFORMS, ReplayResult, Setting, replay
from airflow_gpu.sim.settings import DEFAULT_CONFIG, seed_setting
from airflow_gpu.sim.workload import SeedParams

A100, H100 = "A100-80GB", "H100-80GB"  # node gpu.product labels of the seed scenario
CONFIG_NAMES = {A100: "a100-80gb", H100: "h100-80gb"}  # the quota file's product names
RULES = ("pinned", "fungible-listed", "cheapest-per-work")


@dataclass(frozen=True)
class HeteroParams:
    # the seed scenario, busier: half its A100 nodes and about twice its training arrivals
    seed_params: SeedParams = field(default_factory=lambda: SeedParams(days=7.0, nodes=6, production_per_hour=1.0,
                                                                       best_effort_per_hour=1.5))
    h100_nodes: int = 2  # H100 nodes of 8 GPUs beside the A100 nodes (spot like them, at the seed's share)
    both_share: float = 0.5  # training jobs that accept both products
    h100_first_share: float = 0.4  # of the training jobs: the ones naming H100 first (or only)

    def describe(self) -> dict:
        return asdict(self)


def _products(cfg_path=DEFAULT_CONFIG) -> tuple[dict[str, float], dict[str, tuple[float, float]], list[str]]:
    """(label -> relative speed, label -> (on-demand, spot) price, labels in the file's order)."""
    from airflow_gpu.config import load_config

    cfg = load_config(cfg_path)
    by_name = {v: k for k, v in CONFIG_NAMES.items()}
    speeds, prices, listed = {}, {}, []
    for p in cfg.products:
        label = by_name.get(p.name)
        if label is not None:
            speeds[label] = p.relative_speed
            prices[label] = (p.price_per_gpu_hour.on_demand, p.price_per_gpu_hour.spot)
            listed.append(label)
    return speeds, prices, listed


def hetero_setting(params: HeteroParams, seed: int, rule: str) -> Setting:
    if rule not in RULES:
        raise ValueError(f"rule must be one of {', '.join(RULES)} (got {rule!r})")
    base = seed_setting(params.seed_params, seed)
    speeds, prices, listed = _products()
    h100 = [Node(f"h100-{i:02d}", cpu_milli=96_000, memory_mib=1_000_000, gpu_count=8, gpu_product=H100,
                 gpu_memory_mib=81_920, rack=f"rack-h{i // 4}", clique=f"nvl-h{i // 2}") for i in range(params.h100_nodes)]
    rng = np.random.default_rng(seed + 2900)
    jobs = []
    for job in base.jobs:
        if job.worker.gpus == 0:  # inference on GPU shares: A100 only, as in the seed
            jobs.append(replace(job, worker=replace(job.worker, gpu_products=(A100,))))
            continue
        first, other = (H100, A100) if rng.random() < params.h100_first_share else (A100, H100)
        both = rng.random() < params.both_share
        accepted = (first, other) if both and rule != "pinned" else (first,)
        jobs.append(replace(job, worker=replace(job.worker, gpu_products=accepted)))
    if rule == "cheapest-per-work":
        order = sorted(listed, key=lambda p: (prices[p][0] / speeds[p], listed.index(p)))
    else:
        order = listed
    return replace(base, nodes=base.nodes + tuple(h100), jobs=tuple(jobs), prices={**base.prices, **prices},
                   speeds=speeds, product_rank={p: k for k, p in enumerate(order)} if rule != "pinned" else {})


def measure(r: ReplayResult) -> dict:
    """Mean and p95 completion time and queue wait (hours) over the jobs, cost of the held GPU time."""
    done = [st.finished_at - st.job.submit for st in r.jobs.values() if st.finished_at is not None]
    waits = [(st.first_start if st.first_start is not None else r.end) - st.job.submit for st in r.jobs.values()]
    spot = {n.name for n in r.nodes if n.capacity_type == CAPACITY_SPOT}
    product = {n.name: n.gpu_product for n in r.nodes}
    cost = 0.0
    for a in r.attempts:
        for _, since, p in a.holds:
            on_demand, spot_price = r.setting.prices.get(product[p.node] or "", (0.0, 0.0))
            gpus = sum(m for _, m in p.gpu_shares) / GPU_MILLI
            cost += gpus * max(0.0, a.end - since) / 3600 * (spot_price if p.node in spot else on_demand)
    hours = lambda xs, q=None: round(float(np.mean(xs) if q is None else np.percentile(xs, q)) / 3600, 2)  # noqa: E731
    return {"jobs": len(r.jobs), "finished": len(done), "jct_mean_h": hours(done), "jct_p95_h": hours(done, 95),
            "wait_mean_h": hours(waits), "wait_p95_h": hours(waits, 95), "cost": round(cost, 0)}


def compare(params: HeteroParams = HeteroParams(), seed: int = 1) -> dict[str, dict]:
    return {rule: measure(replay(hetero_setting(params, seed, rule), PLATFORMS["full"])) for rule in RULES}


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m airflow_gpu.sim.hetero", description=__doc__.split("\n\n")[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    params = HeteroParams()
    print(f"parameters (seed {args.seed}): {json.dumps(params.describe())}")
    results = compare(params, args.seed)
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print("| rule | jobs finished | JCT mean h | JCT p95 h | wait mean h | wait p95 h | cost |")
    print("|---|---|---|---|---|---|---|")
    for rule, m in results.items():
        print(f"| {rule} | {m['finished']}/{m['jobs']} | {m['jct_mean_h']} | {m['jct_p95_h']} | {m['wait_mean_h']} | "
              f"{m['wait_p95_h']} | {m['cost']:.0f} |")


if __name__ == "__main__":
    main()
