"""sim/bound.py: the MILP upper bound on GPU allocation is never below what a placement achieves and
is exact on small cases whose optimum is known by hand (per-GPU share packing, per-node CPU, models)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from airflow_gpu.core.model import Node, PodRequest
from airflow_gpu.core.snapshot import OverCommitError, Snapshot
from airflow_gpu.sim.bound import allocation_bound
from airflow_gpu.sim.inflation import run_inflation


def _nodes(k, cpu=8000, mem=64_000, gpus=1, model="T4"):
    return [Node(f"n{i}", cpu, mem, gpu_count=gpus, gpu_product=model) for i in range(k)]


def test_shares_over_half_a_gpu_take_a_gpu_each():
    # three 600-milli shares on two 1-GPU nodes: only two fit, although 1800 <= 2000 milli
    pods = [PodRequest(f"p{i}", cpu_milli=100, gpu_milli=600) for i in range(3)]
    bound = allocation_bound(_nodes(2), pods)
    assert bound.gpu_milli == 1200
    assert bound.method == "milp"


def test_cpu_heavy_pods_one_per_node():
    # 2 GPUs and 8 cores per node; two 1-GPU pods of 5 cores cannot share a node
    pods = [PodRequest(f"p{i}", cpu_milli=5000, gpus=1) for i in range(4)]
    assert allocation_bound(_nodes(2, gpus=2), pods).gpu_milli == 2000


def test_gpu_models_constrain_and_cpu_only_pods_do_not_count():
    pods = [PodRequest("v", cpu_milli=1, gpus=1, gpu_products=("V100M16",)), PodRequest("c", cpu_milli=8000)]
    bound = allocation_bound(_nodes(1, model="T4"), pods)
    assert bound.gpu_milli == 0
    assert bound.pct == 0.0


def _exhaustive_optimum(nodes, pods) -> int:
    """Brute force over every node and GPU choice of every pod (or not placed), validated by Snapshot."""
    best = 0
    options = []
    for pod in pods:
        choices = [None]
        for node in nodes:
            if pod.gpus:
                for gpus in itertools.combinations(range(node.gpu_count), pod.gpus):
                    choices.append((node.name, tuple((g, 1000) for g in gpus)))
            else:
                choices += [(node.name, ((g, pod.gpu_milli),)) for g in range(node.gpu_count)]
        options.append(choices)
    for combo in itertools.product(*options):
        snap = Snapshot.from_nodes(nodes)
        got = 0
        try:
            for pod, choice in zip(pods, combo):
                if choice is not None:
                    snap.assume(snap.placement_for(pod, snap.node_index(choice[0]), choice[1]))
                    got += pod.gpu_milli_total
        except OverCommitError:
            continue
        best = max(best, got)
    return best


@pytest.mark.parametrize("seed", range(6))
def test_bound_is_at_least_the_brute_force_optimum(seed):
    rng = np.random.default_rng(seed)
    nodes = [Node(f"n{i}", int(rng.choice([4000, 8000])), 32_000, gpu_count=2, gpu_product="T4") for i in range(2)]
    pods = []
    for i in range(5):
        if rng.random() < 0.3:
            pods.append(PodRequest(f"p{i}", cpu_milli=int(rng.integers(1, 6)) * 1000, gpus=int(rng.integers(1, 3))))
        else:
            pods.append(PodRequest(f"p{i}", cpu_milli=int(rng.integers(1, 6)) * 1000,
                                   gpu_milli=int(rng.choice([200, 300, 450, 600, 700]))))
    optimum = _exhaustive_optimum(nodes, pods)
    bound = allocation_bound(nodes, pods)
    assert bound.gpu_milli >= optimum
    assert bound.gpu_milli <= bound.total_gpu_milli


def test_bound_is_above_every_policy_on_a_trace_sample(shared_dir):
    from airflow_gpu.sim.traces import load_nodes, load_pods

    openb = shared_dir / "traces" / "openb"
    nodes = load_nodes(openb / "openb_node_list_gpu_node.csv")[::10]
    pods = [p.request for p in load_pods(openb / "openb_pod_list_default.csv")][::10]
    for policy in ("bestfit", "fgd-lookahead"):
        result = run_inflation(nodes, pods, policy, seed=42)
        bound = allocation_bound(nodes, result.pods)
        assert bound.gpu_milli >= result.allocated[-1]


def test_cli_reports_the_bound_and_the_gap(tmp_path):
    nodes_csv = tmp_path / "nodes.csv"
    pods_csv = tmp_path / "pods.csv"
    nodes_csv.write_text("sn,cpu_milli,memory_mib,gpu,model\na,8000,64000,1,T4\nb,8000,64000,1,T4\n")
    pods_csv.write_text("name,cpu_milli,memory_mib,num_gpu,gpu_milli\n"
                        + "".join(f"p{i},100,100,1,600\n" for i in range(3)))
    out = subprocess.run(
        [sys.executable, "-m", "airflow_gpu", "simulate", "inflation", "--nodes", str(nodes_csv), "--pods",
         str(pods_csv), "--policy", "bestfit", "--ratio", "1.0", "--bound", "--json"],
        capture_output=True, text=True, check=True,
    )
    summary = json.loads(out.stdout)
    assert summary["bound"]["gpu_allocation_pct"] == 60.0
    assert summary["bound"]["gap_gpus"] == pytest.approx(1.2 - summary["gpu_allocation_pct"] / 100 * 2)
