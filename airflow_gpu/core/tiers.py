"""What a workload tier decides: priority, whether it may be preempted, whether it may run on spot.

One rule for the scheduler (objects read back from the cluster), the simulator and the operator's
dry run (arguments of a DAG task), so all three build identical gangs. Pure: the config is adapted
to `TierPolicy` values by `airflow_gpu.config.QuotaConfig.tier_policies()`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable, Mapping

from airflow_gpu.constants import DEFAULT_RESTART_OVERHEAD_SECONDS, LABEL_TEAM, LABEL_TIER, TIER_INTERACTIVE
from airflow_gpu.core.capacity import confine_to_eligible_capacity, is_spot_eligible
from airflow_gpu.core.model import Gang, PodRequest

DEFAULT_TIER = "default"  # the tier of a gang that names none
PRIORITY_CLASS_PREFIX = "airflow-gpu-"  # PriorityClass of tier T is `airflow-gpu-T` (pools render-k8s)


@dataclass(frozen=True)
class TierPolicy:
    priority: int = 0
    preemptible: bool = True
    spot_eligible: bool = False
    preempts: bool = True  # False: its PriorityClass says preemptionPolicy: Never (waits, never evicts)
    spot_fallback: bool = False  # not spot-eligible, but checkpointable work may overflow onto spot
    # while its team borrows, it may preempt other teams' borrowers of lower priority (Kueue's
    # borrowWithinCohort, maxPriorityThreshold just below this tier): see core.preemption
    borrow_within_cohort: bool = False
    # behind another gang's head-of-line reservation, its team's first refused gang may still
    # preempt, off the reserved nodes (Kueue: every ClusterQueue's head, every cycle): see core.queue
    preempt_behind_head: bool = False
    # seconds each restart of its gangs computes nothing (a gang's annotation wins): charged as lost
    # GPU-seconds, and counted by victim choice (core.model.RunningGang.preemption_cost)
    restart_overhead_seconds: float = DEFAULT_RESTART_OVERHEAD_SECONDS
    # a gang of this tier running for less than this is no preemption victim (KAI's minruntime,
    # Slurm's PreemptExemptTime): bounds thrashing. Interruptions are not affected
    min_runtime_seconds: float = 0.0
    # True: reclaim of borrowed quota (another team taking back its guarantee) ignores the minimum
    # runtime (KAI's reclaim-min-runtime 0); False: the minimum runtime protects from reclaim too
    reclaim_ignores_min_runtime: bool = False
    # the wait bound (Slurm's age factor, as an earliest-due-date order): its gangs are due at submission
    # + this, and gangs of every tier with a bound are ordered by due time, in one band at the highest
    # of their priorities (wait_bands). None: ordered by priority alone. The queue order only: priority
    # still decides preemption
    max_wait_seconds: float | None = None
    band_priority: int | None = None  # set by wait_bands: the band's priority (None: no band)


@dataclass(frozen=True)
class TierDecision:
    """The tier's verdict on one gang."""

    priority: int
    preemptible: bool
    spot_eligible: bool
    members: tuple[PodRequest, ...]  # confined to on-demand unless spot-eligible
    restart_overhead: float = DEFAULT_RESTART_OVERHEAD_SECONDS  # seconds each restart costs it
    max_wait: float | None = None  # its tier's wait bound and band (Gang.queue_key; wait_bands)
    band_priority: int | None = None


# Tier classes: what the team's Airflow pool and namespace ResourceQuota of a tier are sized at.
# Non-preemptible tiers run inside the team's guarantee; preemptible tiers may also borrow, and are
# displaced (preempted, within the team too) when guaranteed work needs the GPUs back.
TIER_CLASS_GUARANTEED = "guaranteed"
TIER_CLASS_PREEMPTIBLE = "preemptible"
TIER_CLASSES = (TIER_CLASS_GUARANTEED, TIER_CLASS_PREEMPTIBLE)


def tier_class(policy: TierPolicy) -> str:
    """Preemptible tiers (victims allowed) -> "preemptible", the others -> "guaranteed"."""
    return TIER_CLASS_PREEMPTIBLE if policy.preemptible else TIER_CLASS_GUARANTEED


def priority_class_name(tier: str) -> str:
    return f"{PRIORITY_CLASS_PREFIX}{tier}"


def tier_of_priority_class(name: str) -> str:
    """PriorityClass name -> tier: `airflow-gpu-<tier>` or the tier itself."""
    return name[len(PRIORITY_CLASS_PREFIX):] if name.startswith(PRIORITY_CLASS_PREFIX) else name


def decide(
    policy: TierPolicy | None,
    members: tuple[PodRequest, ...],
    checkpointable: bool,
    priority: int | None = None,
    restart_overhead: float | None = None,
) -> TierDecision:
    """Apply a tier to a gang. `priority`: one already set on the pods (spec.priority) wins over
    the tier's; so does the gang's own `restart_overhead` (seconds). The unknown-tier rule: no policy
    -> priority 0, preemptible, not spot-eligible, the default restart overhead, and the members keep
    what their pods ask for (the scheduler does not rewrite what it does not know)."""
    overhead = restart_overhead_of(policy, restart_overhead)
    if policy is None:
        return TierDecision(priority if priority is not None else 0, True, False, members, overhead)
    spot = is_spot_eligible(policy.spot_eligible, checkpointable)
    return TierDecision(
        priority=priority if priority is not None else policy.priority,
        preemptible=policy.preemptible,
        spot_eligible=spot,
        members=confine_to_eligible_capacity(members, spot, is_spot_eligible(policy.spot_fallback, checkpointable)),
        restart_overhead=overhead,
        max_wait=policy.max_wait_seconds if policy.band_priority is not None else None,
        band_priority=policy.band_priority,
    )


def wait_bands(tiers: Mapping[str, TierPolicy]) -> dict[str, TierPolicy]:
    """The tiers with their queue band: every tier with a wait bound (`max_wait_seconds`) joins one
    band at the highest priority among them, where its gangs are ordered by due time (submission +
    bound: earliest due date first, which bounds the lateness of every gang against its tier's
    bound). So a lower tier with a bound of B gives way to newer gangs of a higher bounded tier only
    during its first B seconds of waiting, then keeps its place ahead of them; they may still preempt
    it once it runs (priority decides preemption). Tiers without a bound keep their priority order
    (one above the band comes first, one below after it). No bounds: no band, today's order."""
    bounded = [p.priority for p in tiers.values() if p.max_wait_seconds is not None]
    band = max(bounded) if bounded else None
    return {name: replace(p, band_priority=band if p.max_wait_seconds is not None else None)
            for name, p in tiers.items()}


def restart_overhead_of(policy: TierPolicy | None, own: float | None = None) -> float:
    """Seconds each restart of a gang computes nothing: its own (annotation, operator argument), else
    its tier's, else the default (an unknown tier)."""
    if own is not None:
        return own
    return policy.restart_overhead_seconds if policy is not None else DEFAULT_RESTART_OVERHEAD_SECONDS


def placed_by(gang: Gang, ours: bool) -> Gang:
    """A running gang as preemption sees it: one whose pods another scheduler placed is never a
    victim here, whatever its tier (only this scheduler's placements are its to undo)."""
    return gang if ours or not gang.preemptible else replace(gang, preemptible=False)


def resolve_tier(priority_classes: Iterable[str | None], tiers: Mapping[str, TierPolicy]) -> str:
    """The tier of a gang: the first PriorityClass that maps to a known tier, else the first
    PriorityClass's tier, else DEFAULT_TIER. Never a label: see `identity`."""
    classes = [tier_of_priority_class(pc) for pc in priority_classes if pc]
    for t in classes:
        if t in tiers:
            return t
    return classes[0] if classes else DEFAULT_TIER


def team_of_namespace(namespace: str, team_by_namespace: Mapping[str, str]) -> str:
    """The team of a namespace: the quota config's team of that namespace, else the namespace itself
    (a foreign namespace, no team of the config)."""
    return team_by_namespace.get(namespace) or namespace


@dataclass(frozen=True)
class Identity:
    """Whose a gang is and at which tier. `ignored`: labels that said otherwise, one message each."""

    team: str
    tier: str
    ignored: tuple[str, ...] = ()


def identity(
    namespace: str,
    priority_classes: Iterable[str | None],
    team_by_namespace: Mapping[str, str],
    tiers: Mapping[str, TierPolicy],
    labels: Iterable[Mapping[str, str] | None] = (),
) -> Identity:
    """The namespace is the team; the PriorityClass is the tier. The API server is what ties both to
    the team (RBAC per namespace, ResourceQuota per PriorityClass, spec.priority from the class):
    labels a pod owner writes are hints that never change quota, billing, tier, preemptibility or
    reclaim. A `airflow-gpu.io/team` or `/tier` label in `labels` (the PodGroup's and the pods') that
    contradicts them is reported in `ignored`, and ignored."""
    classes = [pc for pc in priority_classes if pc]
    team = team_of_namespace(namespace, team_by_namespace)
    tier = resolve_tier(classes, tiers)
    deciding = next((pc for pc in classes if tier_of_priority_class(pc) == tier), None)
    said = {LABEL_TEAM: set(), LABEL_TIER: set()}
    for values in labels:
        for key, seen in said.items():
            value = (values or {}).get(key)
            if value not in (None, ""):
                seen.add(str(value))
    ignored = [f"label {LABEL_TEAM}={value!r} contradicts namespace {namespace!r} (team {team!r}); ignored: "
               "the namespace decides the team" for value in sorted(said[LABEL_TEAM] - {team})]
    source = f"PriorityClass {deciding!r}" if deciding else "no PriorityClass"
    ignored += [f"label {LABEL_TIER}={value!r} contradicts {source} (tier {tier!r}); ignored: "
                "the PriorityClass decides the tier" for value in sorted(said[LABEL_TIER] - {tier})]
    return Identity(team, tier, tuple(ignored))


def non_preemptible_tiers(tiers: Mapping[str, TierPolicy]) -> frozenset[str]:
    """Tiers never chosen as preemption victims: those the config marks so, and interactive always."""
    return frozenset(name for name, policy in tiers.items() if not policy.preemptible) | {TIER_INTERACTIVE}


def never_preempting_tiers(tiers: Mapping[str, TierPolicy]) -> frozenset[str]:
    return frozenset(name for name, policy in tiers.items() if not policy.preempts)


def borrow_within_cohort_tiers(tiers: Mapping[str, TierPolicy]) -> frozenset[str]:
    return frozenset(name for name, policy in tiers.items() if policy.borrow_within_cohort and policy.preempts)


def preempt_behind_head_tiers(tiers: Mapping[str, TierPolicy]) -> frozenset[str]:
    return frozenset(name for name, policy in tiers.items() if policy.preempt_behind_head and policy.preempts)


def min_runtimes(tiers: Mapping[str, TierPolicy]) -> tuple[tuple[str, float], ...]:
    """(tier, minimum runtime before preemption) of the tiers that have one."""
    return tuple(sorted((name, p.min_runtime_seconds) for name, p in tiers.items() if p.min_runtime_seconds > 0))


def reclaim_ignores_min_runtime_tiers(tiers: Mapping[str, TierPolicy]) -> frozenset[str]:
    return frozenset(name for name, policy in tiers.items() if policy.reclaim_ignores_min_runtime)


def borrowing_priority(tiers: Mapping[str, TierPolicy]) -> int | None:
    """Idle quota is borrowed at best-effort priority (docs/DESIGN.md): the lowest preemptible tier's."""
    preemptible = [policy.priority for policy in tiers.values() if policy.preemptible]
    return min(preemptible) if preemptible else None
