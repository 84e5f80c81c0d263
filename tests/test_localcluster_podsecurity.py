"""The local cluster's Pod Security admission: what each enforced level refuses, with kube-apiserver's
wording (pure: the admission function on pod dicts)."""

from __future__ import annotations

import pytest

from airflow_gpu.localcluster import errors
from airflow_gpu.localcluster.admission import podsecurity


def ns(level: str | None) -> dict:
    return {"metadata": {"name": "t", "labels": {podsecurity.ENFORCE_LABEL: level} if level else {}}}


def pod(spec: dict) -> dict:
    return {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "base", "image": "x"}], **spec}}


RESTRICTED_OK = {"securityContext": {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}},
                 "containers": [{"name": "base", "image": "x", "securityContext": {
                     "allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]}}}]}


def refusal(namespace: dict, p: dict) -> str | None:
    try:
        podsecurity.admit_pod(namespace, p)
    except errors.ApiError as exc:
        assert exc.code == 403
        return str(exc.message)
    return None


def test_an_unlabelled_namespace_is_privileged_and_admits_anything():
    assert refusal(ns(None), pod({"hostNetwork": True, "volumes": [{"name": "h", "hostPath": {"path": "/"}}]})) is None


@pytest.mark.parametrize("spec,problem", [
    ({"hostNetwork": True}, "host namespaces (hostNetwork=true)"),
    ({"volumes": [{"name": "h", "hostPath": {"path": "/"}}]}, 'hostPath volumes (volume "h")'),
    ({"containers": [{"name": "base", "securityContext": {"privileged": True}}]},
     'privileged (container "base" must not set securityContext.privileged=true)'),
    ({"containers": [{"name": "base", "securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}]},
     'non-default capabilities (container "base" must not include "SYS_ADMIN"'),
])
def test_baseline_refuses_host_access_and_privilege(spec, problem):
    message = refusal(ns("baseline"), pod(spec))
    assert message is not None and 'violates PodSecurity "baseline:latest"' in message and problem in message, message


def test_baseline_admits_a_plain_pod_that_restricted_refuses_with_every_missing_field_named():
    assert refusal(ns("baseline"), pod({})) is None
    message = refusal(ns("restricted"), pod({}))
    for problem in ("allowPrivilegeEscalation != false", "unrestricted capabilities", "runAsNonRoot != true",
                    "seccompProfile"):
        assert problem in message, message
    assert refusal(ns("restricted"), pod(RESTRICTED_OK)) is None


def test_restricted_refuses_root_and_volume_types_outside_its_list_even_when_the_rest_is_right():
    as_root = {**RESTRICTED_OK, "securityContext": {**RESTRICTED_OK["securityContext"], "runAsUser": 0}}
    assert "runAsUser=0" in refusal(ns("restricted"), pod(as_root))
    nfs = {**RESTRICTED_OK, "volumes": [{"name": "n", "nfs": {"server": "s", "path": "/"}},
                                        {"name": "ok", "emptyDir": {}}]}
    message = refusal(ns("restricted"), pod(nfs))
    assert 'volume "n" uses restricted volume type "nfs"' in message and '"ok"' not in message
