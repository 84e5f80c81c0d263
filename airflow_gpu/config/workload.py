"""What the quota configuration decides about one GPU task, from the arguments a DAG author writes.

`plan_gpu_task(cfg, team=..., tier=..., workers=..., gpus_per_worker=... | mig_profile=..., gpu_products=...)`
checks every argument against the config and returns the derived values the author never repeats:
the namespace, the accepted products in preference order, the tier's priority, PriorityClass and
tier class (which team pool and ResourceQuota the task counts against), and its pool_slots. A bad
argument raises `WorkloadError` naming the argument and the fix, so the operator can refuse it when
the DAG file is parsed. Pure: no I/O, no Airflow.

A gang larger than its tier class allows can never start: non-preemptible tiers run inside the
team's guarantee (`quota`), preemptible tiers up to `quota + borrowing_limit`; MIG slices up to the
team's `mig_quota` of the profile (not borrowable).
"""

from __future__ import annotations

from dataclasses import dataclass

from airflow_gpu.config.model import QuotaConfig, Team, Tier
from airflow_gpu.core.tiers import TIER_CLASS_GUARANTEED


class WorkloadError(ValueError):
    """One argument of a GPU task is wrong; `argument` names it."""

    def __init__(self, argument: str, message: str):
        self.argument = argument
        super().__init__(f"{argument}: {message}")


@dataclass(frozen=True)
class GpuTaskPlan:
    team: Team
    tier: Tier
    tier_class: str  # "guaranteed" | "preemptible"
    workers: int
    gpus_per_worker: int  # 0 with a MIG profile
    mig_profile: str | None
    products: tuple[str, ...]  # accepted, preference order
    pool_slots: int  # GPU demand in pool slots (1/7 GPU)

    @property
    def namespace(self) -> str:
        return self.team.namespace

    @property
    def priority(self) -> int:
        return self.tier.priority

    @property
    def priority_class(self) -> str:
        return self.tier.priority_class_name


def _whole(argument: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise WorkloadError(argument, f"must be a whole number >= {minimum} (got {value!r})")
    if value < minimum:
        raise WorkloadError(argument, f"must be >= {minimum} (got {value})")
    return value


def plan_gpu_task(cfg: QuotaConfig, *, team: str, tier: str, workers: int = 1, gpus_per_worker: int | None = None,
                  mig_profile: str | None = None, gpu_products: list[str] | tuple[str, ...] | None = None
                  ) -> GpuTaskPlan:
    names = [t.name for t in cfg.teams]
    if team not in names:
        raise WorkloadError("team", f"unknown team {team!r}; teams in the quota config: {', '.join(names) or 'none'}")
    t = cfg.team(team)
    tiers = [x.name for x in cfg.tiers]
    if tier not in tiers:
        raise WorkloadError("tier", f"unknown tier {tier!r}; tiers: {', '.join(tiers)}")
    if not t.allows_tier(tier):
        raise WorkloadError("tier", f"team {team!r} may not use tier {tier!r}; its tiers: {', '.join(t.tiers or [])} "
                                    f"(teams[].tiers in the quota config)")
    tr = cfg.tier(tier)
    cls = cfg.tier_class(tier)
    workers = _whole("workers", workers, 1)
    if (gpus_per_worker is None) == (mig_profile is None):
        raise WorkloadError("gpus_per_worker", "give exactly one of gpus_per_worker (whole GPUs per worker) or "
                                               "mig_profile (one MIG slice per worker, e.g. '1g.10gb')"
                                               + (", not both" if mig_profile is not None else ""))
    if gpus_per_worker is not None:
        gpus_per_worker = _whole("gpus_per_worker", gpus_per_worker, 1)
    else:
        offered = sorted({m.name for p in cfg.products for m in p.mig_profiles})
        if mig_profile not in offered:
            raise WorkloadError("mig_profile", f"unknown MIG profile {mig_profile!r}; profiles of the config's "
                                               f"products: {', '.join(offered) or 'none'}")
    products = _products(cfg, t, gpu_products, mig_profile)

    def bound(product: str) -> int:
        if mig_profile is not None:
            return t.mig_instances(product, mig_profile)
        return t.quota_gpus(product) if cls == TIER_CLASS_GUARANTEED else t.ceiling_gpus(product)

    need = workers if mig_profile is not None else workers * gpus_per_worker
    unit = f"x {mig_profile}" if mig_profile is not None else "GPUs"
    limit = ("mig_quota" if mig_profile is not None
             else "quota" if cls == TIER_CLASS_GUARANTEED else "quota + borrowing_limit")
    too_small = [p for p in products if bound(p) < need]
    if too_small and (gpu_products is not None or len(too_small) == len(products)):
        detail = ", ".join(f"{p}: {bound(p)}" for p in too_small)
        argument = "workers" if mig_profile is not None or gpu_products is None else "gpu_products"
        raise WorkloadError(
            argument, f"the gang needs {need} {unit} but team {team!r} may hold at most {detail} at tier {tier!r} "
                      f"({limit}, tier class {cls}); it could never start: use fewer workers"
                      f"{'' if mig_profile is not None else ' or GPUs per worker'}, another product, or raise the quota")
    products = tuple(p for p in products if p not in too_small)
    if mig_profile is not None:
        slots = workers * max(cfg.product(p).mig_profile(mig_profile).slices for p in products)
    else:
        slots = cfg.pool_slots(products[0], gpus=workers * gpus_per_worker)
    return GpuTaskPlan(t, tr, cls, workers, gpus_per_worker or 0, mig_profile, products, slots)


def _products(cfg: QuotaConfig, team: Team, asked, mig_profile: str | None) -> tuple[str, ...]:
    defined = [p.name for p in cfg.products]
    if asked is None:  # default: what the team has quota on, in the file's order
        if mig_profile is not None:
            products = [p for p in team.products() if team.mig_instances(p, mig_profile) > 0]
            what = f"mig_quota of {mig_profile}"
        else:
            products = [p for p in team.products() if team.ceiling_gpus(p) > 0]
            what = "whole-GPU quota"
        if not products:
            argument = "mig_profile" if mig_profile is not None else "gpus_per_worker"
            raise WorkloadError(argument, f"team {team.name!r} has no {what} on any product; "
                                          "ask for what the team has quota on, or add quota")
        return tuple(products)
    if isinstance(asked, str) or not all(isinstance(p, str) for p in asked):
        raise WorkloadError("gpu_products", f"must be a list of product names in preference order (got {asked!r})")
    if not asked:
        raise WorkloadError("gpu_products", "must name at least one product, or be left out for the team's products")
    if len(set(asked)) != len(asked):
        raise WorkloadError("gpu_products", f"lists a product twice: {list(asked)}")
    for p in asked:
        if p not in defined:
            raise WorkloadError("gpu_products", f"unknown GPU product {p!r}; products: {', '.join(defined)}")
        if mig_profile is not None:
            offered = [m.name for m in cfg.product(p).mig_profiles]
            if mig_profile not in offered:
                raise WorkloadError("mig_profile", f"product {p!r} has no MIG profile {mig_profile!r}; "
                                                   f"its profiles: {', '.join(offered) or 'none'}")
    return tuple(asked)


def plan_pod_set_task(cfg: QuotaConfig, *, team: str, tier: str, pod_sets, gpu_products=None) -> GpuTaskPlan:
    """A gang of pod sets (launcher + workers; each set has `replicas`, `gpus` and `mig_profile`, as
    kube.spec.PodSetSpec): each GPU set is checked as plan_gpu_task checks a gang of its replicas
    (errors name `pod_sets[i].replicas`, `.gpus`, `.mig_profile`), then all sets together, whole GPUs
    summed and MIG slices per profile, against the quota: the gang starts whole or not at all, so it
    must fit at once. CPU-only sets ask no GPU. `workers` of the plan: every pod of every set."""
    def renamed(i: int, exc: WorkloadError, prefix: str = "") -> WorkloadError:
        field = {"workers": "replicas", "gpus_per_worker": "gpus", "mig_profile": "mig_profile"}.get(exc.argument)
        if field == "replicas" and pod_sets[i].replicas == 1 and pod_sets[i].gpus:
            field = "gpus"  # one pod asking too many GPUs
        message = str(exc).split(": ", 1)[1].replace("GPUs per worker", "GPUs per pod").replace("fewer workers",
                                                                                               "fewer replicas")
        return WorkloadError(f"pod_sets[{i}].{field}" if field else exc.argument, prefix + message)

    gpu_sets = [(i, ps) for i, ps in enumerate(pod_sets) if ps.gpus or ps.mig_profile is not None]
    if not gpu_sets:
        raise WorkloadError("pod_sets", "no set asks for GPUs (gpus or mig_profile); a gang of CPU-only pods is not "
                                        "GPU work")
    products = None
    for i, ps in gpu_sets:
        try:
            plan = plan_gpu_task(cfg, team=team, tier=tier, workers=ps.replicas, gpus_per_worker=ps.gpus or None,
                                 mig_profile=ps.mig_profile, gpu_products=gpu_products)
        except WorkloadError as exc:
            raise renamed(i, exc) from None
        products = plan.products if products is None else tuple(p for p in products if p in plan.products)
    # together: one ask of all whole GPUs, one per MIG profile; an error names the largest set's replicas
    asks: dict[str | None, list[tuple[int, object]]] = {}
    for i, ps in gpu_sets:
        asks.setdefault(ps.mig_profile, []).append((i, ps))
    slots = 0
    for profile, members in asks.items():
        largest = max(members, key=lambda m: m[1].replicas * (m[1].gpus or 1))[0]
        try:
            if profile is None:
                plan = plan_gpu_task(cfg, team=team, tier=tier, workers=1, gpus_per_worker=sum(
                    ps.replicas * ps.gpus for _, ps in members), gpu_products=gpu_products)
            else:
                plan = plan_gpu_task(cfg, team=team, tier=tier, workers=sum(ps.replicas for _, ps in members),
                                     mig_profile=profile, gpu_products=gpu_products)
        except WorkloadError as exc:
            raise renamed(largest, exc, "the pod sets together: ") from None
        products = tuple(p for p in products if p in plan.products)
        slots += plan.pool_slots
    if not products:
        raise WorkloadError("gpu_products", "no GPU product has quota for every pod set of the gang at once; "
                                            "ask for fewer GPUs or name the products to use")
    return GpuTaskPlan(cfg.team(team), cfg.tier(tier), cfg.tier_class(tier), sum(ps.replicas for ps in pod_sets), 0, None,
                       products, slots)
