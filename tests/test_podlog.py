"""kube/podlog.py: the tail and its cut line, the rank header, the result's checks, resumed reads."""

from __future__ import annotations

import pytest

from airflow_gpu.checkpoint import write_result
from airflow_gpu.kube.podlog import (RankEnd, ResultError, parse_result, rank_end, ranks_to_show, since_seconds,
                                     split_timestamp, stamp_key, trim_tail)


def test_the_tail_not_the_head_and_a_line_saying_what_was_cut():
    text = "".join(f"line {i}\n" for i in range(1000))
    tail, cut = trim_tail(text, 3, more_before=False)
    assert tail == "line 997\nline 998\nline 999\n" and "only the last 3 lines" in cut
    assert trim_tail("a\nb\n", 5, more_before=False) == ("a\nb\n", None)
    tail, cut = trim_tail("x" * 1000 + "\nEND\n", 5, more_before=True, max_bytes=100)
    assert tail.endswith("END\n") and len(tail.encode()) == 100 and "905 bytes" in cut


def test_rank_header_reason_and_which_ranks_show():
    pod = {"metadata": {"name": "g-1", "labels": {"airflow-gpu.io/rank": "1"}}, "spec": {"nodeName": "n1"},
           "status": {"phase": "Failed", "containerStatuses": [{"name": "base", "state": {"terminated": {
               "exitCode": 137, "reason": "OOMKilled", "message": "{\"loss\": 1}"}}}]}}
    end = rank_end(pod)
    assert end.describe() == "rank 1: pod g-1 on node n1, exit code 137 (OOMKilled)" and end.message == '{"loss": 1}'
    ok = RankEnd("g-0", 0, "n0", "Running", None, "Running")
    stopped = RankEnd("g-2", 2, "n2", "Failed", 143, "Error")
    assert [e.pod for e in ranks_to_show([stopped, end, ok])] == ["g-0", "g-1", "g-2"]
    assert [e.pod for e in ranks_to_show([stopped, ok], disrupted=True)] == ["g-0"]


def test_result_checks(tmp_path):
    assert parse_result('{"loss": 0.5}') == {"loss": 0.5}
    with pytest.raises(ResultError, match="not valid JSON"):
        parse_result("{loss: 1")
    with pytest.raises(ResultError, match="too big"):
        parse_result('{"x": "' + "a" * 5000)
    path = write_result({"loss": 0.25}, str(tmp_path / "xcom" / "return.json"))
    assert parse_result(open(path).read()) == {"loss": 0.25}
    with pytest.raises(ValueError, match="at most 4096"):
        write_result("a" * 5000, str(tmp_path / "r.json"))


def test_resumed_reads_skip_what_was_copied():
    stamp, message = split_timestamp("2026-12-06T06:00:00.123456789Z step 5")
    assert (stamp, message) == ("2026-12-06T06:00:00.123456789Z", "step 5")
    assert split_timestamp("no stamp here") == (None, "no stamp here")
    assert stamp_key("2026-12-06T06:00:00.5Z") == stamp_key("2026-12-06T06:00:00.500000000Z")
    assert stamp_key("2026-12-06T06:00:00.123456789Z") < stamp_key("2026-12-06T06:00:00.12345679Z")
    assert since_seconds("2026-12-06T06:00:00.9Z", 1796536810.0) >= 1


def test_the_base_container_is_found_by_name_not_position():
    """A sidecar listed first, exiting 5 and still running: the training container (KPO's
    base_container_name) decides the member's end, exit code and termination message."""
    from airflow_gpu.kube.state import SUCCEEDED, gang_state

    def pod(base_state: dict) -> dict:
        return {"metadata": {"name": "g-0", "labels": {"airflow-gpu.io/rank": "0"}}, "spec": {"nodeName": "n0"},
                "status": {"phase": "Running", "containerStatuses": [
                    {"name": "metrics", "state": {"running": {}},
                     "lastState": {"terminated": {"exitCode": 5, "message": "sidecar"}}},
                    {"name": "train", "state": base_state}]}}

    done = pod({"terminated": {"exitCode": 0, "reason": "Completed", "message": '{"loss": 0.1}'}})
    end = rank_end(done, "train")
    assert (end.phase, end.exit_code, end.message, end.failed) == ("Succeeded", 0, '{"loss": 0.1}', False)
    assert gang_state([done], expected=1, container="train").phase == SUCCEEDED
    assert rank_end(done).exit_code == 5  # no container named: any container (what the fix is about)
    running = pod({"running": {}})
    assert gang_state([running], expected=1, container="train").phase == "running"
    failed = rank_end(pod({"terminated": {"exitCode": 3, "reason": "Error"}}), "train")
    assert (failed.phase, failed.exit_code, failed.reason) == ("Failed", 3, "Error")
    # being deleted, the containers end because of it: a disruption, not the application's failure
    stopping = pod({"terminated": {"exitCode": 143, "reason": "Error"}})
    stopping["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    assert gang_state([stopping], expected=1, container="train").phase == "disrupted"


def test_unstreamed_drops_what_live_logs_wrote():
    from airflow_gpu.kube.podlog import STREAMED_ALL, STREAMED_SOME, unstreamed

    stamped = "".join(f"2026-12-06T09:00:0{i}.000000001Z step {i}\n" for i in range(5))
    assert unstreamed(stamped, "2026-12-06T09:00:02.000000001Z") == ("step 3\nstep 4\n", STREAMED_SOME)
    assert unstreamed(stamped, "2026-12-06T09:00:04.000000001Z") == ("", STREAMED_ALL)
    assert unstreamed(stamped, "2026-12-06T08:00:00Z") == ("".join(f"step {i}\n" for i in range(5)), None)
