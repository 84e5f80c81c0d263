"""The ranks' ends, read by GangTrigger when an attempt ends and carried in its event, so the worker
writes them to the try's log (the trigger log file is replaced by the next deferral of the same try).

Read in the triggerer because it is there when the attempt ends: an evicted or preempted pod is deleted
by Kubernetes once its containers stop, before a worker could read it. For a disruption the ranks are
followed until rank 0 has stopped (its SIGTERM checkpoint lines are the ones that matter), at most the
grace period; a rank nobody stops (a partial loss) is read at once.

With live logs (GangTrigger._follow_rank0) rank 0's follower has read its log to the end already: a
disrupted rank 0's tail is what it kept (a preempted pod is deleted the moment it stops, before a new
read could start), and a rank 0 that did not fail shows only what the live log did not write yet.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

import aiohttp

from airflow_gpu.kube.podlog import TAIL_MAX_BYTES, rank_end, ranks_to_show, trim_tail, unstreamed
from airflow_gpu.kube.state import container_ended, stopping

# bytes of tails one event carries (it is stored in the metadata DB): shared by the ranks shown
EVENT_TAIL_BUDGET = 512 * 1024
SETTLE_MARGIN = 5.0  # seconds past the grace period to wait for disrupted ranks to stop


@dataclass(frozen=True)
class LiveCopy:
    """What the live-log follower of rank 0 did: the last lines it read (up to the tail's length),
    whether it read more than those, whether its stream reached the end of the container's output,
    and the timestamp of the last line it wrote to the log (None: it wrote none)."""

    lines: tuple[str, ...] = ()
    more: bool = False
    ended: bool = False
    streamed_until: str | None = None

    def tail(self) -> tuple[str, bool] | None:
        return ("".join(line + "\n" for line in self.lines), self.more) if self.lines else None


async def _tail(core, namespace: str, pod: str, container: str | None, lines: int,
                follow_for: float = 0.0, timestamps: bool = False) -> tuple[str, bool] | None:
    """(the last `lines` lines, whether there were more before), None when there is no log. follow_for > 0:
    follow the log until the container ends (the stream closes) or that many seconds passed."""
    from kubernetes_asyncio import client

    kept: deque[bytes] = deque(maxlen=lines + 1)
    try:
        resp = await core.read_namespaced_pod_log(pod, namespace, container=container, tail_lines=lines + 1,
                                                  follow=follow_for > 0, timestamps=timestamps, _preload_content=False,
                                                  _request_timeout=aiohttp.ClientTimeout(total=None, sock_connect=30))
        async with resp:
            if resp.status >= 400:  # unread (not raised) answers: the pod is gone, its log is not there
                return None
            async def read() -> None:
                while line := await resp.content.readline():
                    kept.append(line)
            try:
                async with asyncio.timeout(follow_for if follow_for > 0 else 60.0):  # not wait_for: see gang.py
                    await read()
            except TimeoutError:
                pass  # what came so far
    except (client.ApiException, aiohttp.ClientError):
        if not kept:
            return None
    more = len(kept) > lines
    return b"".join(list(kept)[1:] if more else kept).decode("utf-8", "replace"), more


async def rank_ends(core, namespace: str, pods: dict[str, dict], container: str | None, *, get_logs: bool,
                    tail_lines: int, disrupted: bool, grace: float, list_pods, log,
                    live: LiveCopy | None = None) -> list[dict]:
    """[{pod, rank, node, phase, exit_code, reason, message, tail, cut}] of the ranks the task log shows
    (failed ranks and rank 0). pods: the attempt's pods by name as last seen; list_pods(): a fresh
    {name: pod} (for a disruption, polled until the ranks stopped). live: rank 0's live-log follower."""
    tails: dict[str, tuple[str, bool] | None] = {}
    if disrupted and get_logs:
        # rank 0 is followed until it has stopped: its SIGTERM lines (the stop-save) come last, and a
        # pod being deleted is gone the moment it stops. The live follower read them already when its
        # stream reached the end; the next deferral replaces the trigger log, so they are all shown.
        for name, pod in pods.items():
            if rank_end(pod, container).rank == 0:
                if live is not None and live.ended and live.lines:
                    tails[name] = live.tail()
                    continue
                follow = grace + SETTLE_MARGIN if stopping(pod) and not container_ended(pod, container) else 0.0
                tails[name] = await _tail(core, namespace, name, container, tail_lines, follow) or \
                    (live.tail() if live is not None else None)
        try:
            fresh = await list_pods()
            pods = {n: fresh.get(n, p) for n, p in pods.items()}
        except Exception as exc:  # noqa: BLE001 - the ends as last seen
            log.info("Reading the ranks of a disrupted gang failed: %s", exc)
    ends = [rank_end(p, container) for p in pods.values()]
    shown = ranks_to_show(ends, disrupted=disrupted)
    budget = max(4096, min(TAIL_MAX_BYTES, EVENT_TAIL_BUDGET // max(1, len(shown))))
    out = []
    for end in shown:
        entry = {"pod": end.pod, "rank": end.rank, "node": end.node, "phase": end.phase, "exit_code": end.exit_code,
                 "reason": end.reason, "message": end.message, "tail": None, "cut": None}
        if get_logs and end.pod not in tails and end.rank == 0 and not end.failed and not disrupted \
                and live is not None and live.streamed_until:
            # the trigger log (shown in the task log) has rank 0's lines up to streamed_until: not twice
            got = await _tail(core, namespace, end.pod, container, tail_lines, timestamps=True)
            if got is not None:
                text, streamed = unstreamed(got[0], live.streamed_until)
                entry["tail"], cut = trim_tail(text, tail_lines, got[1] and streamed is None, budget)
                entry["cut"] = streamed or cut
        elif get_logs:
            got = tails[end.pod] if end.pod in tails else await _tail(core, namespace, end.pod, container,
                                                                           tail_lines)
            if got is not None:
                entry["tail"], entry["cut"] = trim_tail(got[0], tail_lines, got[1], budget)
        out.append(entry)
    return out


__all__ = ["LiveCopy", "rank_ends"]
