"""Deleting every object of one task instance: its pods, headless Services and group objects, found
by the task instance's label selector (`TaskInstanceRef.selector()`), whatever attempt or try made
them. One rule for both sides of Airflow: the operator on the worker (sync official client,
`operators/cluster.py`) and the trigger in the triggerer (`kubernetes_asyncio`, below), which is the
only one still there when a deferred task is marked failed, cleared or marked success.

This module takes the API objects as arguments and imports no client itself.
"""

from __future__ import annotations

from airflow_gpu.kube.backends import GroupResource

NOT_FOUND = 404


async def delete_task_instance_objects(core, custom, namespace: str, selector: str,
                                       group_resource: GroupResource | None, grace: int | None = None) -> list[str]:
    """Ask the API server to delete every pod, Service and group object of `selector` in `namespace`
    (kubernetes_asyncio CoreV1Api / CustomObjectsApi). Pods get `grace` seconds (None: their own
    terminationGracePeriodSeconds, so training code can checkpoint on SIGTERM). Returns "Kind/name"
    of what was asked to go; an object gone meanwhile is not an error."""
    asked: list[str] = []
    pods = await core.list_namespaced_pod(namespace, label_selector=selector)
    for pod in pods.items:
        if await _ignore_missing(core.delete_namespaced_pod(pod.metadata.name, namespace, grace_period_seconds=grace)):
            asked.append(f"Pod/{pod.metadata.name}")
    services = await core.list_namespaced_service(namespace, label_selector=selector)
    for service in services.items:
        if await _ignore_missing(core.delete_namespaced_service(service.metadata.name, namespace)):
            asked.append(f"Service/{service.metadata.name}")
    if group_resource is not None:
        gr = group_resource
        groups = await _ignore_missing(custom.list_namespaced_custom_object(
            gr.group, gr.version, namespace, gr.plural, label_selector=selector))
        for group in (groups or {}).get("items") or []:
            name = group["metadata"]["name"]
            if await _ignore_missing(custom.delete_namespaced_custom_object(gr.group, gr.version, namespace,
                                                                            gr.plural, name)):
                asked.append(f"{gr.kind}/{name}")
    return asked


async def _ignore_missing(call):
    """The call's result, or None when the object (or the CRD) is not there."""
    try:
        return await call
    except Exception as exc:
        if getattr(exc, "status", None) == NOT_FOUND:
            return None
        raise


__all__ = ["delete_task_instance_objects"]
