"""What the time replay replays: jobs with a submit time and an amount of work, and the cluster.

Sources, every rule written down (README, "Queueing replay"):
- sim/jobtrace.py: traces -> jobs (the generic job CSV, the Alibaba openb pod list);
- seed_scenario: the design's seed example, generated from SeedParams (printed with the results).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace

import numpy as np

from airflow_gpu.constants import CAPACITY_SPOT, TIER_BEST_EFFORT_TRAINING, TIER_INFERENCE, TIER_PRODUCTION_TRAINING
from airflow_gpu.core.model import GPU_MILLI, Node, PodRequest


@dataclass(frozen=True)
class Job:
    """One unit of user work: `workers` identical pods that run together for `work` seconds."""

    name: str
    team: str
    tier: str
    worker: PodRequest  # one worker's ask (the gang is `workers` of these)
    workers: int
    submit: float
    work: float  # seconds of computation to finish, on the trace's clock
    checkpointable: bool
    checkpoint_interval: float = 0.0  # seconds between periodic checkpoints (0: none)
    checkpoint_seconds: float | None = None  # seconds its SIGTERM checkpoint takes (None: the setting's default)

    @property
    def gpu_milli(self) -> int:
        return self.worker.gpu_milli_total * self.workers


def keep_capacity(nodes: list[Node], fraction: float, seed: int) -> list[Node]:
    """A seeded fraction of the GPU nodes (at least one), in their original order."""
    if not 0 < fraction <= 1:
        raise ValueError(f"--capacity must be in (0, 1], got {fraction}")
    gpu_nodes = [n for n in nodes if n.gpu_count]
    k = max(1, round(fraction * len(gpu_nodes)))
    keep = set(np.random.default_rng(seed).choice(len(gpu_nodes), size=k, replace=False).tolist())
    return [n for i, n in enumerate(gpu_nodes) if i in keep]


def mark_spot(nodes: list[Node], share: float, seed: int) -> list[Node]:
    """A seeded `share` of the nodes becomes spot capacity (the rest stays on-demand)."""
    k = int(round(share * len(nodes)))
    spot = set(np.random.default_rng(seed + 1).choice(len(nodes), size=k, replace=False).tolist()) if k else set()
    return [replace(n, capacity_type=CAPACITY_SPOT) if i in spot else n for i, n in enumerate(nodes)]


@dataclass(frozen=True)
class SeedParams:
    """The seed scenario (docs/DESIGN.md): every knob of the generator, printed with the results."""

    days: float = 14.0
    nodes: int = 12  # A100-80GB nodes, 8 GPUs each
    teams: tuple[str, ...] = ("nlp", "vision", "recsys", "research")
    quota_gpus: int = 8  # guaranteed whole GPUs per team (the seed's "teams of eight GPUs")
    serving_team: str = "serving"
    production_per_hour: float = 0.55  # fine-tunes (1-2 workers x 4 GPUs)
    best_effort_per_hour: float = 0.8  # sweeps (1-2 workers x 4 GPUs)
    inference_per_hour: float = 3.0  # serving pods needing 2 GB of GPU memory
    production_hours_lognormal: tuple[float, float] = (math.log(3.0), 0.6)  # (mu, sigma) of hours
    best_effort_hours_lognormal: tuple[float, float] = (math.log(4.0), 0.8)
    inference_hours_lognormal: tuple[float, float] = (math.log(1.0), 0.5)
    checkpoint_interval: float = 1800.0  # one epoch, seconds
    mig_share_milli: int = 143  # a 1g.10gb slice: 1/7 of an A100's compute
    spot_share: float = 0.33  # fraction of the nodes that are spot
    interruptions_per_node_day: float = 0.5
    notice_seconds: float = 120.0
    replace_after_seconds: float = 900.0
    burst_factor: float = 2.0  # arrivals in working hours (8-20 h) are this much denser

    def describe(self) -> dict:
        return asdict(self)


def seed_nodes(p: SeedParams) -> list[Node]:
    return [Node(f"a100-{i:02d}", cpu_milli=96_000, memory_mib=1_000_000, gpu_count=8, gpu_product="A100-80GB",
                 gpu_memory_mib=81_920, rack=f"rack-{i // 4}", clique=f"nvl-{i // 2}") for i in range(p.nodes)]


def _arrivals(rng, rate_per_hour: float, p: SeedParams) -> np.ndarray:
    """A Poisson process of mean `rate_per_hour` with a daily cycle: working hours (8-20 h) are
    `burst_factor` times denser than the night (thinning of a peak-rate process)."""
    horizon = p.days * 86400
    peak = rate_per_hour / (0.5 + 0.5 / p.burst_factor) / 3600
    t = np.sort(rng.uniform(0, horizon, rng.poisson(peak * horizon)))
    hour = (t % 86400) / 3600
    keep_p = np.where((hour >= 8) & (hour < 20), 1.0, 1.0 / p.burst_factor)
    return t[rng.uniform(size=len(t)) < keep_p]


def seed_scenario(p: SeedParams, seed: int) -> tuple[list[Node], list[Job]]:
    rng = np.random.default_rng(seed)
    jobs: list[Job] = []

    def hours(mu_sigma) -> np.ndarray:
        return rng.lognormal(mu_sigma[0], mu_sigma[1])

    for tier, rate, dur, teams in (
        (TIER_PRODUCTION_TRAINING, p.production_per_hour, p.production_hours_lognormal, p.teams[:3]),
        (TIER_BEST_EFFORT_TRAINING, p.best_effort_per_hour, p.best_effort_hours_lognormal, p.teams),
    ):
        for i, t in enumerate(_arrivals(rng, rate, p)):
            workers = int(rng.integers(1, 3))
            worker = PodRequest(f"{tier[:4]}-{i}", cpu_milli=16_000, memory_mib=120_000, gpus=4)
            jobs.append(Job(f"{tier[:4]}-{i}", str(rng.choice(teams)), tier, worker, workers, float(t),
                            float(hours(dur) * 3600), checkpointable=True,
                            checkpoint_interval=p.checkpoint_interval))
    for i, t in enumerate(_arrivals(rng, p.inference_per_hour, p)):
        worker = PodRequest(f"inf-{i}", cpu_milli=2_000, memory_mib=8_000, gpu_milli=p.mig_share_milli)
        jobs.append(Job(f"inf-{i}", p.serving_team, TIER_INFERENCE, worker, 1, float(t),
                        float(hours(p.inference_hours_lognormal) * 3600), checkpointable=False))
    return seed_nodes(p), sorted(jobs, key=lambda j: (j.submit, j.name))


def whole_gpus(worker: PodRequest) -> PodRequest:
    """A GPU share as the naive platform runs it: one whole GPU."""
    return replace(worker, gpu_milli=0, gpus=1) if 0 < worker.gpu_milli < GPU_MILLI else worker
