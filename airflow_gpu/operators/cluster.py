"""The operator's few Kubernetes calls: create a gang's objects (find-or-create by deterministic name,
waiting on a ResourceQuota refusal), check that stored UIDs still exist, read the ranks' ends and log tails, and
delete every object of a task instance by label selector. Sync official client, from the cncf
provider's KubernetesHook (so `kubernetes_conn_id` works exactly as for KubernetesPodOperator)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

from kubernetes import client
from kubernetes.client.rest import ApiException

from airflow_gpu.kube.cleanup import delete_task_instance_objects_sync

QUOTA_REFUSAL = "exceeded quota"
POD_SECURITY_REFUSAL = "violates PodSecurity"  # kube-apiserver's Pod Security admission


class ForeignObjectError(RuntimeError):
    """An object with the gang's deterministic name exists but belongs to something else."""


def _key(obj: dict) -> str:
    return f"{obj['kind']}/{obj['metadata']['name']}"


class GangClient:
    def __init__(self, api_client: client.ApiClient, log,
                 on_quota: Callable[[str, str], None] | None = None):
        self.api = api_client
        self.on_quota = on_quota  # called on a quota refusal (the operator defers from it); else wait here
        self.core = client.CoreV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.log = log
        self.last_refusal: str | None = None  # the ResourceQuota's message while create() waits

    # -- create --------------------------------------------------------------------------------

    def create(self, manifests, labels: dict[str, str], poll_interval: float,
               sleep: Callable[[float], None] = time.sleep) -> dict[str, str]:
        """Create the group, Service and pods in that order; return {"Kind/name": uid}. An object that
        already exists with our labels (a worker that died after creating it) is adopted. A 403
        "exceeded quota" means the namespace is full for now: log the quota's message once per change
        and try again every poll_interval (the task's execution_timeout bounds the wait). With on_quota,
        it is called first: the operator defers there (raises), so no worker slot waits."""
        uids: dict[str, str] = {}
        last_refusal = None
        for obj in manifests.objects():
            while True:
                try:
                    created = self._create(obj, manifests)
                    break
                except ApiException as exc:
                    if exc.status == 409:
                        created = self._adopt(obj, manifests, labels)
                        break
                    if exc.status == 403 and QUOTA_REFUSAL in (exc.body or ""):
                        message = _status_message(exc)
                        if message != last_refusal:
                            self.log.warning("waiting: %s refused by a ResourceQuota: %s", _key(obj), message)
                            last_refusal = self.last_refusal = message
                        if self.on_quota is not None:
                            self.on_quota(_key(obj), message)
                        sleep(poll_interval)
                        continue
                    raise
            uids[_key(obj)] = created["metadata"]["uid"]
        return uids

    def _create(self, obj: dict, manifests) -> dict:
        ns = obj["metadata"]["namespace"]
        if obj["kind"] == "Pod":
            return _json(self.core.create_namespaced_pod(ns, obj, _preload_content=False))
        if obj["kind"] == "Service":
            return _json(self.core.create_namespaced_service(ns, obj, _preload_content=False))
        gr = manifests.group_resource
        return self.custom.create_namespaced_custom_object(gr.group, gr.version, ns, gr.plural, obj)

    def _read(self, kind: str, ns: str, name: str, group_resource=None) -> dict:
        if kind == "Pod":
            return _json(self.core.read_namespaced_pod(name, ns, _preload_content=False))
        if kind == "Service":
            return _json(self.core.read_namespaced_service(name, ns, _preload_content=False))
        gr = group_resource
        return self.custom.get_namespaced_custom_object(gr.group, gr.version, ns, gr.plural, name)

    def _adopt(self, obj: dict, manifests, labels: dict[str, str]) -> dict:
        meta = obj["metadata"]
        existing = self._read(obj["kind"], meta["namespace"], meta["name"], manifests.group_resource)
        have = existing["metadata"].get("labels") or {}
        if any(have.get(k) != v for k, v in labels.items()):
            raise ForeignObjectError(f"{_key(obj)} in {meta['namespace']} exists but is not this task instance's "
                                     f"(labels {have}); delete it or rename the task")
        self.log.info("reattached to existing %s (uid %s)", _key(obj), existing["metadata"]["uid"])
        return existing

    # -- read back ------------------------------------------------------------------------------

    def live_uids(self, namespace: str, selector: str) -> dict[str, str]:
        """{"Pod/name": uid} of the task instance's pods that are not being deleted."""
        pods = _json(self.core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False))
        return {f"Pod/{p['metadata']['name']}": p["metadata"]["uid"] for p in pods["items"]
                if not p["metadata"].get("deletionTimestamp")}

    def pods(self, namespace: str, selector: str) -> list[dict]:
        """The pods of `selector` (wire dicts)."""
        return _json(self.core.list_namespaced_pod(namespace, label_selector=selector,
                                                   _preload_content=False))["items"]

    def log_tail(self, namespace: str, pod: str, container: str | None, lines: int) -> tuple[str, bool] | None:
        """(the last `lines` lines of the pod's log, whether it has lines before them), None when
        there is no log. tailLines, not limitBytes: limitBytes keeps the head, and the end is what matters."""
        try:
            resp = self.core.read_namespaced_pod_log(pod, namespace, container=container, tail_lines=lines + 1,
                                                     _preload_content=False)
        except ApiException as exc:
            self.log.info("no log for pod %s: %s", pod, exc.reason)
            return None
        text = resp.data.decode("utf-8", "replace")
        kept = text.splitlines(keepends=True)
        if len(kept) > lines:
            return "".join(kept[len(kept) - lines:]), True
        return text, False

    # -- delete ---------------------------------------------------------------------------------

    def group(self, namespace: str, name: str, group_resource) -> dict | None:
        """The gang's group object, None when there is none (or no group resource)."""
        if group_resource is None:
            return None
        gr = group_resource
        try:
            return self.custom.get_namespaced_custom_object(gr.group, gr.version, namespace, gr.plural, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise

    def annotate_pod(self, namespace: str, pod: str, annotations: dict[str, str]) -> None:
        self.core.patch_namespaced_pod(pod, namespace, {"metadata": {"annotations": annotations}},
                                       _preload_content=False)

    def delete_pod(self, namespace: str, pod: str) -> int:
        return self._ignore_missing(lambda: self.core.delete_namespaced_pod(pod, namespace, _preload_content=False))

    def delete_all(self, namespace: str, selector: str, group_resource=None, grace: int | None = None,
                   spare: Callable[[dict], bool] | None = None) -> int:
        """Delete every pod, Service and group object matching `selector` (kube/cleanup.py's rule), but
        the pods `spare` says stay; return how many were asked to go."""
        kept = ()
        if spare is not None:
            pods = _json(self.core.list_namespaced_pod(namespace, label_selector=selector, _preload_content=False))
            kept = {p["metadata"]["name"] for p in pods["items"] if spare(p)}
        return len(delete_task_instance_objects_sync(self.core, self.custom, namespace, selector, group_resource,
                                                     grace, spare_pods=kept))

    def remaining(self, namespace: str, selector: str, group_resource=None,
                  spare: Callable[[dict], bool] | None = None) -> list[str]:
        """Objects of the selector still present (pods still terminating count; spared pods do not)."""
        left = [f"Pod/{p['metadata']['name']}" for p in _json(self.core.list_namespaced_pod(
            namespace, label_selector=selector, _preload_content=False))["items"] if spare is None or not spare(p)]
        left += [f"Service/{s['metadata']['name']}" for s in _json(self.core.list_namespaced_service(
            namespace, label_selector=selector, _preload_content=False))["items"]]
        if group_resource is not None:
            gr = group_resource
            try:
                left += [f"{gr.plural}/{g['metadata']['name']}" for g in self.custom.list_namespaced_custom_object(
                    gr.group, gr.version, namespace, gr.plural, label_selector=selector)["items"]]
            except ApiException as exc:
                if exc.status != 404:
                    raise
        return left


def _json(resp) -> dict:
    return json.loads(resp.data) if hasattr(resp, "data") else resp


def invalid_refusal(exc: BaseException) -> str | None:
    """The API server's message when it refused an object's spec for good, else None: 422 (validation
    or an admission plugin, e.g. a volume type the cluster does not offer) or 403 from Pod Security
    admission (the namespace enforces a level the spec breaks). The same spec is refused again: a
    deterministic error, not one to retry. Other 403s (RBAC, a ResourceQuota) are not the spec's fault."""
    if not isinstance(exc, ApiException):
        return None
    if exc.status == 422:
        return _status_message(exc)
    if exc.status == 403 and POD_SECURITY_REFUSAL in (exc.body or ""):
        return (f"{_status_message(exc)} (set the operator's security_context / container_security_context, "
                "as for KubernetesPodOperator, to meet the namespace's Pod Security level)")
    return None


def _status_message(exc: ApiException) -> str:
    try:
        return json.loads(exc.body).get("message") or exc.reason
    except (TypeError, ValueError):
        return str(exc.body or exc.reason)


__all__ = ["ForeignObjectError", "GangClient", "QUOTA_REFUSAL", "invalid_refusal"]
