"""The replay's backlog kept in queue order (the cycle's input), and the keys hashed once that the
cycle looks up for every gang of a long backlog."""

from __future__ import annotations

import pickle

from airflow_gpu.core.model import Gang, HashedTuple, PodRequest
from airflow_gpu.core.backoff import NoPlanMemo
from airflow_gpu.core.queue import queue_order
from airflow_gpu.sim.replay import PLATFORMS, Replay
from airflow_gpu.sim.settings import seed_setting
from airflow_gpu.sim.workload import SeedParams


def test_the_backlog_stays_in_queue_order_through_arrivals_starts_preemptions_and_interruptions():
    # contended (3 of the seed scenario's 12 nodes) so gangs wait, get preempted and are interrupted on spot
    setting = seed_setting(SeedParams(days=2.0, nodes=3), 3)
    replay = Replay(setting, PLATFORMS["full"])
    checked = []
    cycles = replay._cycles

    def checking(now: float) -> None:
        assert replay.queue == queue_order(replay.pending.values())
        assert len(replay.queue) == len(replay.pending)
        checked.append(len(replay.queue))
        cycles(now)

    replay._cycles = checking
    result = replay.run()
    assert max(checked) > 10, "the setting should build a backlog"
    assert result.preemptions + result.interruptions > 0
    assert replay.queue == [] and replay.pending == {}


def test_hashed_tuple_is_a_tuple_that_survives_pickling():
    key = HashedTuple(("team-a", ("x", 1), frozenset({"n1"})))
    assert key == ("team-a", ("x", 1), frozenset({"n1"})) and hash(key) == hash(tuple(key))
    again = pickle.loads(pickle.dumps(key))
    assert type(again) is HashedTuple and again == key and {key: 1}[again] == 1


def test_no_plan_memo_answers_gangs_of_one_plan_ask_alike():
    pod = PodRequest("p", cpu_milli=1000, memory_mib=1000, gpus=1)
    one, other = (Gang(n, "a", "production-training", 10, (pod, pod)) for n in ("g1", "g2"))
    bigger = Gang("g3", "a", "production-training", 10, (pod, pod, pod))
    memo = NoPlanMemo()
    memo.add(one, ("behind", frozenset({"n1"})))
    assert memo.failed(other, ("behind", frozenset({"n1"})))
    assert not memo.failed(other) and not memo.failed(other, ("behind", frozenset({"n2"})))
    assert not memo.failed(bigger, ("behind", frozenset({"n1"})))
