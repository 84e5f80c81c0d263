"""The Kubernetes shape of a gang, both ways (docs/DESIGN.md): a validated `WorkloadSpec` -> pods
with rank and checkpoint env, a headless Service and the group object of the gang backend
(`build`); and objects -> the gang's state (`gang_state`). The operator, the demo, devtools and the
scheduler's tests all build gangs here; nothing else decides labels, names or the group object."""

from airflow_gpu.kube.backends import GroupResource, Membership, group_manifest, group_resource, membership
from airflow_gpu.kube.manifests import GangManifests, build
from airflow_gpu.kube.names import TaskInstanceRef, gang_name, label_value, member_name
from airflow_gpu.kube.spec import SecretEnv, WorkloadSpec, WorkloadSpecError
from airflow_gpu.kube.state import GangState, MemberState, gang_state

__all__ = [
    "GangManifests", "GangState", "GroupResource", "MemberState", "Membership", "SecretEnv", "TaskInstanceRef",
    "WorkloadSpec", "WorkloadSpecError", "build", "gang_name", "gang_state", "group_manifest", "group_resource",
    "label_value", "member_name", "membership",
]
