"""The plugin's queue without a cluster: one shared build serves every request for its max age; the
published queue's encoding stays under the API's object limit at scale; with nothing published, or a
publication too old, the answer says so instead of guessing; ui/ never places or estimates."""

from __future__ import annotations

import ast
import json
import random
from pathlib import Path

from airflow_gpu import constants as C
from airflow_gpu.kube import queue_status
from airflow_gpu.ui import queue, service

UI = Path(__file__).resolve().parents[1] / "airflow_gpu" / "ui"
# what decides or places: the UI reads the scheduler's publication instead
PLACEMENT = ("airflow_gpu.core.gang", "airflow_gpu.core.placement", "airflow_gpu.core.queue",
             "airflow_gpu.core.policies", "airflow_gpu.core.preemption", "airflow_gpu.core.room",
             "airflow_gpu.core.visibility", "airflow_gpu.scheduler")
# the chargeback still reads pods with the conversion's parsers (issue 28 item 2 moves them to kube/)
ALLOWED = ("airflow_gpu.kube.convert",)


def test_one_build_is_shared_until_it_is_too_old(monkeypatch):
    builds = []

    def build(session, settings):
        builds.append(settings.kubeconfig)
        return {"n": len(builds)}

    monkeypatch.setattr(service, "build_queue", build)
    clock = [100.0]
    monkeypatch.setattr(service.time, "monotonic", lambda: clock[0])
    shared = service.SharedQueue(max_age=5.0)
    a = service.Settings("kube-a", "quotas.yaml")
    assert shared.get(None, a) == {"n": 1}
    clock[0] += 4.9
    assert shared.get(None, a) == {"n": 1}  # within the max age: the same build
    assert json.loads(shared.get_json(None, a)) == {"n": 1}
    clock[0] += 0.2
    assert shared.get(None, a) == {"n": 2}  # too old: built again
    assert json.loads(shared.get_json(None, a)) == {"n": 2}  # its JSON with it
    assert shared.get(None, service.Settings("kube-b", "quotas.yaml")) == {"n": 3}  # another cluster
    assert shared.get(None, service.Settings("kube-b", "quotas.yaml", scheduler_name="other")) == {"n": 4}


def entry(i: int) -> dict:
    return {"gang": f"team-{i % 7}/gang-{i:05d}", "namespace": f"team-{i % 7}", "team": f"team{i % 7}",
            "tier": "production-training", "priority": 100, "gpus": 8.0, "products": ["NVIDIA-A100-SXM4-80GB"],
            "created_at": 1.7e9 + i, "cluster_position": i + 1, "position": i // 7 + 1,
            "reason": f"needs 2 x NVIDIA-A100-SXM4-80GB; largest free block is {i % 8}; ~{i} s",
            "estimated_start": 1.7e9 + 60 * i if i < 25 else None, "estimate_note": "" if i < 25 else "not estimated",
            "nodes": [f"gpu-{i:04d}"], "expected_products": ["NVIDIA-A100-SXM4-80GB"],
            "ti": [f"dag_{i}", "train", "manual__2026-12-03T08-00-00", "1"]}


def test_the_publication_fits_the_object_limit_at_5000_nodes_and_1000_waiting():
    rng = random.Random(1)
    nodes = [{"name": f"gpu-node-{i:05d}", "product": "NVIDIA-A100-SXM4-80GB", "capacity_type": "spot" if i % 3 else "on-demand",
              "gpus": sorted(rng.choice((0, 0, 1000, 500)) for _ in range(8)), "held": i % 50 == 0, "mig": {}}
             for i in range(5000)]
    running = [{"gang": f"team-1/run-{i}", "namespace": "team-1", "team": "team1", "tier": "production-training",
                "gpus": 8.0, "pods": [{"name": f"team-1/run-{i}-{r}", "node": f"gpu-node-{i * 2 + r:05d}",
                                       "capacity_type": "spot"} for r in range(2)],
                "started_at": 1.7e9, "last_checkpoint_at": None, "interruptions": 0, "preemptions": 0,
                "ti": [f"run_{i}", "train", "manual__1", "1"]} for i in range(2000)]
    doc = {"version": queue_status.VERSION, "generated_at": 1.7e9, "cycle": 7, "scheduler": "s", "profile": "fgd-lookahead",
           "publish_interval": 5.0, "waiting": [entry(i) for i in range(1000)], "incomplete": [], "running": running,
           "cluster": {"nodes": nodes, "allocation_ratio": 0.8, "fragmentation": 0.1, "gpus_total": 40000}}
    blob = queue_status.encode(doc)
    assert len(blob) <= queue_status.MAX_BYTES
    back = queue_status.decode(queue_status.manifest("ns", "s", blob))
    assert back["waiting"] == doc["waiting"] and len(back["cluster"]["nodes"]) == 5000
    assert back["truncated"] == {"waiting": 0, "incomplete": 0, "running": 0, "nodes": 0}
    print(f"5,000 nodes, 1,000 waiting, 2,000 running: {len(blob) / 1024:.0f} KiB gzip")
    # too large for the limit: lists halved, what was left out counted
    small = queue_status.encode(doc, max_bytes=20_000)
    cut = queue_status.decode(queue_status.manifest("ns", "s", small))
    assert len(small) <= 20_000 and cut["truncated"]["waiting"] == 1000 - len(cut["waiting"]) > 0
    cm = queue_status.manifest("ns", "s", small)
    assert cm["metadata"]["name"] == C.QUEUE_CONFIGMAP_PREFIX + "s" and C.LABEL_PLAN_OF not in cm["metadata"]["labels"]


def test_nothing_published_or_too_old_is_said_not_guessed():
    pools = [queue.PoolRow("gpu.nlp.guaranteed", 56, 56, 0, 7, "nlp")]
    tasks = [queue.TaskRow("held_dag", "fit", "manual__1", 1, "gpu.nlp.guaranteed", "scheduled", 1000.0, 5, 7)]
    none = queue.build(queue.Inputs(pools, tasks, None, source="ConfigMap default/x"), now=2000.0)
    assert none["published_at"] is None and none["stale"] and "published no queue" in none["warnings"][0]
    assert [w["dag_id"] for w in none["waiting"]] == ["held_dag"] and none["waiting"][0]["reason"].startswith("pool full")
    assert none["cluster"]["nodes"] == [] and none["running"] == []
    pub = {"version": 1, "generated_at": 1900.0, "cycle": 3, "scheduler": "s", "profile": "fgd-lookahead",
           "publish_interval": 5.0, "waiting": [entry(0)], "incomplete": [], "running": [],
           "cluster": queue.EMPTY_CLUSTER}
    fresh = queue.build(queue.Inputs(pools, tasks, pub), now=1900.0 + 45)
    assert fresh["stale"] is False and fresh["published_at"] == 1900.0 and fresh["warnings"] == []
    row = fresh["waiting"][0]
    assert {k: row[k] for k in ("cluster_position", "position", "reason", "estimated_start")} == \
        {k: entry(0)[k] for k in ("cluster_position", "position", "reason", "estimated_start")}
    assert fresh["waiting"][1]["cluster_position"] == 2  # Airflow's held task after the scheduler's queue
    cut = queue.build(queue.Inputs(pools, tasks, {**pub, "truncated": {"waiting": 12, "nodes": 0}}), now=1901.0)
    assert cut["warnings"] == ["the scheduler's publication leaves out 12 waiting gangs (object size limit); "
                               "the rows shown are the first in its order"]
    old = queue.build(queue.Inputs(pools, tasks, pub), now=1900.0 + 3 * 5 + queue.STALE_GRACE + 1)
    assert old["stale"] is True and "46 s ago" in old["warnings"][0]


def test_ui_never_imports_a_placement_function():
    """Static: no module of ui/ imports what decides or places (a lazy import inside a function too)."""
    bad = []
    for path in sorted(UI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if isinstance(node, ast.ImportFrom) and node.module in ("airflow_gpu.core", "airflow_gpu"):
                names = [f"{node.module}.{a.name}" for a in node.names]
            bad += [f"{path.name}: {n}" for n in names
                    if n.startswith(PLACEMENT) and not n.startswith(ALLOWED)]
    assert bad == []


def test_ui_and_the_queue_cli_load_no_placement_module():
    """At run time too (transitive imports): a fresh interpreter after importing them."""
    import subprocess
    import sys

    code = ("import sys, airflow_gpu.ui.queue, airflow_gpu.ui.service, airflow_gpu.ui.sources, airflow_gpu.cli.queue; "
            "print('\\n'.join(m for m in sys.modules if m.startswith('airflow_gpu.')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    loaded = out.stdout.split()
    assert "airflow_gpu.ui.service" in loaded
    assert [m for m in loaded if m.startswith(PLACEMENT) and not m.startswith(ALLOWED) and m != "airflow_gpu.scheduler"] == []


def test_the_queue_says_on_which_product_a_gang_is_expected_to_start(capsys):
    """Issue 29: the scheduler publishes the product of the nodes a waiting gang is expected to start
    on (core.visibility); the page and `airflow-gpu queue` show it, deciding nothing."""
    from airflow_gpu.cli.queue import print_queue

    both = {**entry(0), "products": ["NVIDIA-A100-SXM4-80GB", "NVIDIA-H100-80GB-HBM3"],
            "expected_products": ["NVIDIA-H100-80GB-HBM3"], "estimated_start": 1960.0}
    pub = {"version": 1, "generated_at": 1900.0, "cycle": 3, "scheduler": "s", "profile": "fgd-lookahead",
           "publish_interval": 5.0, "waiting": [both], "incomplete": [], "running": [], "cluster": queue.EMPTY_CLUSTER}
    data = queue.build(queue.Inputs([], [], pub), now=1900.0)
    assert data["waiting"][0]["expected_products"] == ["NVIDIA-H100-80GB-HBM3"]
    print_queue(data)
    out = " ".join(capsys.readouterr().out.split())
    assert "in 60 s on NVIDIA-H100-80GB-HBM3" in out, out
    page = (UI / "static" / "index.html").read_text()
    assert "w.expected_products" in page and "onProduct(w)" in page  # the page's estimate column shows it


def test_the_queue_says_when_a_gang_keeps_its_place_under_its_tiers_wait_bound(capsys):
    """The wait bound (issue 30): the scheduler publishes `due_at` for a gang of a tier with
    max_wait_seconds > 0; the page and `airflow-gpu queue` say from when it keeps its place."""
    from airflow_gpu.cli.queue import print_queue

    later, overdue = {**entry(0), "due_at": 2000.0}, {**entry(1), "due_at": 1800.0}
    pub = {"version": 1, "generated_at": 1900.0, "cycle": 3, "scheduler": "s", "profile": "fgd-lookahead",
           "publish_interval": 5.0, "waiting": [later, overdue, entry(2)], "incomplete": [], "running": [],
           "cluster": queue.EMPTY_CLUSTER}
    data = queue.build(queue.Inputs([], [], pub), now=1900.0)
    assert [w["due_at"] for w in data["waiting"]] == [2000.0, 1800.0, None]
    print_queue(data)
    out = " ".join(capsys.readouterr().out.split())
    assert "keeps its place in 100 s" in out and out.count("keeps its place") == 2, out
    page = (UI / "static" / "index.html").read_text()
    assert "due(w, now)" in page and "w.due_at" in page
