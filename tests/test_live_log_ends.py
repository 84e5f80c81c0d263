"""Live logs and the end of an attempt (issue 26), with a stand-in for the API's pod log (no cluster):

- the follower ends when it is cancelled as its last line arrives (Python 3.11's asyncio.wait_for dropped
  such a cancel: the follower then read on forever and the trigger never yielded its event);
- once the gang is done, the follower stops at the end of its stream by itself;
- rank 0's end tail does not repeat what live logs wrote; a failed rank's tail stays whole; a disrupted
  rank 0's tail is what the follower read (its pod may be gone before a new read could start).
"""

from __future__ import annotations

import asyncio

from airflow_gpu.kube.podlog import STREAMED_ALL, STREAMED_SOME
from airflow_gpu.triggers.gang import GangTrigger
from airflow_gpu.triggers.ranklogs import LiveCopy, rank_ends


class _Content:
    def __init__(self, queue: asyncio.Queue):
        self.queue = queue

    async def readline(self) -> bytes:
        return await self.queue.get()


class _Resp:
    def __init__(self, queue: asyncio.Queue, status: int = 200):
        self.content, self.status = _Content(queue), status

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return False

    async def text(self) -> str:
        return "gone"


class _Core:
    """read_namespaced_pod_log: a follow stream fed by `lines` (b"" ends it), or a fixed tail per pod."""

    def __init__(self, tails: dict[str, str] | None = None, gone: bool = False):
        self.gone = gone
        self.lines: asyncio.Queue = asyncio.Queue()
        self.tails = tails or {}
        self.reads: list[dict] = []
        self.patches = 0

    async def read_namespaced_pod_log(self, pod, namespace, **kw):
        self.reads.append({"pod": pod, **kw})
        if kw.get("follow") and pod not in self.tails and not self.gone:
            return _Resp(self.lines)
        if pod not in self.tails:
            return _Resp(asyncio.Queue(), status=404)
        queue: asyncio.Queue = asyncio.Queue()
        for line in self.tails[pod].splitlines(keepends=True):
            queue.put_nowait(line.encode())
        queue.put_nowait(b"")
        return _Resp(queue)

    async def patch_namespaced_pod(self, *args, **kw):
        self.patches += 1


def _trigger(interval: float = 0) -> GangTrigger:
    t = GangTrigger("ns", "g", ["g-0", "g-1"], settle_seconds=0, logging_interval=interval)
    t._running.set()
    return t


def _line(i: int) -> bytes:
    return f"2026-12-06T09:00:{i:02d}.000000001Z step {i}\n".encode()


def test_a_cancel_that_arrives_with_the_last_line_ends_the_follower():
    async def main():
        t, core = _trigger(interval=30), _Core()  # a batch waits up to 30 s: each read has a time limit
        follower = asyncio.create_task(t._follow_rank0(core))
        core.lines.put_nowait(_line(1))
        await asyncio.sleep(0.05)  # read, in the batch
        core.lines.put_nowait(_line(2))
        follower.cancel()  # in the same turn as the line: the read completes as the cancel arrives
        done, _ = await asyncio.wait([follower], timeout=3)
        return t, core, bool(done)
    t, core, ended = asyncio.run(main())
    assert ended, "the follower went on reading after it was cancelled"
    assert core.patches == 1 and t._streamed_until == "2026-12-06T09:00:01.000000001Z"  # its batch flushed


def test_the_follower_stops_at_the_end_of_its_stream_once_the_gang_is_done():
    async def main():
        t, core = _trigger(), _Core()
        follower = asyncio.create_task(t._follow_rank0(core))
        for i in range(3):
            core.lines.put_nowait(_line(i))
        await asyncio.sleep(0.05)
        t._gang_done.set()
        core.lines.put_nowait(b"")  # the container's output ended
        await asyncio.wait_for(follower, 5)
        return t, core
    t, core = asyncio.run(main())
    assert t._live_ended.is_set() and list(t._live_lines) == ["step 0", "step 1", "step 2"]
    assert t._streamed_until == "2026-12-06T09:00:02.000000001Z" and core.patches == 3
    assert len([r for r in core.reads if r.get("follow")]) == 1  # not reopened


def _pod(name: str, rank: int, phase: str, code: int, reason: str = "Completed", stopping: bool = False) -> dict:
    return {"metadata": {"name": name, "labels": {"airflow-gpu.io/rank": str(rank)},
                         **({"deletionTimestamp": "2026-12-06T09:00:09Z"} if stopping else {})},
            "spec": {"nodeName": "n"},
            "status": {"phase": phase, "containerStatuses": [{"name": "base", "state": {"terminated": {
                "exitCode": code, "reason": reason}}}]}}


def _ends(core, pods, live, disrupted=False):
    class Log:
        def info(self, *a):
            pass

    async def list_pods():
        return pods
    return {r["pod"]: r for r in asyncio.run(rank_ends(
        core, "ns", pods, None, get_logs=True, tail_lines=200, disrupted=disrupted, grace=1.0,
        list_pods=list_pods, log=Log(), live=live))}


def test_rank_0_s_end_tail_leaves_out_what_live_logs_wrote_and_failed_ranks_stay_whole():
    rank0 = "".join(_line(i).decode() for i in range(5))
    core = _Core({"g-0": rank0, "g-1": "rank one starting\nCUDA out of memory\n"})
    pods = {"g-0": _pod("g-0", 0, "Running", 0), "g-1": _pod("g-1", 1, "Failed", 1, "Error")}
    pods["g-0"]["status"]["containerStatuses"][0]["state"] = {"running": {}}
    ends = _ends(core, pods, LiveCopy(("step 0", "step 1", "step 2"), False, False, "2026-12-06T09:00:02.000000001Z"))
    assert (ends["g-0"]["tail"], ends["g-0"]["cut"]) == ("step 3\nstep 4\n", STREAMED_SOME)
    assert ends["g-1"]["tail"] == "rank one starting\nCUDA out of memory\n" and ends["g-1"]["cut"] is None
    # all of it streamed: the block says it is above
    ends = _ends(core, pods, LiveCopy((), False, True, "2026-12-06T09:00:04.000000001Z"))
    assert (ends["g-0"]["tail"], ends["g-0"]["cut"]) == ("", STREAMED_ALL)
    # a failed rank 0 keeps its whole tail (the exception quotes it)
    pods = {"g-0": _pod("g-0", 0, "Failed", 1, "Error")}
    ends = _ends(core, pods, LiveCopy((), False, True, "2026-12-06T09:00:04.000000001Z"))
    assert ends["g-0"]["tail"].splitlines()[-1].endswith("step 4") and ends["g-0"]["cut"] is None


def test_a_disrupted_rank_0_s_tail_is_what_the_follower_read():
    core = _Core(gone=True)  # the pod is gone: a read answers 404
    pods = {"g-0": _pod("g-0", 0, "Failed", 143, "Error", stopping=True)}
    ends = _ends(core, pods, LiveCopy(("epoch 3", "stopped"), True, True, "x"), disrupted=True)
    assert ends["g-0"]["tail"] == "epoch 3\nstopped\n" and "cut" in (ends["g-0"]["cut"] or "")
    assert not core.reads
    # the follower did not reach the end: read (404: gone), then what it had
    ends = _ends(core, pods, LiveCopy(("epoch 3",), False, False, "x"), disrupted=True)
    assert ends["g-0"]["tail"] == "epoch 3\n" and len(core.reads) == 1
