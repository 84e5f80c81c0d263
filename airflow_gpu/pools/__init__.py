"""Team GPU quotas -> Airflow pools (and the Kubernetes Namespace/ResourceQuota/PriorityClass side).

Slot unit: one pool slot is 1/7 GPU (`airflow_gpu.config.SLOTS_PER_GPU`), one MIG compute slice.
A task's `pool_slots` is its GPU demand in that unit: 7 per whole GPU, the "Ng" of a MIG profile
(`QuotaConfig.pool_slots`). Why 1/7: A100/H100 MIG divides a GPU into seven compute slices and every
profile is an integer number of them, so whole GPUs and slices share one integer pool in proportion
to their size; a unit of one GPU could not express a slice, and per-profile pools would let a team
hold its whole-GPU quota *and* every slice quota at once without one bound.

One pool per team and product: `gpu.<team>.<product>` with (quota + borrowing_limit) x 7 + MIG-quota
slices slots, include_deferred=True (a deferred training task still holds its GPUs), team_name set
when Airflow's multi_team is on. Only pools whose description starts with
`constants.POOL_DESCRIPTION_MARKER` are changed or deleted.
"""

from airflow_gpu.pools.plan import Change, Plan, PoolState, desired_pools, diff, pool_name

__all__ = ["Change", "Plan", "PoolState", "desired_pools", "diff", "pool_name"]
