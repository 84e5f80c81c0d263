"""Team GPU quotas -> Airflow pools (and the Kubernetes Namespace/ResourceQuota/PriorityClass side).

Slot unit: one pool slot is 1/7 GPU (`airflow_gpu.config.SLOTS_PER_GPU`), one MIG compute slice.
A task's `pool_slots` is its GPU demand in that unit: 7 per whole GPU, the "Ng" of a MIG profile
(`QuotaConfig.pool_slots`). Why 1/7: A100/H100 MIG divides a GPU into seven compute slices and every
profile is an integer number of them, so whole GPUs and slices share one integer pool in proportion
to their size.

Pools per team and tier class (`gpu.<team>.guaranteed`, `gpu.<team>.preemptible`), not per product:
- guaranteed (non-preemptible tiers: interactive, production-training, inference) is sized at the
  team's guarantee, quota x 7 + MIG slices summed over products; preemptible (best-effort-training)
  at quota + borrowing. So a production task is never held back in Airflow behind the team's own
  deferred best-effort tasks: both are submitted, and the GPU scheduler enforces the combined
  guarantee at binding time, preempting the best-effort gang (Kueue's split of submission, here the
  pools and ResourceQuotas, from admission, the scheduler). A team may have up to guarantee +
  ceiling submitted; it never holds more than its quota (+ borrowing, for preemptible work) bound.
- Several products: Airflow gives a task exactly one pool, chosen when the DAG is parsed, but a task
  that accepts A100 or H100 learns its product only when the scheduler places it. Per-product pools
  would have to charge it to one product and then either block it while only another of its products
  has room, or let the other product's usage go uncounted. So the pool is the team's submission
  bound over all its products (1 slot = 1/7 GPU of whichever product), and the per-product bound is
  enforced exactly where the product is decided: the GPU scheduler's quota check per product at
  binding time (`core.quota`, `core.gang.admit` skips an accepted product without room, like Kueue's
  flavor assignment). A multi-product task therefore takes its GPUs x 7 slots once, is submitted
  whenever the team's pool has room, and binds on the first accepted product with quota room; no
  product is ever above its quota, because nothing binds past it. With one product (the seed), the
  pool is exactly that product's quota.
- include_deferred=True (a deferred training task still holds its GPUs), team_name set when Airflow's
  multi_team is on. Only pools whose description starts with `constants.POOL_DESCRIPTION_MARKER` are
  changed or deleted; a managed pool no longer wanted (e.g. the per-product `gpu.<team>.<product>` of
  earlier versions) is deleted once no task instance uses it, and until then kept with its slots and
  marked retired (a task in a missing pool is never scheduled).
"""

from airflow_gpu.pools.plan import Change, Plan, PoolState, desired_pools, diff, parse_pool_name, pool_name

__all__ = ["Change", "Plan", "PoolState", "desired_pools", "diff", "parse_pool_name", "pool_name"]
