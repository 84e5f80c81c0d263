"""The plugin's shared queue build: one build serves every request for its max age, then it is built
again; other settings (another cluster or config) never get an answer built for the first, nor its
conversions (the Memo)."""

from __future__ import annotations

import json

from airflow_gpu.scheduler.cache import View
from airflow_gpu.ui import service


def test_one_build_is_shared_until_it_is_too_old(monkeypatch):
    builds = []

    def build(session, settings, view=None, memo=None):
        builds.append((settings.kubeconfig, memo))
        return {"n": len(builds)}

    monkeypatch.setattr(service, "build_queue", build)
    clock = [100.0]
    monkeypatch.setattr(service.time, "monotonic", lambda: clock[0])
    shared = service.SharedQueue(max_age=5.0, view_of=lambda settings: View({}, {}, {}, {}, {}))
    a = service.Settings("kube-a", "quotas.yaml")
    assert shared.get(None, a) == {"n": 1}
    clock[0] += 4.9
    assert shared.get(None, a) == {"n": 1}  # within the max age: the same build
    assert json.loads(shared.get_json(None, a)) == {"n": 1}
    clock[0] += 0.2
    assert shared.get(None, a) == {"n": 2}  # too old: built again
    assert json.loads(shared.get_json(None, a)) == {"n": 2}  # its JSON with it
    assert shared.get(None, service.Settings("kube-b", "quotas.yaml")) == {"n": 3}  # another cluster
    assert len(builds) == 3
    assert builds[0][1] is builds[1][1] and builds[2][1] is not builds[0][1]  # conversions kept per cluster
