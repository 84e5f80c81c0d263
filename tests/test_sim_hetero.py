"""Two GPU generations in the replay (issue 29 items 4 and 7): work runs at the product's relative
speed, the platform's product order picks the product, and the heterogeneous comparison runs."""

from __future__ import annotations

from dataclasses import replace

from airflow_gpu.core.model import Node, PodRequest
from airflow_gpu.sim.hetero import RULES, HeteroParams, compare
from airflow_gpu.sim.replay import PLATFORMS, Setting, SpotModel, replay
from airflow_gpu.sim.settings import seed_setting
from airflow_gpu.sim.workload import Job, SeedParams


def _setting(jobs, nodes, **kw):
    base = seed_setting(SeedParams(days=0.1), 1)
    return Setting(tuple(nodes), tuple(jobs), base.tiers, {"a": 1.0}, base.preemption_policy, base.borrowed_priority,
                   {"A100": (4.1, 1.64), "H100": (9.8, 3.92)}, SpotModel(share=0.0), 1, **kw)


def _node(name, product):
    return Node(name, cpu_milli=64_000, memory_mib=512_000, gpu_count=8, gpu_product=product)


def _job(name, products, work=10_000.0, interval=0.0):
    worker = PodRequest(name, cpu_milli=1000, memory_mib=1000, gpus=8, gpu_products=products)
    return Job(name, "a", "best-effort-training", worker, 1, 0.0, work, checkpointable=interval > 0,
               checkpoint_interval=interval)


def test_work_runs_at_the_products_speed_and_the_platform_order_picks_the_product():
    nodes = [_node("a0", "A100"), _node("h0", "H100")]
    speeds = {"A100": 1.0, "H100": 2.5}
    authors = replay(_setting([_job("j", ("A100", "H100"))], nodes, speeds=speeds), PLATFORMS["full"])
    (a,) = authors.attempts
    assert {p.node for _, _, p in a.holds} == {"a0"} and authors.jobs["j"].finished_at == 10_000
    fastest = replay(_setting([_job("j", ("A100", "H100"))], nodes, speeds=speeds,
                              product_rank={"H100": 0, "A100": 1}), PLATFORMS["full"])
    (a,) = fastest.attempts
    assert {p.node for _, _, p in a.holds} == {"h0"} and fastest.jobs["j"].finished_at == 4_000  # 10,000 / 2.5
    # without speeds the H100 run takes the reference time: the speed is what shortened it
    plain = replay(_setting([_job("j", ("H100",))], nodes), PLATFORMS["full"])
    assert plain.jobs["j"].finished_at == 10_000


def test_the_heterogeneous_comparison_runs_every_rule():
    params = HeteroParams(replace(HeteroParams().seed_params, days=1.0))
    results = compare(params, seed=3)
    assert list(results) == list(RULES)
    for m in results.values():
        assert m["finished"] > 0 and m["jct_p95_h"] >= m["jct_mean_h"] * 0.5 and m["cost"] > 0
    # fungible jobs that may take the faster product never finish later on average than pinned ones
    assert results["cheapest-per-work"]["jct_mean_h"] <= results["pinned"]["jct_mean_h"]
