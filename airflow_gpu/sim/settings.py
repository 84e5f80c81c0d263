"""Build a replay Setting from the quota config (tiers, prices: config/core.py, the scheduler's adapter) and a
workload source (the openb trace or the seed-scenario generator)."""

from __future__ import annotations

from pathlib import Path

from airflow_gpu.sim.replay import Setting, SpotModel
from airflow_gpu.sim.traces import load_nodes, load_pods
from airflow_gpu.sim.jobtrace import (OPENB_TEAMS, Mapped, check_products, load_jobs, map_jobs, openb_jobs,
                                     team_shares)
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
    nodes = keep_capacity(load_nodes(nodes_csv), capacity, seed)
    jobs = openb_jobs(load_pods(pods_csv), seed)
    price = next(iter(prices.values()), (0.0, 0.0))
    prices = {n.gpu_product: price for n in nodes if n.gpu_product}
    share = 1.0 / len(OPENB_TEAMS)
    return Setting(tuple(nodes), tuple(jobs), tiers, {t: share for t in OPENB_TEAMS}, policy, borrowed, prices,
                   spot, seed, **_queue_rules(cfg))


def trace_setting(nodes_csv: Path, trace_csv: Path, capacity: float, seed: int, config: Path = DEFAULT_CONFIG,
                  team_map: dict[str, str] | None = None, tier_map: dict[str, str] | None = None,
                  spot: SpotModel = SpotModel()) -> tuple[Setting, Mapped]:
    """A generic job CSV (sim/jobtrace.py) on a seeded `capacity` fraction of the node list's GPU
    nodes. Teams and tiers: the quota file's, the trace's mapped onto them (jobtrace.map_jobs), each
    team guaranteed jobtrace.team_shares of every product; prices: the config's price of a product
    whose name or node label is the node model, else its first product's."""
    cfg, tiers, policy, borrowed, prices = _from_config(config)
    all_nodes = load_nodes(nodes_csv)
    nodes = keep_capacity(all_nodes, capacity, seed)
    teams = {t.name: float(sum(t.quota.values())) for t in cfg.teams}
    if not teams:
        raise ValueError(f"{config}: no teams; a replay needs the quota file's teams")
    mapped = map_jobs(load_jobs(trace_csv), list(teams), tiers, seed, team_map, tier_map,
                      {t.namespace: t.name for t in cfg.teams})
    check_products(mapped.jobs, {n.gpu_product for n in all_nodes if n.gpu_product}, trace_csv)
    by_name = {p.name: p for p in cfg.products}
    fallback = next(iter(prices.values()), (0.0, 0.0))
    node_prices = {}
    for n in nodes:
        product = by_name.get(n.gpu_product or "")
        key = (product.node_label or product.name) if product else n.gpu_product
        node_prices[n.gpu_product] = prices.get(key, fallback)
    shares = team_shares(teams, sum(n.gpu_count for n in nodes))
    return Setting(tuple(nodes), tuple(mapped.jobs), tiers, shares, policy, borrowed, node_prices, spot, seed,
                   **_queue_rules(cfg)), mapped


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
    from dataclasses import replace

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
    from dataclasses import replace

    from airflow_gpu.core.tiers import wait_bands

    if max_wait is None:
        return setting
    unknown = sorted(set(max_wait) - set(setting.tiers))
    if unknown:
        raise ValueError(f"no tier {', '.join(unknown)} in the quota file; its tiers: {', '.join(sorted(setting.tiers))}")
    tiers = {name: replace(tier, max_wait_seconds=max_wait.get(name)) for name, tier in setting.tiers.items()}
    return replace(setting, tiers=wait_bands(tiers))
