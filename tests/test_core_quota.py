"""Quotas and borrowing (core.quota): guaranteed, borrowed, refused, reclaimable; never exceeded."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from airflow_gpu.core.model import Placement
from airflow_gpu.core.quota import QuotaBook, QuotaUsage, TeamQuota, check, demand_of_placements, within_limits

A100 = ("a100-80gb", None)


def gpus(n: float) -> dict:
    return {A100: int(n * 1000)}


def book(**teams) -> QuotaBook:
    return QuotaBook({name: TeamQuota.from_gpus(name, **kw) for name, kw in teams.items()}, borrowed_priority=0)


def test_within_quota_is_guaranteed_and_the_full_quota_is_refused_with_the_numbers():
    b = book(**{"ml-research": {"quota": {"a100-80gb": 8}}, "vision": {"quota": {"a100-80gb": 8}}})
    usage = QuotaUsage()
    v = check(b, usage, "ml-research", gpus(8))
    assert v.fits and not v.borrowed
    usage.add("ml-research", gpus(8))
    v = check(b, usage, "ml-research", gpus(1))
    assert not v.fits and v.own_excess and not v.reclaimable
    assert v.reason.startswith("team quota: ml-research uses 8 of 8 a100-80gb")


def test_borrowing_within_limit_uses_idle_quota_and_is_marked_borrowed():
    b = book(a={"quota": {"a100-80gb": 8}, "borrowing_limit": {"a100-80gb": 4}}, b={"quota": {"a100-80gb": 8}})
    usage = QuotaUsage({"a": gpus(8)})
    v = check(b, usage, "a", gpus(4))
    assert v.fits and v.borrowed
    assert not check(b, usage, "a", gpus(5)).fits  # beyond the borrowing limit
    # b is busy: nothing idle to borrow
    usage.add("b", gpus(6))
    v = check(b, usage, "a", gpus(4))
    assert not v.fits and "2 idle in cohort default" in v.reason


def test_owner_within_its_quota_is_short_when_others_borrowed_it_and_may_reclaim():
    b = book(a={"quota": {"a100-80gb": 8}, "borrowing_limit": {"a100-80gb": 8}}, b={"quota": {"a100-80gb": 8}})
    usage = QuotaUsage({"a": gpus(14), "b": gpus(1)})
    v = check(b, usage, "b", gpus(4))
    assert not v.fits and v.reclaimable
    assert "other teams borrowed it" in v.reason


def test_lending_limit_keeps_part_of_the_quota_for_its_owner():
    b = book(a={"quota": {"a100-80gb": 8}, "lending_limit": {"a100-80gb": 2}},
             b={"quota": {"a100-80gb": 0}, "borrowing_limit": {"a100-80gb": 8}})
    usage = QuotaUsage()
    assert check(b, usage, "b", gpus(2)).fits
    assert not check(b, usage, "b", gpus(3)).fits
    usage.add("b", gpus(2))
    assert check(b, usage, "a", gpus(6)).fits  # the kept 6 are a's alone
    v = check(b, usage, "a", gpus(7))  # the 7th is lent out: reclaim it
    assert not v.fits and v.reclaimable


def test_mig_quota_counts_instances_and_unknown_team_is_refused_by_name():
    b = QuotaBook({"s": TeamQuota.from_gpus("s", mig_quota={"a100-80gb": {"1g.10gb": 2}})})
    usage = QuotaUsage()
    key = ("a100-80gb", "1g.10gb")
    assert check(b, usage, "s", {key: 2}).fits
    v = check(b, usage, "s", {key: 3})
    assert not v.fits and "uses 0 of 2 a100-80gb 1g.10gb MIG slices" in v.reason
    v = check(b, usage, "nobody", {key: 1})
    assert not v.fits and "'nobody' has no quota" in v.reason


def test_from_teams_reads_config_shaped_objects_and_aliases_node_labels():
    team = SimpleNamespace(name="vision", quota={"a100-80gb": 8}, borrowing_limit={}, lending_limit={}, mig_quota={})
    b = QuotaBook.from_teams([team], aliases={"NVIDIA-A100-SXM4-80GB": "a100-80gb"})
    placements = [Placement("p", "n1", ((0, 1000), (1, 1000))), Placement("q", "n1", ((2, 500),)),
                  Placement("r", "n1", (), mig_profile="1g.10gb")]
    demand = demand_of_placements(placements, {"n1": "NVIDIA-A100-SXM4-80GB"}, b)
    assert demand == {A100: 2500, ("a100-80gb", "1g.10gb"): 1}


def test_negative_quota_is_rejected_naming_the_field():
    with pytest.raises(ValueError, match="borrowing_limit"):
        TeamQuota.from_gpus("a", quota={"x": 1}, borrowing_limit={"x": -1})


def test_releasing_more_than_used_is_an_error():
    usage = QuotaUsage({"a": gpus(1)})
    with pytest.raises(ValueError, match="more than it uses"):
        usage.remove("a", gpus(2))


team_names = ["a", "b", "c"]
products = ["a100-80gb", "h100"]


@st.composite
def books(draw):
    teams = {}
    for t in team_names:
        q = {p: draw(st.integers(0, 8)) for p in products}
        bl = {p: draw(st.integers(0, 8)) for p in products if draw(st.booleans())}
        ll = {p: draw(st.integers(0, 8)) for p in products if draw(st.booleans())}
        teams[t] = TeamQuota.from_gpus(t, q, bl, ll, cohort=draw(st.sampled_from(["x", "y"])))
    return QuotaBook(teams)


ops = st.lists(st.tuples(st.sampled_from(team_names), st.sampled_from(products),
                         st.integers(1, 6000), st.booleans()), max_size=40)


@settings(max_examples=150, deadline=None)
@given(books(), ops)
def test_quotas_are_never_exceeded_in_any_product(b, operations):
    usage = QuotaUsage()
    held: list[tuple[str, dict]] = []
    for team, product, milli, release in operations:
        if release and held:
            t, d = held.pop(0)
            usage.remove(t, d)
        else:
            demand = {(product, None): milli}
            v = check(b, usage, team, demand)
            if v.fits:
                usage.add(team, demand)
                held.append((team, demand))
                tq = b.team(team)
                assert v.borrowed == (usage.of(team, (product, None)) > tq.n((product, None)))
        assert within_limits(b, usage) == []


def test_the_seed_quota_file_caps_each_team_at_eight_a100s(repo_root):
    from airflow_gpu.config import load_config

    cfg = load_config(repo_root / "examples" / "seed-quotas.yaml")
    b = QuotaBook.from_teams(cfg.teams, aliases={p.node_label: p.name for p in cfg.products if p.node_label})
    placed = [Placement(f"p{i}", "node-a", ((i, 1000),)) for i in range(8)]
    usage = QuotaUsage()
    usage.add("nlp", demand_of_placements(placed, {"node-a": "NVIDIA-A100-SXM4-80GB"}, b))
    v = check(b, usage, "nlp", gpus(1))
    assert not v.fits and v.reason == "team quota: nlp uses 8 of 8 a100-80gb; gang needs 1"
    assert check(b, usage, "vision", gpus(8)).fits
    assert check(b, QuotaUsage(), "serving", {("a100-80gb", "1g.10gb"): 22}).fits
    assert not check(b, QuotaUsage(), "serving", {("a100-80gb", "1g.10gb"): 23}).fits
