"""A rank's long log reaches the task log by its tail, and on_finish_action="delete_succeeded_pod" keeps a
failed gang's ended pods (issue 26). (It hung past 400 s: the live-log follower, cancelled as its last
line arrived, read on forever, Python 3.11's wait_for having dropped the cancel; tests/test_live_log_ends.py.)"""

from __future__ import annotations

import sys

import pytest

from airflow_gpu import constants as C
from tests.test_operator_logs import LONG_LOG
from tests.test_operator_run import platform, run_dag  # noqa: F401 - platform is a fixture

pytestmark = pytest.mark.slow


def test_the_end_of_a_long_log_and_kept_pods(platform, sqlite_airflow_db, kube_cluster, seaweedfs):
    core = platform["core"]
    result, log = run_dag(sqlite_airflow_db, kube_cluster, seaweedfs, "logs_long", (
        'team="nlp", tier="production-training", workers=1, gpus_per_worker=1, retries=1, image="python:3.11", '
        f'on_finish_action="delete_succeeded_pod", logging_interval=None, cmds=["{sys.executable}", "-c", {LONG_LOG!r}]'))
    ti = result["tis"]["train"]
    assert (ti["state"], ti["try_number"]) == ("failed", 2), log[-6000:]
    assert "FINAL-MARKER Traceback: the real error" in log, log[-6000:]
    cut = log.index("[... earlier output cut: only the last 200 lines are shown")
    assert cut < log.rindex("FINAL-MARKER"), log[-6000:]  # the tail after its cut line (live logs may show it earlier)
    assert "003999 " in log and "000100 " not in log  # the tail, not the head
    # both tries' pods are kept (ended, annotated), each try ran its own; kubectl logs works on them
    pods = core.list_namespaced_pod("team-nlp", label_selector=f"{C.LABEL_DAG_ID}=logs_long").items
    assert sorted(p.metadata.labels[C.LABEL_ATTEMPT] for p in pods) == ["1000", "2000"], [p.metadata.name for p in pods]
    assert all(p.status.phase == "Failed" and C.ANNOTATION_KEEP_UNTIL in p.metadata.annotations for p in pods)
    text = core.read_namespaced_pod_log(pods[0].metadata.name, "team-nlp", _preload_content=False).data.decode()
    assert "FINAL-MARKER" in text
    assert f"kubectl logs -n team-nlp {pods[0].metadata.name}" in log
    services = core.list_namespaced_service("team-nlp", label_selector=f"{C.LABEL_DAG_ID}=logs_long").items
    assert not services, [s.metadata.name for s in services]
    for p in pods:  # clean up for the other tests
        core.delete_namespaced_pod(p.metadata.name, "team-nlp", grace_period_seconds=0)
