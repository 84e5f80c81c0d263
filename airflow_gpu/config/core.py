"""The one adapter from the quota config to core's vocabulary: the preemption policy, the quota book,
the priority of borrowed quota and what a MIG profile counts for in GPUs. The scheduler, the replay,
the UI and the operator read the config through these, so the four apply the same rules."""

from __future__ import annotations

import re
from collections.abc import Iterable

from typing import TYPE_CHECKING

from airflow_gpu.config.model import MIG_PROFILE, SLOTS_PER_GPU, QuotaConfig
from airflow_gpu.core.tiers import (borrow_within_cohort_tiers, borrowing_priority, min_runtimes,
                                    never_preempting_tiers, non_preemptible_tiers, preempt_behind_head_tiers,
                                    reclaim_ignores_min_runtime_tiers)

if TYPE_CHECKING:  # the decision modules load where decisions are made: the UI reads mig_gpus only
    from airflow_gpu.core.preemption import PreemptionPolicy
    from airflow_gpu.core.quota import QuotaBook


def preemption_policy_from_config(cfg: QuotaConfig | None) -> PreemptionPolicy:
    """The tiers' preemption rules (core.tiers) as the preemption plugin takes them."""
    from airflow_gpu.core.preemption import PreemptionPolicy

    if cfg is None:
        return PreemptionPolicy()
    tiers = cfg.tier_policies()
    return PreemptionPolicy(non_preemptible_tiers=non_preemptible_tiers(tiers),
                            never_preempting_tiers=never_preempting_tiers(tiers),
                            borrow_within_cohort_tiers=borrow_within_cohort_tiers(tiers),
                            preempt_behind_head_tiers=preempt_behind_head_tiers(tiers),
                            min_runtime=min_runtimes(tiers),
                            reclaim_ignores_min_runtime_tiers=reclaim_ignores_min_runtime_tiers(tiers))


def quota_book_from_config(cfg: QuotaConfig | None) -> QuotaBook | None:
    from airflow_gpu.core.quota import QuotaBook

    if cfg is None:
        return None
    return QuotaBook.from_teams(cfg.teams, aliases=cfg.node_label_aliases(),
                                borrowed_priority=borrowing_priority_from_config(cfg),
                                speeds=cfg.product_speeds(), product_rank=cfg.product_ranks())


def borrowing_priority_from_config(cfg: QuotaConfig) -> int | None:
    """The priority work on borrowed quota runs at (core.tiers.borrowing_priority of the config's tiers)."""
    return borrowing_priority(cfg.tier_policies())


def mig_gpus(profile: str, cfg: QuotaConfig | None = None, products: Iterable[str | None] = ()) -> float:
    """GPUs one instance of MIG `profile` counts for (pool slots / SLOTS_PER_GPU): the config's `slices`
    for it on `products` (the largest, as the operator's pool slots count it; no product of the
    config named: every product offering it), else the compute slices its name says ("3g.40gb": 3)."""
    slices = []
    if cfg is not None:
        named = {p for p in products if p} & {p.name for p in cfg.products}
        slices = [m.slices for p in cfg.products if not named or p.name in named
                  for m in p.mig_profiles if m.name == profile]
    if not slices:
        match = re.match(MIG_PROFILE, profile)
        slices = [int(match.group(1)) if match else int(profile.split("g", 1)[0] or 1)]
    return max(slices) / SLOTS_PER_GPU
