"""Deleting every object of one task instance: its pods, headless Services and group objects, found
by the task instance's label selector (`TaskInstanceRef.selector()`), whatever attempt or try made
them. One rule (`_kinds`: what, in which order, which call) for both sides of Airflow, over two thin
transports: the operator on the worker (sync official client, `operators/cluster.py`) and the trigger
in the triggerer (`kubernetes_asyncio`), which is the only one still there when a deferred task is
marked failed, cleared or marked success.

Kept pods (on_finish_action): ended pods of a gang, marked `airflow-gpu.io/keep-until`, are spared by
the operator's deletion and go once that time has passed (`expired_kept`, one rule for the operator,
which sweeps its namespace when a task starts, and the GPU scheduler, which sweeps on its own clock).

This module takes the API objects as arguments and imports no client itself.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from airflow_gpu import constants as C
from airflow_gpu.kube.backends import GroupResource

NOT_FOUND = 404
_MISSING = object()


@dataclass(frozen=True)
class _Kind:
    kind: str
    list: Callable[[], Any]  # the request listing the selector's objects (a result, or a coroutine)
    delete: Callable[[str], Any]  # the request deleting one by name
    may_be_absent: bool = False  # a CRD that is not installed: nothing to delete


def _kinds(core, custom, namespace: str, selector: str, group_resource: GroupResource | None,
           grace: int | None, **raw) -> Iterator[_Kind]:
    """Pods first (with `grace`: None is their own terminationGracePeriodSeconds, so training code
    can checkpoint on SIGTERM), then Services, then the group objects."""
    yield _Kind("Pod", lambda: core.list_namespaced_pod(namespace, label_selector=selector, **raw),
                lambda name: core.delete_namespaced_pod(name, namespace, grace_period_seconds=grace, **raw))
    yield _Kind("Service", lambda: core.list_namespaced_service(namespace, label_selector=selector, **raw),
                lambda name: core.delete_namespaced_service(name, namespace, **raw))
    if group_resource is not None:
        gr = group_resource
        yield _Kind(gr.kind, lambda: custom.list_namespaced_custom_object(gr.group, gr.version, namespace, gr.plural,
                                                                          label_selector=selector),
                    lambda name: custom.delete_namespaced_custom_object(gr.group, gr.version, namespace, gr.plural,
                                                                        name), may_be_absent=True)


def _names(listed: Any) -> list[str]:
    """Names in a list answer: a raw response (sync, _preload_content=False), a dict, or a client model."""
    if listed is _MISSING:
        return []
    if hasattr(listed, "data"):
        listed = json.loads(listed.data)
    if isinstance(listed, dict):
        return [o["metadata"]["name"] for o in listed.get("items") or []]
    return [o.metadata.name for o in listed.items]


def _missing(exc: Exception) -> bool:
    return getattr(exc, "status", None) == NOT_FOUND


async def delete_task_instance_objects(core, custom, namespace: str, selector: str,
                                       group_resource: GroupResource | None, grace: int | None = None) -> list[str]:
    """Ask the API server to delete every pod, Service and group object of `selector` in `namespace`
    (kubernetes_asyncio CoreV1Api / CustomObjectsApi). Returns "Kind/name" of what was asked to go;
    an object gone meanwhile is not an error."""

    async def call(request, absent_ok: bool = True):
        try:
            return await request()
        except Exception as exc:
            if absent_ok and _missing(exc):
                return _MISSING
            raise

    asked: list[str] = []
    for k in _kinds(core, custom, namespace, selector, group_resource, grace):
        for name in _names(await call(k.list, k.may_be_absent)):
            if await call(lambda: k.delete(name)) is not _MISSING:
                asked.append(f"{k.kind}/{name}")
    return asked


def delete_task_instance_objects_sync(core, custom, namespace: str, selector: str,
                                      group_resource: GroupResource | None, grace: int | None = None,
                                      spare_pods: Collection[str] = ()) -> list[str]:
    """The same with the sync official client (CoreV1Api / CustomObjectsApi), lists and deletes of
    pods and Services not deserialised (the operator's path). `spare_pods`: pod names kept (ended
    pods on_finish_action keeps for debugging)."""

    def call(request, absent_ok: bool = True):
        try:
            return request()
        except Exception as exc:
            if absent_ok and _missing(exc):
                return _MISSING
            raise

    asked: list[str] = []
    for k in _kinds(core, custom, namespace, selector, group_resource, grace, _preload_content=False):
        for name in _names(call(k.list, k.may_be_absent)):
            if k.kind == "Pod" and name in spare_pods:
                continue
            if call(lambda: k.delete(name)) is not _MISSING:
                asked.append(f"{k.kind}/{name}")
    return asked


def is_kept(pod: dict, now: dt.datetime) -> bool:
    """A pod kept by on_finish_action whose keep-until time has not passed (an unreadable time has)."""
    until = ((pod.get("metadata") or {}).get("annotations") or {}).get(C.ANNOTATION_KEEP_UNTIL)
    if not until:
        return False
    try:
        return dt.datetime.fromisoformat(until.replace("Z", "+00:00")) > now
    except ValueError:
        return False


def expired_kept(pods: Iterable[dict], now: dt.datetime) -> list[dict]:
    """The pods to delete now: ours (managed-by label), ended (a kept pod holds nothing; a running one
    is its owner's to stop), marked keep-until, and past that time. The annotation is writable by the
    pod's owner, who may delete the pod anyway: it can only bring forward the end of its own pod."""
    def ours_and_ended(pod: dict) -> bool:
        meta = pod.get("metadata") or {}
        return ((meta.get("labels") or {}).get(C.LABEL_MANAGED_BY) == C.MANAGED_BY_VALUE
                and C.ANNOTATION_KEEP_UNTIL in (meta.get("annotations") or {})
                and (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"))
    return [p for p in pods if ours_and_ended(p) and not is_kept(p, now)]


__all__ = ["delete_task_instance_objects", "delete_task_instance_objects_sync", "expired_kept", "is_kept"]
