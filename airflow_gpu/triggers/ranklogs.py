"""The ranks' ends, read by GangTrigger when an attempt ends and carried in its event, so the worker
writes them to the try's log (the trigger log file is replaced by the next deferral of the same try).

Read in the triggerer because it is there when the attempt ends: an evicted or preempted pod is deleted
by Kubernetes once its containers stop, before a worker could read it. For a disruption the ranks are
followed until rank 0 has stopped (its SIGTERM checkpoint lines are the ones that matter), at most the
grace period; a rank nobody stops (a partial loss) is read at once.
"""

from __future__ import annotations

import asyncio
from collections import deque

import aiohttp

from airflow_gpu import constants as C
from airflow_gpu.kube.podlog import TAIL_MAX_BYTES, rank_end, ranks_to_show, trim_tail

# bytes of tails one event carries (it is stored in the metadata DB): shared by the ranks shown
EVENT_TAIL_BUDGET = 512 * 1024
SETTLE_MARGIN = 5.0  # seconds past the grace period to wait for disrupted ranks to stop


def _ended(pod: dict, container: str | None) -> bool:
    """The pod ended, or its training container did (a sidecar may still run)."""
    status = pod.get("status") or {}
    if status.get("phase") in ("Succeeded", "Failed"):
        return True
    states = [cs.get("state") or {} for cs in status.get("containerStatuses") or []
              if not container or cs.get("name") == container]
    return bool(states) and all("terminated" in s for s in states)


def _stopping(pod: dict) -> bool:
    """Being deleted or told to stop (DisruptionTarget): its last lines are still to come."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return True
    return any(c.get("type") == C.CONDITION_DISRUPTION_TARGET and c.get("status") == "True"
               for c in (pod.get("status") or {}).get("conditions") or [])


async def _tail(core, namespace: str, pod: str, container: str | None, lines: int,
                follow_for: float = 0.0) -> tuple[str, bool] | None:
    """(the last `lines` lines, whether there were more before), None when there is no log. follow_for > 0:
    follow the log until the container ends (the stream closes) or that many seconds passed."""
    from kubernetes_asyncio import client

    kept: deque[bytes] = deque(maxlen=lines + 1)
    try:
        resp = await core.read_namespaced_pod_log(pod, namespace, container=container, tail_lines=lines + 1,
                                                  follow=follow_for > 0, _preload_content=False,
                                                  _request_timeout=aiohttp.ClientTimeout(total=None, sock_connect=30))
        async with resp:
            async def read() -> None:
                while line := await resp.content.readline():
                    kept.append(line)
            try:
                await asyncio.wait_for(read(), follow_for if follow_for > 0 else 60.0)
            except asyncio.TimeoutError:
                pass  # what came so far
    except (client.ApiException, aiohttp.ClientError):
        if not kept:
            return None
    more = len(kept) > lines
    return b"".join(list(kept)[1:] if more else kept).decode("utf-8", "replace"), more


async def rank_ends(core, namespace: str, pods: dict[str, dict], container: str | None, *, get_logs: bool,
                    tail_lines: int, disrupted: bool, grace: float, list_pods, log) -> list[dict]:
    """[{pod, rank, node, phase, exit_code, reason, message, tail, cut}] of the ranks the task log shows
    (failed ranks and rank 0). pods: the attempt's pods by name as last seen; list_pods(): a fresh
    {name: pod} (for a disruption, polled until the ranks stopped)."""
    tails: dict[str, tuple[str, bool] | None] = {}
    if disrupted and get_logs:
        # rank 0 is followed until it has stopped: its SIGTERM lines (the stop-save) come last, and a
        # pod being deleted is gone the moment it stops
        for name, pod in pods.items():
            if rank_end(pod, container).rank == 0:
                follow = grace + SETTLE_MARGIN if _stopping(pod) and not _ended(pod, container) else 0.0
                tails[name] = await _tail(core, namespace, name, container, tail_lines, follow)
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
        if get_logs:
            got = tails[end.pod] if end.pod in tails else await _tail(core, namespace, end.pod, container,
                                                                           tail_lines)
            if got is not None:
                entry["tail"], entry["cut"] = trim_tail(got[0], tail_lines, got[1], budget)
        out.append(entry)
    return out


__all__ = ["rank_ends"]
