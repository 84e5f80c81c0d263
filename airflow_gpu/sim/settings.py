"""Build a replay Setting from the quota config (tiers, prices: config/core.py, the scheduler's adapter) and a
workload source (the openb trace or the seed-scenario generator)."""

from __future__ import annotations

from collections import Counter
from dataclasses import replace
from pathlib import Path

from airflow_gpu.sim.replay import Setting, SpotModel, never_fit
from airflow_gpu.sim.traces import TraceError, load_nodes, load_pods
from airflow_gpu.sim.jobtrace import (OPENB_TEAMS, Mapped, check_products, from_zero, load_jobs, map_jobs,
                                     node_gpus_by_product, openb_jobs, team_shares)
from airflow_gpu.sim.workload import SeedParams, keep_capacity, seed_scenario

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "seed-quotas.yaml"


def _from_config(config: Path):
    from airflow_gpu.config import load_config
    from airflow_gpu.config.core import borrowing_priority_from_config, preemption_policy_from_config

    cfg = load_config(config)
    tiers = cfg.tier_policies()
    prices = {}
    for p in cfg.products:
        price = p.price_per_gpu_hour
        if price is not None:
            prices[p.node_label or p.name] = (float(price.on_demand), float(price.spot))
    return cfg, tiers, preemption_policy_from_config(cfg), borrowing_priority_from_config(cfg), prices


def _queue_rules(cfg) -> dict:
    """The Setting fields the scheduler reads from the same config (Scheduler: the `scheduling` section)."""
    return {"reservation_hold": cfg.scheduling.reservation_hold_seconds,
            "checkpoint_seconds": cfg.scheduling.checkpoint_seconds}


def openb_setting(nodes_csv: Path, pods_csv: Path, capacity: float, seed: int, config: Path = DEFAULT_CONFIG,
                  spot: SpotModel = SpotModel()) -> Setting:
    """The openb trace on a seeded `capacity` fraction of its GPU nodes. Teams: OPENB_TEAMS, each
    guaranteed an equal share of every product; the config's first product's price for every GPU
    model (the trace's models have no public price)."""
    cfg, tiers, policy, borrowed, prices = _from_config(config)
    all_nodes = load_nodes(nodes_csv)
    nodes = keep_capacity(all_nodes, capacity, seed)
    skipped: Counter = Counter()
    # pods split by the trace's whole node list: a job's shape does not depend on the capacity kept
    jobs = openb_jobs(load_pods(pods_csv), seed, skipped=skipped, node_gpus=node_gpus_by_product(all_nodes))
    notes = tuple(f"{n:,} pod{'s' if n != 1 else ''} {why} left out" for why, n in sorted(skipped.items()))
    price = next(iter(prices.values()), (0.0, 0.0))
    prices = {n.gpu_product: price for n in nodes if n.gpu_product}
    share = 1.0 / len(OPENB_TEAMS)
    return startable(Setting(tuple(nodes), tuple(jobs), tiers, {t: share for t in OPENB_TEAMS}, policy, borrowed,
                             prices, spot, seed, notes=notes, **_queue_rules(cfg)), pods_csv)


def trace_setting(nodes_csv: Path, trace_csv: Path, capacity: float, seed: int, config: Path = DEFAULT_CONFIG,
                  team_map: dict[str, str] | None = None, tier_map: dict[str, str] | None = None,
                  spot: SpotModel = SpotModel(share=0.0)) -> tuple[Setting, Mapped]:
    """A generic job CSV (sim/jobtrace.py) on a seeded `capacity` fraction of the node list's GPU
    nodes, on-demand as listed unless `spot` makes a share of them spot (a what-if). Teams and tiers:
    the quota file's, the trace's mapped onto them (jobtrace.map_jobs), each team guaranteed
    jobtrace.team_shares of every product; prices and relative speeds: the config's product whose
    name or node label is the node model, else its first product's price at speed 1.0."""
    cfg, tiers, policy, borrowed, prices = _from_config(config)
    all_nodes = load_nodes(nodes_csv)
    nodes = keep_capacity(all_nodes, capacity, seed)
    teams = {t.name: float(sum(t.quota.values())) for t in cfg.teams}
    if not teams:
        raise ValueError(f"{config}: no teams; a replay needs the quota file's teams")
    jobs, origin = from_zero(load_jobs(trace_csv))
    mapped = replace(map_jobs(jobs, list(teams), tiers, seed, team_map, tier_map,
                              {t.namespace: t.name for t in cfg.teams}), origin=origin)
    check_products(mapped.jobs, {n.gpu_product for n in all_nodes if n.gpu_product}, trace_csv)
    by_name = {p.name: p for p in cfg.products}
    aliases, product_speeds = cfg.node_label_aliases(), cfg.product_speeds()
    fallback = next(iter(prices.values()), (0.0, 0.0))
    node_prices, speeds = {}, {}
    for n in nodes:
        product = by_name.get(aliases.get(n.gpu_product or "", n.gpu_product or ""))
        key = (product.node_label or product.name) if product else n.gpu_product
        node_prices[n.gpu_product] = prices.get(key, fallback)
        if product is not None:  # durations are on the reference product; a faster one runs them faster
            speeds[n.gpu_product] = float(product_speeds[product.name])
    shares = team_shares(teams, sum(n.gpu_count for n in nodes))
    setting = startable(Setting(tuple(nodes), tuple(mapped.jobs), tiers, shares, policy, borrowed, node_prices, spot,
                                seed, speeds=speeds, **_queue_rules(cfg)), trace_csv)
    unknown = frozenset(n.gpu_product for n in nodes if n.gpu_product and n.gpu_product not in speeds)
    by_team = {t.name: t for t in cfg.teams}
    disallowed = Counter((j.team, j.tier) for j in setting.jobs if not by_team[j.team].allows_tier(j.tier))
    return setting, replace(mapped, jobs=list(setting.jobs), unknown_models=unknown, disallowed=dict(disallowed))


def startable(setting: Setting, source) -> Setting:
    """`setting` without the jobs that can never start on its nodes (replay.never_fit), named in its
    `left_out`: such a job would wait to the end of every platform and hold a partial gang on the
    naive one, skewing every number. A source with no job left is an error."""
    if not setting.jobs:
        raise TraceError(f"{source}: no job to replay (the openb pod lists without qos and creation, deletion "
                         "and scheduled times are for `simulate inflation`)")
    left_out = never_fit(setting)
    if len(left_out) == len(setting.jobs):
        name, why = next(iter(left_out.items()))
        raise TraceError(f"{source}: no job can start on the {len(setting.nodes)} nodes kept (e.g. {name}: {why}); "
                         "check the node list, --capacity and the GPU columns")
    if not left_out:
        return setting
    return replace(setting, jobs=tuple(j for j in setting.jobs if j.name not in left_out), left_out=left_out)


def seed_setting(params: SeedParams, seed: int, config: Path = DEFAULT_CONFIG) -> Setting:
    """The seed scenario: teams of `quota_gpus` guaranteed GPUs (serving half of that), the config's
    A100 prices, spot as in `params`."""
    cfg, tiers, policy, borrowed, prices = _from_config(config)
    nodes, jobs = seed_scenario(params, seed)
    total = sum(n.gpu_count for n in nodes)
    teams = {t: params.quota_gpus / total for t in params.teams}
    teams[params.serving_team] = params.quota_gpus / 2 / total
    price = next(iter(prices.values()), (0.0, 0.0))
    spot = SpotModel(params.spot_share, params.interruptions_per_node_day, params.notice_seconds,
                     params.replace_after_seconds)
    return Setting(tuple(nodes), tuple(jobs), tiers, teams, policy, borrowed, {"A100-80GB": price}, spot, seed,
                   **_queue_rules(cfg))


def with_restart_cost(setting: Setting, restart_overhead: float | None = None,
                      min_runtime: dict[str, float] | None = None) -> Setting:
    """`setting` with every tier's restart overhead set to `restart_overhead` seconds (None: the
    config's) and the minimum runtimes before preemption replaced by `min_runtime` (tier -> seconds;
    None: the config's, {}: none), as the quota file's tiers would say them."""
    tiers = setting.tiers
    if restart_overhead is not None:
        tiers = {name: replace(tier, restart_overhead_seconds=restart_overhead) for name, tier in tiers.items()}
    policy = setting.preemption_policy
    if min_runtime is not None:
        policy = replace(policy, min_runtime=tuple(sorted((t, s) for t, s in min_runtime.items() if s > 0)))
    return replace(setting, tiers=tiers, preemption_policy=policy)


def with_wait_bounds(setting: Setting, max_wait: dict[str, float] | None) -> Setting:
    """`setting` with its tiers' wait bounds replaced by `max_wait` (tier -> seconds; None: the
    config's; {}: none, strict priority order), the bands drawn again as the quota file's would be
    (core.tiers.wait_bands). A tier the setting does not have is an error naming the ones it has."""
    from airflow_gpu.core.tiers import wait_bands

    if max_wait is None:
        return setting
    unknown = sorted(set(max_wait) - set(setting.tiers))
    if unknown:
        raise ValueError(f"no tier {', '.join(unknown)} in the quota file; its tiers: {', '.join(sorted(setting.tiers))}")
    tiers = {name: replace(tier, max_wait_seconds=max_wait.get(name)) for name, tier in setting.tiers.items()}
    return replace(setting, tiers=wait_bands(tiers))
