"""Quota configuration: the seed example loads; every bad input is rejected naming file, field and fix."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from airflow_gpu import constants
from airflow_gpu.config import SLOTS_PER_GPU, ConfigError, load_config, parse_config

SEED = Path(__file__).resolve().parent.parent / "examples" / "seed-quotas.yaml"


@pytest.fixture
def seed_data() -> dict:
    return yaml.safe_load(SEED.read_text())


def test_seed_config_is_the_seed_scenario():
    cfg = load_config(SEED)
    assert [p.name for p in cfg.products] == ["a100-80gb", "h100-80gb"]
    assert {t.name for t in cfg.teams if t.quota_gpus("h100-80gb")} == {"recsys"}  # two generations: recsys has both
    a100 = cfg.product("a100-80gb")
    assert a100.memory_gb == 80
    assert [p.name for p in a100.mig_profiles] == ["1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb"]
    # teams capped at eight guaranteed GPUs; research may borrow 8 more of idle quota (reclaimable)
    assert cfg.teams and all(cfg.guaranteed_slots(t, "a100-80gb") == 8 * SLOTS_PER_GPU for t in cfg.teams)
    assert {t.name: cfg.team_slots(t, "a100-80gb") // SLOTS_PER_GPU for t in cfg.teams if t.borrowing_limit} == {"research": 16}
    assert {t.name for t in cfg.tiers} == set(constants.TIERS)
    prod, best = cfg.tier(constants.TIER_PRODUCTION_TRAINING), cfg.tier(constants.TIER_BEST_EFFORT_TRAINING)
    assert prod.priority > best.priority and best.preemptible and not prod.preemptible
    assert prod.preemption_policy == "PreemptLowerPriority"
    assert best.spot_eligible and not prod.spot_eligible


@pytest.mark.parametrize("order, first", [("author", None), ("listed", "a100-80gb"), ("fastest", "h100-80gb"),
                                          ("cheapest_per_work", "h100-80gb")])
def test_product_order_from_the_scheduling_section(order, first, seed_data):
    # seed prices: A100 4.10 at speed 1.0 (4.10 per unit of work), H100 9.80 at 2.5 (3.92)
    seed_data["scheduling"]["product_order"] = order
    cfg = parse_config(seed_data, source="quotas.yaml")
    ranks = cfg.product_ranks()
    assert (min(ranks, key=ranks.get) if ranks else None) == first
    assert cfg.product_speeds() == {"a100-80gb": 1.0, "h100-80gb": 2.5}


def test_slot_helpers_use_one_unit():
    cfg = load_config(SEED)
    assert cfg.pool_slots("a100-80gb", gpus=1) == SLOTS_PER_GPU == 7
    assert cfg.pool_slots("a100-80gb", gpus=8) == 56
    # a MIG slice consumes quota in proportion to its compute share, in integer slots
    sizes = {p.name: cfg.pool_slots("a100-80gb", mig_profile=p.name) for p in cfg.product("a100-80gb").mig_profiles}
    assert sizes == {"1g.10gb": 1, "1g.20gb": 1, "2g.20gb": 2, "3g.40gb": 3, "4g.40gb": 4, "7g.80gb": 7}
    assert cfg.pool_slots("a100-80gb", mig_profile="1g.10gb", count=3) == 3
    serving = cfg.team("serving")
    assert cfg.team_slots(serving, "a100-80gb") == 4 * 7 + 22 * 1 + 2 * 3
    assert cfg.product("a100-80gb").mig_profile("3g.40gb").resource == "nvidia.com/mig-3g.40gb"
    assert cfg.node_label_aliases() == {"NVIDIA-A100-SXM4-80GB": "a100-80gb", "NVIDIA-H100-80GB-HBM3": "h100-80gb"}
    with pytest.raises(ValueError):
        cfg.pool_slots("a100-80gb", gpus=1, mig_profile="1g.10gb")
    with pytest.raises(KeyError, match="profiles: 1g.10gb"):
        cfg.pool_slots("a100-80gb", mig_profile="9g.99gb")


def test_a_tiers_borrow_within_cohort_reaches_the_preemption_policy(seed_data):
    from airflow_gpu.config.core import preemption_policy_from_config

    prod = next(t for t in seed_data["tiers"] if t["name"] == constants.TIER_PRODUCTION_TRAINING)
    prod["borrow_within_cohort"] = False
    assert preemption_policy_from_config(parse_config(seed_data)).borrow_within_cohort_tiers == frozenset()
    prod["borrow_within_cohort"] = True
    policy = preemption_policy_from_config(parse_config(seed_data))
    assert policy.borrow_within_cohort_tiers == {constants.TIER_PRODUCTION_TRAINING}
    prod["borrow_within_cohort"] = "yes"
    with pytest.raises(ConfigError, match="borrow_within_cohort"):
        parse_config(seed_data)


def test_borrow_within_cohort_is_off_unless_a_team_sets_a_threshold(seed_data):
    from airflow_gpu.config.core import quota_book_from_config

    seed_data["teams"][0]["borrow_within_cohort"] = 500
    book = quota_book_from_config(parse_config(seed_data))
    first, second = seed_data["teams"][0]["name"], seed_data["teams"][1]["name"]
    assert book.team(first).borrow_within_cohort == 500 and book.team(second).borrow_within_cohort is None
    seed_data["teams"][0]["borrow_within_cohort"] = "high"
    with pytest.raises(ConfigError, match="borrow_within_cohort"):
        parse_config(seed_data)


def test_team_limits_default_like_kueue(seed_data):
    seed_data["teams"][0]["borrowing_limit"] = {"a100-80gb": 4}
    seed_data["teams"][0]["lending_limit"] = {"a100-80gb": 2}
    cfg = parse_config(seed_data)
    nlp, vision = cfg.team("nlp"), cfg.team("vision")
    assert (nlp.borrowing_gpus("a100-80gb"), nlp.lending_gpus("a100-80gb"), nlp.ceiling_gpus("a100-80gb")) == (4, 2, 12)
    assert (vision.borrowing_gpus("a100-80gb"), vision.lending_gpus("a100-80gb")) == (0, 8)
    # the pool is the ceiling; only the guarantee counts against capacity
    assert cfg.team_slots(nlp, "a100-80gb") == 12 * 7 and cfg.guaranteed_slots(nlp, "a100-80gb") == 8 * 7


def _set(path: str | tuple, value):
    """A mutation of the seed data at a dotted path (teams.2.quota.a100-80gb) or a tuple of keys."""
    keys = path if isinstance(path, tuple) else tuple(int(k) if k.isdigit() else k for k in path.split("."))

    def mutate(data):
        node = data
        for key in keys[:-1]:
            node = node[key] if isinstance(key, int) else node.setdefault(key, {})
        node[keys[-1]] = value
    return mutate


BAD_CASES = {
    "fractional GPUs": (_set("teams.2.quota.a100-80gb", 2.5), "teams[2].quota.a100-80gb", "whole number"),
    "negative GPUs": (_set("teams.2.quota.a100-80gb", -1), "teams[2].quota.a100-80gb", ">= 0"),
    "quoted number": (_set("teams.1.quota.a100-80gb", "8"), "teams[1].quota.a100-80gb", "whole number"),
    "negative MIG count": (_set(('teams', 4, 'mig_quota', 'a100-80gb', '1g.10gb'), -3), "teams[4].mig_quota.a100-80gb.1g.10gb", ">= 0"),
    "unknown team key": (_set("teams.2.quotas", {"a100-80gb": 8}), "teams[2].quotas", "allowed keys: name, namespace"),
    "unknown top-level key": (_set("clusters", 3), "clusters", "allowed keys: version, products, tiers, teams, capacity"),
    "unknown tier key": (_set("tiers.1.preempts", ["best-effort-training"]), "tiers[1].preempts", "allowed keys: name, priority"),
    "duplicate team": (_set("teams.3.name", "nlp"), "teams[3].name", "duplicate team name 'nlp' (also teams[0])"),
    "duplicate namespace": (_set("teams.3.namespace", "team-nlp"), "teams[3].namespace", "already used by teams[0]"),
    "unknown product in quota": (_set("teams.2.quota.b200", 8), "teams[2].quota.b200", "defined products: a100-80gb"),
    "unknown product in capacity": (_set("capacity.b200", 8), "capacity.b200", "defined products: a100-80gb"),
    "unknown MIG profile": (_set(('teams', 4, 'mig_quota', 'a100-80gb', '1g.5gb'), 2), "teams[4].mig_quota.a100-80gb.1g.5gb", "its profiles: 1g.10gb"),
    "unknown tier name": (_set("tiers.0.name", "gold"), "tiers[0].name", "'production-training', 'inference' or 'best-effort-training'"),
    "unknown tier reference": (_set("teams.3.tiers", ["interactive", "platinum"]), "teams[3].tiers[1]", "defined tiers: interactive"),
    "quota above capacity": (_set("capacity.a100-80gb", 39), "capacity.a100-80gb", "sum to 40 GPUs"),
    "one team above capacity": (_set("capacity.a100-80gb", 6), "teams[0].quota.a100-80gb", "allowed 0..6"),
    "lending above quota": (_set("teams.0.lending_limit", {"a100-80gb": 9}), "teams[0].lending_limit.a100-80gb", "allowed 0..8"),
    "bad team name": (_set("teams.0.name", "NLP_team"), "teams[0].name", "lowercase DNS label"),
    "priority out of range": (_set("tiers.0.priority", 2_000_000_000), "tiers[0].priority", "<= 1000000000"),
    "negative reservation hold": (_set("scheduling.reservation_hold_seconds", -5), "scheduling.reservation_hold_seconds", ">= 0"),
    "unknown scheduling key": (_set("scheduling.hold", 60), "scheduling.hold", "allowed keys: reservation_hold_seconds"),
    "estimate error of an unknown tier": (_set("scheduling.estimate_error_seconds", {"gold": 600}),
                                          "scheduling.estimate_error_seconds.gold", "defined tiers: "),
    "negative estimate error": (_set("scheduling.estimate_error_seconds", {"inference": -1}),
                                "scheduling.estimate_error_seconds.inference", ">= 0"),
    "MIG profile bigger than the GPU": (_set("products.0.mig_profiles.5", {"name": "7g.96gb"}), "products[0].mig_profiles[5].memory_gb", "exceeds the product's memory"),
}


@pytest.mark.parametrize("case", list(BAD_CASES))
def test_bad_config_names_the_field(case, seed_data):
    mutate, path, allowed = BAD_CASES[case]
    mutate(seed_data)
    with pytest.raises(ConfigError) as info:
        parse_config(seed_data, source="quotas.yaml")
    text = str(info.value)
    assert f"quotas.yaml: {path}: " in text, text
    assert allowed in text, text


def test_missing_tier_and_several_problems_reported_together(seed_data):
    del seed_data["tiers"][3]
    seed_data["teams"][0]["quota"]["a100-80gb"] = -2
    with pytest.raises(ConfigError) as info:
        parse_config(seed_data, source="q.yaml")
    # structural errors are reported first; tiers are complete only after they pass
    assert [i.path for i in info.value.issues] == ["teams[0].quota.a100-80gb"]
    seed_data["teams"][0]["quota"]["a100-80gb"] = 2
    with pytest.raises(ConfigError) as info:
        parse_config(seed_data, source="q.yaml")
    assert "tiers: missing tier(s) best-effort-training" in str(info.value)


def test_file_level_errors(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the file"):
        load_config(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("teams: [\n")
    with pytest.raises(ConfigError, match=r"bad.yaml: not valid YAML: line \d+"):
        load_config(bad)
    dup = tmp_path / "dup.yaml"
    dup.write_text(SEED.read_text().replace("quota: {a100-80gb: 8}", "quota: {a100-80gb: 8, a100-80gb: 2}", 1))
    with pytest.raises(ConfigError, match="duplicate key 'a100-80gb'"):
        load_config(dup)
    listed = tmp_path / "list.yaml"
    listed.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(listed)


def test_models_are_immutable_and_round_trip():
    cfg = load_config(SEED)
    with pytest.raises(Exception):
        cfg.teams[0].quota_gpus = 3  # type: ignore[misc]
    again = parse_config(cfg.model_dump(mode="json"))
    assert again == cfg


def test_a_mig_profile_counts_the_slices_the_config_declares_everywhere(seed_data):
    """config.core.mig_gpus is the one MIG -> GPUs rule: a profile that declares `slices` (charged by
    memory, say) counts that, not its name's compute slices, in the chargeback and the operator."""
    from airflow_gpu import constants as C
    from airflow_gpu.config.core import mig_gpus
    from airflow_gpu.ui import ledger

    a100 = next(p for p in seed_data["products"] if p["name"] == "a100-80gb")
    profile = a100["mig_profiles"][0]
    name = profile["name"] if isinstance(profile, dict) else profile
    a100["mig_profiles"][0] = {"name": name, "slices": 2}
    cfg = parse_config(seed_data)
    named = int(name.split("g")[0])
    assert named != 2
    assert mig_gpus(name) == named / 7  # no config: the name's compute slices
    assert mig_gpus(name, cfg, ["a100-80gb"]) == mig_gpus(name, cfg) == 2 / 7
    assert mig_gpus(name, cfg, ["not-a-product"]) == 2 / 7  # unknown products: every product offering it
    pod = {"metadata": {"namespace": "team-x", "name": "p"},
           "spec": {"nodeName": "n1", "containers": [{"resources": {"limits": {f"{C.RESOURCE_MIG_PREFIX}{name}": "1"}}}]},
           "status": {"containerStatuses": [{"state": {"running": {"startedAt": "2026-01-01T00:00:00Z"}}}]}}
    node = {"metadata": {"name": "n1", "labels": {C.NODE_GPU_PRODUCT: a100.get("node_label", "x")}}}
    [usage] = ledger.usage_from_pods([pod], {"n1": node}, lambda p: "x", lambda label: "a100-80gb", 1767225700.0, cfg)
    assert usage.gpus == 2 / 7
    # the scheduler's published queue (core.visibility.gpus_of) counts it by the same rule, passed in
    from functools import partial

    from airflow_gpu.core.model import PodRequest
    from airflow_gpu.core.visibility import gpus_of

    member = PodRequest("team-x/p", mig_profile=name)
    assert gpus_of([member, PodRequest("team-x/q", gpus=1)], partial(mig_gpus, cfg=cfg)) == round(1 + 2 / 7, 3)
    with pytest.raises(ValueError, match="pass mig_gpus"):
        gpus_of([member])  # core reads no config and never guesses from the name
