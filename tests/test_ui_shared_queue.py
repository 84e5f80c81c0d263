"""The plugin's shared queue build: one build serves every request for its max age, then it is built
again; other settings (another cluster or config) never get an answer built for the first."""

from __future__ import annotations

from airflow_gpu.ui import service


def test_one_build_is_shared_until_it_is_too_old(monkeypatch):
    builds = []
    monkeypatch.setattr(service, "build_queue", lambda session, settings: builds.append(settings) or {"n": len(builds)})
    clock = [100.0]
    monkeypatch.setattr(service.time, "monotonic", lambda: clock[0])
    shared = service.SharedQueue(max_age=5.0)
    a = service.Settings("kube-a", "quotas.yaml")
    assert shared.get(None, a) == {"n": 1}
    clock[0] += 4.9
    assert shared.get(None, a) == {"n": 1}  # within the max age: the same build
    clock[0] += 0.2
    assert shared.get(None, a) == {"n": 2}  # too old: built again
    assert shared.get(None, service.Settings("kube-b", "quotas.yaml")) == {"n": 3}  # another cluster
    assert len(builds) == 3
