"""GangTrigger: waits, in the triggerer, for one attempt of a gang to end, and says how it ended.

It WATCHES the gang's pods and its group object (one list each, then long watches resumed from the
last resourceVersion: a handful of requests per watch timeout, whatever the wait), logs the
scheduler's wait reason when it changes, mirrors the checkpoint status channel onto the pods while
the gang runs (so the scheduler picks victims by lost work), and yields one TriggerEvent whose
payload is a `kube.outcome.GangOutcome` classified by `kube.gang_state`.

The cluster is reached like KubernetesPodTrigger does: the provider's AsyncKubernetesHook through
`kubernetes_conn_id`, or a kubeconfig file (`config_file`) read on the triggerer, so no credentials
are serialised into the trigger row.

The event is held until the deferral has settled (`settle_seconds` after the trigger started): Airflow
3.3's scheduler fails a try ("finished with state success, but the task instance's state attribute is
queued/running", apache/airflow#66374, #71580, #72716) when a trigger event resumes the task before the
scheduler has drained the executor's "success" of the worker that deferred. The task would then be
up_for_retry: a preemption or a spot interruption right after a deferral would cost the DAG author a
retry and the try's counters.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
from airflow.triggers.base import BaseTrigger, TriggerEvent

from airflow_gpu import constants as C
from airflow_gpu.kube import state as S
from airflow_gpu.kube.outcome import STATUS_DISRUPTED, STATUS_ERROR, GangOutcome, outcome_of, with_recorded_preemption
from airflow_gpu.kube.podlog import DEFAULT_TAIL_LINES, since_seconds, split_timestamp, stamp_key
from airflow_gpu.kube.preemptions import read_record
from airflow_gpu.kube.state import GangState, container_ended, disruption_target, gang_state, stopping
from airflow_gpu.triggers.ranklogs import SETTLE_MARGIN, LiveCopy, rank_ends


# seconds the live log's last flush (and its position record) may take; a bound only: the trigger that
# never yielded (10d3845) was the follower reading on after a cancel Python 3.11's wait_for had dropped
FLUSH_TIMEOUT = 10.0

CLASSPATH = "airflow_gpu.triggers.gang.GangTrigger"
USER_AGENT = "airflow-gpu-gang-trigger"  # names this component in the API server's audit log
MAX_CHECKPOINT_STEP = 10**15
CLOCK_SKEW = 300.0  # a checkpoint time this far in the future is refused (the writer's clock is off)
WATCH_CLIENT_SLACK = 30  # seconds the client waits beyond the server's end of a watch
# How long an event waits after the trigger started (module docstring). The worker's supervisor reports
# the deferring task process's exit at its next wake-up, up to [workers] min_heartbeat_interval (5 s)
# later, then the executor and a scheduler loop pass it on: drained 0.2-6.1 s after "Pausing task as
# DEFERRED" on the loaded 2-core test machine. The margin covers a slow scheduler loop; the cost is paid only by
# gangs that end sooner than that after their deferral (training runs for minutes).
SETTLE_MARGIN_SECONDS = 10.0
MAX_SETTLE_SECONDS = 300.0
_RELIST = object()  # a watch ended in a way that needs a fresh list (410 Gone, error)


def checkpoint_hint(status: Any, now: float) -> tuple[int, float] | None:
    """(step, time) from a status.json record, or None when it is not a sane one. The record is
    written by the training code: bounded and validated before it becomes an annotation."""
    if not isinstance(status, dict):
        return None
    step, when = status.get("step"), status.get("time")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_CHECKPOINT_STEP:
        return None
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
        return None
    if not 0 < when <= now + CLOCK_SKEW:
        return None
    return step, float(when)


def default_settle_seconds() -> float:
    """[workers] min_heartbeat_interval + SETTLE_MARGIN_SECONDS (15 s with Airflow's defaults)."""
    from airflow.configuration import conf

    return float(conf.getint("workers", "min_heartbeat_interval", fallback=5)) + SETTLE_MARGIN_SECONDS


def settle_problem(seconds: Any) -> str | None:
    """What is wrong with a deferral settle time, None when it is usable."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds):
        return f"must be a number of seconds (got {seconds!r})"
    if not 0 <= seconds <= MAX_SETTLE_SECONDS:
        return f"must be between 0 and {MAX_SETTLE_SECONDS:g} seconds (got {seconds!r})"
    return None


def checkpoint_annotations(hint: tuple[int, float]) -> dict[str, str]:
    step, when = hint
    return {C.ANNOTATION_LAST_CHECKPOINT_STEP: str(step), C.ANNOTATION_LAST_CHECKPOINT_TIME: f"{when:.3f}"}


class GangTrigger(BaseTrigger):
    """Waits for gang `gang_name` (pods `pod_names` in `namespace`) to succeed, fail or be disrupted.

    pod_uids: pod name -> UID of the pods this attempt created; a pod of that name with another UID
    is not ours (it counts as missing). group: {"group", "version", "plural"} of the gang's group
    object, None when the backend has none. checkpoint_status_uri: the store whose status.json is
    mirrored (rank 0's); S3 credentials come from the triggerer's environment or pod identity.
    poll_interval: the least time between two fresh lists after a watch failed (the watch itself
    does not poll). watch_timeout: how long one watch request lasts before it is resumed. settle_seconds:
    the least time between the trigger's start and its event (module docstring; None: the default)."""

    def __init__(
        self,
        namespace: str,
        gang_name: str,
        pod_names: list[str],
        *,
        attempt: int = 0,
        pod_uids: dict[str, str] | None = None,
        group: dict[str, str] | None = None,
        label_selector: str | None = None,
        kubernetes_conn_id: str | None = None,
        config_file: str | None = None,
        cluster_context: str | None = None,
        in_cluster: bool | None = None,
        poll_interval: float = 10.0,
        watch_timeout: int = 300,
        checkpoint_status_uri: str | None = None,
        checkpoint_mirror_interval: float = 60.0,
        container_name: str | None = None,
        api_failure_timeout: float = 600.0,
        cleanup_selector: str | None = None,
        cleanup_grace_period: int | None = None,
        settle_seconds: float | None = None,
        get_logs: bool = True,
        logging_interval: float | None = None,
        log_tail_lines: int = DEFAULT_TAIL_LINES,
        preemption_record: dict[str, str] | None = None,
    ):
        super().__init__()
        if not pod_names:
            raise ValueError("pod_names: give the names of the gang's pods")
        if poll_interval <= 0 or watch_timeout < 1 or checkpoint_mirror_interval <= 0:
            raise ValueError("poll_interval, watch_timeout and checkpoint_mirror_interval must be > 0")
        settle_seconds = default_settle_seconds() if settle_seconds is None else settle_seconds
        problem = settle_problem(settle_seconds)
        if problem:
            raise ValueError(f"settle_seconds: {problem}")
        self.namespace = namespace
        self.gang_name = gang_name
        self.pod_names = list(pod_names)
        self.attempt = attempt
        self.pod_uids = dict(pod_uids or {})
        self.group = dict(group) if group else None
        self.label_selector = label_selector or f"{C.LABEL_GANG}={gang_name}"
        self.kubernetes_conn_id = kubernetes_conn_id
        self.config_file = config_file
        self.cluster_context = cluster_context
        self.in_cluster = in_cluster
        self.poll_interval = float(poll_interval)
        self.watch_timeout = int(watch_timeout)
        self.checkpoint_status_uri = checkpoint_status_uri
        self.checkpoint_mirror_interval = float(checkpoint_mirror_interval)
        self.container_name = container_name
        self.api_failure_timeout = float(api_failure_timeout)
        self.cleanup_selector = cleanup_selector
        self.cleanup_grace_period = cleanup_grace_period
        self.settle_seconds = float(settle_seconds)
        self.get_logs = bool(get_logs)
        self.logging_interval = None if logging_interval is None else float(logging_interval)
        self.log_tail_lines = int(log_tail_lines)
        # {"namespace", "name"} of the scheduler's record of preempted pods (kube/preemptions.py)
        self.preemption_record = dict(preemption_record) if preemption_record else None
        # watch state (not serialised)
        self._pods: dict[str, dict] = {}
        self._group_obj: dict | None = None
        self._first_disruption: dict[str, str] = {}
        self._last_phase: str | None = None
        self._last_wait: str | None = None
        self._checkpoint: tuple[int, float] | None = None
        self._running = asyncio.Event()
        # live logs: the follower task, what it read and wrote (ranklogs.LiveCopy), the end of its stream
        self._live: asyncio.Task | None = None
        self._live_lines: deque[str] = deque(maxlen=self.log_tail_lines)
        self._live_read = 0
        self._live_ended = asyncio.Event()
        self._live_streaming = False  # its stream is open
        self._streamed_until: str | None = None
        self._gang_done = asyncio.Event()

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return CLASSPATH, {
            "namespace": self.namespace,
            "gang_name": self.gang_name,
            "pod_names": self.pod_names,
            "attempt": self.attempt,
            "pod_uids": self.pod_uids,
            "group": self.group,
            "label_selector": self.label_selector,
            "kubernetes_conn_id": self.kubernetes_conn_id,
            "config_file": self.config_file,
            "cluster_context": self.cluster_context,
            "in_cluster": self.in_cluster,
            "poll_interval": self.poll_interval,
            "watch_timeout": self.watch_timeout,
            "checkpoint_status_uri": self.checkpoint_status_uri,
            "checkpoint_mirror_interval": self.checkpoint_mirror_interval,
            "container_name": self.container_name,
            "api_failure_timeout": self.api_failure_timeout,
            "cleanup_selector": self.cleanup_selector,
            "cleanup_grace_period": self.cleanup_grace_period,
            "settle_seconds": self.settle_seconds,
            "get_logs": self.get_logs,
            "logging_interval": self.logging_interval,
            "log_tail_lines": self.log_tail_lines,
            "preemption_record": self.preemption_record,
        }

    # --- the cluster ---------------------------------------------------------------------------

    def _hook(self):
        from airflow.providers.cncf.kubernetes.hooks.kubernetes import AsyncKubernetesHook

        config_dict = None
        if self.config_file:
            import yaml

            with open(self.config_file) as f:
                config_dict = yaml.safe_load(f)
        return AsyncKubernetesHook(conn_id=self.kubernetes_conn_id, in_cluster=self.in_cluster,
                                   config_dict=config_dict, cluster_context=self.cluster_context)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        self.log.info("Waiting for gang %s/%s (%d pods, attempt %s)", self.namespace, self.gang_name,
                      len(self.pod_names), self.attempt)
        # measured on the triggerer's own clock from here: the trigger starts after the deferral was
        # recorded, so this never holds less than settle_seconds after it (a restarted triggerer holds
        # an early event again, harmlessly)
        started = time.monotonic()
        try:
            async with self._hook().get_conn() as api:
                api.user_agent = USER_AGENT
                try:
                    outcome = await self._wait(api)
                    await self._live_to_its_end(outcome)
                finally:
                    await self._stop_live()
                outcome = await self._with_ranks(api, outcome)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the event says what went wrong; the operator decides
            self.log.exception("Watching gang %s/%s failed", self.namespace, self.gang_name)
            outcome = GangOutcome(STATUS_ERROR, self.namespace, self.gang_name, self.attempt,
                                  reason=f"{type(exc).__name__}: {exc}", finished_at=time.time())
        self.log.info("Gang %s/%s: %s", self.namespace, self.gang_name, outcome.status +
                      (f" ({outcome.reason})" if outcome.reason else ""))
        hold = self.settle_seconds - (time.monotonic() - started)
        if hold > 0:
            self.log.info("Gang %s/%s: the event waits %.1fs for the deferral to settle (Airflow 3.3 would "
                          "otherwise spend a retry on it)", self.namespace, self.gang_name, hold)
            await asyncio.sleep(hold)
        yield TriggerEvent(outcome.to_payload())

    async def _wait(self, api) -> GangOutcome:
        from kubernetes_asyncio import client

        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        failing_since: float | None = None
        mirror = asyncio.create_task(self._mirror_checkpoints(core)) if self.checkpoint_status_uri else None
        if self.get_logs and self.logging_interval is not None:
            self._live = asyncio.create_task(self._follow_rank0(core))
        try:
            while True:
                try:
                    pod_rv, group_rv = await self._list(core, custom)
                    failing_since = None
                except (client.ApiException, aiohttp.ClientError, asyncio.TimeoutError, OSError) as exc:
                    # an API server restart or a network blip is waited out; refused access is not
                    failing_since = failing_since or time.monotonic()
                    status = getattr(exc, "status", None)
                    if status in (401, 403) or time.monotonic() - failing_since > self.api_failure_timeout:
                        raise
                    self.log.warning("Listing gang %s failed (%s); retrying in %.0fs", self.gang_name,
                                     status or f"{type(exc).__name__}: {exc}", self.poll_interval)
                    await asyncio.sleep(self.poll_interval)
                    continue
                done = self._evaluate() or await self._watch(core, custom, pod_rv, group_rv)
                if done is not None:
                    return await self._with_recorded_preemption(core, done)
                await asyncio.sleep(self.poll_interval)  # a watch failed: never relist in a tight loop
        finally:
            if mirror is not None:
                mirror.cancel()

    async def _live_to_its_end(self, outcome: GangOutcome) -> None:
        """The gang is done: the live log follower stops at the end of its stream instead of being cut
        off. A disrupted rank 0 is followed until it stopped (its SIGTERM stop-save lines come last, and
        its pod is deleted the moment it stops), at most the grace period; a rank 0 that ended, for a
        moment (its stream is closing); one still running (another rank failed or was lost) is not
        waited for."""
        self._gang_done.set()
        if self._live is None or self._live.done() or not self._live_streaming:
            return
        pod = self._pods.get(self.pod_names[0]) or {}
        if outcome.status == STATUS_DISRUPTED and (stopping(pod) or container_ended(pod, self.container_name)):
            bound = float(self.cleanup_grace_period or 30) + SETTLE_MARGIN
        elif container_ended(pod, self.container_name):
            bound = FLUSH_TIMEOUT
        else:
            return
        try:
            async with asyncio.timeout(bound):
                await self._live_ended.wait()
        except TimeoutError:
            pass

    async def _stop_live(self) -> None:
        """Cancel the follower; its last lines are flushed within a bound (the outcome must not wait on
        them)."""
        live, self._live = self._live, None
        if live is None:
            return
        live.cancel()
        try:
            async with asyncio.timeout(2 * FLUSH_TIMEOUT):
                await asyncio.gather(live, return_exceptions=True)
        except TimeoutError:
            self.log.info("Live log of %s: the last flush did not finish; the tails follow", self.gang_name)

    async def _with_recorded_preemption(self, core, outcome: GangOutcome) -> GangOutcome:
        """A disruption the pods call an interruption is a preemption when the scheduler recorded one
        of them as preempted: the Eviction API overwrites the pod's PreemptionByScheduler reason."""
        if outcome.status != STATUS_DISRUPTED or outcome.cause == S.CAUSE_PREEMPTION or not self.preemption_record:
            return outcome
        try:
            resp = await core.read_namespaced_config_map(self.preemption_record["name"],
                                                         self.preemption_record["namespace"], _preload_content=False)
            record = read_record(await resp.json())
        except Exception as exc:  # noqa: BLE001 - the outcome stands as the pods tell it
            if getattr(exc, "status", None) != 404:
                self.log.warning("Gang %s: the scheduler's record of preemptions could not be read (%s); the "
                                 "disruption counts as an interruption", self.gang_name, getattr(exc, "status", exc))
            return outcome
        return with_recorded_preemption(outcome, record, self.pod_uids.values())

    async def _list(self, core, custom) -> tuple[str, str | None]:
        pods = await core.list_namespaced_pod(self.namespace, **self._pod_selector(), _preload_content=False)
        body = await pods.json()
        self._pods = {p["metadata"]["name"]: p for p in body.get("items") or []}
        group_rv = None
        if self.group:
            groups = await custom.list_namespaced_custom_object(
                self.group["group"], self.group["version"], self.namespace, self.group["plural"],
                field_selector=f"metadata.name={self.gang_name}")
            items = groups.get("items") or []
            self._group_obj = items[0] if items else None
            group_rv = (groups.get("metadata") or {}).get("resourceVersion")
        return (body.get("metadata") or {}).get("resourceVersion"), group_rv

    def _pod_selector(self) -> dict[str, str]:
        return {"label_selector": self.label_selector}

    async def _watch(self, core, custom, pod_rv: str | None, group_rv: str | None) -> GangOutcome | None:
        """Apply watch events until the gang is done (its outcome) or a watch needs a relist (None)."""
        queue: asyncio.Queue = asyncio.Queue()
        tasks = [asyncio.create_task(self._stream(queue, "pod", core.list_namespaced_pod, pod_rv,
                                                  self.namespace, **self._pod_selector()))]
        if self.group:
            tasks.append(asyncio.create_task(self._stream(
                queue, "group", custom.list_namespaced_custom_object, group_rv, self.group["group"],
                self.group["version"], self.namespace, self.group["plural"],
                field_selector=f"metadata.name={self.gang_name}")))
        try:
            while True:
                item = await queue.get()
                if item is _RELIST:
                    return None
                kind, event_type, obj = item
                if kind == "pod":
                    name = obj["metadata"]["name"]
                    if event_type == "DELETED":
                        self._pods.pop(name, None)
                    else:
                        self._pods[name] = obj
                else:
                    self._group_obj = None if event_type == "DELETED" else obj
                done = self._evaluate()
                if done is not None:
                    return done
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _stream(self, queue: asyncio.Queue, kind: str, list_fn, resource_version: str | None, *args,
                      **kwargs) -> None:
        """One watch, resumed from its last resourceVersion each time the server ends it."""
        from kubernetes_asyncio import client, watch

        rv = resource_version
        try:
            while True:
                w = watch.Watch()
                try:
                    # the provider's client applies a 60 s client-side timeout unless told otherwise (it
                    # cannot see a watch's timeout_seconds): give the server's end of the watch room
                    async for event in w.stream(list_fn, *args, resource_version=rv, timeout_seconds=self.watch_timeout,
                                                allow_watch_bookmarks=True,
                                                _request_timeout=self.watch_timeout + WATCH_CLIENT_SLACK, **kwargs):
                        obj = event["raw_object"]
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        if event["type"] == "ERROR":
                            queue.put_nowait(_RELIST)
                            return
                        if event["type"] != "BOOKMARK":
                            queue.put_nowait((kind, event["type"], obj))
                finally:
                    w.stop()
        except asyncio.CancelledError:
            raise
        except client.ApiException as exc:
            self.log.info("Watch of %s %s ended (%s); listing again", kind, self.gang_name, exc.status)
            queue.put_nowait(_RELIST)
        except Exception as exc:  # connection reset, timeout: list again after poll_interval
            self.log.warning("Watch of %s %s failed: %s", kind, self.gang_name, exc)
            queue.put_nowait(_RELIST)

    async def on_kill(self) -> None:
        """The deferred task was marked failed, cleared or marked success by a user (Airflow 3.3 calls
        this only then, not on a triggerer restart or a timeout): no worker runs the operator's
        on_kill, so the trigger deletes every object of the task instance (`cleanup_selector`: all
        attempts and tries), pods with their grace period so that training code can checkpoint."""
        if not self.cleanup_selector:
            return
        from kubernetes_asyncio import client

        from airflow_gpu.kube.backends import GroupResource
        from airflow_gpu.kube.cleanup import delete_task_instance_objects

        group = GroupResource(self.group["group"], self.group["version"], self.group["plural"]) if self.group else None
        async with self._hook().get_conn() as api:
            api.user_agent = USER_AGENT
            asked = await delete_task_instance_objects(client.CoreV1Api(api), client.CustomObjectsApi(api),
                                                       self.namespace, self.cleanup_selector, group,
                                                       grace=self.cleanup_grace_period)
        self.log.info("Task of gang %s/%s stopped by a user: deleted %s (%s)", self.namespace, self.gang_name,
                      ", ".join(asked) or "nothing (already gone)", self.cleanup_selector)

    # --- state ---------------------------------------------------------------------------------

    def _ours(self) -> list[dict]:
        if not self.pod_uids:
            return [p for name, p in self._pods.items() if name in self.pod_names]
        return [p for name, p in self._pods.items() if self.pod_uids.get(name) in (None, p["metadata"].get("uid"))
                and name in self.pod_names]

    def _evaluate(self) -> GangOutcome | None:
        pods = self._ours()
        for pod in pods:
            target = disruption_target(pod)
            if target:
                self._first_disruption.setdefault(pod["metadata"]["name"], target[0])
        state = gang_state(pods, self._group_obj, expected_names=self.pod_names, container=self.container_name)
        self._log_changes(state)
        if state.phase == S.RUNNING:
            self._running.set()
        if not state.terminal:
            return None
        return outcome_of(state, self.namespace, self.gang_name, self.attempt, time.time(),
                          self._first_disruption, self._checkpoint)

    def _log_changes(self, state: GangState) -> None:
        if state.wait_reason and state.wait_reason != self._last_wait:
            self.log.info("Gang %s waits: %s", self.gang_name, state.wait_reason)
        self._last_wait = state.wait_reason or self._last_wait
        if state.phase != self._last_phase:
            self.log.info("Gang %s: %s", self.gang_name, state.describe())
            self._last_phase = state.phase

    # --- logs -----------------------------------------------------------------------------------

    async def _with_ranks(self, api, outcome: GangOutcome) -> GangOutcome:
        """The outcome with its ranks' ends and log tails (triggers/ranklogs.py): read here, before
        anything deletes the pods, and carried to the worker in the event."""
        if outcome.status == STATUS_ERROR:
            return outcome
        import dataclasses

        from kubernetes_asyncio import client

        core = client.CoreV1Api(api)

        async def list_pods() -> dict[str, dict]:
            await self._list(core, client.CustomObjectsApi(api))
            return {p["metadata"]["name"]: p for p in self._ours()}

        live = None
        if self.get_logs and self.logging_interval is not None:
            live = LiveCopy(tuple(self._live_lines), self._live_read > len(self._live_lines),
                            self._live_ended.is_set(), self._streamed_until)
        try:
            ranks = await rank_ends(core, self.namespace, {p["metadata"]["name"]: p for p in self._ours()},
                                    self.container_name, get_logs=self.get_logs, tail_lines=self.log_tail_lines,
                                    disrupted=outcome.status == STATUS_DISRUPTED,
                                    grace=float(self.cleanup_grace_period or 30), list_pods=list_pods, log=self.log,
                                    live=live)
        except Exception as exc:  # noqa: BLE001 - the outcome stands without the logs
            self.log.warning("Reading the ranks' logs of %s failed: %s", self.gang_name, exc)
            return outcome
        return dataclasses.replace(outcome, ranks=ranks)

    async def _follow_rank0(self, core) -> None:
        """Live logs: rank 0's output into the trigger log (Airflow shows it in the task log), in
        batches every logging_interval seconds (0: as it comes). One follow stream per gang; each flush
        records the last line's timestamp on rank 0's pod, where a restarted triggerer resumes. Once
        the gang is done it stops at the end of its stream (`_live_to_its_end`)."""
        await self._running.wait()
        pod = self.pod_names[0]
        last = ((self._pods.get(pod) or {}).get("metadata") or {}).get("annotations", {}).get(
            C.ANNOTATION_LOGGED_UNTIL)
        batch: list[str] = []
        flushed_at = time.monotonic()

        async def flush() -> None:
            nonlocal batch, flushed_at
            flushed_at = time.monotonic()
            if not batch:
                return
            self.log.info("rank 0 (%s):\n%s", pod, "\n".join(batch))
            batch = []
            self._streamed_until = last
            try:
                await core.patch_namespaced_pod(pod, self.namespace,
                                                {"metadata": {"annotations": {C.ANNOTATION_LOGGED_UNTIL: last}}},
                                                _content_type="application/merge-patch+json",
                                                _request_timeout=FLUSH_TIMEOUT)
            except Exception as exc:  # noqa: BLE001 - a restart would repeat this batch, nothing worse
                self.log.info("Recording the live log position of %s failed: %s", pod, exc)

        try:
            while True:
                try:
                    resp = await core.read_namespaced_pod_log(
                        pod, self.namespace, container=self.container_name, follow=True, timestamps=True,
                        **({"since_seconds": since_seconds(last, time.time())} if last else {}), _preload_content=False,
                        _request_timeout=aiohttp.ClientTimeout(total=None, sock_connect=30))
                    async with resp:
                        if resp.status >= 400:  # not raised with _preload_content=False: its body is no log
                            raise RuntimeError(f"HTTP {resp.status} {(await resp.text())[:200]}")
                        self._live_ended.clear()
                        self._live_streaming = True
                        while True:
                            wait = None if self.logging_interval == 0 or not batch else \
                                max(0.0, self.logging_interval - (time.monotonic() - flushed_at))
                            try:
                                # asyncio.timeout, not wait_for: Python 3.11's wait_for drops a cancel that
                                # arrives as the read completes (the gang ending as its last line comes),
                                # and the follower then read on forever
                                async with asyncio.timeout(wait):
                                    raw = await resp.content.readline()
                            except TimeoutError:
                                await flush()
                                continue
                            if not raw:
                                self._live_ended.set()  # the container's output ended (or the server closed)
                                break
                            stamp, message = split_timestamp(raw.decode("utf-8", "replace").rstrip("\n"))
                            if stamp is not None:
                                if last and stamp_key(stamp) <= stamp_key(last):
                                    continue  # copied before the restart
                                last = stamp
                            batch.append(message)
                            self._live_lines.append(message)
                            self._live_read += 1
                            if self.logging_interval == 0 or time.monotonic() - flushed_at >= self.logging_interval:
                                await flush()
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - live logs are a convenience: try again
                    self.log.info("Following the log of %s: %s", pod, exc)
                finally:
                    self._live_streaming = False
                await flush()
                if self._gang_done.is_set():
                    return  # the gang is done: its stream has given all it will
                await asyncio.sleep(max(1.0, self.logging_interval or 0.0))
        finally:
            try:
                async with asyncio.timeout(FLUSH_TIMEOUT):
                    await asyncio.shield(flush())
            except TimeoutError:
                pass

    # --- checkpoint status channel -> pod annotations ------------------------------------------

    async def _mirror_checkpoints(self, core) -> None:
        """While the gang runs: status.json -> last-checkpoint annotations on its pods, when it changed,
        at most once per checkpoint_mirror_interval."""
        await self._running.wait()
        while True:
            try:
                hint = checkpoint_hint(await asyncio.to_thread(self._read_status), time.time())
                if hint is not None and hint != self._checkpoint:
                    await self._annotate(core, checkpoint_annotations(hint))
                    self._checkpoint = hint
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a hint only: never end the wait over it
                self.log.warning("Mirroring checkpoint status of %s failed: %s", self.gang_name, exc)
            await asyncio.sleep(self.checkpoint_mirror_interval)

    def _read_status(self) -> dict | None:
        from airflow_gpu.checkpoint.store import read_status_of

        return read_status_of(self.checkpoint_status_uri)

    async def _annotate(self, core, annotations: dict[str, str]) -> None:
        from kubernetes_asyncio import client

        body = {"metadata": {"annotations": annotations}}
        for pod in self._ours():
            if (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
                continue
            try:
                await core.patch_namespaced_pod(pod["metadata"]["name"], self.namespace, body,
                                                _content_type="application/merge-patch+json")
            except client.ApiException as exc:
                if exc.status != 404:  # gone meanwhile: the watch reports it
                    raise
