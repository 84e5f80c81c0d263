"""Named placement policies: a Profile per name, the same in the simulator and the scheduler.

Baselines from the FGD artifact (random, dotprod, gpuclustering, gpupacking, bestfit), FGD itself,
and the project's default, fgd-lookahead: FGD's fragmentation plus two terms FGD cannot see.
1. CPU stranding (FragModel.stranded): FGD asks whether ONE typical pod still fits a node; a node
   with 8 free GPUs and CPU for one pod passes and then strands 7 GPUs. Counting the GPU milli the
   free CPU cannot feed (at the workload's CPU-per-GPU ratio) steers CPU-heavy pods away.
2. Lookahead over future fills (final_waste_table): FGD scores a hole by whether the next pod fits;
   the expected milli still free when the workload is over also sees that a 530 hole filled by a
   470 wastes 60 for good while a 350 hole filled by a 320 wastes 30, and that holes only rare
   pods fit mostly stay empty.
"""

from __future__ import annotations

import numpy as np

from airflow_gpu.core.framework import Profile
from airflow_gpu.core.plugins.fgd import FGDScore, TypicalPods
from airflow_gpu.core.plugins.filters import default_filters
from airflow_gpu.core.plugins.scores import (
    BestFitGpu,
    BestFitScore,
    CapacityPreference,
    DotProductScore,
    GpuClusteringScore,
    GpuPackingScore,
    GpuProductPreference,
    LeastAllocatedScore,
    RandomGpu,
    RandomScore,
)

# the policy the scheduler runs (scheduler/loop.Settings, `airflow-gpu scheduler --policy`) and the
# simulator's default: a number measured with `simulate inflation` is one the scheduler produces
DEFAULT_POLICY = "fgd-lookahead"
# fgd-lookahead: weights of the stranded milli and of the expected final waste against FGD's
# fragmentation, and the sigmoid scale (milli) of the integer score
STRANDING_WEIGHT = 2.0
WASTE_WEIGHT = 6.0
LOOKAHEAD_DIVISOR = 500.0
BASELINES = ("random", "dotprod", "gpuclustering", "gpupacking", "bestfit", "fgd")
# spread: kube-scheduler's default spreading (LeastAllocated), the naive platform of the replay
SPREAD_POLICY = "spread"
POLICIES = BASELINES + (DEFAULT_POLICY, SPREAD_POLICY)
# CapacityPreference scores 0..100 like every plugin; this weight puts it above all of them together
CAPACITY_PREFERENCE_WEIGHT = 10.0
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
    prefer_products: bool = True,
) -> Profile:
    """The Profile for policy `name`. FGD-based policies use `typical` (the workload's typical pods)
    or, when None, learn it online from the pods they are asked to place; random uses `rng`.
    `tie_rank` orders nodes among equal scores (None: node list order).
    prefer_products adds a score for the pod's GPU product preference order; the simulator turns
    it off because the trace's gpu_spec is an unordered accept list (the artifact has no such score).
    Every profile takes a pod's preferred capacity type first (CapacityPreference); on clusters
    without spot nodes, or for pods with one capacity type, it changes nothing.
    """
    profile = _make_profile(name, typical, rng, tie_rank)
    profile.scores = profile.scores + ((CapacityPreference(), CAPACITY_PREFERENCE_WEIGHT),)
    if prefer_products:
        profile.scores = profile.scores + ((GpuProductPreference(), 1.0),)
    return profile


def _make_profile(name, typical, rng, tie_rank) -> Profile:
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
    if name == SPREAD_POLICY:
        return Profile(name, filters, ((LeastAllocatedScore(), 1.0),), BestFitGpu(), tie_rank)
    if name == "bestfit":
        return Profile(name, filters, ((BestFitScore(), 1.0),), BestFitGpu(), tie_rank)
    if name in ("fgd", DEFAULT_POLICY):
        if name == "fgd":
            fgd = FGDScore(typical)
        else:
            fgd = FGDScore(
                typical, stranding_weight=STRANDING_WEIGHT, waste_weight=WASTE_WEIGHT, divisor=LOOKAHEAD_DIVISOR
            )
        return Profile(name, filters, ((fgd, 1.0),), fgd, tie_rank)
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
