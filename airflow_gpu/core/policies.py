"""Named placement policies: a Profile per name, the same in the simulator and the scheduler.

Baselines from the FGD artifact (random, dotprod, gpuclustering, gpupacking, bestfit), FGD itself,
and the project's default, fgd-strand: FGD whose fragmentation also counts the GPU milli a node's
free CPU cannot feed at the workload's CPU-per-GPU ratio (FragModel.stranded). FGD asks whether ONE
typical pod still fits a node; a node with 8 free GPUs and CPU for one pod passes that test and then
strands 7 GPUs. Counting the stranded milli steers CPU-heavy and CPU-only pods away from GPU-rich,
CPU-poor nodes.
"""

from __future__ import annotations

import numpy as np

from airflow_gpu.core.framework import Profile
from airflow_gpu.core.plugins.fgd import FGDScore, TypicalPods
from airflow_gpu.core.plugins.filters import default_filters
from airflow_gpu.core.plugins.scores import (
    BestFitGpu,
    BestFitScore,
    DotProductScore,
    GpuClusteringScore,
    GpuPackingScore,
    RandomGpu,
    RandomScore,
)

DEFAULT_POLICY = "fgd-strand"
# fgd-strand: weight of the stranded milli against FGD fragmentation, and the sigmoid scale (milli)
STRANDING_WEIGHT = 1.0
STRANDING_DIVISOR = 500.0
BASELINES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd")
POLICIES = BASELINES + (DEFAULT_POLICY,)
# the anchors' policy labels (../shared/anchors/fgd_gpu_allocation.csv)
ANCHOR_LABELS = {
    "random": "01-Random",
    "dotprod": "02-DotProd",
    "gpuclustering": "03-GpuClustering",
    "gpupacking": "04-GpuPacking",
    "bestfit": "05-BestFit",
    "fgd": "06-FGD",
}


def make_profile(
    name: str,
    *,
    typical: TypicalPods | None = None,
    rng: np.random.Generator | None = None,
    tie_rank: np.ndarray | None = None,
) -> Profile:
    """The Profile for policy `name`. FGD-based policies use `typical` (the workload's typical pods)
    or, when None, learn it online from the pods they are asked to place; random uses `rng`. `tie_rank` orders nodes among equal scores (None: node list order)."""
    name = name.lower()
    filters = default_filters()
    if name == "random":
        rng = rng if rng is not None else np.random.default_rng(0)
        return Profile(name, filters, ((RandomScore(rng), 1.0),), RandomGpu(rng), tie_rank)
    if name == "dotprod":
        return Profile(name, filters, ((DotProductScore(), 1.0),), BestFitGpu(), tie_rank)
    if name == "gpuclustering":
        return Profile(name, filters, ((GpuClusteringScore(), 1.0),), BestFitGpu(), tie_rank)
    if name == "gpupacking":
        return Profile(name, filters, ((GpuPackingScore(), 1.0),), BestFitGpu(), tie_rank)
    if name == "bestfit":
        return Profile(name, filters, ((BestFitScore(), 1.0),), BestFitGpu(), tie_rank)
    if name in ("fgd", DEFAULT_POLICY):
        if name == "fgd":
            fgd = FGDScore(typical)
        else:
            fgd = FGDScore(typical, stranding_weight=STRANDING_WEIGHT, divisor=STRANDING_DIVISOR)
        return Profile(name, filters, ((fgd, 1.0),), fgd, tie_rank)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
