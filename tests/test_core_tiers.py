"""The tier rule shared by the scheduler, the simulator and the operator's dry run (core/tiers.py),
and its one adapter from the quota config."""

from __future__ import annotations

from airflow_gpu import constants as C
from airflow_gpu.config import load_config
from airflow_gpu.core.model import PodRequest
from airflow_gpu.core.tiers import (
    DEFAULT_TIER,
    Identity,
    TierPolicy,
    decide,
    identity,
    priority_class_name,
    resolve_tier,
    team_of_namespace,
    tier_of_priority_class,
)


def test_known_tier_sets_priority_preemptible_and_confines_to_on_demand_without_checkpoint():
    members = (PodRequest("w0", gpus=1),)
    best_effort = TierPolicy(priority=100, preemptible=True, spot_eligible=True)
    d = decide(best_effort, members, checkpointable=True)
    assert (d.priority, d.preemptible, d.spot_eligible) == (100, True, True)
    assert d.members[0].capacity_types == (C.CAPACITY_SPOT, C.CAPACITY_ON_DEMAND)  # spot first
    production = TierPolicy(priority=1000, preemptible=False, spot_eligible=False, spot_fallback=True)
    assert decide(production, members, True).members[0].capacity_types == (C.CAPACITY_ON_DEMAND, C.CAPACITY_SPOT)
    assert decide(production, members, False).members[0].capacity_types == (C.CAPACITY_ON_DEMAND,)
    d = decide(best_effort, members, checkpointable=False)
    assert not d.spot_eligible and d.members[0].capacity_types == (C.CAPACITY_ON_DEMAND,)
    assert decide(best_effort, members, True, priority=7).priority == 7  # spec.priority wins


def test_unknown_tier_keeps_what_the_pods_ask_for():
    members = (PodRequest("w0", gpus=1, capacity_types=(C.CAPACITY_SPOT,)), PodRequest("w1", gpus=1))
    d = decide(None, members, checkpointable=True)
    assert (d.priority, d.preemptible, d.spot_eligible, d.members) == (0, True, False, members)


def test_tier_names_and_priority_classes_round_trip():
    tiers = {"production-training": TierPolicy()}
    assert tier_of_priority_class(priority_class_name("inference")) == "inference"
    assert resolve_tier(["other", "airflow-gpu-production-training"], tiers) == "production-training"
    assert resolve_tier(["other"], tiers) == "other"
    assert resolve_tier([None, ""], tiers) == resolve_tier([], tiers) == DEFAULT_TIER


def test_the_namespace_is_the_team_and_the_priority_class_the_tier_whatever_the_labels_say():
    tiers = {"interactive": TierPolicy(preemptible=False), "best-effort-training": TierPolicy()}
    teams = {"team-research": "research", "team-nlp": "nlp"}
    be = ["airflow-gpu-best-effort-training"]
    # labels that agree (what GpuTrainingOperator writes): nothing to say
    agree = identity("team-research", be, teams, tiers,
                     [{C.LABEL_TEAM: "research", C.LABEL_TIER: "best-effort-training"}, None, {}])
    assert agree == Identity("research", "best-effort-training", ())
    # the reproductions: a borrower claiming interactive, a pod of team-research claiming nlp
    who = identity("team-research", be, teams, tiers, [{C.LABEL_TEAM: "nlp", C.LABEL_TIER: "interactive"}])
    assert (who.team, who.tier) == ("research", "best-effort-training")
    assert who.ignored == (
        f"label {C.LABEL_TEAM}='nlp' contradicts namespace 'team-research' (team 'research'); ignored: "
        "the namespace decides the team",
        f"label {C.LABEL_TIER}='interactive' contradicts PriorityClass 'airflow-gpu-best-effort-training' "
        "(tier 'best-effort-training'); ignored: the PriorityClass decides the tier")
    # no PriorityClass: the default tier, whatever the label says; a foreign namespace is its own team
    stray = identity("ml-sandbox", [None], teams, tiers, [{C.LABEL_TEAM: "nlp", C.LABEL_TIER: "interactive"}])
    assert (stray.team, stray.tier) == ("ml-sandbox", DEFAULT_TIER)
    assert [m.split(" contradicts ")[1].split(";")[0] for m in stray.ignored] == [
        "namespace 'ml-sandbox' (team 'ml-sandbox')", f"no PriorityClass (tier {DEFAULT_TIER!r})"]
    # one message per distinct value, however many pods carry it
    many = identity("team-nlp", [], teams, tiers, [{C.LABEL_TEAM: "vision"}] * 8 + [{C.LABEL_TEAM: "recsys"}])
    assert [m.split("=")[1].split(" ")[0] for m in many.ignored] == ["'recsys'", "'vision'"]
    assert team_of_namespace("team-nlp", teams) == "nlp" and team_of_namespace("x", teams) == "x"


def test_config_adapter(repo_root):
    cfg = load_config(repo_root / "examples" / "seed-quotas.yaml")
    policies = cfg.tier_policies()
    for tier in cfg.tiers:
        assert policies[tier.name] == TierPolicy(tier.priority, tier.preemptible, tier.spot_eligible,
                                                 preempts=tier.preemption_policy != "Never",
                                                 spot_fallback=tier.spot_fallback,
                                                 borrow_within_cohort=tier.borrow_within_cohort,
                                                 preempt_behind_head=tier.preempt_behind_head,
                                                 max_wait_seconds=tier.max_wait_seconds,
                                                 band_priority=None if tier.max_wait_seconds is None else 100000)
        assert tier.priority_class_name == priority_class_name(tier.name)
    assert policies["production-training"].spot_fallback and not policies["best-effort-training"].spot_fallback
    assert policies["production-training"].borrow_within_cohort and not policies["best-effort-training"].borrow_within_cohort
    assert policies["production-training"].preempt_behind_head and not policies["best-effort-training"].preempt_behind_head
    from airflow_gpu.config.core import preemption_policy_from_config

    assert preemption_policy_from_config(cfg).preempt_behind_head_tiers == {"production-training"}


def test_preemption_rules_of_the_tiers(repo_root):
    """The scheduler's preemption and borrowing inputs come from core.tiers, not from scheduler/."""
    from airflow_gpu.constants import TIER_BEST_EFFORT_TRAINING, TIER_INTERACTIVE
    from airflow_gpu.core.tiers import borrowing_priority, never_preempting_tiers, non_preemptible_tiers

    cfg = load_config(repo_root / "examples" / "seed-quotas.yaml")
    policies = cfg.tier_policies()
    assert non_preemptible_tiers(policies) == {t.name for t in cfg.tiers if not t.preemptible} | {TIER_INTERACTIVE}
    assert never_preempting_tiers(policies) == {t.name for t in cfg.tiers if t.preemption_policy == "Never"}
    assert borrowing_priority(policies) == cfg.tier(TIER_BEST_EFFORT_TRAINING).priority
    assert non_preemptible_tiers({}) == {TIER_INTERACTIVE} and borrowing_priority({}) is None
